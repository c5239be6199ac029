"""The build lock held by another thread of the same process (load_many's workers, a user's threads):
/proc/locks names the process, which is this one, so the messages said "another process (pid <ours>)"."""
from __future__ import annotations

import os
import threading

import pytest

from opbuilder.cache.lock import build_lock
from opbuilder.errors import BuildError


def test_a_lock_held_by_another_thread_of_this_process_is_said_to_be(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPBUILDER_LOCK_TIMEOUT", "0.5")
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with build_lock(tmp_path, "twin_op"):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    try:
        with pytest.raises(BuildError) as info:
            with build_lock(tmp_path, "twin_op"):
                pass
    finally:
        done.set()
        holder.join(30)
    pid = os.getpid()
    assert str(info.value) == (f"building operator 'twin_op' failed: gave up after waiting 0.5 s "
                               f"(OPBUILDER_LOCK_TIMEOUT) for the build lock {tmp_path / '.lock'}, held by another "
                               f"thread of this process (pid {pid}); load again once that build is done, or set "
                               f"OPBUILDER_LOCK_TIMEOUT higher")
    assert capsys.readouterr().err == (f"opbuilder: waiting for another thread of this process (pid {pid}) that is "
                                       f"building twin_op; giving up after 0.5 s (OPBUILDER_LOCK_TIMEOUT)\n")

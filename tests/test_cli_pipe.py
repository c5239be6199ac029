"""``python -m opbuilder cache list | head``: a reader that closes the pipe early ends the command quietly
(no BrokenPipeError traceback; the status of a command ended by SIGPIPE, 141)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder_util import child_env
from opbuilder import build_library

ADD = Path(__file__).resolve().parents[1] / "custom_src" / "aot_add.cpp"
COPIES = 600  # about 260 bytes of listing each: more than twice what a pipe holds (64 KiB)
LIST = [sys.executable, "-m", "opbuilder", "cache", "list"]


@pytest.fixture(scope="module")
def big_cache(tmp_path_factory):
    """A cache with one real build and COPIES copies of its directory under other operator names."""
    cache = tmp_path_factory.mktemp("pipe") / "cache"
    build_library("pipe_op", [ADD], build_dir=cache)
    for i in range(COPIES):
        shutil.copytree(cache / "pipe_op.lib", cache / f"pipe_op_{i:03d}.lib", symlinks=True)
    return cache


def test_cache_list_into_head_ends_without_a_traceback(big_cache):
    env = child_env(OPBUILDER_CACHE_DIR=str(big_cache))
    full = subprocess.run(LIST, env=env, capture_output=True, text=True, timeout=120)
    assert full.returncode == 0, full.stderr
    assert sum(line.startswith("pipe_op_") for line in full.stdout.splitlines()) == COPIES
    assert len(full.stdout) > 2 * 65536  # more than the pipe and head's first read hold
    lister = subprocess.Popen(LIST, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-n", "1"], stdin=lister.stdout, stdout=subprocess.PIPE)
    lister.stdout.close()  # head alone reads the pipe now
    first, _ = head.communicate(timeout=120)
    err = lister.stderr.read().decode()
    status = lister.wait(timeout=120)
    lister.stderr.close()
    assert first.decode() == f"cache: {big_cache}\n"
    assert err == "", err
    assert status == 141


def test_a_pipe_closed_before_anything_is_written(tmp_path):
    # the smallest listing, still in the stdout buffer when the reader is already gone: the final flush fails
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run(LIST, env=child_env(OPBUILDER_CACHE_DIR=str(tmp_path / "empty")), stdout=w,
                             stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert res.stderr == ""
    assert res.returncode == 141

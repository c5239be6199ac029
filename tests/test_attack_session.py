"""Found by attacking this session's additions as a user would: each test failed before its fix."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_load_many import RUNAWAY, _procs_mentioning


@pytest.mark.build
def test_an_interrupted_load_many_leaves_no_compiler_running(cache_dir, tmp_path):
    # the interrupt reaches the calling thread only: the workers' ninja and compilers went on, and
    # outlived the process (a runaway compile, for minutes)
    code = textwrap.dedent("""\
        import sys
        from opbuilder import Inline, load_many
        try:
            load_many([Inline("atk_interrupted", sys.argv[1], functions=["value"])])
        except KeyboardInterrupt:
            print("interrupted")
    """)
    build_dir = Path(cache_dir).resolve() / "atk_interrupted" / "build"
    needle = [f"OPBUILDER_BUILD_DIR={build_dir}\0"]
    proc = subprocess.Popen([sys.executable, "-c", code, RUNAWAY], env=dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any("cc1plus" in cmd for _, cmd in _procs_mentioning(needle)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (0, "interrupted\n"), err
    assert _procs_mentioning(needle) == []


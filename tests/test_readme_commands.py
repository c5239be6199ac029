"""The README's one-process pytest line works as written: run on one small file, pytest accepts it
(``-p no:xdist`` is rejected: the configured addopts pass ``-n``) and starts no xdist workers."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_PROCESS = re.compile(r"`python -m pytest ([^`]*)` runs it in one process")


def test_the_readme_names_a_one_process_command_that_pytest_accepts():
    found = ONE_PROCESS.findall((ROOT / "README.md").read_text())
    assert len(found) == 1, found
    args = found[0].split()
    # a file of quick tests that compile nothing (test_moved_modules.py, the earlier choice, imports torch
    # and builds: 30 s of the one-minute fast subset)
    r = subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-m", "not build", "tests/test_inline_text.py"],
                       cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bringing up nodes" not in r.stdout + r.stderr  # xdist starts no workers: one process

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
    proc = subprocess.Popen([sys.executable, "-c", code, RUNAWAY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir)), text=True)
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


def _project(tmp_path, ops: str):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\n' + ops)
    return tmp_path


@pytest.mark.parametrize("ops, message", [
    # the second binary and record entry replaced the first: its load() silently built instead
    ('[[tool.opbuilder.ops]]\nname = "a"\nsources = ["p/a.cpp"]\n[[tool.opbuilder.ops]]\nname = "a"\n'
     'sources = ["p/b.cpp"]\n',
     "operator 'a' is listed twice in [[tool.opbuilder.ops]]; give each operator its own name"),
    ('[[tool.opbuilder.ops]]\nname = "a"\nsources = ["p/a.cpp"]\ncflags = [1]\n',
     "operator 'a' in [[tool.opbuilder.ops]]: cflags must be a list of strings, got [1]"),
    ('[[tool.opbuilder.ops]]\nname = "a"\nsources = ["p/a.cpp"]\ndebug_mode = "yes"\n',
     "operator 'a' in [[tool.opbuilder.ops]]: debug_mode must be true or false, got 'yes'"),
    ('[tool]\nopbuilder = 3\n', "[tool.opbuilder] ops must be an array of tables: [[tool.opbuilder.ops]]"),
])
def test_a_bad_op_entry_says_what_is_wrong(tmp_path, ops, message):
    from opbuilder import build_meta

    with pytest.raises(ValueError) as e:
        build_meta.read_ops(_project(tmp_path, ops))
    assert str(e.value) == message


def test_a_string_include_path_is_one_path_and_cuda_arch_is_an_option(tmp_path):
    # include_paths = "p/include" was iterated a character at a time ("p", "/", "i", ...); cuda_arch,
    # a CustomOpBuilder option, was refused as unknown
    from opbuilder import build_meta

    p = _project(tmp_path, '[[tool.opbuilder.ops]]\nname = "a"\nsources = ["p/a.cu"]\ninclude_paths = "p/include"\n'
                           'cuda_arch = "8.0"\nbackend = "GPU"\n')
    assert build_meta.read_ops(p) == [{"name": "a", "sources": ["p/a.cu"], "include_paths": ["p/include"],
                                       "cuda_arch": "8.0", "backend": "GPU"}]


@pytest.mark.build
def test_a_diagnostic_column_counts_characters_after_a_tab_or_a_wide_character(cache_dir):
    # gcc's JSON "column" is a display column: a tab reaches column 9, a CJK character is 2 wide; the
    # caret's column was that, not the character's place in the line (as nvcc's and the docs' columns)
    from opbuilder import BuildError, Inline

    src = 'int value() {\n\treturn zq_tabbed;\n}\nconst char* s = "日本"; int w = zq_wide;\n'
    with pytest.raises(BuildError) as info:
        Inline("atk_columns", src, functions=["value"]).load()
    lines = src.splitlines()
    got = [(d.line, d.column) for d in info.value.diagnostics if d.severity == "error"]
    assert got == [(2, lines[1].index("zq_tabbed") + 1), (4, lines[3].index("zq_wide") + 1)]


@pytest.mark.build
def test_an_infinite_timeout_is_no_limit_and_no_thread_error(cache_dir, monkeypatch):
    # timeout=float("inf") passed the check, then each build's watchdog timer died with an
    # OverflowError traceback on stderr ("timestamp out of range for platform time_t")
    import threading

    from opbuilder import Inline, load_many

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    [r] = load_many([Inline("atk_inf_timeout", "int value() { return 5; }", functions=["value"])],
                    timeout=float("inf"))
    assert (r.error, r.module.value(), died) == (None, 5, [])


@pytest.mark.build
def test_an_inline_source_with_unicode_builds_under_an_ascii_locale(cache_dir):
    # the strings were written in the locale's encoding: under LC_ALL=C (no coercion) a comment in
    # Japanese was a UnicodeEncodeError, though g++ reads UTF-8 whatever the locale
    code = textwrap.dedent("""\
        from opbuilder import Inline
        print(Inline("atk_ascii_locale", "// \\u65e5\\u672c\\u8a9e\\nint value() { return 4; }\\n",
                     functions=["value"]).load().value())
    """)
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir), LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, "4\n"), done.stderr

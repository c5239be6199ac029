"""CustomOpBuilder: warm path, errors, cache-directory safety."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opbuilder import BuildError, CustomOpBuilder, UnsafeCacheDirError, build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
FUNCTION_OPS = str(ROOT / "custom_src" / "function_ops.cpp")


def test_load_again_returns_the_same_module(my_ops):
    assert CustomOpBuilder("my_ops", [FUNCTION_OPS]).load() is my_ops


def test_build_returns_the_library_path(my_ops, cache_dir):
    path = Path(CustomOpBuilder("my_ops", [FUNCTION_OPS]).build())
    assert path.is_file() and path.suffix == ".so" and cache_dir in path.parents


def test_warm_load_in_a_child_process_starts_no_process(my_ops):
    child = textwrap.dedent(f"""
        import os, subprocess
        def refuse(*a, **k):
            raise AssertionError("a process was started on the warm path")
        subprocess.Popen = refuse
        os.posix_spawn = os.posix_spawnp = os.fork = os.system = refuse
        import runtime
        from opbuilder import CustomOpBuilder
        m = CustomOpBuilder("my_ops", [{FUNCTION_OPS!r}]).load()
        x = runtime.Tensor(2.0)
        print(m.mul(x, x).item())
    """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "4.0"
    assert "building" not in res.stderr  # silent on the warm path


def test_compile_error_is_a_build_error_with_file_and_line(tmp_path):
    src = tmp_path / "broken.cpp"
    src.write_text('#include "opbuilder/extension.h"\n\nint f() {\n  return undefined_name;\n}\n')
    with pytest.raises(BuildError) as info:
        CustomOpBuilder("broken_op", [str(src)]).load()
    err = info.value
    assert isinstance(err, RuntimeError)
    msg = str(err)
    lines = msg.splitlines()
    assert lines[0] == "building operator 'broken_op' failed:"
    assert f"{src}:4:" in lines[1] and "error" in lines[1] and "undefined_name" in lines[1]  # the first error next
    assert lines[-1] == f"full log: {err.log_path}"  # and the log last
    assert err.log_path and Path(err.log_path).is_file() and "undefined_name" in err.log


def test_unknown_backend_lists_the_accepted_values():
    with pytest.raises(ValueError, match="unknown backend 'Ascend'; accepted values: 'CPU', 'GPU'"):
        CustomOpBuilder("x", [FUNCTION_OPS], backend="Ascend")


def test_missing_source_is_named():
    with pytest.raises(FileNotFoundError, match="nope.cpp"):
        CustomOpBuilder("x", ["nope.cpp"])


@pytest.mark.parametrize("name", ["my-ops", "1ops", ""])
def test_name_must_be_an_identifier(name):
    with pytest.raises(ValueError, match="valid Python identifier"):
        CustomOpBuilder(name, [FUNCTION_OPS])


def test_a_keyword_name_is_named_so():
    """'class' is an identifier, so "must be a valid Python identifier" misled; it is a keyword."""
    with pytest.raises(ValueError, match=r"^operator name 'class' is a Python keyword, which cannot name a module "
                                         r"\(import class is a syntax error\); choose another name$"):
        CustomOpBuilder("class", [FUNCTION_OPS])


def test_the_caches_own_inline_directory_is_no_operator_name():
    import opbuilder
    # an operator named "inline" shared <cache>/inline/ with load_inline's sources, and `opbuilder cache clean
    # inline` deleted every load_inline operator's sources (an attack's find; fails on fdce2ab)
    for make in (lambda: CustomOpBuilder("inline", [FUNCTION_OPS]),
                 lambda: opbuilder.load_inline("inline", "int f() { return 1; }", functions=["f"])):
        with pytest.raises(ValueError, match=r"^operator name 'inline' is reserved: the cache keeps load_inline's "
                                             r"sources in its directory inline/ \(and `opbuilder cache clean inline` "
                                             r"would remove them\); choose another name$"):
            make()


def test_include_paths_given_as_one_path_is_that_path(tmp_path):
    """include_paths="/dir" was taken as its characters ("include path ... is not a directory: /")."""
    b = CustomOpBuilder("inc_one", [FUNCTION_OPS], include_paths=str(tmp_path))
    assert b.spec.include_paths == (tmp_path,)


def test_unexpected_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument\\(s\\) op_def"):
        CustomOpBuilder("x", [FUNCTION_OPS], op_def="y")


def test_cuda_source_needs_the_gpu_backend(tmp_path):
    cu = tmp_path / "k.cu"
    cu.write_text("")
    with pytest.raises(ValueError, match="backend='GPU'"):
        CustomOpBuilder("k", [str(cu)])


def test_cache_dir_is_created_private(tmp_path, monkeypatch, my_ops):
    root = tmp_path / "fresh-cache"
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(root))
    src = tmp_path / "tiny.cpp"
    src.write_text("int tiny() { return 1; }\n")
    build_library("tiny", [str(src)])
    assert (os.stat(root).st_mode & 0o777) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o702])
def test_group_or_other_writable_cache_dir_is_refused(tmp_path, monkeypatch, mode):
    root = tmp_path / "shared-cache"
    root.mkdir()
    os.chmod(root, mode)
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(root))
    with pytest.raises(UnsafeCacheDirError, match=f"{root}.*writable by group or others"):
        CustomOpBuilder("my_ops", [FUNCTION_OPS]).load()
    assert os.listdir(root) == []  # nothing built there


def test_a_shared_sticky_cache_dir_is_refused_with_a_private_directory_as_the_fix(tmp_path, monkeypatch):
    """Before, the fix said "chmod 700 /tmp" for OPBUILDER_CACHE_DIR=/tmp: closing a shared directory to
    its other users. A sticky directory's fix is a private directory inside it."""
    root = tmp_path / "tmp-like"
    root.mkdir()
    os.chmod(root, 0o1777)
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(root))
    with pytest.raises(UnsafeCacheDirError) as e:
        CustomOpBuilder("my_ops", [FUNCTION_OPS]).load()
    assert str(e.value) == (
        f"opbuilder cache directory {root} is writable by group or others (mode 1777); nothing is built or loaded "
        f"from it. Fix: {root} is a shared directory (sticky bit): set OPBUILDER_CACHE_DIR to a private directory "
        f"of your own, e.g. {root / 'opbuilder-cache'} (opbuilder creates it with mode 700)")
    assert "chmod" not in str(e.value) and os.listdir(root) == []


def test_load_inline_under_a_cache_path_that_is_a_file_names_it(tmp_path, monkeypatch):
    """Before: a raw NotADirectoryError for <file>/inline/<name>/<key>; now load()'s words for each."""
    import opbuilder
    file = tmp_path / "file.txt"
    file.write_text("")
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(file))
    with pytest.raises(UnsafeCacheDirError, match=rf"^opbuilder cache path {re.escape(str(file))} is not a "
                                                  rf"directory; set OPBUILDER_CACHE_DIR to a directory$"):
        opbuilder.load_inline("li_file", "int f() { return 1; }", functions=["f"])
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(file / "cache"))
    with pytest.raises(BuildError, match=rf"^building operator 'li_file' failed: cannot create "
                                         rf"{re.escape(str(file / 'cache'))} \(Not a directory: a part of that path "
                                         rf"is a file\); set OPBUILDER_CACHE_DIR to a directory you can write to"):
        opbuilder.load_inline("li_file", "int f() { return 1; }", functions=["f"])
    assert file.read_text() == ""


def test_link_error_names_the_missing_library(tmp_path):
    src = tmp_path / "l.cpp"
    src.write_text('extern "C" int l() { return 1; }\n')
    with pytest.raises(BuildError) as info:
        build_library("linkfail", [str(src)], ldflags=["-lopbuilder_no_such_library"])
    msg = str(info.value)
    assert msg.splitlines()[0] == "building operator 'linkfail' failed:"
    assert "cannot find -lopbuilder_no_such_library" in msg and "full log: " in msg


def test_every_line_of_the_linkers_error_is_kept(tmp_path):
    # only the known phrasings were kept: a user saw "collect2: error: ld returned 1 exit status" alone,
    # without the linker's line naming the cause (an attack's find; fails on 297829d)
    src = tmp_path / "l.cpp"
    src.write_text('extern "C" int foo_val();\nextern "C" int l() { return foo_val(); }\n')
    missing = tmp_path / "nowhere" / "libq.a"
    with pytest.raises(BuildError) as info:
        build_library("linkpath", [str(src)], ldflags=[f"-Wl,{missing}"])
    assert f"cannot find {missing}: No such file or directory" in str(info.value)
    junk = tmp_path / "libjunk.a"
    junk.write_text("not an archive\n")
    with pytest.raises(BuildError) as info:
        build_library("linkjunk", [str(src)], ldflags=[str(junk)])
    msg = str(info.value)
    assert f"{junk}: file format not recognized" in msg and "ld returned 1 exit status" in msg
    assert "warning" not in msg


def test_duplicate_definition_is_a_readable_link_error(tmp_path):
    for name in ("one", "two"):
        (tmp_path / f"{name}.cpp").write_text("int twice(int x) { return x; }\n")
    with pytest.raises(BuildError) as info:
        build_library("dupdef", [str(tmp_path / "one.cpp"), str(tmp_path / "two.cpp")])
    msg = str(info.value)
    assert "dupdef" in msg.splitlines()[0]
    assert "multiple definition of `twice(int)'" in msg


def test_undefined_symbol_at_import_is_named_demangled(tmp_path):
    from builder_util import tiny_module

    src = tiny_module(tmp_path / "undef_op.cpp", "ob_missing_symbol(41)",
                      decls="namespace ob { int helper(int); }\nint ob_missing_symbol(int x) { return ob::helper(x); }")
    with pytest.raises(BuildError) as info:
        CustomOpBuilder("undef_op", [str(src)]).load()
    msg = str(info.value)
    assert msg.startswith("operator 'undef_op' was built but cannot be imported: undefined symbol ob::helper(int)")
    assert "(_ZN2ob6helperEi)" in msg and "library: " in msg


def test_a_non_ascii_name_is_refused_before_compiling():
    # Python imports a module named 'ñ_ops' through PyInitU_..., which PYBIND11_MODULE never defines
    with pytest.raises(ValueError, match="operator name 'ñ_ops' must be ASCII"):
        CustomOpBuilder("ñ_ops", [FUNCTION_OPS])


def test_an_overlong_name_is_refused_with_its_length():
    with pytest.raises(ValueError, match="is 230 characters long; at most 100 are accepted"):
        CustomOpBuilder("o" * 230, [FUNCTION_OPS])
    with pytest.raises(ValueError, match="is 230 characters long"):
        build_library("o" * 230, [FUNCTION_OPS])


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_lock_timeout_is_a_value_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv("OPBUILDER_LOCK_TIMEOUT", value)
    src = tmp_path / "timed.cpp"
    src.write_text('extern "C" int timed() { return 1; }\n')
    with pytest.raises(ValueError, match=f"OPBUILDER_LOCK_TIMEOUT must be a positive number of seconds.*{value!r}"):
        build_library("timed", [str(src)], build_dir=tmp_path / "cache")


@pytest.mark.parametrize("where", ["source", "include", "cache"])
def test_a_path_that_is_not_utf8_is_a_named_error(where, tmp_path, monkeypatch):
    """A name with bytes that are not UTF-8 (Python holds them as surrogates) cannot go into the
    build's files: a ValueError naming the path, before anything is built (it was a raw
    UnicodeEncodeError from deep in the build)."""
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/dir\xff")
    os.makedirs(bad)
    src = Path(bad if where == "source" else tmp_path) / "op.cpp"
    src.write_text('#include "opbuilder/extension.h"\nOB_MODULE(m) { m.def("f", []() { return 1; }); }\n')
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", bad if where == "cache" else str(tmp_path / "cache"))
    what = {"source": f"source {str(src)!r}", "include": f"include path {bad!r}",
            "cache": f"the cache directory {bad!r}"}[where]
    fix = "set OPBUILDER_CACHE_DIR to one" if where == "cache" else "rename it"
    with pytest.raises(ValueError) as e:
        CustomOpBuilder("not_utf8", [str(src)], include_paths=[bad] if where == "include" else None).load()
    assert str(e.value) == (f"{what} of operator 'not_utf8' is not a UTF-8 path: its name has bytes no build "
                            f"file can hold; {fix}")

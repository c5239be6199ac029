"""The content-addressed cache: headers count, touch does not, reload in-process,
published files never rewritten, incremental rebuilds, old builds pruned."""
import ctypes
import os
import subprocess
import time
from pathlib import Path

import pytest

from builder_util import PYTHON, child_env, compiled_sources, tiny_module, wrapper_cxx
from opbuilder import BuildError, CustomOpBuilder, build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def _touch(*paths):
    for p in paths:
        st = os.stat(p)
        os.utime(p, ns=(st.st_atime_ns + 5_000_000_000, st.st_mtime_ns + 5_000_000_000))


def test_header_edit_is_seen_in_process_and_in_a_new_process(tmp_path):
    header = tmp_path / "value.h"
    header.write_text("#define OB_VALUE 1\n")
    src = tiny_module(tmp_path / "hdr_op.cpp", "OB_VALUE", includes='#include "value.h"')
    builder = CustomOpBuilder("hdr_op", [src])

    first = builder.load()
    assert first.value() == 1
    first_lib = Path(builder.build())
    first_bytes = first_lib.read_bytes()

    header.write_text("#define OB_VALUE 2\n")
    second = builder.load()  # same process: the new code, as a new module object
    assert second is not first and second.value() == 2
    assert first.value() == 1  # the module loaded before still runs its own code
    second_lib = Path(builder.build())
    assert second_lib != first_lib and first_lib.read_bytes() == first_bytes  # never overwritten

    _touch(header, src)  # new mtimes, same contents: nothing to rebuild
    assert builder.load() is second

    header.write_text("#define OB_VALUE 3\n")
    code = f"from opbuilder import CustomOpBuilder; print(CustomOpBuilder('hdr_op', [{str(src)!r}]).load().value())"
    res = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300, env=child_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "3"
    assert "building hdr_op" in res.stderr  # the new process rebuilt for the header edit
    assert builder.load().value() == 3  # and this process now finds that build


def test_a_header_beside_the_source_directory_counts(tmp_path):
    """``#include "../inc/value.h"`` from src/: a header under neither a directory the user named nor a
    system one was left out of the key, so its edit loaded the old module (found by this session's attack)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "inc").mkdir()
    header = tmp_path / "inc" / "value.h"
    header.write_text("#define OB_VALUE 1\n")
    src = tiny_module(tmp_path / "src" / "rel_hdr_op.cpp", "OB_VALUE", includes='#include "../inc/value.h"')
    builder = CustomOpBuilder("rel_hdr_op", [src])
    assert builder.load().value() == 1
    header.write_text("#define OB_VALUE 2\n")
    assert builder.load().value() == 2


def test_a_header_that_disappears_is_a_build_error_naming_it(tmp_path):
    header = tmp_path / "gone.h"
    header.write_text("#define OB_VALUE 5\n")
    src = tiny_module(tmp_path / "gone_op.cpp", "OB_VALUE", includes='#include "gone.h"')
    assert CustomOpBuilder("gone_op", [src]).load().value() == 5
    header.unlink()
    with pytest.raises(BuildError) as info:  # the recorded header is gone: rebuild, and the compiler says why
        CustomOpBuilder("gone_op", [src]).load()
    assert "gone.h" in str(info.value) and "gone_op" in str(info.value).splitlines()[0]


@pytest.fixture
def three_sources(tmp_path, monkeypatch):
    """Three C sources (b and c include common.h) built as one library through a logging CXX."""
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    (tmp_path / "common.h").write_text("#define BASE 100\n")
    srcs = []
    for name, body in (("a", "return 1;"), ("b", "return BASE + 2;"), ("c", "return BASE + 3;")):
        inc = '#include "common.h"\n' if name != "a" else ""
        p = tmp_path / f"{name}.cpp"
        p.write_text(f'{inc}extern "C" int {name}_value() {{ {body} }}\n')
        srcs.append(p)
    return tmp_path, srcs, log


def _values(lib):
    so = ctypes.CDLL(lib)
    return so.a_value(), so.b_value(), so.c_value()


def test_editing_one_of_three_sources_recompiles_only_that_one(three_sources):
    root, srcs, log = three_sources
    cache = root / "cache"
    lib = build_library("three", srcs, build_dir=cache)
    assert sorted(compiled_sources(log)) == ["a.cpp", "b.cpp", "c.cpp"]
    assert _values(lib) == (1, 102, 103)

    log.write_text("")
    srcs[0].write_text('extern "C" int a_value() { return 11; }\n')
    lib2 = build_library("three", srcs, build_dir=cache)
    assert compiled_sources(log) == ["a.cpp"]
    assert lib2 != lib and _values(lib2) == (11, 102, 103)

    log.write_text("")
    (root / "common.h").write_text("#define BASE 200\n")
    lib3 = build_library("three", srcs, build_dir=cache)
    assert sorted(compiled_sources(log)) == ["b.cpp", "c.cpp"]
    assert _values(lib3) == (11, 202, 203)


def test_touch_alone_rebuilds_nothing(three_sources):
    root, srcs, log = three_sources
    cache = root / "cache"
    lib = build_library("three", srcs, build_dir=cache)
    log.write_text("")
    _touch(*srcs, root / "common.h")
    assert build_library("three", srcs, build_dir=cache) == lib
    assert log.read_text() == ""  # not even a compiler probe
    # and touching, then editing another file, still compiles only the edited one
    _touch(*srcs, root / "common.h")
    srcs[2].write_text('#include "common.h"\nextern "C" int c_value() { return BASE + 33; }\n')
    assert _values(build_library("three", srcs, build_dir=cache)) == (1, 102, 133)
    assert compiled_sources(log) == ["c.cpp"]


def test_going_back_to_earlier_contents_is_a_warm_hit(three_sources):
    root, srcs, log = three_sources
    cache = root / "cache"
    original = srcs[0].read_text()
    lib = build_library("three", srcs, build_dir=cache)
    srcs[0].write_text('extern "C" int a_value() { return 7; }\n')
    build_library("three", srcs, build_dir=cache)
    log.write_text("")
    srcs[0].write_text(original)
    assert build_library("three", srcs, build_dir=cache) == lib
    assert compiled_sources(log) == []


def test_only_the_newest_builds_are_kept(tmp_path):
    from opbuilder.cache.publish import KEEP_BUILDS

    src = tmp_path / "p.cpp"
    cache = tmp_path / "cache"
    libs = []
    for i in range(KEEP_BUILDS + 2):
        src.write_text(f'extern "C" int p_value() {{ return {i}; }}\n')
        libs.append(Path(build_library("pruned", [src], build_dir=cache)))
    op_dir = cache / "pruned.lib"
    kept = sorted(d for d in op_dir.iterdir() if (d / "build.json").exists())
    assert len(kept) == KEEP_BUILDS
    assert all(lib.exists() for lib in libs[-KEEP_BUILDS:])
    assert not any(lib.exists() for lib in libs[:2])
    assert len(list((op_dir / "deps").glob("*.json"))) == KEEP_BUILDS  # manifests of dropped builds go too
    assert ctypes.CDLL(str(libs[-1])).p_value() == KEEP_BUILDS + 1


def test_five_alternating_variants_compile_once_each(tmp_path, monkeypatch):
    # keeping only the newest few builds used to drop the one needed next: every switch recompiled
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    srcs = [tmp_path / f"alt{i}.cpp" for i in range(5)]
    for i, src in enumerate(srcs):
        src.write_text(f'extern "C" int alt() {{ return {i}; }}\n')
    time.sleep(0.1)  # saved well before any build starts (one saved in its first clock tick is built twice)
    cache = tmp_path / "cache"
    libs = {}
    for _ in range(3):
        for i, src in enumerate(srcs):
            lib = build_library("alt", [src], build_dir=cache)
            assert libs.setdefault(i, lib) == lib and ctypes.CDLL(lib).alt() == i
    assert sorted(compiled_sources(log)) == [src.name for src in srcs]  # each once
    assert len({Path(lib).parent.parent for lib in libs.values()}) == 1  # five builds of one operator


def test_the_least_recently_used_build_goes_not_the_one_just_used(tmp_path):
    from opbuilder.cache.publish import KEEP_BUILDS
    from opbuilder.cache.published import USE_STAMP_S

    src = tmp_path / "lru.cpp"
    cache = tmp_path / "cache"

    def build(i):
        src.write_text(f'extern "C" int lru() {{ return {i}; }}\n')
        return Path(build_library("lru", [src], build_dir=cache))

    libs = [build(i) for i in range(KEEP_BUILDS)]
    now = time.time()
    for i, lib in enumerate(libs):  # built (and last used) long ago, build 0 first
        os.utime(lib.parent, (now - 10 * USE_STAMP_S + i, now - 10 * USE_STAMP_S + i))
    assert build(0) == libs[0]  # build 0 is used again (a warm hit), so it is now the most recently used
    assert libs[0].parent.stat().st_mtime >= now
    newest = build(KEEP_BUILDS)  # one more build: the least recently used one (build 1) makes room
    assert newest.exists() and libs[0].exists()
    assert not libs[1].exists() and all(lib.exists() for lib in libs[2:])


@pytest.mark.parametrize("call", ["build", "load"])
def test_a_library_pruned_right_after_its_lookup_is_built_again(tmp_path, monkeypatch, call):
    import shutil

    import opbuilder.builder

    src = tiny_module(tmp_path / f"pruned_{call}.cpp", "6")
    builder = CustomOpBuilder(f"pruned_{call}", [src], build_dir=tmp_path / "cache")
    first = Path(builder.build())
    real_lookup = opbuilder.builder._lookup
    pruned = []

    def lookup_then_prune(*args):
        hit = real_lookup(*args)
        if hit is not None and not pruned:
            shutil.rmtree(hit[1].parent)  # what another process pruning old builds does, just after the lookup
            pruned.append(hit[1])
        return hit

    monkeypatch.setattr(opbuilder.builder, "_lookup", lookup_then_prune)
    if call == "build":
        assert builder.build() == str(first)
    else:
        assert builder.load().value() == 6
    assert pruned == [first] and first.is_file()  # built again, under the same key


def test_a_source_edited_while_it_compiles_is_built_again(tmp_path, monkeypatch):
    src = tmp_path / "racy.cpp"
    src.write_text('extern "C" int racy() { return 1; }\n')
    log = tmp_path / "cxx.log"
    flag = tmp_path / "edit-once"
    flag.touch()
    inner = wrapper_cxx(tmp_path, log)
    editing = tmp_path / "editing-cxx.sh"  # compiles, then (once) saves a new version of the source
    editing.write_text(f"""#!/bin/sh
'{inner}' "$@"; rc=$?
case " $* " in *" -c "*)
  if [ -e '{flag}' ]; then rm '{flag}'; echo 'extern "C" int racy() {{ return 2; }}' > '{src}'; fi;;
esac
exit $rc
""")
    editing.chmod(0o755)
    monkeypatch.setenv("CXX", str(editing))
    lib = build_library("racy", [src], build_dir=tmp_path / "cache")
    assert ctypes.CDLL(lib).racy() == 2  # never published version 1 under version 2's contents
    assert compiled_sources(log) == ["racy.cpp", "racy.cpp"]
    log.write_text("")
    assert build_library("racy", [src], build_dir=tmp_path / "cache") == lib and compiled_sources(log) == []


@pytest.mark.parametrize("call", ["build", "load"])
def test_a_library_pruned_after_every_lookup_is_a_build_error_after_the_last_pass(tmp_path, monkeypatch, caplog,
                                                                                  call):
    # the retry loop's bound (opbuilder/retry.py): a path that no longer exists is never returned
    import logging
    import shutil

    import opbuilder.builder
    from opbuilder.retry import MAX_PASSES, Reason

    src = tiny_module(tmp_path / f"always_pruned_{call}.cpp", "7")
    builder = CustomOpBuilder(f"always_pruned_{call}", [src], build_dir=tmp_path / "cache")
    builder.build()
    real_build = opbuilder.builder._build
    pruned = []

    def build_then_prune(spec):
        hit = real_build(spec)
        shutil.rmtree(hit[1].parent)  # another process pruning old builds, every time just before our use
        pruned.append(hit[1])
        return hit

    monkeypatch.setattr(opbuilder.builder, "_build", build_then_prune)
    caplog.set_level(logging.DEBUG, logger="opbuilder")
    with pytest.raises(BuildError, match=r"^building operator 'always_pruned_\w+' failed: its library kept being "
                                         r"removed \(cache clean, or another process pruning old builds\) between "
                                         r"its lookup and its use; load again once that is done$"):
        getattr(builder, call)()
    assert len(pruned) == MAX_PASSES and len(set(pruned)) == 1  # one build (relinked), lost each pass
    spoiled = [r.getMessage() for r in caplog.records if "spoiled" in r.getMessage()]
    assert spoiled == [f"always_pruned_{call}: pass {n} of {MAX_PASSES} spoiled: {Reason.PRUNED.value}"
                       + ("; trying again" if n < MAX_PASSES else "") for n in range(1, MAX_PASSES + 1)]


def test_a_source_edited_during_every_compile_is_a_build_error_after_the_last_pass(tmp_path, monkeypatch, caplog):
    import logging

    from opbuilder.retry import MAX_PASSES, Reason

    src = tmp_path / "restless.cpp"
    src.write_text('extern "C" int restless() { return 0; }\n')
    log = tmp_path / "cxx.log"
    inner = wrapper_cxx(tmp_path, log)
    editing = tmp_path / "always-editing-cxx.sh"  # compiles, then saves a new version of the source, every time
    editing.write_text(f"""#!/bin/sh
'{inner}' "$@"; rc=$?
case " $* " in *" -c "*) echo "extern \\"C\\" int restless() {{ return $$; }}" > '{src}';; esac
exit $rc
""")
    editing.chmod(0o755)
    monkeypatch.setenv("CXX", str(editing))
    caplog.set_level(logging.DEBUG, logger="opbuilder")
    with pytest.raises(BuildError, match=r"^building operator 'restless' failed: its sources kept changing \(or the "
                                         r"cache was being cleaned\) while they were being compiled; save them and "
                                         r"load again$"):
        build_library("restless", [src], build_dir=tmp_path / "cache")
    assert compiled_sources(log) == ["restless.cpp"] * MAX_PASSES  # one compile a pass, and no more passes
    spoiled = [r.getMessage() for r in caplog.records if "spoiled" in r.getMessage()]
    assert spoiled == [f"restless: pass {n} of {MAX_PASSES} spoiled: {Reason.INPUT_CHANGED.value}"
                       + ("; trying again" if n < MAX_PASSES else "") for n in range(1, MAX_PASSES + 1)]
    published = [p for p in (tmp_path / "cache" / "restless.lib").glob("*/librestless.so") if p.parent.name != "build"]
    assert published == []  # nothing was published under a key its contents do not have


def test_a_source_saved_after_its_key_was_computed_is_never_published_under_that_key(tmp_path, monkeypatch):
    # the window between hashing the sources (under the lock) and the compiler reading them:
    # the save lands just before ninja starts, so no ctime comparison can see it
    import opbuilder.compile.ninja_run

    src = tmp_path / "window.cpp"
    src.write_text('extern "C" int window() { return 1; }\n')
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    real_run_ninja = opbuilder.compile.ninja_run.run_ninja
    saves = []

    def save_then_run_ninja(*args, **kwargs):
        if not saves:
            src.write_text('extern "C" int window() { return 2; }\n')
            saves.append(src)
        return real_run_ninja(*args, **kwargs)

    monkeypatch.setattr(opbuilder.compile.ninja_run, "run_ninja", save_then_run_ninja)
    cache = tmp_path / "cache"
    lib = build_library("window", [src], build_dir=cache)
    assert saves == [src]
    assert ctypes.CDLL(lib).window() == 2  # the contents compiled last...
    assert compiled_sources(log) == ["window.cpp", "window.cpp"]  # ...found changed, and built again
    log.write_text("")
    assert build_library("window", [src], build_dir=cache) == lib and compiled_sources(log) == []  # ...keyed by them
    src.write_text('extern "C" int window() { return 1; }\n')  # the contents the first key was made from
    first = build_library("window", [src], build_dir=cache)
    assert first != lib and ctypes.CDLL(first).window() == 1 and compiled_sources(log) == ["window.cpp"]


def test_a_file_changed_in_the_tick_a_build_starts_counts_as_changed(tmp_path):
    # file clocks are coarse: a save in the same tick as the build's start may come after the compiler read it
    from opbuilder.cache.publish import changed_since

    header = tmp_path / "same_tick.h"
    header.write_text("#define X 1\n")
    ctime = os.stat(header).st_ctime_ns
    assert changed_since([str(header)], ctime) == [str(header)]
    assert changed_since([str(header)], ctime + 1) == []
    assert changed_since([str(tmp_path / "gone.h")], ctime + 1) == [str(tmp_path / "gone.h")]


PYBIND11_OP = """\
#include "opbuilder/extension.h"
namespace py = pybind11;
struct Counter { int start = VERSION; };
PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  py::class_<Counter>(m, "Counter", py::module_local()).def(py::init<>()).def_readonly("start", &Counter::start);
  m.def("version", [] { return VERSION; });
}
"""


def test_pybind11_module_edited_and_reloaded_in_process_runs_the_new_code(tmp_path):
    # pybind11 hands back the module it created first for a name it has seen: each new build
    # must be imported under a name of its own
    src = tmp_path / "pb_reload.cpp"
    src.write_text(PYBIND11_OP.replace("VERSION", "1"))
    first = CustomOpBuilder("pb_reload", [src]).load()
    assert first.version() == 1 and first.Counter().start == 1 and first.__name__ == "pb_reload"
    src.write_text(PYBIND11_OP.replace("VERSION", "2"))
    second = CustomOpBuilder("pb_reload", [src]).load()
    assert second.version() == 2 and second.Counter().start == 2
    assert second.__name__.endswith(".pb_reload") and first.version() == 1


def test_a_class_registered_by_an_earlier_build_is_explained():
    from opbuilder.importer import _explain

    why = _explain(ImportError('generic_type: type "Foo" is already registered!'))
    assert 'an earlier build loaded in this process registered "Foo"' in why
    assert "py::module_local()" in why and "restart Python" in why


def test_everything_that_decides_the_binary_is_in_the_key(tmp_path):
    """Each of these changes gives a build of its own (same name, same source): a key that left one
    out would hand back a library built with other flags."""
    src = tmp_path / "keyed.cpp"
    src.write_text('extern "C" int keyed_value() { return 7; }\n')
    inc = tmp_path / "inc"
    inc.mkdir()
    variants = {"plain": {}, "cflags": {"cflags": ["-DKEYED=1"]}, "ldflags": {"ldflags": ["-lm"]},
                "include_paths": {"include_paths": [inc]}, "debug_mode": {"debug_mode": True}}
    libs = {what: build_library("keyed", [src], **kw) for what, kw in variants.items()}
    assert len(set(libs.values())) == len(libs), libs
    assert len({Path(lib).parent.parent for lib in libs.values()}) == 1  # one operator, five builds
    assert build_library("keyed", [src], debug_mode=True) == libs["debug_mode"]  # and each is found again


def test_module_keys_cover_the_toolchain_python_pybind11_and_opbuilders_headers(tmp_path):
    import pybind11
    import sysconfig
    from opbuilder import builder
    from opbuilder.native.headers import headers_digest
    src = tiny_module(tmp_path / "ident_op.cpp", "1")
    spec = CustomOpBuilder("ident_op", [src]).spec
    from opbuilder.tools.toolchain import find_compiler
    cxx = find_compiler(spec.root)
    identity = builder._plan(spec, cxx).identity  # what the key hashes besides the sources' contents
    assert f"pybind11={pybind11.__version__}" in identity
    assert any(part.startswith("python=") and sysconfig.get_config_var("EXT_SUFFIX") in part for part in identity)
    assert f"headers={headers_digest(spec.root)}" in identity
    assert "backend=CPU" in identity and f"cxx={cxx.identity}" in identity

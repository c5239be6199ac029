"""What the compile and link commands contain: -O2 by default, -O0 -g in debug mode, LTO."""
import shlex
import time

import pytest

from opbuilder import CustomOpBuilder

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def _commands(cache_dir, name):
    text = (cache_dir / name / "build" / "build.ninja").read_text()
    rules = {}
    for block in text.split("\nrule ")[1:]:
        rule, body = block.split("\n", 1)
        command = next(line for line in body.splitlines() if line.strip().startswith("command = "))
        rules[rule.strip()] = shlex.split(command.split("command = ", 1)[1])
    return rules


@pytest.fixture
def tiny(tmp_path):
    src = tmp_path / "tiny.cpp"
    src.write_text("int tiny_value() { return 7; }\n")  # builds as a module; .build() does not import
    return str(src)


def test_default_build_is_optimized_with_lto(cache_dir, tiny, monkeypatch):
    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    CustomOpBuilder("flags_default", [tiny]).build()
    rules = _commands(cache_dir, "flags_default")
    assert "-O2" in rules["cxx"] and "-g" not in rules["cxx"] and "-O0" not in rules["cxx"]
    assert "-Werror=return-type" in rules["cxx"]  # falling off a non-void function is an error
    from opbuilder.tools.toolchain import find_compiler, links_with_lto
    cxx = find_compiler(cache_dir)
    gcc = cxx.family == "gcc"
    # gcc: -O2 plus the loop vectorizer with -O3's cost model
    assert ("-ftree-vectorize" in rules["cxx"] and "-fvect-cost-model=dynamic" in rules["cxx"]) == gcc
    lto = gcc and links_with_lto(cxx, cache_dir)  # not a gcc installed without its LTO parts
    assert ("-flto" in rules["cxx"]) == lto  # gcc: LTO, code generation split over the jobs at link time
    # gcc: flags that change no code but save time (a pipe to the assembler, fewer garbage collections)
    gc_param = any(rules["cxx"][i:i + 2] == ["--param", "ggc-min-heapsize=524288"] for i in range(len(rules["cxx"])))
    assert ("-pipe" in rules["cxx"] and gc_param) == gcc
    assert any(a.startswith("-flto=") for a in rules["link"]) == lto


def test_debug_mode_is_unoptimized_with_symbols_and_no_lto(cache_dir, tiny):
    CustomOpBuilder("flags_debug", [tiny], debug_mode=True).build()
    rules = _commands(cache_dir, "flags_debug")
    assert "-O0" in rules["cxx"] and "-g" in rules["cxx"] and "-O2" not in rules["cxx"]
    assert "-ftree-vectorize" not in rules["cxx"]
    assert "-flto" not in rules["cxx"] and not any(a.startswith("-flto") for a in rules["link"])


def test_lto_can_be_turned_off(cache_dir, tiny, monkeypatch):
    monkeypatch.setenv("OPBUILDER_LTO", "0")
    CustomOpBuilder("flags_nolto", [tiny]).build()
    rules = _commands(cache_dir, "flags_nolto")
    assert "-O2" in rules["cxx"] and "-flto" not in rules["cxx"]
    assert not any(a.startswith("-flto") for a in rules["link"])


def test_several_sources_are_built_without_lto(cache_dir, tiny, tmp_path, monkeypatch):
    """LTO would make every relink generate code for all objects: a one-file edit would cost a full build."""
    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    other = tmp_path / "other.cpp"
    other.write_text("int other_value() { return 8; }\n")
    CustomOpBuilder("flags_two", [tiny, str(other)]).build()
    rules = _commands(cache_dir, "flags_two")
    assert "-O2" in rules["cxx"] and "-flto" not in rules["cxx"]
    assert not any(a.startswith("-flto") for a in rules["link"])


def test_a_nanobind_module_and_its_runtime_are_built_without_lto_the_runtime_at_Os(cache_dir, tmp_path,
                                                                                  monkeypatch):
    """A nanobind module's one small TU has too little code for LTO's parallel code generation to pay
    (it only adds the intermediate form's write and read). nanobind's runtime is built at -Os, as
    nanobind's CMake builds it, without LTO: on a first load() it compiles beside the operator and the
    core library, and its CPU time is what counts (nanobind_runtime.py). Its key holds the -O flag,
    so a runtime built with other flags is not reused."""
    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    src = tmp_path / "nb_tiny.cpp"
    src.write_text('#include "opbuilder/extension.h"\nOB_MODULE(m) { m.def("seven", []() { return 7; }); }\n')
    assert CustomOpBuilder("flags_nb", [str(src)]).load().seven() == 7
    rules = _commands(cache_dir, "flags_nb")
    assert "-DOB_BINDING_NANOBIND" in rules["cxx"] and "-O2" in rules["cxx"]
    assert "-flto" not in rules["cxx"] and not any(a.startswith("-flto") for a in rules["link"])
    from opbuilder import builder
    from opbuilder.native.nanobind_runtime import runtime_spec
    from opbuilder.tools.toolchain import find_compiler
    runtime = _commands(cache_dir, "_nanobind.lib")
    assert "-Os" in runtime["cxx"] and "-O2" not in runtime["cxx"] and "-ftree-vectorize" not in runtime["cxx"]
    assert "-flto" not in runtime["cxx"] and not any(a.startswith("-flto") for a in runtime["link"])
    plan = builder._plan(runtime_spec(cache_dir), find_compiler(cache_dir))
    assert "-Os" in plan.identity and "-O2" not in plan.identity  # the flags its key is made from


def test_lto_is_a_way_to_build_not_part_of_the_key(cache_dir, tiny, monkeypatch):
    """Toggling LTO reuses the cached build (same key, like the job count); a rebuild in the same
    build directory recompiles the objects, which an -flto compile leaves without code."""
    import shutil
    import subprocess
    from pathlib import Path

    from opbuilder.tools.toolchain import find_compiler

    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    with_lto = Path(CustomOpBuilder("flags_toggle", [tiny]).build())
    monkeypatch.setenv("OPBUILDER_LTO", "0")
    assert Path(CustomOpBuilder("flags_toggle", [tiny]).build()) == with_lto  # a cache hit: same key
    # the same key built the other way in the same build directory: its objects are compiled again
    shutil.rmtree(with_lto.parent)
    without = Path(CustomOpBuilder("flags_toggle", [tiny]).build())
    assert without == with_lto and without.is_file()
    rules = _commands(cache_dir, "flags_toggle")
    assert "-flto" not in rules["cxx"]
    if find_compiler(cache_dir).family == "gcc":  # the object was recompiled: it holds code, not only GIMPLE
        obj = next((cache_dir / "flags_toggle" / "build" / "obj").glob("*.o"))
        syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
        assert "tiny_value" in syms and "__gnu_lto" not in syms


def test_a_compiler_launcher_builds_without_lto(cache_dir, tiny, tmp_path, monkeypatch):
    """sccache/ccache cache compiles, not links; with LTO the link generates the code, so it is off."""
    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    launcher = tmp_path / "launch.sh"
    launcher.write_text('#!/bin/sh\nexec "$@"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", str(launcher))
    CustomOpBuilder("flags_launched", [tiny]).build()
    rules = _commands(cache_dir, "flags_launched")
    assert rules["cxx"][0] == str(launcher) and "-O2" in rules["cxx"] and "-flto" not in rules["cxx"]
    assert not any(a.startswith("-flto") for a in rules["link"])


_NO_LTO_GCC = """#!/bin/sh
# g++ installed without its LTO parts (seen on a CUDA image): -flto objects compile, their link fails
lto=0; shared=0
for a in "$@"; do case "$a" in -flto*) lto=1;; -shared) shared=1;; esac; done
if [ $lto = 1 ] && [ $shared = 1 ]; then echo "/usr/bin/ld: error: could not run lto-wrapper" >&2; exit 1; fi
exec {gxx} "$@"
"""


def test_a_gcc_that_cannot_link_lto_objects_builds_without_lto(tmp_path, tiny, monkeypatch):
    """LTO is only a faster way to build one source: a compiler that cannot link it builds without it
    (asked once per compiler and remembered), instead of every pybind11 module failing to link."""
    import json
    import shutil
    import subprocess

    from opbuilder.tools.toolchain import find_compiler, links_with_lto

    gxx = shutil.which("g++")
    if gxx is None or find_compiler(None).family != "gcc":
        pytest.skip("needs g++ (LTO is used with gcc only)")
    wrapper = tmp_path / "g++-without-lto"
    wrapper.write_text(_NO_LTO_GCC.format(gxx=gxx))
    wrapper.chmod(0o755)
    time.sleep(0.2)  # facts about a file changed in the last 0.1 s are not stored (probe_cache.SETTLE_NS)
    monkeypatch.delenv("OPBUILDER_LTO", raising=False)
    monkeypatch.setenv("CXX", str(wrapper))
    cache = tmp_path / "cache"
    lib = CustomOpBuilder("flags_broken_lto", [tiny], build_dir=cache).build()
    assert lib.endswith(".so")
    rules = _commands(cache, "flags_broken_lto")
    assert "-flto" not in rules["cxx"] and not any(a.startswith("-flto") for a in rules["link"])
    records = json.loads((cache / "toolchains.json").read_text())
    assert [r["facts"] for k, r in records.items() if k.startswith("lto ")] == [{"lto": False}]
    monkeypatch.delenv("CXX")  # the real compiler is asked for itself: a g++ that links LTO objects keeps LTO
    CustomOpBuilder("flags_working_lto", [tiny], build_dir=cache).build()
    real = find_compiler(cache)
    # the probe's answer, against this test's own -flto link with the real compiler
    so = tmp_path / "lto_check.so"
    links = subprocess.run([*real.argv, "-flto", "-fPIC", "-shared", "-x", "c++", "-", "-o", str(so)],
                           input="int f() { return 1; }\n", capture_output=True, text=True).returncode == 0
    assert links_with_lto(real, cache) == links
    assert ("-flto" in _commands(cache, "flags_working_lto")["cxx"]) == links


_LTO_PART_GCC = """#!/bin/sh
# g++ whose LTO link works while {part} (its lto-wrapper) exists
for a in "$@"; do case "$a" in -print-prog-name=lto-wrapper) echo {part}; exit 0;; esac; done
lto=0; shared=0
for a in "$@"; do case "$a" in -flto*) lto=1;; -shared) shared=1;; esac; done
if [ $lto = 1 ] && [ $shared = 1 ] && [ ! -e {part} ]; then echo "could not run lto-wrapper" >&2; exit 1; fi
exec {gxx} "$@"
"""


def test_the_lto_answer_is_asked_again_when_the_parts_the_link_runs_change(tmp_path):
    """The answer is remembered with the stamps of the compiler and of what an LTO link runs
    (lto-wrapper, the plugin, ld): removing or installing one of them asks again."""
    import shutil

    from opbuilder.tools.toolchain import Compiler, links_with_lto

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++")
    part = tmp_path / "lto-wrapper"
    part.write_text("")
    wrapper = tmp_path / "g++-with-a-part"
    wrapper.write_text(_LTO_PART_GCC.format(part=part, gxx=gxx))
    wrapper.chmod(0o755)
    time.sleep(0.2)  # facts about files changed in the last 0.1 s are not stored (probe_cache.SETTLE_NS)
    cxx = Compiler((str(wrapper),), str(wrapper), f"g++ behind {wrapper}", "gcc", "test")
    state = tmp_path / "state"
    state.mkdir()
    assert links_with_lto(cxx, state)
    assert "lto-wrapper" in (state / "toolchains.json").read_text()  # remembered with the part's stamp
    part.unlink()
    assert not links_with_lto(cxx, state)


_CPU = "processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n\n"


def test_march_native_builds_are_keyed_by_the_cpu(tmp_path, tiny, monkeypatch):
    """-march=native is another program on another CPU: a cache shared by machines (a home directory
    on a cluster) must not hand one machine's native build to another, where it may not run."""
    from opbuilder.tools import toolchain

    cpuinfo = tmp_path / "cpuinfo"

    def machine(flags, mhz="2600.000"):
        cpuinfo.write_text(_CPU.format(n=0, mhz=mhz, flags=flags) + _CPU.format(n=1, mhz="800.0", flags="x"))
        monkeypatch.setattr(toolchain, "_native_cpu", [])  # a new process on that machine

    monkeypatch.setattr(toolchain, "CPUINFO", str(cpuinfo))
    native = CustomOpBuilder("flags_native", [tiny], cflags=["-O2", "-march=native"], build_dir=tmp_path / "c")
    plain = CustomOpBuilder("flags_native", [tiny], cflags=["-O2"], build_dir=tmp_path / "c")
    machine("fpu sse2 avx2")
    first, first_plain = native.build(), plain.build()
    machine("fpu sse2 avx2", mhz="3400.125")  # the same CPU at another clock speed: the same build
    assert native.build() == first
    machine("fpu sse2 avx2 avx512f")  # another CPU
    assert native.build() != first
    assert plain.build() == first_plain  # without -march=native the CPU is not in the key


def test_relative_paths_in_flags_are_relative_to_the_current_directory(tmp_path, monkeypatch):
    """As sources and include_paths are: the compiler runs in the cache's build directory, so a relative
    -I in cflags used to name a directory there (the header was 'not found')."""
    import subprocess

    from builder_util import tiny_module

    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "cfg.h").write_text("#define CFG 20\n")
    (tmp_path / "pre.h").write_text("#define PRE 1\n")
    (tmp_path / "helper.cpp").write_text("int helper() { return 3; }\n")
    subprocess.run(["c++", "-fPIC", "-c", str(tmp_path / "helper.cpp"), "-o", str(tmp_path / "helper.o")], check=True)
    tiny_module(tmp_path / "rel_op.cpp", "CFG + PRE + helper()", includes="#include <cfg.h>",
                decls="int helper();")
    monkeypatch.chdir(tmp_path)
    op = CustomOpBuilder("flags_relative", ["rel_op.cpp"], cflags=["-Iinc", "-include", "pre.h"],
                         ldflags=["helper.o"], build_dir=tmp_path / "cache").load()
    assert op.value() == 24
    # a -include name that is not a file here is still looked up along the include path
    inc_only = CustomOpBuilder("flags_relative", ["rel_op.cpp"], cflags=["-I", "inc", "-include", "cfg.h"],
                               ldflags=["helper.o"], build_dir=tmp_path / "cache")
    assert inc_only.spec.cflags == ("-I", str(tmp_path / "inc"), "-include", "cfg.h")


def test_flags_whose_path_is_not_relative_to_the_current_directory_are_left_as_written(tmp_path, tiny, monkeypatch):
    """-I- (gcc's split of the quote and bracket search) names no directory, and -I=dir, -isystem =dir and
    $SYSROOT/dir are relative to the sysroot: made absolute against the current directory, they named
    directories that do not exist ('-I-' became '-I<cwd>/-', and the split was lost)."""
    monkeypatch.chdir(tmp_path)
    flags = ["-I-", "-I=usr/inc", "-isystem", "=usr/sys", "-idirafter$SYSROOT/after", "-iquote", "$SYSROOT/q",
             "-Ilocal"]
    spec = CustomOpBuilder("flags_sysroot", [tiny], cflags=flags, ldflags=["-L=usr/lib"],
                           build_dir=tmp_path / "cache").spec
    assert spec.cflags == (*flags[:-1], f"-I{tmp_path / 'local'}")
    assert spec.ldflags == ("-L=usr/lib",)

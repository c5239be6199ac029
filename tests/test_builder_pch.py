"""The precompiled opbuilder/extension.h: built once per toolchain and flags, used only
where forcing it first cannot change a source's meaning, and accepted by the compiler."""
import time

import pytest

from opbuilder import CustomOpBuilder
from opbuilder.native import pch


@pytest.mark.parametrize("text, expected", [
    ('#include "opbuilder/extension.h"\n', True),
    ('// a comment\n/* a\n block */\n#include <vector>\n#include <string>\n\n#include "opbuilder/extension.h"\n', True),
    ('#include <opbuilder/extension.h>\n', True),
    ('#include <stdexcept>\n#  include "ms_extension.h"\n', True),
    ('#define PYBIND11_DETAILED_ERROR_MESSAGES\n#include "opbuilder/extension.h"\n', False),
    ('#include "my_config.h"\n#include "opbuilder/extension.h"\n', False),
    ('#ifdef FAST\n#include "opbuilder/extension.h"\n#endif\n', False),
    ('#include <pybind11/pybind11.h>\nPYBIND11_MODULE(x, m) {}\n', False),
    ('int f() { return 1; }\n#include "opbuilder/extension.h"\n', False),
    ('', False),
])
def test_eligible_only_when_the_header_comes_first(tmp_path, text, expected):
    src = tmp_path / "s.cpp"
    src.write_text(text)
    assert pch.eligible(src) is expected


def _pch_dir_of(cache_dir, op):
    """The PCH directory an operator's build.ninja force-includes."""
    text = (cache_dir / op / "build" / "build.ninja").read_text()
    dirs = {d for d in (cache_dir / ".pch").iterdir() if d.is_dir() and _includes(d) in text}
    assert len(dirs) == 1, f"{op} does not include exactly one PCH"
    return dirs.pop()


def _includes(pch_dir) -> str:
    """How build.ninja force-includes the PCH in ``pch_dir``: relative to the build directory
    (<cache>/<op>/build), so the command is the same in every cache."""
    return f"-include ../../.pch/{pch_dir.name}/pch.h"


def _wait_for_gch(directory, timeout=600):
    deadline = time.monotonic() + timeout
    while not (directory / "pch.h.gch").is_file():
        assert time.monotonic() < deadline, "the precompiled header was never built"
        time.sleep(0.2)


@pytest.mark.parametrize("value, on", [("False", False), (" off ", False), ("NO", False), ("0", False),
                                       ("", False), ("1", True), ("yes", True)])
def test_opbuilder_pch_reads_as_the_other_switches(monkeypatch, value, on):
    """OPBUILDER_PCH=False left the PCH on (its check took "false" in lower case only); it reads through
    spec.switch_on, as OPBUILDER_NO_BUILD and OPBUILDER_LTO do. Fails on 60da065 for "False", " off ", "NO"."""
    from opbuilder.builder import _lto_enabled
    monkeypatch.setenv("OPBUILDER_PCH", value)
    monkeypatch.setenv("OPBUILDER_LTO", value)
    assert pch.enabled() is on
    assert _lto_enabled() is on


def test_one_pch_serves_every_operator_and_the_compiler_accepts_it(cache_dir, my_ops, ms_ops, api_ops, tmp_path):
    from opbuilder.tools.toolchain import default_jobs

    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    if default_jobs() < 2:  # then a build starts no background precompile (see pch.py), and none ever ends
        pytest.skip("builds here may run only one job (MAX_JOBS=1, or under 2 GiB of available memory), "
                    "and the PCH is precompiled only beside a build that may run two or more")
    # one PCH per binding layer (same toolchain and flags; other tests' flags get their own): my_ops and
    # ms_ops (ms_extension.h code that binds plain functions only) are bound with nanobind, whose flags
    # and headers differ from those of tensor_api_ops, a pybind11 operator
    nanobind = {_pch_dir_of(cache_dir, op) for op in ("my_ops", "ms_ops")}
    assert len(nanobind) == 1
    shared = {_pch_dir_of(cache_dir, "tensor_api_ops")}
    assert not nanobind & shared
    dirs = [shared.pop()]
    _wait_for_gch(dirs[0])  # started in the background by the first of these builds
    assert not list(dirs[0].glob(".pch.h.gch.tmp-*")) and (dirs[0] / "build.log").read_text() == ""
    # an operator compiled now that the .gch exists: gcc must take it (-Winvalid-pch would say otherwise)
    src = tmp_path / "pch_user.cpp"
    src.write_text('#include <vector>\n#include "opbuilder/extension.h"\n'
                   'PYBIND11_MODULE(OB_EXTENSION_NAME, m) { m.def("three", [] { return 3; }); }\n')
    assert CustomOpBuilder("pch_user", [src]).load().three() == 3
    log = (cache_dir / "pch_user" / "build" / "build.log").read_text()
    assert "pch.h.gch" not in log and "Winvalid-pch" not in log
    assert _includes(dirs[0]) in (cache_dir / "pch_user" / "build" / "build.ninja").read_text()
    # a two-source operator is compiled without -flto; the same PCH serves it, and gcc takes it too
    other = tmp_path / "pch_other.cpp"
    other.write_text("int pch_other() { return 4; }\n")
    CustomOpBuilder("pch_two", [src, other]).build()
    ninja = (cache_dir / "pch_two" / "build" / "build.ninja").read_text()
    assert "-flto" not in ninja and _includes(dirs[0]) in ninja
    log = (cache_dir / "pch_two" / "build" / "build.log").read_text()
    assert "pch.h.gch" not in log and "Winvalid-pch" not in log


@pytest.mark.build
def test_a_pch_removed_during_a_build_is_made_again_and_the_build_retried(tmp_path, monkeypatch, caplog):
    """`cache clean` may remove the PCH directory while a compile is about to read it: that build
    is redone (with pch.h written again) instead of failing."""
    import logging
    import stat

    from builder_util import REAL_CXX

    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    flag = tmp_path / "removed"
    script = tmp_path / "cxx-removes-pch.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"case \" $* \" in *\" -c \"*) if [ ! -e '{flag}' ]; then touch '{flag}'\n"
        "  for a in \"$@\"; do case \"$a\" in */pch.h) rm -rf \"$(dirname \"$a\")\";; esac; done; fi;; esac\n"
        f"exec '{REAL_CXX}' \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(script))
    src = tmp_path / "pch_gone.cpp"
    src.write_text('#include "opbuilder/extension.h"\n'
                   'PYBIND11_MODULE(OB_EXTENSION_NAME, m) { m.def("five", [] { return 5; }); }\n')
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        mod = CustomOpBuilder("pch_gone", [src], build_dir=tmp_path / "cache").load()
    assert mod.five() == 5
    assert flag.exists()  # the first compile did run without its PCH directory
    assert any("precompiled header was removed during the build" in r.getMessage() for r in caplog.records)


STALLING_PRECOMPILE = """#!/bin/sh
# a precompile that writes part of its output (and a temporary file of its own) and is then killed
out=; prev=
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
head -c 1048576 /dev/zero > "$out"
echo partial > "$TMPDIR/cc-temporary.s"
touch "$(dirname "$out")/started"
sleep 120
"""


def test_what_a_killed_precompile_leaves_is_removed_by_the_next_build(tmp_path):
    import os
    import signal
    import subprocess

    from builder_util import PYTHON, child_env

    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    target = pch.prepare(root, "killed")
    compiler = tmp_path / "stalling-cxx.sh"
    compiler.write_text(STALLING_PRECOMPILE)
    compiler.chmod(0o755)
    worker = subprocess.Popen([PYTHON, "-c", "import sys; from opbuilder.native.pch import build_now; "
                               "build_now(sys.argv[1], sys.argv[2:])", str(target.dir), str(compiler)],
                              env=child_env(), start_new_session=True)
    deadline = time.monotonic() + 120
    while not (target.dir / "started").exists():
        assert worker.poll() is None and time.monotonic() < deadline, "the precompile never started"
        time.sleep(0.01)
    os.killpg(worker.pid, signal.SIGKILL)  # the worker and its compiler
    worker.wait()
    leftovers = list(target.dir.glob(".pch.h.gch.tmp-*"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size == 1 << 20
    assert (target.dir / ".tmp" / "cc-temporary.s").exists()
    pch.prune(root, current="killed")  # what every build that uses this PCH does
    assert list(target.dir.glob(".pch.h.gch.tmp-*")) == [] and not (target.dir / ".tmp").exists()
    assert not target.built and target.header.is_file()  # the rest stays


NB_FIRST = """\
#include "opbuilder/extension.h"
OB_MODULE(m) { m.def("seven", []() { return 7; }); }
"""


@pytest.mark.build
def test_a_first_nanobind_load_starts_the_precompile_after_its_runtime_and_core_library(tmp_path, monkeypatch):
    """A nanobind operator's first load() in a fresh cache compiles nanobind's runtime and the core
    library in threads beside the operator: the PCH precompile is asked for only once all three are
    built (started next to them it took ~1 s of a 5.2 s first load). Real compiles; each dependency's
    build is made to end after the operator's, so the order is the same on every machine."""
    import threading

    from opbuilder import builder
    from opbuilder.native import nanobind_runtime
    from opbuilder.tools.toolchain import default_jobs

    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    if default_jobs() < 2:
        pytest.skip("builds here may run only one job: no background precompile is ever started")
    events = []
    operator_built = threading.Event()
    real_build = builder._build_checked

    def build_checked(spec, **kw):
        if spec.kind == "module":
            try:
                return real_build(spec, **kw)
            finally:
                events.append("operator")
                operator_built.set()
        result = real_build(spec, **kw)
        operator_built.wait(timeout=600)  # the operator's compile may be the slower one: not here
        events.append(spec.name)
        return result

    def start_build(target, cxx, flags):
        events.append("precompile")
        return False  # the order is what is tested: no precompile left running

    monkeypatch.setattr(builder, "_build_checked", build_checked)
    monkeypatch.setattr(pch, "start_build", start_build)
    src = tmp_path / "nb_first.cpp"
    src.write_text(NB_FIRST)
    # a process that loaded a nanobind operator already keeps its runtime: then only the core is built
    built = ["_obcore", "operator"] + (["_nanobind"] if nanobind_runtime.loaded() is None else [])
    assert CustomOpBuilder("nb_first_pch", [src], build_dir=tmp_path / "cache").load().seven() == 7
    assert sorted(events[:-1]) == sorted(built) and events[-1] == "precompile", events

"""Toolchain: CXX honoured, its identity probed once per binary, ninja from the package,
MAX_JOBS and the default job count."""
import json
import logging
import os
import subprocess

from pathlib import Path

import pytest

from builder_util import PYTHON, child_env, compiled_sources, version_probes, wrapper_cxx
from opbuilder import build_library
from opbuilder.errors import ToolchainError
from opbuilder.tools.toolchain import available_memory, default_jobs, find_compiler, ninja_path, which

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

BUILD = ("import sys; from opbuilder import build_library; "
         "print(build_library('tc', [sys.argv[1]], build_dir=sys.argv[2]))")


def test_cxx_is_honoured_and_probed_once_across_processes(tmp_path):
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    src = tmp_path / "tc.cpp"
    cache = tmp_path / "cache"
    libs = []
    for value in (1, 2, 3):  # three processes, three different builds
        src.write_text(f'extern "C" int tc() {{ return {value}; }}\n')
        res = subprocess.run([PYTHON, "-c", BUILD, str(src), str(cache)], capture_output=True, text=True,
                             timeout=300, env=child_env(CXX=cxx))
        assert res.returncode == 0, res.stderr
        libs.append(res.stdout.strip())
    assert compiled_sources(log) == ["tc.cpp"] * 3  # every compile went through $CXX
    assert version_probes(log) == 1  # its identity was probed by the first process only
    remembered = json.loads((cache / "toolchains.json").read_text())
    assert any(cxx in key for key in remembered)
    assert len(set(libs)) == 3


def test_a_changed_compiler_is_probed_again_and_a_new_version_rebuilds(tmp_path, monkeypatch):
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    monkeypatch.setenv("CXX", cxx)
    src = tmp_path / "tc.cpp"
    src.write_text('extern "C" int tc() { return 1; }\n')
    first = build_library("tc", [src], build_dir=tmp_path / "cache")
    with open(cxx, "a") as f:
        f.write("# the binary changed, its version did not\n")
    assert build_library("tc", [src], build_dir=tmp_path / "cache") == first  # same identity: a warm hit
    assert version_probes(log) == 2 and compiled_sources(log) == ["tc.cpp"]
    fake_version = "[ \"$1\" = --version ] && echo 'g++ (other) 99.1' && exit 0\n"
    text = open(cxx).read().replace("#!/bin/sh\n", "#!/bin/sh\n" + fake_version)
    with open(cxx, "w") as f:
        f.write(text)  # a new version: a new key
    assert build_library("tc", [src], build_dir=tmp_path / "cache") != first
    assert compiled_sources(log) == ["tc.cpp", "tc.cpp"]


def test_a_compiler_symlink_pointed_elsewhere_is_probed_again(tmp_path, monkeypatch):
    """The warm path resolves no links: the record is stamped through the symlink, so re-pointing it
    (as update-alternatives does) must still be noticed and, with another version, rebuild."""
    log = tmp_path / "cxx.log"
    first_cxx = wrapper_cxx(tmp_path, log)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other_cxx = wrapper_cxx(other_dir, log)
    text = open(other_cxx).read().replace(  # logs the call, then answers --version itself
        "exec ", "[ \"$1\" = --version ] && echo 'g++ (other) 98.2' && exit 0\nexec ", 1)
    with open(other_cxx, "w") as f:
        f.write(text)
    link = tmp_path / "c++"
    link.symlink_to(first_cxx)
    monkeypatch.setenv("CXX", str(link))
    src = tmp_path / "tc.cpp"
    src.write_text('extern "C" int tc() { return 1; }\n')
    first = build_library("tc", [src], build_dir=tmp_path / "cache")
    assert build_library("tc", [src], build_dir=tmp_path / "cache") == first and version_probes(log) == 1
    link.unlink()
    link.symlink_to(other_cxx)
    assert build_library("tc", [src], build_dir=tmp_path / "cache") != first
    assert version_probes(log) == 2 and compiled_sources(log) == ["tc.cpp", "tc.cpp"]
    compiler = find_compiler(tmp_path / "cache")
    assert compiler.path == os.path.realpath(other_cxx) and compiler.version == "g++ (other) 98.2"


def test_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/no/such/compiler-g++")
    src = tmp_path / "x.cpp"
    src.write_text("int x;\n")
    with pytest.raises(FileNotFoundError, match="CXX compiler '/no/such/compiler-g\\+\\+' was not found"):
        build_library("nocxx", [src], build_dir=tmp_path / "cache")


def test_ninja_comes_from_the_package_not_path(tmp_path, monkeypatch):
    import ninja

    assert os.path.dirname(ninja_path()) == ninja.BIN_DIR
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ninja").write_text("#!/bin/sh\necho 'the ninja on PATH was used' >&2\nexit 1\n")
    (fake / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    src = tmp_path / "n.cpp"
    src.write_text('extern "C" int n() { return 4; }\n')
    assert build_library("ninja_pkg", [src], build_dir=tmp_path / "cache")


def test_ninja_is_found_when_the_package_reports_no_bin_dir(monkeypatch):
    """A venv made with --system-site-packages: ninja's BIN_DIR is "" but its RECORD names the file."""
    import ninja

    real = ninja_path()
    monkeypatch.setattr(ninja, "BIN_DIR", "")
    assert ninja_path() == str(Path(real).resolve())


def test_ninja_missing_everywhere_is_named(monkeypatch):
    import ninja

    from opbuilder.tools import toolchain

    monkeypatch.setattr(ninja, "BIN_DIR", "/no/such/bin")
    monkeypatch.setattr(toolchain, "_ninja_from_record", lambda module_file, name: None)
    with pytest.raises(ToolchainError, match=r"^the ninja package has no binary at /no/such/bin/ninja; "
                                             r"reinstall it \(python -m pip install --force-reinstall ninja\)$"):
        ninja_path()


def test_max_jobs_is_passed_to_ninja(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MAX_JOBS", "1")
    assert default_jobs() == 1
    src = tmp_path / "j.cpp"
    src.write_text('extern "C" int j() { return 5; }\n')
    with caplog.at_level(logging.INFO, logger="opbuilder"):
        build_library("jobs", [src], build_dir=tmp_path / "cache")
    assert any("(1 jobs)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("max_jobs,overlap", [("1", False), ("3", True)])
def test_max_jobs_bounds_the_compiles_running_at_once(tmp_path, monkeypatch, max_jobs, overlap):
    """Each compile holds a directory while it runs; one that finds it taken ran beside another."""
    import time
    from builder_util import REAL_CXX, SETTLE_NS
    busy, seen = tmp_path / "busy", tmp_path / "overlapped"
    script = tmp_path / "cxx-slot.sh"
    script.write_text(f"""#!/bin/sh
case " $* " in *" -c "*)
  if mkdir '{busy}' 2>/dev/null; then sleep 0.5; rmdir '{busy}'; else touch '{seen}'; sleep 0.5; fi;;
esac
exec '{REAL_CXX}' "$@"
""")
    script.chmod(0o755)
    time.sleep(SETTLE_NS / 1e9 + 0.05)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("MAX_JOBS", max_jobs)
    srcs = []
    for k in range(3):
        srcs.append(tmp_path / f"slot{k}.cpp")
        srcs[-1].write_text(f'extern "C" int slot{k}() {{ return {k}; }}\n')
    build_library("slots", srcs, build_dir=tmp_path / "cache")
    assert seen.exists() is overlap


@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5"])
def test_bad_max_jobs_is_a_value_error(monkeypatch, bad):
    monkeypatch.setenv("MAX_JOBS", bad)
    with pytest.raises(ValueError, match=f"MAX_JOBS must be a positive integer, got '{bad}'"):
        default_jobs()


def test_default_jobs_are_bounded_by_cores_and_memory(monkeypatch):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    jobs = default_jobs()
    assert 1 <= jobs <= len(os.sched_getaffinity(0))
    mem = available_memory()
    assert mem is not None and jobs <= max(1, mem // (1 << 30))
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # read independently of opbuilder
    assert 0 < mem <= total


@pytest.mark.parametrize("gib,cores,expected", [(1.5, 8, 1), (0.2, 8, 1), (3.5, 8, 3), (64, 2, 2)])
def test_default_jobs_take_one_gib_per_compile(monkeypatch, gib, cores, expected):
    from opbuilder.tools import toolchain
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(toolchain, "available_memory", lambda: int(gib * (1 << 30)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert default_jobs() == expected


def test_compiler_family_is_known(cache_dir):
    cxx = find_compiler(cache_dir)
    assert cxx.family in ("gcc", "clang") and cxx.version and cxx.path in cxx.identity


def test_gpu_backend_compiles_cuda_with_nvcc(tmp_path):
    from opbuilder.tools.toolchain import find_nvcc, which

    if which("nvcc") is None and not (os.environ.get("NVCC") or os.environ.get("CUDA_HOME")):
        pytest.skip("no nvcc here")
    src = tmp_path / "k.cu"
    src.write_text("__global__ void add1(float *x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1; }\n"
                   'extern "C" int launch(float *x, int n) { add1<<<1, 32>>>(x, n); return 0; }\n')
    lib = build_library("cuda_k", [src], backend="GPU", build_dir=tmp_path / "cache")
    import ctypes
    assert hasattr(ctypes.CDLL(lib), "launch")  # linked against libcudart from nvcc's own toolkit
    assert find_nvcc(None).family == "nvcc"


def test_remembered_facts_are_probed_again_only_when_their_files_change(tmp_path, monkeypatch):
    import time

    from opbuilder.native.headers import _digest_now
    from opbuilder.tools.probe_cache import SETTLE_NS, remembered

    inc = tmp_path / "include"
    (inc / "opbuilder").mkdir(parents=True)
    header = inc / "opbuilder" / "x.h"
    header.write_text("int x;\n")
    time.sleep(SETTLE_NS / 1e9 + 0.05)
    probes = []

    def probe():
        probes.append(1)
        return _digest_now(((str(inc), "", (".h",)),))

    settle = SETTLE_NS / 1e9 + 0.05
    first = remembered(tmp_path, "headers test", probe)["digest"]
    assert remembered(tmp_path, "headers test", probe)["digest"] == first and len(probes) == 1
    os.utime(header, (1, 1))  # touched: probed again, same digest
    time.sleep(settle)
    assert remembered(tmp_path, "headers test", probe)["digest"] == first and len(probes) == 2
    assert remembered(tmp_path, "headers test", probe)["digest"] == first and len(probes) == 2
    header.write_text("int y;\n")  # edited: a new digest
    time.sleep(settle)
    second = remembered(tmp_path, "headers test", probe)["digest"]
    assert second != first and len(probes) == 3
    (inc / "opbuilder" / "new.h").write_text("int z;\n")  # a header added to a watched directory
    time.sleep(settle)
    assert remembered(tmp_path, "headers test", probe)["digest"] not in (first, second) and len(probes) == 4
    import opbuilder.tools.probe_cache

    monkeypatch.setattr(opbuilder.tools.probe_cache, "SETTLE_NS", 60_000_000_000)  # "moments ago", deterministically
    header.write_text("int w;\n")  # changed moments ago: used, but not remembered (file clocks are coarse)
    remembered(tmp_path, "headers test", probe)
    remembered(tmp_path, "headers test", probe)
    assert len(probes) == 6


def test_threads_remembering_at_once_leave_a_valid_file_and_no_temporary_ones(tmp_path):
    # every thread writes toolchains.json through a temporary file and a rename: one each
    import threading

    from opbuilder.tools.probe_cache import FILE_NAME, remembered

    threads, rounds = 8, 25
    barrier = threading.Barrier(threads, timeout=120)
    wrong = []

    def remember(i):
        for r in range(rounds):
            barrier.wait()  # all threads write at the same moment
            facts = {"value": "x" * (37 * i + r)}  # records of different lengths
            got = remembered(tmp_path, f"thread {i} round {r}", lambda: (facts, []))
            if got != facts:
                wrong.append((i, r, got))

    workers = [threading.Thread(target=remember, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert wrong == []
    data = json.loads((tmp_path / FILE_NAME).read_text())  # never two writers' bytes in one file
    assert isinstance(data, dict) and len(data) == threads * rounds  # merged under the lock: none lost
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", FILE_NAME]  # no temporary file left


_PROBE_ONE = """
import sys, time
from pathlib import Path
from opbuilder.tools.probe_cache import remembered
state, name, source, go = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
while not go.exists():
    time.sleep(0.005)
def probe():
    time.sleep(0.2)  # lines the processes up, so that their writes to the file overlap
    return {"value": name}, [source]
print(remembered(state, "fact " + name, probe)["value"])
"""


def test_processes_probing_at_once_keep_every_fact(tmp_path):
    """Records are merged under the cache directory's lock: none is lost to a concurrent writer."""
    import time

    from opbuilder.tools.probe_cache import SETTLE_NS

    source = tmp_path / "source.txt"
    source.write_text("x\n")
    time.sleep(SETTLE_NS / 1e9 + 0.05)  # settled: its facts may be stored
    state, go = tmp_path / "state", tmp_path / "go"
    state.mkdir()
    names = [f"p{i}" for i in range(6)]
    procs = [subprocess.Popen([PYTHON, "-c", _PROBE_ONE, str(state), n, str(source), str(go)],
                              stdout=subprocess.PIPE, text=True, env=child_env()) for n in names]
    time.sleep(0.5)  # all started and waiting
    go.touch()
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == names
    stored = json.loads((state / "toolchains.json").read_text())
    assert sorted(stored) == sorted(f"fact {n}" for n in names)


def test_a_compiler_link_pointed_elsewhere_while_probing_is_not_remembered(tmp_path, monkeypatch):
    """The link's target changes during the probe (its times do not): the facts are used once, not stored,
    so the next lookup probes the compiler the link names now."""
    log = tmp_path / "cxx.log"
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = wrapper_cxx(other_dir, log)
    with open(other) as f:
        text = f.read().replace("exec ", "[ \"$1\" = --version ] && echo 'g++ (other) 98.3' && exit 0\nexec ", 1)
    with open(other, "w") as f:
        f.write(text)
    link = tmp_path / "c++"
    first = wrapper_cxx(tmp_path, log)
    with open(first) as f:  # answers --version after pointing the link at the other compiler
        text = f.read().replace("exec ", f"[ \"$1\" = --version ] && ln -sfn '{other}' '{link}'\nexec ", 1)
    with open(first, "w") as f:
        f.write(text)
    link.symlink_to(first)
    import time

    from opbuilder.tools.probe_cache import SETTLE_NS
    time.sleep(SETTLE_NS / 1e9 + 0.05)
    monkeypatch.setenv("CXX", str(link))
    state = tmp_path / "state"
    state.mkdir()
    assert find_compiler(state).path == os.path.realpath(first)  # probed through the first target
    assert os.path.realpath(link) == os.path.realpath(other)
    again = find_compiler(state)
    assert again.path == os.path.realpath(other) and again.version == "g++ (other) 98.3"
    assert version_probes(log) == 2


def test_a_stopped_holder_of_the_cache_lock_delays_a_probe_only_briefly(tmp_path, monkeypatch):
    """A probe's record is only a cache: if the lock is not free within LOCK_WAIT_S it is not stored."""
    import threading

    from opbuilder.tools import probe_cache
    from opbuilder.cache.lock import wait_lock

    monkeypatch.setattr(probe_cache, "LOCK_WAIT_S", 0.3)
    holding, release = threading.Event(), threading.Event()

    def holder():
        with wait_lock(tmp_path, -1) as held:  # another open file: flock excludes us like another process
            assert held
            holding.set()
            release.wait(60)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert holding.wait(60)
        assert probe_cache.remembered(tmp_path, "fact", lambda: ({"v": 1}, [])) == {"v": 1}
        assert not (tmp_path / probe_cache.FILE_NAME).exists()  # not stored, and no hang
    finally:
        release.set()
        t.join()
    assert probe_cache.remembered(tmp_path, "fact", lambda: ({"v": 2}, [])) == {"v": 2}
    assert json.loads((tmp_path / probe_cache.FILE_NAME).read_text())["fact"]["facts"] == {"v": 2}


def test_which_stats_only_the_executables_on_path(tmp_path, monkeypatch):
    # issue 21: isfile() on each PATH entry before the compiler's raised and caught an error per entry
    # (~0.05 ms of a warm load()); os.access answers first, and only an executable is checked as a file
    dirs = [tmp_path / f"d{i}" for i in range(5)]
    for d in dirs:
        d.mkdir()
    (dirs[1] / "cxx").write_text("")  # not executable: skipped
    (dirs[2] / "cxx").mkdir()  # executable, not a file: skipped
    exe = dirs[3] / "cxx"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, dirs)))
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(str(path)) or real_stat(path, *a, **k))
    assert which("cxx") == str(exe)
    assert which(str(exe)) == str(exe) and which(str(dirs[1] / "cxx")) is None
    assert stats == [str(dirs[2] / "cxx"), str(exe), str(exe)]


def test_running_ninja_leaves_no_unclosed_pipe(tmp_path):
    """run_ninja reads ninja's output through a pipe; it closes it (each build warned ``ResourceWarning:
    unclosed file`` when the collector found it open, on f2d235d)."""
    import gc
    import warnings

    from opbuilder.compile.ninja_run import run_ninja
    build = tmp_path / "build"
    build.mkdir(mode=0o700)
    (build / "build.ninja").write_text("rule touch\n  command = touch $out\nbuild out.txt: touch\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_ninja(ninja_path(), build, 1, "pipe_check", False)
        gc.collect()
    assert (build / "out.txt").is_file()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []

"""opbuilder.load_many and opbuilder.Inline: many operators at once, in order, each distinct build once,
a failure or a runaway compile confined to its own item, safe beside another process doing the same."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opbuilder
from opbuilder import BuildError, BuildTimeout, CustomOpBuilder, Inline, LoadResult, load_many


def _op(name: str, value: int) -> Inline:
    return Inline(name, f"int value() {{ return {value}; }}\n", functions=["value"])


BAD = "int value() {\n  return zq_undeclared;\n}\n"
# a compile-time loop that takes gcc minutes (each loop is under -fconstexpr-loop-limit; the
# whole is under -fconstexpr-ops-limit only after ~8e9 steps)
RUNAWAY = textwrap.dedent("""\
    constexpr long spin() {
      long s = 0;
      for (long i = 0; i < 200000; ++i)
        for (long j = 0; j < 200000; ++j) s += i ^ j;
      return s;
    }
    static_assert(spin() != 1, "never false");
    int value() { return 1; }
""")


def _compiles(cache: Path, name: str) -> int:
    """How many times ninja compiled operator ``name``'s objects in ``cache`` (its .ninja_log keeps one
    line per successful run of a command)."""
    log = Path(cache) / name / "build" / ".ninja_log"
    if not log.is_file():
        return 0
    return sum(1 for line in log.read_text().splitlines()[1:] if line.split("\t")[3].startswith("obj/"))


@pytest.fixture(scope="session")
def many_sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("many_src")
    (d / "many_file.cpp").write_text('#include "opbuilder/extension.h"\nint value() { return 40; }\n'
                                     'OB_MODULE(m) { m.def("value", &value); }\n')
    return d


@pytest.fixture(scope="session")
def many_run(cache_dir, many_sources):
    """One load_many call: two good inline items, one that fails, a repeat, and a CustomOpBuilder."""
    items = [_op("many_a", 10), Inline("many_bad", BAD, functions=["value"]), _op("many_b", 20),
             _op("many_a", 10), CustomOpBuilder("many_file", [str(many_sources / "many_file.cpp")])]
    return items, load_many(items, jobs=2)


# the tests that compile are marked `build` by hand (tests/build_guard.py); the bad-input tests are not
@pytest.mark.build
def test_results_are_in_order_one_per_item(many_run):
    items, results = many_run
    assert len(results) == 5 and all(isinstance(r, LoadResult) for r in results)
    assert [r.module.value() if r.module else None for r in results] == [10, None, 20, 10, 40]
    assert [r.error is None for r in results] == [True, False, True, True, True]
    assert all(r.seconds > 0 for r in results)


@pytest.mark.build
def test_a_failing_item_says_why_and_stops_no_other(many_run, cache_dir):
    _, results = many_run
    err = results[1].error
    assert isinstance(err, BuildError) and not isinstance(err, BuildTimeout)
    assert str(err).startswith("building operator 'many_bad' failed:\n")
    user = Path(cache_dir).resolve() / "inline" / "many_bad"
    [d] = err.diagnostics
    assert Path(d.file).parent.parent == user and Path(d.file).name == "cpp_sources.cpp"
    assert (d.line, d.column, d.severity) == (2, 10, "error")
    assert d.message in ("‘zq_undeclared’ was not declared in this scope",  # the quotes of a UTF-8 locale
                         "'zq_undeclared' was not declared in this scope")


@pytest.mark.build
def test_a_repeated_item_is_one_build_and_one_module(many_run, cache_dir):
    _, results = many_run
    assert results[3].module is results[0].module
    assert results[3] is results[0]
    assert _compiles(cache_dir, "many_a") == 1


@pytest.mark.build
def test_cached_items_compile_nothing(many_run, cache_dir):
    items, first = many_run
    again = load_many(items, jobs=2)
    assert [r.module for r in again] == [r.module for r in first]  # the same module objects
    assert [_compiles(cache_dir, n) for n in ("many_a", "many_b", "many_file")] == [1, 1, 1]


def _procs_mentioning(needles):
    """Live processes (not this one) whose command line or environment holds one of ``needles``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(n.encode() in cmd or n.encode() in env for n in needles):
            found.append((int(entry), cmd.replace(b"\0", b" ").decode(errors="replace")))
    return found


@pytest.mark.build
def test_a_runaway_compile_is_killed_with_its_whole_tree_at_the_timeout(many_run, cache_dir):
    runaway = Inline("many_runaway", RUNAWAY, functions=["value"])
    results = load_many([runaway, _op("many_a", 10)], timeout=2)
    err = results[0].error
    assert isinstance(err, BuildTimeout) and isinstance(err, BuildError) and err.seconds == 2
    assert str(err).startswith("building operator 'many_runaway' timed out after 2 s: ninja and its compilers (")
    assert results[1].module is many_run[1][0].module  # the other item is unaffected
    key_dir = runaway.builder().spec.sources[0].parent
    build_dir = Path(cache_dir).resolve() / "many_runaway" / "build"
    assert _procs_mentioning([str(key_dir), f"OPBUILDER_BUILD_DIR={build_dir}\0"]) == []
    assert not (build_dir / ".building").exists()  # every process of the build is gone: nothing to clean


@pytest.mark.build
def test_two_processes_with_overlapping_items_compile_each_once(cache_dir, tmp_path):
    code = textwrap.dedent("""\
        import json, os, sys, time
        from opbuilder import Inline, load_many
        go = sys.argv[1]
        while not os.path.exists(go):
            time.sleep(0.005)
        names = sys.argv[2:]
        results = load_many([Inline(n, f"int value() {{ return {len(n)}; }}", functions=["value"]) for n in names])
        print(json.dumps([[r.module.value() if r.module else None, str(r.error) if r.error else None]
                          for r in results]))
    """)
    go = tmp_path / "go"
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir))
    sides = [["many_p1", "many_p22"], ["many_p22", "many_p333", "many_p1"]]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(go), *names], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for names in sides]
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert json.loads(outs[0][0]) == [[7, None], [8, None]]
    assert json.loads(outs[1][0]) == [[8, None], [9, None], [7, None]]
    assert [_compiles(cache_dir, n) for n in ("many_p1", "many_p22", "many_p333")] == [1, 1, 1]


@pytest.mark.build
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the CUDA compile needs it")
def test_a_cuda_inline_source_compiles_with_no_gpu_for_a_given_arch(cache_dir):
    cuda = textwrap.dedent("""\
        __global__ void add_kernel(const float *a, const float *b, float *out, int n) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) out[i] = a[i] + b[i];
        }
        int launch_width() { return 256; }
    """)
    [r] = load_many([Inline("many_cuda", "int launch_width();", functions=["launch_width"], cuda_sources=cuda,
                            cuda_arch="8.0")])
    assert r.error is None, r.error
    assert r.module.launch_width() == 256  # host code only: runs with no GPU
    build = Path(cache_dir) / "many_cuda" / "build" / "build.ninja"
    assert "-gencode=arch=compute_80,code=sm_80" in build.read_text()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.build
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the CUDA compile needs it")
def test_a_cuda_items_timeout_kills_nvcc_and_its_children(cache_dir, tmp_path, monkeypatch):
    """A CUDA item past its time: nvcc (here in the middle of thrust's sort, tens of seconds of cicc) dies
    with its whole tree (cudafe++, cicc, the host gcc), as the C++ compiler's does."""
    from opbuilder.tools.toolchain import find_nvcc

    log = tmp_path / "nvcc.pids"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f"#!/bin/sh\necho $$ >> '{log}'\nexec '{find_nvcc(None).path}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("NVCC", str(wrapper))
    cuda = ("#include <thrust/device_vector.h>\n#include <thrust/sort.h>\n"
            "void sort_it(thrust::device_vector<double> &v) { thrust::sort(v.begin(), v.end()); }\n"
            "int width() { return 1; }\n")
    item = Inline("many_cuda_killed", "int width();", functions=["width"], cuda_sources=cuda, cuda_arch="8.0")
    [r] = load_many([item], timeout=3)
    assert isinstance(r.error, BuildTimeout) and r.error.seconds == 3, r.error
    pids = [int(p) for p in log.read_text().split()] if log.exists() else []
    assert pids, "nvcc never started"
    assert [p for p in pids if _alive(p)] == []
    key_dir = item.builder().spec.sources[0].parent
    build_dir = Path(cache_dir).resolve() / "many_cuda_killed" / "build"
    assert _procs_mentioning([str(key_dir), f"OPBUILDER_BUILD_DIR={build_dir}\0"]) == []


# ---- bad inputs: nothing compiles ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"jobs": 0}, "load_many: jobs must be a positive integer (or None for the cores), got 0"),
    ({"jobs": 1.5}, "load_many: jobs must be a positive integer (or None for the cores), got 1.5"),
    ({"timeout": -1}, "load_many: timeout must be a positive number of seconds (or None), got -1"),
    ({"timeout": 0}, "load_many: timeout must be a positive number of seconds (or None), got 0"),
    ({"timeout": float("nan")}, "load_many: timeout must be a positive number of seconds (or None), got nan"),
    ({"timeout": "5"}, "load_many: timeout must be a positive number of seconds (or None), got '5'"),
    ({"jobs": True}, "load_many: jobs must be a positive integer (or None for the cores), got True"),
])
def test_bad_jobs_or_timeout_is_a_value_error(kwargs, message):
    with pytest.raises(ValueError) as info:
        load_many([], **kwargs)
    assert str(info.value) == message


def test_an_item_of_another_type_is_a_type_error_naming_its_place():
    with pytest.raises(TypeError) as info:
        load_many([_op("many_typed", 1), "int f();"])
    assert str(info.value) == ("load_many: item 1 is a str; expected opbuilder.Inline or "
                               "opbuilder.CustomOpBuilder")


def test_no_items_is_no_results():
    assert load_many([]) == []


def test_inline_checks_its_arguments_when_made():
    with pytest.raises(ValueError) as info:
        Inline("a-b", "")
    assert str(info.value) == "Inline: name must be a Python identifier, got 'a-b'"
    with pytest.raises(TypeError) as info:
        Inline("x", 3)
    assert str(info.value) == "Inline('x'): cpp_sources must be a string or a list of strings"
    with pytest.raises(ValueError) as info:
        Inline("x", "", functions=["not a name"])
    assert str(info.value) == "load_inline('x'): functions must name C++ functions, got 'not a name'"


@pytest.mark.parametrize("make, exc, message", [
    (lambda: Inline("café", ""), ValueError, "operator name 'café' must be ASCII (letters, digits, _): Python cannot "
                                             "import an extension module with a non-ASCII name"),
    (lambda: Inline("class", ""), ValueError, "operator name 'class' is a Python keyword, which cannot name a module "
                                              "(import class is a syntax error); choose another name"),
    (lambda: Inline("a" * 150, ""), ValueError, f"operator name {'a' * 20}... is 150 characters long; at most 100 are "
                                                f"accepted (it names files in the cache, whose names the file system "
                                                f"limits)"),
    (lambda: Inline("x", "", backend="TPU"), ValueError, "unknown backend 'TPU'; accepted values: 'CPU', 'GPU' (the "
                                                         "TPU backend is not available: opbuilder builds for these "
                                                         "backends only)"),
    (lambda: Inline("x", "", binding="swig"), ValueError, "unknown binding 'swig'; accepted values: None (read from "
                                                          "the sources), 'nanobind', 'pybind11'"),
    (lambda: Inline("x", "", cflags=[3]), TypeError, "cflags must be strings, got int: 3"),
    (lambda: opbuilder.load_inline("class", ""), ValueError, "operator name 'class' is a Python keyword, which "
                                                             "cannot name a module (import class is a syntax error); "
                                                             "choose another name"),
    (lambda: Inline("x", "", include_paths=[3]), TypeError, "include_paths must be paths (str or os.PathLike), got "
                                                            "int: 3"),
    (lambda: Inline("x", "", build_dir=5), TypeError, "build_dir must be a path (a str or os.PathLike), got int"),
    (lambda: Inline("x", "", cflags=b"-O2"), TypeError, "cflags must be a string or a list of strings, got bytes"),
])
def test_inline_checks_the_builders_name_and_options_when_made(make, exc, message, tmp_path, monkeypatch):
    """Before, these were accepted and failed only inside load_many, after the sources were written."""
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(exc) as info:
        make()
    assert str(info.value) == message
    assert not (tmp_path / "cache").exists()  # nothing written


def test_equal_inline_items_are_one_build():
    assert _op("many_eq", 1) == _op("many_eq", 1) and hash(_op("many_eq", 1)) == hash(_op("many_eq", 1))
    assert _op("many_eq", 1) != _op("many_eq", 2)
    assert Inline("many_eq", "x", cflags=["-O3"]) != Inline("many_eq", "x")


def test_a_cuda_arch_that_names_no_architecture_is_a_value_error():
    with pytest.raises(ValueError) as info:
        CustomOpBuilder("many_arch", ["k.cu"], backend="GPU", cuda_arch="sm_1")
    assert str(info.value).startswith("cuda_arch: 'sm_1' is not an architecture; accepted: compute capabilities")
    with pytest.raises(ValueError) as info:
        CustomOpBuilder("many_arch", ["k.cu"], backend="GPU", cuda_arch="8.0", cuda_cflags=["-arch=sm_90"])
    assert str(info.value) == ("cuda_arch='8.0' and cuda_cflags that choose architectures (-gencode, -arch, "
                               "-code) were both given; give one of them")


def test_the_new_names_are_public():
    assert opbuilder.load_many is load_many and opbuilder.Inline is Inline
    assert {"Inline", "load_many", "LoadResult", "Diagnostic", "BuildTimeout"} <= set(opbuilder.__all__)


@pytest.mark.build
def test_the_many_variants_example_reports_each_status(cache_dir):
    example = Path(__file__).resolve().parents[1] / "examples" / "many_variants.py"
    done = subprocess.run([sys.executable, str(example), "--count", "7", "--jobs", "2"], capture_output=True,
                          text=True, env=dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir)), timeout=600)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["name"], r["status"]) for r in records] == [
        ("variant_00", "ok"), ("variant_01", "ok"), ("variant_02", "ok"), ("variant_03", "ok"),
        ("variant_04", "compile_error"), ("variant_05", "ok"), ("variant_06", "wrong")]
    assert {k: v for k, v in records[4]["diagnostic"].items() if k != "message"} == {
        "file": "cpp_sources.cpp", "line": 11, "column": 19}
    assert done.stderr.rstrip().endswith("summary: compile_error 1, ok 5, wrong 1")
    import importlib.util
    if importlib.util.find_spec("tqdm") is not None:  # the bar: tqdm's last refresh shows every variant done
        assert "variants: 100%" in done.stderr and "| 7/7 [" in done.stderr
    else:
        assert done.stderr.startswith("(no progress bar: tqdm is not installed; pip install -e \".[examples]\")\n")


def test_an_item_that_cannot_even_start_is_its_own_build_error():
    # (an unknown keyword is refused when the Inline is made: test_inline_text.py)
    bad = Inline("many_opt", "int value() { return 1; }", functions=["value"], include_paths=["/no/such/dir"])
    [r] = load_many([bad])
    assert r.module is None and type(r.error) is BuildError and isinstance(r.error.__cause__, FileNotFoundError)
    assert str(r.error).startswith("building operator 'many_opt' failed: FileNotFoundError: ")
    assert "/no/such/dir" in str(r.error) and r.error.diagnostics == []


RUNTIME_FIRST = textwrap.dedent("""\
    import json
    from opbuilder import Inline, load_many
    items = [Inline(f"rt_first_{k}", f"double f{k}(double x) {{ return x + {k}; }}", functions=[f"f{k}"])
             for k in range(2)]
    results = load_many(items, timeout=45)
    print(json.dumps([[type(r.error).__name__ if r.error else None,
                       getattr(r.module, f"f{k}")(1.0) if r.module else None] for k, r in enumerate(results)]))
""")


@pytest.mark.build
def test_the_runtimes_one_time_build_counts_against_no_items_timeout(tmp_path):
    """A cold cache without opbuilder's installed runtime: nanobind's runtime and the core library (about a
    minute of CPU, once for all items) were built inside the first items' limits, which killed their
    compiles; they are built first, untimed, and each limit covers its item's own compile. The limit, 45 s, is
    well over an item's own compile on a cold cache (a few seconds of CPU; 10 s was too short on two cores
    at load 10) and under the runtime's build (about a minute of CPU)."""
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(tmp_path / "cache"), OPBUILDER_INSTALLED_RUNTIME="0")
    res = subprocess.run([sys.executable, "-c", RUNTIME_FIRST], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == [[None, 1.0], [None, 2.0]]


@pytest.mark.parametrize("items, message", [
    (_op("many_single", 1), "load_many: items must be a list of opbuilder.Inline or opbuilder.CustomOpBuilder "
                            "items, got Inline (put the one item in a list)"),
    (None, "load_many: items must be a list of opbuilder.Inline or opbuilder.CustomOpBuilder items, got NoneType"),
    ("int f();", "load_many: items must be a list of opbuilder.Inline or opbuilder.CustomOpBuilder items, got str"),
])
def test_items_that_are_not_a_list_of_items_are_a_type_error(items, message):
    with pytest.raises(TypeError) as info:
        load_many(items)
    assert str(info.value) == message


@pytest.mark.build  # the C++ compiler's identity may be probed before nvcc is looked for
def test_a_cuda_item_with_no_nvcc_is_a_toolchain_error_naming_the_item(cache_dir, monkeypatch):
    """No nvcc on PATH and no CUDA_HOME: the item's error is a ToolchainError that says whose build it
    stopped (it was raised before the build knew its operator: no name, no operator in the message)."""
    from opbuilder import ToolchainError
    from opbuilder.tools.toolchain import which

    for var in ("NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not which(os.path.join(d, "nvcc"))]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    good, cuda = _op("many_nonvcc_ok", 3), Inline("many_nonvcc", "int width();", functions=["width"],
                                                 cuda_sources="int width() { return 256; }\n", cuda_arch="8.0")
    ok, r = load_many([good, cuda])
    assert ok.error is None and ok.module.value() == 3
    assert type(r.error) is ToolchainError and r.module is None and r.error.name == "many_nonvcc"
    assert str(r.error) == ("building operator 'many_nonvcc' failed: backend='GPU' needs nvcc: install the CUDA "
                            "toolkit, or set CUDA_HOME or NVCC")


@pytest.mark.build
def test_one_name_with_two_sources_is_two_builds_each_with_its_own_values(cache_dir):
    """A harness that reuses a name for another variant gets both, each computing its own source."""
    one, two = _op("many_samename", 1), _op("many_samename", 2)
    results = load_many([one, two, one], jobs=2)
    assert [r.error for r in results] == [None, None, None]
    assert [r.module.value() for r in results] == [1, 2, 1]
    assert results[0].module is not results[1].module and results[2] is results[0]


@pytest.mark.build
def test_no_more_than_jobs_compiles_run_at_once(cache_dir, tmp_path, monkeypatch):
    """A compiler launcher (not in any key) counts the item compiles running as each starts."""
    running, log = tmp_path / "running", tmp_path / "starts.log"
    running.mkdir()
    launcher = tmp_path / "count.sh"
    launcher.write_text("#!/bin/sh\n"
                        'case "$*" in *many_jobs_*) ;; *) exec "$@" ;; esac\n'
                        f'touch "{running}/$$"\n'
                        f"ls '{running}' | wc -l >> '{log}'\n"
                        "sleep 0.3\n"  # long enough for the next compile to start beside it, were it allowed
                        '"$@"; rc=$?\n'
                        f'rm -f "{running}/$$"\n'
                        "exit $rc\n")
    launcher.chmod(0o755)
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", str(launcher))
    for jobs in (1, 2):
        items = [_op(f"many_jobs_{jobs}_{k}", 10 * jobs + k) for k in range(3)]
        results = load_many(items, jobs=jobs)
        assert [r.module.value() for r in results] == [10 * jobs + k for k in range(3)]
        starts = [int(n) for n in log.read_text().split()]
        log.unlink()
        assert len(starts) == 3 and max(starts) <= jobs, (jobs, starts)


INTERRUPTED = textwrap.dedent("""\
    import os, signal, sys, threading, time
    from pathlib import Path
    from opbuilder import CustomOpBuilder, load_many
    from opbuilder.cache.lock import build_lock
    builder = CustomOpBuilder("many_stopped", [sys.argv[1]])
    op_dir = builder.spec.op_dir
    op_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    with build_lock(op_dir, "many_stopped"):  # as another process's build holds it: the worker waits
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            load_many([builder], jobs=1)
            print("finished")
        except KeyboardInterrupt:
            print("interrupted", time.monotonic() - t0 < 8)
    time.sleep(4)  # the lock is free: a worker that went on would build now
    kids = [p for p in os.listdir("/proc") if p.isdigit() and
            open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
    print("children", len(kids), "built", any(op_dir.rglob("*.so")))
""")


@pytest.mark.build
def test_an_interrupted_load_many_starts_no_compiler_afterwards(tmp_path):
    """A worker waiting for another build's lock was abandoned after the interrupt (10 s later): once the
    lock came free it started ninja and its compilers, which outlived the call and the process. The stop
    now reaches every build of the call: the wait ends within a poll and no compiler starts."""
    src = tmp_path / "stopped.cpp"
    src.write_text('#include "opbuilder/extension.h"\nint value() { return 1; }\nOB_MODULE(m) { m.def("value", &value); }\n')
    res = subprocess.run([sys.executable, "-c", INTERRUPTED, str(src)], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["interrupted", "True", "children", "0", "built", "False"], res.stdout + res.stderr


@pytest.mark.build
def test_an_inline_item_whose_written_sources_were_cleaned_writes_them_again(tmp_path, monkeypatch):
    """`cache clean` between an item's writing its sources and its build (no lock held then) removed
    inline/: the build failed with FileNotFoundError for <name>.cpp. They are written again, once."""
    from opbuilder.inline import load_written
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    item = Inline("cleaned_between", "int value() { return 4; }\n", functions=["value"])
    builder = item.builder()  # what load_many does first: the sources are in the cache now
    shutil.rmtree(tmp_path / "cache" / "inline")
    assert load_written(item.builder, builder).value() == 4
    builder = item.builder()
    shutil.rmtree(tmp_path / "cache" / "inline")
    [r] = load_many([item])  # (cached now: no build reads them)
    assert r.error is None and r.module.value() == 4

"""nvcc builds choose their GPU architectures: OPBUILDER_CUDA_ARCH_LIST (or TORCH_CUDA_ARCH_LIST), else the
GPUs nvidia-smi lists (asked on a cold build only), else a default; the user's own arch flags win; the
choice is in the key."""
import os
import time
from pathlib import Path

import pytest

from builder_util import run_python
from opbuilder import build_library
from opbuilder.tools.cuda_arch import (DEFAULT, ENV, TORCH_ENV, arch_flags, gencode_flags, parse_arch_list,
                                       user_sets_arch)
from opbuilder.tools.probe_cache import SETTLE_NS
from opbuilder.tools.toolchain import which

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

G = "-gencode=arch=compute_{0},code=sm_{0}"
P = "-gencode=arch=compute_{0},code=compute_{0}"
NO_NVCC = which("nvcc") is None and not (os.environ.get("NVCC") or os.environ.get("CUDA_HOME"))


@pytest.mark.parametrize("text, flags", [
    ("8.0;8.6+PTX", [G.format(80), G.format(86), P.format(86)]),
    ("8.0 9.0", [G.format(80), G.format(90)]),
    ("sm_90", [G.format(90)]),
    ("90a, 8.6+ptx 8.6", [G.format(86), P.format(86), G.format("90a")]),
    ("Ampere+PTX", [G.format(80), G.format(86), P.format(86)]),
    ("12.0;10.0+PTX", [G.format(100), P.format(100), G.format(120)]),
])
def test_the_usual_spellings_of_an_arch_list(text, flags):
    assert gencode_flags(parse_arch_list(text)) == flags


@pytest.mark.parametrize("text", ["8.x", "sm90+SASS", "compute_90", "8", "Fermi", ";", "+PTX"])
def test_a_malformed_arch_list_is_a_value_error_naming_the_variable_and_the_forms(text):
    with pytest.raises(ValueError, match=rf"^{TORCH_ENV}(: '.*' is not an architecture|=.* names no architecture); "
                                         rf"accepted: compute capabilities separated by "):
        parse_arch_list(text, TORCH_ENV)


@pytest.mark.parametrize("flags, sets", [
    (["-gencode", "arch=compute_90,code=sm_90"], True), (["-arch=sm_90"], True), (["-arch", "native"], True),
    (["--gpu-architecture", "sm_90"], True), (["-code=sm_90"], True), (["--generate-code=arch=compute_90"], True),
    (["-Xcompiler", "-arch"], False), (["-Xcompiler", "-march=native"], False), (["-DARCH=90", "-O3"], False),
    (["-Xptxas", "-arch=sm_90"], False), ([], False),
])
def test_only_real_arch_flags_switch_the_default_off(flags, sets):
    assert user_sets_arch(flags) is sets


def test_ours_wins_over_torchs_and_user_flags_win_over_both(tmp_path, monkeypatch):
    monkeypatch.setenv(TORCH_ENV, "7.5")
    assert arch_flags([], tmp_path) == ([G.format(75)], TORCH_ENV)
    monkeypatch.setenv(ENV, "9.0")
    assert arch_flags([], tmp_path) == ([G.format(90)], ENV)
    assert arch_flags(["-arch=sm_86"], tmp_path) == ([], "cuda_cflags")


def test_without_a_gpu_the_default_is_sm_80_with_its_ptx(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(TORCH_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert arch_flags([], tmp_path) == ([G.format(80), P.format(80)], "the default: no GPU visible")
    assert gencode_flags(DEFAULT) == [G.format(80), P.format(80)]


def _logging_script(path: Path, log: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\n{body}")
    path.chmod(0o755)
    time.sleep(SETTLE_NS / 1e9 + 0.05)  # old enough for its probe to be remembered (probe_cache)
    return str(path)


def _nvcc_compiles(log: Path):
    """nvcc's compile commands in the wrapper's log (not the toolkit probe's -dryrun)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if " -c " in f" {line} " and "-dryrun" not in line]


@pytest.fixture
def cu(tmp_path, monkeypatch):
    if NO_NVCC:
        pytest.skip("nvcc (the CUDA toolkit) is not installed")
    from opbuilder.tools.toolchain import find_nvcc
    nvcc = find_nvcc(None)
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("NVCC", _logging_script(tmp_path / "nvcc", log, f"exec '{nvcc.path}' \"$@\"\n"))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(TORCH_ENV, raising=False)
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float *x) { x[0] = 1; }\n"
                   'extern "C" int launch(float *x) { k<<<1, 1>>>(x); return 0; }\n')
    return src, log


def test_the_arch_list_is_in_the_key_and_a_change_rebuilds(cu, tmp_path, monkeypatch):
    src, log = cu
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, "8.0")
    a = build_library("arch_k", [src], backend="GPU", build_dir=cache)
    monkeypatch.setenv(ENV, "8.0;")  # the same list
    assert build_library("arch_k", [src], backend="GPU", build_dir=cache) == a
    monkeypatch.setenv(ENV, "sm_90")
    b = build_library("arch_k", [src], backend="GPU", build_dir=cache)
    assert b != a
    compiles = _nvcc_compiles(log)
    assert len(compiles) == 2
    assert G.format(80) in compiles[0].split() and P.format(80) not in compiles[0].split()
    assert G.format(90) in compiles[1].split() and G.format(80) not in compiles[1].split()
    monkeypatch.setenv(ENV, "8.0+SASS")
    with pytest.raises(ValueError, match=rf"^{ENV}: '8.0\+SASS' is not an architecture; accepted: "):
        build_library("arch_k", [src], backend="GPU", build_dir=cache)
    assert len(_nvcc_compiles(log)) == 2


def test_user_arch_flags_replace_the_default(cu, tmp_path):
    src, log = cu
    build_library("arch_u", [src], backend="GPU", build_dir=tmp_path / "cache",
                  cuda_cflags=["-gencode", "arch=compute_86,code=sm_86"])
    (line,) = _nvcc_compiles(log)
    assert "-gencode=" not in line and "arch=compute_86,code=sm_86" in line.split()


def test_the_visible_gpus_arch_is_asked_on_a_cold_build_only(cu, tmp_path, monkeypatch):
    """nvidia-smi (here a script answering as it does) is run by the first build only: a warm load in
    another process runs nothing. A changed nvidia-smi (a driver update) is asked again: one that fails,
    as it does without a driver, gives the default and another key."""
    src, log = cu
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi_log = tmp_path / "smi.log"
    smi = _logging_script(bin_dir / "nvidia-smi", smi_log, "printf '9.0\\n9.0\\n'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "cache"
    first = build_library("arch_d", [src], backend="GPU", build_dir=cache)
    assert smi_log.read_text().splitlines() == ["--query-gpu=compute_cap --format=csv,noheader"]
    assert {G.format(90), P.format(90)} <= set(_nvcc_compiles(log)[0].split())
    code = "import sys; from opbuilder import build_library; print(build_library('arch_d', [sys.argv[1]], " \
           "backend='GPU', build_dir=sys.argv[2]))"
    res = run_python(code, str(src), str(cache), PATH=os.environ["PATH"], NVCC=os.environ["NVCC"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == first and len(smi_log.read_text().splitlines()) == 1
    _logging_script(Path(smi), smi_log, "echo 'NVIDIA-SMI has failed because it could not communicate with "
                                        "the NVIDIA driver.'\nexit 9\n")
    assert build_library("arch_d", [src], backend="GPU", build_dir=cache) != first
    assert len(smi_log.read_text().splitlines()) == 2
    assert {G.format(80), P.format(80)} <= set(_nvcc_compiles(log)[1].split())


def test_torch_cuda_arch_list_alone_compiles_for_it_and_asks_no_gpu(cu, tmp_path, monkeypatch):
    """A harness on a CPU machine sets TORCH_CUDA_ARCH_LIST as it does for torch: nvcc compiles for that
    architecture and nvidia-smi (here a logging script) is never asked."""
    src, log = cu
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi_log = tmp_path / "smi.log"
    _logging_script(bin_dir / "nvidia-smi", smi_log, "exit 9\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(TORCH_ENV, "7.5")
    build_library("arch_t", [src], backend="GPU", build_dir=tmp_path / "cache")
    (line,) = _nvcc_compiles(log)
    assert G.format(75) in line.split() and P.format(75) not in line.split()
    assert not smi_log.exists()

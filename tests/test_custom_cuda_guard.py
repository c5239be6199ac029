"""The host-pointer guard: a library that uses CUDA, called on host tensors, is a clear error, never garbage.

Seed 004 builds its CUDA add with ``nvcc --shared -Xcompiler -fPIC`` and calls
it through ops.Custom; handed host pointers, its kernel launch fails silently
and the output is uninitialised memory. Here the tutorial's own .cu is built
that way (nvcc needed, no GPU) and called on CPU tensors.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops.cuda_elf import cuda_use

HERE = Path(__file__).resolve().parent
SEED_CU = HERE / "cuda" / "seed004_custom_add.cu"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not on PATH")


def _nvcc(out: Path, *extra: str) -> Path:
    subprocess.run([NVCC, "--shared", "-Xcompiler", "-fPIC", *extra, "-o", str(out), str(SEED_CU)], check=True,
                   capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def seed_so(tmp_path_factory):
    """Seed 004's custom_add.so, built as the tutorial says (CUDA runtime linked statically)."""
    if NVCC is None:
        pytest.skip("nvcc (the CUDA toolkit) is not on PATH")
    return _nvcc(tmp_path_factory.mktemp("seed004") / "custom_add.so")


@pytest.fixture(scope="session")
def host_so(tmp_path_factory):
    """A plain g++ aot library (no CUDA)."""
    d = tmp_path_factory.mktemp("hostlib")
    src = d / "add.cpp"
    src.write_text('#include <cstdint>\nextern "C" int CustomAdd(int n, void **p, int *nd, int64_t **s, '
                   'const char **t, void *st, void *e) {\n  float *a = (float *)p[0], *b = (float *)p[1], '
                   '*o = (float *)p[2];\n  for (int64_t i = 0; i < s[2][0]; ++i) o[i] = a[i] + b[i];\n'
                   '  (void)n; (void)nd; (void)t; (void)st; (void)e;\n  return 0;\n}\n')
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(d / "add.so"), str(src)], check=True, timeout=120)
    return d / "add.so"


@needs_nvcc
def test_seed_004s_nvcc_library_is_recognised_as_cuda_code(seed_so):
    assert cuda_use(str(seed_so)) == "carries device code (.nv_fatbin)"


def test_host_libraries_and_non_elf_files_are_not_cuda_code(host_so, tmp_path):
    assert cuda_use(str(host_so)) is None
    assert cuda_use(str(Path(rt.__file__))) is None  # a text file
    assert cuda_use(str(tmp_path / "missing.so")) is None
    (tmp_path / "short.so").write_bytes(b"\x7fELF\x02\x01")
    assert cuda_use(str(tmp_path / "short.so")) is None


@needs_nvcc
@pytest.mark.build
def test_a_host_library_that_links_the_cuda_runtime_counts_as_cuda_code(tmp_path):
    from opbuilder.tools.toolchain import cuda_lib_dir, find_nvcc
    lib = cuda_lib_dir(find_nvcc(None))
    if lib is None or not (Path(lib) / "libcudart.so").exists():
        pytest.skip(f"libcudart.so is not where the builder looks for it beside nvcc ({lib})")
    lib_dir = Path(lib)
    inc_dir = lib_dir.parent / "include"
    src = tmp_path / "count.cpp"
    src.write_text('#include <cuda_runtime_api.h>\nextern "C" int Count() { int n = 0; '
                   'cudaGetDeviceCount(&n); return n; }\n')
    out = tmp_path / "count.so"
    subprocess.run(["g++", "-shared", "-fPIC", f"-I{inc_dir}", str(src), f"-L{lib_dir}", "-lcudart", "-o", str(out)],
                   check=True, timeout=120)
    assert cuda_use(str(out)).startswith("links libcudart.so")


@needs_nvcc
def test_seed_004s_library_on_host_tensors_is_an_error_naming_the_library_and_the_device(seed_so):
    add = ops.Custom(f"{seed_so}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")
    assert add._kernel.cuda == "carries device code (.nv_fatbin)"
    why = rt.cuda.unavailable_reason()
    with pytest.raises(RuntimeError) as err:
        add(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0]))
    msg = str(err.value)
    assert msg.startswith(f"aot operator 'CustomAdd' in {seed_so} is CUDA code (carries device code (.nv_fatbin)) "
                          f"and needs tensors on a GPU device, but input(s) [0, 1] are on the CPU (host memory): "
                          f"its kernel would be handed host pointers. Put the inputs on the GPU")
    if why is not None:
        assert msg.endswith(f"; no GPU is usable here: {why}")


@needs_nvcc
def test_the_guard_holds_inside_a_cell_with_a_bprop_as_the_seed_uses_it(seed_so):
    add = ops.Custom(f"{seed_so}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")

    class Add(rt.nn.Cell):
        def bprop(self, x, y, out, dout):
            return (y,)

        def construct(self, x, y):
            return add(x, y)

    with pytest.raises(RuntimeError, match=r"is CUDA code .* but input\(s\) \[0, 1\] are on the CPU"):
        rt.grad(Add(), grad_position=(0,))(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0]))


def test_a_host_library_still_runs_on_host_tensors(host_so):
    add = ops.Custom(f"{host_so}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")
    assert add._kernel.cuda is None
    assert add(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0])).asnumpy().tolist() == [4.0, 4.0, 4.0]

"""ops.Custom with aot kernels: the C ABI as the kernel sees it, building sources, errors."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from opbuilder import build_library
from runtime import Tensor, nn, ops

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")
ABI = str(ROOT / "tests" / "cpp" / "aot_abi_ops.cpp")
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def test_seed_custom_add_with_fixed_out_shape():
    t1 = Tensor([1.0, 2.0, 3.0], rt.float32)
    t2 = Tensor([3.0, 2.0, 1.0], rt.float32)
    custom_add = ops.Custom(f"{ADD}:CustomAdd", out_shape=[t1.shape[0]], out_dtype=rt.float32, func_type="aot")
    res = custom_add(t1, t2)
    assert isinstance(res, Tensor)
    assert res.dtype == rt.float32 and res.shape == (3,)
    np.testing.assert_array_equal(res.asnumpy(), [4.0, 4.0, 4.0])


def test_custom_add_with_shape_and_dtype_callables():
    seen = []

    def shape_fn(x, y):
        seen.append((x, y))
        return x

    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=shape_fn, out_dtype=lambda x, _: x, func_type="aot")
    x0 = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
    x1 = np.array([[2.0, 2.0], [3.0, 3.0]], np.float32)
    np.testing.assert_array_equal(op(Tensor(x0), Tensor(x1)).asnumpy(), [[2.0, 2.0], [4.0, 4.0]])
    assert seen == [([2, 2], [2, 2])]  # the callables get the input shapes as lists
    op(Tensor(x0), Tensor(x1))
    assert len(seen) == 1  # and run once per input signature
    np.testing.assert_array_equal(op(Tensor([1.0]), Tensor([2.0])).asnumpy(), [3.0])
    assert seen[-1] == ([1], [1])


def test_kernel_status_checks_reach_python():
    # the seed kernel returns 2 for a non-float32 dtype: the runtime reports that status
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=lambda x, _: x, out_dtype=lambda x, _: x)
    with pytest.raises(RuntimeError, match=r"aot operator 'CustomAdd' in .*aot_add.* returned status 2$"):
        op(Tensor([1.0], rt.float64), Tensor([1.0], rt.float64))


def test_a_source_path_is_built_on_first_use_and_cached(tmp_path, cache_dir):
    src = tmp_path / "my_add.cc"  # .cc is a source too
    shutil.copy(ADD, src)
    op = ops.Custom(f"{src}:CustomAdd", out_shape=[2], out_dtype=rt.float32)
    lib = Path(op._kernel.library)
    assert lib.suffix == ".so" and cache_dir in lib.parents
    np.testing.assert_array_equal(op(Tensor([1.0, 2.0]), Tensor([3.0, 4.0])).asnumpy(), [4.0, 6.0])
    # the same contents: the same library, nothing rebuilt
    assert ops.Custom(f"{src}:CustomAdd", out_shape=[2], out_dtype=rt.float32)._kernel.library == str(lib)
    # edited contents: a new library with the new code
    src.write_text(src.read_text().replace("out[i] = x[i] + y[i];", "out[i] = x[i] - y[i];"))
    op2 = ops.Custom(f"{src}:CustomAdd", out_shape=[2], out_dtype=rt.float32)
    assert op2._kernel.library != str(lib)
    np.testing.assert_array_equal(op2(Tensor([1.0, 2.0]), Tensor([3.0, 5.0])).asnumpy(), [-2.0, -3.0])


def test_a_prebuilt_library_path():
    lib = build_library("aot_add_prebuilt", [ADD])
    op = ops.Custom(f"{lib}:CustomAdd", out_shape=[1], out_dtype=rt.float32)
    assert op._kernel.library == lib
    assert op(Tensor([1.5]), Tensor([2.0])).item() == 3.5


def test_a_library_rebuilt_at_the_same_path_is_the_new_code(tmp_path):
    # the seed's workflow: g++ --shared -o add.so add.cc, use it, edit, rebuild to the same path, use it
    src, lib = tmp_path / "k.cc", tmp_path / "k.so"

    def build(value):
        src.write_text('#include <cstdint>\nextern "C" int K(int, void **params, int *, int64_t **, const char **, '
                       f'void *, void *) {{ static_cast<float *>(params[1])[0] = {value}f; return 0; }}\n')
        subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, timeout=120)

    build(1.0)
    old = ops.Custom(f"{lib}:K", out_shape=[1], out_dtype=rt.float32)
    assert old(Tensor([0.0])).item() == 1.0
    build(2.0)
    # the loader still holds the first build under this path: it was handed back, old code, silently
    assert ops.Custom(f"{lib}:K", out_shape=[1], out_dtype=rt.float32)(Tensor([0.0])).item() == 2.0
    assert ops.Custom(f"{lib}:K", out_shape=[1], out_dtype=rt.float32)(Tensor([0.0])).item() == 2.0
    assert old(Tensor([0.0])).item() == 1.0  # an op made before keeps the code it was made with
    build(3.0)
    assert ops.Custom(f"{lib}:K", out_shape=[1], out_dtype=rt.float32)(Tensor([0.0])).item() == 3.0
    assert sorted(tmp_path.iterdir()) == sorted([src, lib])  # no copy left beside it


def test_params_are_inputs_then_outputs_with_their_shapes_and_dtype_names():
    inputs = [Tensor(np.zeros((2, 1 + k % 3), dtype=d)) for k, d in enumerate(DTYPES)]
    op = ops.Custom(f"{ABI}:Describe", out_shape=[64], out_dtype=rt.int64)
    out = op(*inputs).asnumpy().tolist()
    expected = [len(DTYPES) + 1]
    for k, x in enumerate(inputs):
        expected += [2, 2, 1 + k % 3, k]
    expected += [1, 64, DTYPES.index("int64")]  # the output itself comes last
    assert out == expected + [-9] * (64 - len(expected))


def test_scalar_and_empty_tensors():
    op = ops.Custom(f"{ABI}:Describe", out_shape=[8], out_dtype=rt.int64)
    assert op(Tensor(1.0, rt.float32)).asnumpy().tolist() == [2, 0, 1, 1, 8, 6, -9, -9]
    copy = ops.Custom(f"{ABI}:CopyBytes", out_shape=lambda x: x, out_dtype=lambda x: x)
    assert copy(Tensor(np.zeros((0, 3), np.float32))).shape == (0, 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 4)) * 50).astype(dtype)
    copy = ops.Custom(f"{ABI}:CopyBytes", out_shape=lambda s: s, out_dtype=lambda d: d)
    out = copy(Tensor(x))
    assert out.dtype == rt.dtypes.to_dtype(dtype)
    np.testing.assert_array_equal(out.asnumpy(), x)


def test_inputs_are_made_contiguous():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    copy = ops.Custom(f"{ABI}:CopyBytes", out_shape=lambda s: s, out_dtype=lambda d: d)
    for view in (x.T, x[:, ::2], x[::-1]):
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(copy(Tensor(view)).asnumpy(), np.ascontiguousarray(view))


def test_numpy_arrays_and_numbers_are_inputs_too():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[], out_dtype=rt.float32)
    assert op(np.float32(1.5), 2.0).item() == 3.5


def test_several_outputs():
    sincos = ops.Custom(f"{OPS}:SinCos", out_shape=lambda x: [x, x], out_dtype=lambda x: [x, x])
    x = np.linspace(-2, 2, 7)
    s, c = sincos(Tensor(x))
    np.testing.assert_allclose(s.asnumpy(), np.sin(x))
    np.testing.assert_allclose(c.asnumpy(), np.cos(x))
    fixed = ops.Custom(f"{OPS}:SinCos", out_shape=[[3], [3]], out_dtype=[rt.float32, rt.float32])
    assert [t.shape for t in fixed(Tensor([0.0, 1.0, 2.0]))] == [(3,), (3,)]


class LeakyReluNet(nn.Cell):
    """The seed's ATen LeakyRelu network, with a plain C++ kernel (slope 0.01)."""

    def __init__(self):
        super().__init__()
        self.leaky_relu = ops.Custom(f"{OPS}:LeakyRelu", out_shape=lambda x: x, out_dtype=lambda x: x,
                                     func_type="aot")

    def construct(self, x):
        return self.leaky_relu(x)


def test_seed_leaky_relu_inside_a_cell():
    x0 = np.array([[0.0, -0.1], [-0.2, 1.0]]).astype(np.float32)
    out = LeakyReluNet()(Tensor(x0))
    assert out.dtype == rt.float32
    np.testing.assert_allclose(out.asnumpy(), [[0.0, -0.001], [-0.002, 1.0]], rtol=1e-6)


# ---- errors -------------------------------------------------------------------

def test_a_failing_status_names_symbol_library_and_status():
    op = ops.Custom(f"{ABI}:FailWith42", out_shape=[1], out_dtype=rt.float32)
    with pytest.raises(RuntimeError) as e:
        op(Tensor([1.0]))
    msg = str(e.value)
    assert "'FailWith42'" in msg and "status 42" in msg
    assert op._kernel.library in msg and op._kernel.library.endswith(".so")


def test_a_missing_symbol_names_it_and_the_library():
    with pytest.raises(AttributeError, match=r"symbol 'NoSuchOp' not found in aot library .*\.so.*extern \"C\""):
        ops.Custom(f"{ABI}:NoSuchOp", out_shape=[1], out_dtype=rt.float32)


def test_a_missing_library_or_source_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"aot library .*nowhere/libx\.so .*not found"):
        ops.Custom(f"{tmp_path}/nowhere/libx.so:Op", out_shape=[1], out_dtype=rt.float32)
    with pytest.raises(FileNotFoundError, match=r"aot source .*missing\.cpp .*not found"):
        ops.Custom(f"{tmp_path}/missing.cpp:Op", out_shape=[1], out_dtype=rt.float32)


def test_a_file_that_is_not_a_library(tmp_path):
    bad = tmp_path / "libbad.so"
    bad.write_text("not an ELF file")
    with pytest.raises(OSError, match=r"aot library .*libbad\.so could not be loaded"):
        ops.Custom(f"{bad}:Op", out_shape=[1], out_dtype=rt.float32)


def test_a_source_that_does_not_compile_is_a_build_error(tmp_path):
    from opbuilder import BuildError
    src = tmp_path / "broken.cpp"
    src.write_text('extern "C" int Op() { return undefined_name; }\n')
    with pytest.raises(BuildError, match="undefined_name"):
        ops.Custom(f"{src}:Op", out_shape=[1], out_dtype=rt.float32)


@pytest.mark.parametrize("func", ["custom_add.so", "lib.so:", ":Sym", "lib.so:not-a-symbol"])
def test_func_must_be_path_colon_symbol(func):
    with pytest.raises(ValueError, match="aot func"):
        ops.Custom(func, out_shape=[1], out_dtype=rt.float32)


def test_unknown_func_type_lists_the_accepted_ones():
    # "akg" (hybrid DSL kernels) is supported now; "tbe" (Ascend TBE) is not
    with pytest.raises(ValueError, match="func_type 'tbe' is not supported; accepted: aot, pyfunc, hybrid, akg"):
        ops.Custom(lambda x: x, func_type="tbe")


def test_aot_needs_out_shape_and_a_string_func():
    with pytest.raises(ValueError, match="needs out_shape"):
        ops.Custom(f"{ADD}:CustomAdd", out_dtype=rt.float32)
    with pytest.raises(TypeError, match="an aot func is a string"):
        ops.Custom(len, out_shape=[1], func_type="aot")


def test_out_shape_and_out_dtype_must_agree():
    with pytest.raises(ValueError, match="out_shape gives 2 output\\(s\\) but out_dtype 1"):
        ops.Custom(f"{OPS}:SinCos", out_shape=[[1], [1]], out_dtype=rt.float32)
    with pytest.raises(ValueError, match=r"output 0 shape \[2, -1\] is not a list of non-negative ints"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[2, -1], out_dtype=rt.float32)
    with pytest.raises(TypeError, match="output 0 dtype: not a dtype"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[2], out_dtype="float128x")
    bad = ops.Custom(f"{ADD}:CustomAdd", out_shape=lambda x, y: 3, out_dtype=lambda x, y: x)
    with pytest.raises(ValueError, match="output 0 shape 3 is not a list"):
        bad(Tensor([1.0]), Tensor([1.0]))


def test_inputs_must_be_tensors_arrays_or_numbers():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32)
    with pytest.raises(TypeError, match="Custom 'CustomAdd': input 1 is a str"):
        op(Tensor([1.0]), "2")
    with pytest.raises(TypeError, match="unsupported tensor dtype float128"):  # (complex128 is a dtype now)
        op(Tensor([1.0]), np.array([1.0], np.longdouble))
    torch = pytest.importorskip("torch", reason="torch is not installed")
    # "input 1 is a Tensor; pass Tensors, ..." named torch's class by its bare name (attack on 07d2521)
    with pytest.raises(TypeError, match=r"^Custom 'CustomAdd': input 1 is a torch.Tensor; pass Tensors, numpy arrays "
                                        r"or numbers \(runtime.from_dlpack\(x\) makes a Tensor of another library's "
                                        r"array\)$"):
        op(Tensor([1.0]), torch.ones(1))


def test_the_compiled_call_path_rejects_what_custom_never_passes():
    from runtime.ops.aot_trampoline import trampoline
    tr = trampoline()
    with pytest.raises(TypeError, match=r"run\(fn, extra, inputs, out_specs, scratch\) takes 5 arguments, got 2"):
        tr.run(0, 0)
    with pytest.raises(TypeError, match="argument 2 must be a tuple"):
        tr.run(0, 0, [], (), ())
    with pytest.raises(TypeError, match="input 0 is a str, not a numpy array"):
        tr.run(0, 0, ("x",), (), ())
    with pytest.raises(TypeError, match="input 0 has a dtype aot operators do not take"):
        tr.run(0, 0, (np.array([1.0], np.longdouble),), (), ())  # (complex is an aot dtype now)
    with pytest.raises(TypeError, match="out_specs entries must be \\(shape, dtype\\)"):
        tr.run(0, 0, (), ((1,),), ())
    with pytest.raises(ValueError, match="negative dimensions"):
        tr.run(0, 0, (), (((-1,), np.float32),), ())

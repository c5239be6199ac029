"""The C++ Tensor API and the zero-copy bridge to runtime.Tensor."""
import subprocess

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor
from opbuilder import include_dir


def test_inputs_are_not_copied(api_ops):
    a = np.arange(6.0).reshape(2, 3)
    assert api_ops.data_ptr(rt.from_numpy(a)) == a.ctypes.data
    assert api_ops.data_ptr(a) == a.ctypes.data  # plain numpy arrays are accepted too


def test_outputs_made_in_cpp_are_not_copied(api_ops):
    t = api_ops.arange(5)
    assert isinstance(t, Tensor) and t.dtype == rt.float32
    assert t.asnumpy().ctypes.data == api_ops.last_alloc()
    np.testing.assert_array_equal(t.asnumpy(), np.arange(5))
    assert t.asnumpy().ctypes.data % 64 == 0  # 64-byte aligned storage


def test_writes_in_cpp_are_seen_in_python(api_ops):
    a = np.zeros(4)
    api_ops.fill_(rt.from_numpy(a), 2.5)
    np.testing.assert_array_equal(a, 2.5)


def test_returning_an_input_returns_the_same_python_object(api_ops):
    t = Tensor(np.ones(3))
    assert api_ops.identity(t) is t


def test_tensor_metadata(api_ops):
    a = np.zeros((2, 3, 4), np.float32).transpose(2, 0, 1)
    info = api_ops.info(rt.from_numpy(a))  # a strided view (Tensor() would copy it)
    assert info["shape"] == [4, 2, 3] and info["strides"] == [1, 12, 4]
    assert info["dtype"] == "float32" and info["same_dtype"] and info["numel"] == 24 and info["ndim"] == 3
    assert info["nbytes"] == 96 and not info["contiguous"] and info["device"] == "cpu"
    assert not info["requires_grad"]
    assert api_ops.info(Tensor(np.ones(2), requires_grad=True))["requires_grad"]
    c = api_ops.info(Tensor(np.zeros((2, 3))))
    assert c["contiguous"] and c["strides"] == [3, 1]


def test_mindspore_size_names(api_ops):
    assert api_ops.ms_sizes(Tensor(np.zeros((2, 3, 4)))) == (24, 192, True, True)
    assert api_ops.ms_sizes(Tensor(np.zeros((5,), np.int16))) == (5, 10, True, False)
    assert api_ops.ms_sizes(Tensor(np.zeros((0, 3), np.float32))) == (0, 0, True, False)


def test_contiguous_copies_only_when_needed(api_ops):
    a = np.arange(12.0).reshape(3, 4)
    t = Tensor(a)
    assert api_ops.contiguous(t) is t
    v = rt.from_numpy(a.T)
    c = api_ops.contiguous(v)
    assert c is not v and api_ops.info(c)["contiguous"]
    np.testing.assert_array_equal(c.asnumpy(), a.T)
    r = rt.from_numpy(a[::-1, ::2])  # negative and step strides
    np.testing.assert_array_equal(api_ops.contiguous(r).asnumpy(), a[::-1, ::2])


@pytest.mark.parametrize("dtype", [rt.bool_, rt.int8, rt.int16, rt.int32, rt.int64, rt.uint8, rt.float16,
                                   rt.float32, rt.float64])
def test_every_dtype_round_trips(api_ops, dtype):
    code = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"].index(dtype.name)
    z = api_ops.zeros([2, 3], code)
    assert z.dtype == dtype and z.shape == (2, 3) and not z.asnumpy().any()
    src = Tensor(np.ones((2, 2), dtype.np))
    assert api_ops.info(src)["dtype"] == dtype.name
    assert api_ops.empty_like(src).dtype == dtype


def test_data_with_the_wrong_type_is_a_type_error(api_ops):
    with pytest.raises(TypeError, match="dtype float32, but T is float64"):
        api_ops.read_double(Tensor(np.ones(2, np.float32)))


def test_unsupported_numpy_dtype_is_a_type_error(api_ops):
    with pytest.raises(TypeError, match="unsupported tensor dtype float128"):
        api_ops.info(np.ones(2, np.longdouble))  # (complex128, the example here, is a tensor dtype now)


def test_lists_of_tensors(api_ops):
    assert api_ops.count([Tensor(1.0), Tensor(2.0), np.ones(2)]) == 3
    t = Tensor(np.ones(3))
    a, b = api_ops.pair(t)
    assert a is t and b.shape == (3,) and not b.asnumpy().any()


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, -2.5, 65504.0, 6.1035156e-05, 5.9604645e-08, 0.1, 7e4, -1e-9])
def test_half_matches_numpy(api_ops, value):
    with np.errstate(over="ignore"):  # 7e4 is past float16's range: both must give inf
        want = np.float16(value)
    assert api_ops.half_bits(value) == int(want.view(np.uint16))
    assert api_ops.half_roundtrip(value) == float(want)


@pytest.mark.parametrize("kind,exc", [("invalid_argument", ValueError), ("out_of_range", IndexError),
                                      ("other", RuntimeError)])
def test_cpp_exceptions_map_to_python_types(api_ops, kind, exc):
    with pytest.raises(exc, match="from C\\+\\+"):
        api_ops.throw_(kind)


@pytest.mark.build
def test_headers_compile_without_warnings(tmp_path):
    """extension.h and ms_extension.h under -Wall -Wextra -Werror (C++17)."""
    import pybind11
    import sysconfig
    src = tmp_path / "w.cpp"
    src.write_text('#include "opbuilder/extension.h"\n#include "ms_extension.h"\n'
                   "using namespace opbuilder;\n"
                   "struct F : Function<F> {\n"
                   "  static TensorPtr Forward(AutogradContext *c, const TensorPtr &x, int64_t k) {\n"
                   "    c->SaveForBackward({x}); (void)k; return x->contiguous(); }\n"
                   "  static TensorPtrList Backward(AutogradContext *c, TensorPtrList g) {\n"
                   "    (void)c->GetSavedTensors(); return {g[0]}; }\n};\n"
                   "struct UserState { TensorPtr t; ShapeVector s; };  // user types holding ours\n"
                   "using namespace mindspore;  // both namespaces open: MindSpore's names are not ambiguous\n"
                   "static_assert(TypeId::kNumberTypeFloat32 == kFloat32 && kNumberTypeInt64 == DataType::kInt64);\n"
                   "inline TensorPtr MsEmpty() {\n"
                   "  return std::make_shared<tensor::BaseTensor>(TypeId::kNumberTypeFloat16, ShapeVector{2}); }\n"
                   "inline size_t MsBytes(const tensor::TensorPtr &t) { tensor::Tensor &r = *t; return r.Size(); }\n"
                   "inline pynative::autograd::TensorPtrList MsList() { return {MsEmpty()}; }\n"
                   "PYBIND11_MODULE(w, m) { m.def(\"f\", [](const TensorPtr &x) { return F::Apply(x, 2); }); }\n")
    cmd = ["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{include_dir()}",
           "-isystem", pybind11.get_include(), "-isystem", sysconfig.get_paths()["include"], str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr

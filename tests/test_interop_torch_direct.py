"""A CPU torch tensor passed straight to a C++ operator (no to_torch): read through DLPack's C
exchange table (include/opbuilder/detail/dlpack_exchange.h), with the runtime's Python path for
what that table cannot say. Memory arrives without a copy, dtypes as torch has them, a write the
operator declares reaches torch's version counter, and views DLPack cannot describe are refused."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

from op_util import BINDINGS, CPP, load_op

torch = pytest.importorskip("torch", reason="torch is not installed")

pytestmark = pytest.mark.build


@pytest.fixture(scope="session", params=BINDINGS)
def seed_ops(cache_dir, request):
    return load_op("seed_style_ops", [CPP / "seed_style_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                   binding=request.param)


def test_a_marked_write_reaches_torchs_version_counter(seed_ops):
    x = torch.zeros(3, dtype=torch.float64)
    y = torch.ones(3, dtype=torch.float64)
    before = x._version
    out = seed_ops.add_(x, y)  # MarkDirty({x}): x written in place
    assert x._version == before + 1
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert type(out) is Tensor
    out.asnumpy()[0] = 5.0  # the result is x's memory
    assert x[0].item() == 5.0
    assert y._version == 0  # only the written argument


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_write_reaches_torch_after_many_other_types(cache_dir, binding):
    """In a new process that hands an op 20 other types before its first torch tensor: the path kept a
    table of the first 16 types met, so torch.Tensor was then never taken as torch's, and a MarkDirty
    write skipped torch's version counter (silently: autograd missed it). Found by the full suite, where
    one worker had met many types first."""
    import subprocess
    import sys
    from builder_util import child_env
    code = ("import torch\nfrom op_util import CPP, load_op\n"
            f"m = load_op('seed_style_ops', [CPP / 'seed_style_ops.cpp'], cflags=['-Wall', '-Wextra', '-Werror'], "
            f"binding={binding!r})\n"
            "for i in range(20):\n"
            "    thing = type(f'Thing{i}', (), {})\n"
            "    try:\n        m.add_(thing(), thing())\n    except TypeError:\n        pass\n"
            "x = torch.zeros(3, dtype=torch.float64)\n"
            "m.add_(x, torch.ones(3, dtype=torch.float64))\n"
            "print(x._version, x.tolist())\n")
    tests = str(CPP.parent)
    env = child_env(PYTHONPATH=tests, OPBUILDER_CACHE_DIR=str(cache_dir))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[-2] == "1 [1.0, 1.0, 1.0]"


def test_torchs_autograd_sees_a_write_into_a_saved_tensor(seed_ops):
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    x = torch.zeros(3, dtype=torch.float64)
    loss = (w * x).sum()  # x saved for w's gradient
    seed_ops.add_(x, torch.ones(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        loss.backward()


class _Sub(torch.Tensor):
    """A torch.Tensor subclass: not torch's own type, so the C exchange table is not read for it."""


def _plain(t):
    return t


def _sub(t):
    return t.as_subclass(_Sub)


@pytest.mark.parametrize("kind", [_plain, _sub], ids=["tensor", "subclass"])
def test_a_write_into_a_saved_tensor_fails_torchs_backward(seed_ops, kind):
    """A subclass goes the Python way (runtime.interop.dlpack_input); its write reached the memory but not
    torch's version counter, so backward silently used the new values (a plain torch.Tensor raised)."""
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    x = kind(torch.zeros(3, dtype=torch.float64))
    loss = (w * x).sum()  # x saved for w's gradient
    seed_ops.add_(x, torch.ones(3, dtype=torch.float64))
    assert x._version == 1 and x.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"^one of the variables needed for gradient computation has been "
                                           r"modified by an inplace operation: \[torch\.DoubleTensor \[3\]\] is at "
                                           r"version 1; expected version 0 instead\."):
        loss.backward()


@pytest.mark.parametrize("kind", [_plain, _sub], ids=["tensor", "subclass"])
def test_a_write_into_a_saved_non_leaf_fails_torchs_backward(seed_ops, kind):
    """An argument that requires grad is taken detached (its version counter is the same). A write into it
    with torch's grad mode on is refused before it is done (issue 33: this route records nothing in torch's
    graph), for a plain tensor and a subclass alike; under no_grad it goes through and torch's backward
    refuses the changed saved tensor."""
    a = torch.ones(3, dtype=torch.float64, requires_grad=True)
    b = kind(a * 2)
    loss = (b * b).sum()  # b saved
    with pytest.raises(RuntimeError, match=r"^AddInPlace modifies argument 0 in place \(MarkDirty\), but it is a "
                                           r"torch tensor that requires grad, "):
        seed_ops.add_(b, torch.ones(3, dtype=torch.float64))
    assert b._version == 0 and b.tolist() == [2.0, 2.0, 2.0]
    with torch.no_grad():
        out = seed_ops.add_(b, torch.ones(3, dtype=torch.float64))
    assert b._version == 1 and b.tolist() == [3.0, 3.0, 3.0]
    np.testing.assert_array_equal(out.asnumpy(), [3.0, 3.0, 3.0])
    with pytest.raises(RuntimeError, match=r"^one of the variables needed for gradient computation has been "
                                           r"modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
                                   torch.uint32, torch.uint64, torch.bool, torch.complex64, torch.complex128])
def test_every_dtype_arrives_as_torch_has_it(dlpack_ops, dtype):
    x = (torch.arange(6) % 2 == 1) if dtype is torch.bool else (torch.arange(6) + 1).to(dtype)
    x = x.reshape(2, 3)
    assert dlpack_ops.address(x) == x.data_ptr()
    back = dlpack_ops.identity(x)  # a runtime.Tensor over the same memory
    arr = back.asnumpy()
    assert type(back) is Tensor and arr.dtype.name == str(x.dtype).replace("torch.", "") and arr.shape == (2, 3)
    if dtype is torch.bfloat16:
        np.testing.assert_array_equal(arr.astype(np.float64), x.to(torch.float64).numpy())
    else:
        np.testing.assert_array_equal(arr, x.numpy())


def test_views_keep_their_strides_and_offset(dlpack_ops):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    for v in (base[1:, 2:], base.t(), torch.ones(1, dtype=torch.float64).expand(5), base[2, 3]):
        assert dlpack_ops.address(v) == v.data_ptr()
        np.testing.assert_array_equal(dlpack_ops.twice(v).asnumpy(), 2 * v.numpy())


def test_the_result_keeps_the_torch_tensors_memory_alive(dlpack_ops):
    back = dlpack_ops.identity(torch.arange(5, dtype=torch.float64))
    gc.collect()
    np.testing.assert_array_equal(back.asnumpy(), np.arange(5.0))


def test_a_returned_argument_pins_the_torch_storage(dlpack_ops):
    x = torch.arange(4, dtype=torch.float64)
    back = dlpack_ops.identity(x)  # a numpy array over x's memory now lives in `back`
    with pytest.raises(RuntimeError, match=r"^Trying to resize storage that is not resizable$"):
        x.resize_(1 << 20)  # would free the memory `back` points to
    np.testing.assert_array_equal(back.asnumpy(), np.arange(4.0))


def test_a_parameter_is_taken_and_a_subclass_goes_the_python_way(dlpack_ops):
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    assert dlpack_ops.address(p) == p.data_ptr()
    np.testing.assert_array_equal(dlpack_ops.twice(p).asnumpy(), np.full(3, 2.0))
    assert p.grad is None

    class Mine(torch.Tensor):
        pass
    m = torch.arange(3, dtype=torch.float64).as_subclass(Mine)
    np.testing.assert_array_equal(dlpack_ops.twice(m).asnumpy(), np.array([0.0, 2.0, 4.0]))


_NEG = (r"^from_dlpack: a torch tensor with the negative bit set \(a lazily negated view, such as "
        r"x\.conj\(\)\.imag\) cannot be shared through DLPack; pass x\.resolve_neg\(\)$")


def test_a_negative_view_is_read_resolved_not_negated(dlpack_ops):
    """An operator gets a negative view as a resolved copy, as on to_torch (issue 33: one semantics; a write
    into it is refused, tests/test_torch_routes_semantics.py); sharing its memory stays refused."""
    v = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128).conj().imag  # [-2, -4], stored as [2, 4]
    assert v.is_neg()
    np.testing.assert_array_equal(dlpack_ops.twice(v).asnumpy(), [-4.0, -8.0])
    np.testing.assert_array_equal(dlpack_ops.twice(v.detach()).asnumpy(), [-4.0, -8.0])
    with pytest.raises(BufferError, match=_NEG):
        rt.from_dlpack(v)
    np.testing.assert_array_equal(dlpack_ops.twice(v.resolve_neg()).asnumpy(), [-4.0, -8.0])


def test_a_conjugate_view_is_read_as_a_resolved_copy(dlpack_ops):
    c = torch.tensor([1 + 2j], dtype=torch.complex128).conj()
    assert dlpack_ops.address(c) != c.data_ptr()  # DLPack has no conjugate bit: a copy with its values
    np.testing.assert_array_equal(dlpack_ops.identity(c).asnumpy(), [1 - 2j])
    with pytest.raises(BufferError, match=r"^Can't export tensors with the conjugate bit set$"):
        rt.from_dlpack(c)


def test_float8_is_named_by_the_python_path(dlpack_ops):
    with pytest.raises(TypeError, match=r"^from_dlpack: Tensor has DLPack dtype float8_e4m3fn, which numpy cannot "
                                        r"read \(bfloat16 is taken from torch and JAX tensors\)$"):
        dlpack_ops.address(torch.ones(2, dtype=torch.float8_e4m3fn))


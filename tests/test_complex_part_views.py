"""``ops.real``/``ops.imag`` of a complex tensor are views of it (a bit cast: each complex element is two
reals). Written through, or read after their base was written, their gradient goes to the base's history
at the right part of each element, as torch's AsStridedBackward does: the real part gets ``g``, the
imaginary part ``1j * g``. Before, both raised "a bit cast cannot be differentiated"."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from inplace_util import PyAdd, PyScale
from runtime import Tensor, ops

Z0 = np.array([1 + 2j, 3 - 1j, -0.5 + 0.25j])
Y0 = np.array([2.0, -1.0, 0.5])
C1, C2 = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 4.0])
PART = {"real": np.real, "imag": np.imag}


def _complex_central(f, w, eps=1e-6):
    """torch's gradient of the real f at complex w: dL/dRe + 1j dL/dIm, by central differences."""
    g = np.zeros_like(w)
    for i in range(w.size):
        for unit in (1.0, 1j):
            d = np.zeros_like(w)
            d[i] = eps * unit
            g[i] += unit * (f(w + d) - f(w - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("part", sorted(PART))
def test_a_part_read_after_its_base_was_written_under_no_grad_takes_the_base_history(part):
    w = Tensor(Z0.copy(), requires_grad=True)
    z = w * 1.0
    r = getattr(ops, part)(z)
    with rt.no_grad():
        z[0] = 5 + 5j  # not differentiated: r reads the new value, its gradient goes to w through z
    (r * r).sum().backward()
    now = PART[part](z.asnumpy())
    assert now[0] == 5.0
    want = 2 * now * (1 if part == "real" else 1j)
    np.testing.assert_array_equal(w.grad.asnumpy(), want.astype(np.complex128))


WRITES = {  # how a custom Function writes the part view r, and its numpy twin
    "scale": (lambda r, y: PyScale.apply(r, 3.0), lambda r, y: r.__imul__(3.0)),
    "add": (lambda r, y: PyAdd.apply(r, y), lambda r, y: r.__iadd__(y)),
    "add_into_a_slice": (lambda r, y: PyAdd.apply(r[1:], y[1:] * 2.0),
                         lambda r, y: r[1:].__iadd__(y[1:] * 2.0)),
}


def _loss_np(part, write, w, y):
    z = w.copy()
    r = getattr(z, part)  # numpy's real/imag of a complex array are views, as the runtime's
    write(r, y)
    return np.sum(z.real * C1 + z.imag * C2) + np.sum(r * r)


@pytest.mark.parametrize("form", sorted(WRITES))
@pytest.mark.parametrize("part", sorted(PART))
def test_a_function_writing_a_part_view_gives_the_gradient_to_the_base(part, form):
    write, write_np = WRITES[form]
    w, y = Tensor(Z0.copy(), requires_grad=True), Tensor(Y0.copy(), requires_grad=True)
    z = w * 1.0
    r = getattr(ops, part)(z)
    write(r, y)
    loss = (ops.real(z) * Tensor(C1) + ops.imag(z) * Tensor(C2)).sum() + (r * r).sum()
    np.testing.assert_allclose(loss.asnumpy(), _loss_np(part, write_np, Z0, Y0), rtol=1e-12)
    loss.backward()
    np.testing.assert_allclose(w.grad.asnumpy(), _complex_central(lambda v: _loss_np(part, write_np, v, Y0), Z0),
                               rtol=1e-6, atol=1e-8)
    if form != "scale":
        from numeric_util import central
        np.testing.assert_allclose(y.grad.asnumpy(), central(lambda v: _loss_np(part, write_np, Z0, v), Y0),
                                   rtol=1e-6, atol=1e-8)


def test_a_view_of_another_dtype_is_still_refused():
    """Only the real pairs of a complex base are understood: other bit casts stay a named error."""
    from runtime.autograd.views import view_indices
    base = np.zeros(4, np.float64)
    with pytest.raises(RuntimeError, match=r"^an in-place write into a view of dtype int64 of a base of dtype "
                                           r"float64 \(a bit cast\) cannot be differentiated; write into a copy$"):
        view_indices(base.view(np.int64), base)


@pytest.mark.parametrize("part", sorted(PART))
def test_a_part_of_a_leaf_read_after_the_leaf_was_written_under_no_grad(part):
    """real/imag's rules read their input's dtype only, but were declared to read its values: the write
    was refused ("argument 0 of real is at version 1"), where torch gives 2 * the part's new values."""
    w = Tensor(Z0.copy(), requires_grad=True)
    r = getattr(ops, part)(w)
    with rt.no_grad():
        w[0] = 7 + 7j
    (r * r).sum().backward()
    now = PART[part](w.asnumpy())
    np.testing.assert_array_equal(w.grad.asnumpy(), (2 * now * (1 if part == "real" else 1j)).astype(np.complex128))

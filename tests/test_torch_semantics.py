"""to_torch keeps torch's semantics on every Python route of a call (issue 33): the first call of a
signature (torch.library's registered operator), later eager calls, the operator handle itself, calls
under a TorchFunctionMode and with nn.Parameter arguments; all with OPBUILDER_TORCH_BRIDGE=0 (the tests'
default). Each case is compared with what torch's own operators do: gradients kept per call (not per
data pointer), saved inputs version-checked, version counters shared with arguments returned or written,
one named error for double backward, tuples for several outputs, plain values returned as they are."""
from __future__ import annotations

import copy
import io
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402
from opbuilder.bridges.interop_torch import op_handle  # noqa: E402

pytestmark = pytest.mark.build

SRC = r'''
#include <cmath>
#include <string>
#include "opbuilder/extension.h"
using namespace opbuilder;

namespace {
TensorPtr Like(const TensorPtr &x) { return std::make_shared<Tensor>(x->dtype(), x->shape()); }
TensorPtr Scaled(const TensorPtr &g, double k) {
  auto out = Like(g);
  const double *s = g->data<double>();
  double *d = out->data<double>();
  for (int64_t i = 0; i < out->numel(); ++i) d[i] = k * s[i];
  return out;
}
}  // namespace

// returns x unchanged; the gradient passes through
struct Ident : Function<Ident> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};
// x *= 2 in place (MarkDirty), returns x
struct Scale : Function<Scale> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    double *p = x->data<double>();
    for (int64_t i = 0; i < x->numel(); ++i) p[i] *= 2;
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], 2)}; }
};
// x + y, saves nothing (torch's add: a later write into x or y is no error)
struct Add : Function<Add> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &y) {
    auto out = Like(x);
    const double *a = x->data<double>(), *b = y->data<double>();
    double *o = out->data<double>();
    for (int64_t i = 0; i < out->numel(); ++i) o[i] = a[i] + b[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], g[0]}; }
};
// (2x, 3x)
struct Two : Function<Two> {
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) { return {Scaled(x, 2), Scaled(x, 3)}; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto a = Scaled(g[0], 2), b = Scaled(g[1], 3);
    double *p = a->data<double>();
    const double *q = b->data<double>();
    for (int64_t i = 0; i < a->numel(); ++i) p[i] += q[i];
    return {a};
  }
};
// x = exp(x) in place (MarkDirty), saving the result for Backward (torch's exp_)
struct ExpInplace : Function<ExpInplace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    double *p = x->data<double>();
    for (int64_t i = 0; i < x->numel(); ++i) p[i] = std::exp(p[i]);
    ctx->MarkDirty({x});
    ctx->SaveForBackward({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto saved = ctx->GetSavedTensors();
    auto out = Like(g[0]);
    const double *s = g[0]->data<double>(), *e = saved[0]->data<double>();
    double *d = out->data<double>();
    for (int64_t i = 0; i < out->numel(); ++i) d[i] = s[i] * e[i];
    return {out};
  }
};
// the out= pattern (pytorch/extension-cpp's myadd_out): out = x + y, returns nothing
void AddOut(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) {
  const double *a = x->data<double>(), *b = y->data<double>();
  double *o = out->data<double>();
  for (int64_t i = 0; i < out->numel(); ++i) o[i] = a[i] + b[i];
}
double Total(const TensorPtr &x) {
  double s = 0;
  const double *p = x->data<double>();
  for (int64_t i = 0; i < x->numel(); ++i) s += p[i];
  return s;
}
// k * x * y, saving x and y (torch's k * x * y): k a float, or an int
struct MulK : Function<MulK> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y, double k) {
    ctx->SaveForBackward({x, y});
    ctx->saved_data["k"] = k;
    auto out = Like(x);
    const double *a = x->data<double>(), *b = y->data<double>();
    double *o = out->data<double>();
    for (int64_t i = 0; i < out->numel(); ++i) o[i] = k * a[i] * b[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    double k = ctx->saved_data["k"].cast<double>();
    auto s = ctx->GetSavedTensors();
    auto gx = Like(g[0]), gy = Like(g[0]);
    const double *d = g[0]->data<double>(), *a = s[0]->data<double>(), *b = s[1]->data<double>();
    double *p = gx->data<double>(), *q = gy->data<double>();
    for (int64_t i = 0; i < gx->numel(); ++i) { p[i] = k * d[i] * b[i]; q[i] = k * d[i] * a[i]; }
    return {gx, gy, nullptr};
  }
};
// x *= k in place (MarkDirty), returns x (torch's mul_ by a scalar)
struct ScaleK : Function<ScaleK> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    double *p = x->data<double>();
    for (int64_t i = 0; i < x->numel(); ++i) p[i] *= k;
    ctx->MarkDirty({x});
    ctx->saved_data["k"] = k;
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Scaled(g[0], ctx->saved_data["k"].cast<double>()), nullptr};
  }
};
std::string Name(const TensorPtr &) { return "hello"; }
TensorPtr PlainIdent(const TensorPtr &x) { return x; }

OB_MODULE(m) {
  m.def("ident", [](const TensorPtr &x) { return Ident::Apply(x); });
  m.def("scale_", [](const TensorPtr &x) { return Scale::Apply(x); });
  m.def("exp_", [](const TensorPtr &x) { return ExpInplace::Apply(x); });
  m.def("add", [](const TensorPtr &x, const TensorPtr &y) { return Add::Apply(x, y); });
  m.def("two", [](const TensorPtr &x) { return Two::Apply(x); });
  m.def("add_out", &AddOut);
  m.def("total", &Total);
  m.def("name", &Name);
  m.def("plain_ident", &PlainIdent);
  m.def("mulk", [](const TensorPtr &x, const TensorPtr &y, double k) { return MulK::Apply(x, y, k); });
  m.def("mulki", [](const TensorPtr &x, const TensorPtr &y, int64_t k) { return MulK::Apply(x, y, double(k)); });
  m.def("scale_k", [](const TensorPtr &x, double k) { return ScaleK::Apply(x, k); });
}
'''

PATHS = ("first", "eager", "handle", "mode", "parameter")
DOUBLE = torch.float64


@pytest.fixture(scope="module")
def sem_ops(cache_dir):
    return opbuilder.load_inline("torch_semantics_ops", SRC)


class _Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _call(path, module, name, *args):
    """``name`` of a fresh to_torch(module) called with ``args`` on one route: the signature's first call
    (the registered operator), a later eager call, the operator handle, under a TorchFunctionMode, or
    (``parameter``) with nn.Parameter arguments (``_t(..., path=path)`` makes them)."""
    ns = opbuilder.to_torch(module)
    fn = getattr(ns, name)
    if path == "eager":  # the signature's first call, on copies: later calls take the eager path
        fn(*[a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args])
    if path == "handle":
        out = op_handle(fn, *args)(*args)
        return out[0] if len(out) == 1 else tuple(out)
    if path == "mode":
        with _Passthrough():
            return fn(*args)
    return fn(*args)


def _t(*values, grad=False, path=None):
    t = torch.tensor(values, dtype=DOUBLE, requires_grad=grad)
    return torch.nn.Parameter(t) if grad and path == "parameter" else t


# ---- #4: the graph of each call, not of a data pointer --------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_an_op_returning_its_input_keeps_the_earlier_ops_gradient(sem_ops, my_ops, path):
    ns = opbuilder.to_torch(my_ops)
    x, y = _t(1.0, 2.0, 3.0, grad=True, path=path), _t(4.0, 5.0, 6.0)
    z = ns.mul(x, y)
    w = _call(path, sem_ops, "ident", z)  # returns z unchanged: the same memory as mul's output
    (w * _t(1.0, 10.0, 100.0)).sum().backward()
    torch.testing.assert_close(x.grad, y * _t(1.0, 10.0, 100.0))


@pytest.mark.parametrize("path", PATHS)
def test_an_op_on_a_view_of_an_output_keeps_the_earlier_ops_gradient(sem_ops, my_ops, path):
    ns = opbuilder.to_torch(my_ops)
    x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0)
    z = ns.mul(x, y)
    w = _call(path, sem_ops, "ident", z[1:])
    w.sum().backward()
    torch.testing.assert_close(x.grad, _t(0.0, 5.0, 6.0))


# ---- #5: saved inputs are version-checked --------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_a_saved_input_written_before_backward_is_an_error(my_ops, path):
    x, y = _t(1.0, 2.0, 3.0, grad=True, path=path), _t(4.0, 5.0, 6.0)
    z = _call(path, my_ops, "mul", x, y)  # saves y for x's gradient
    y.mul_(10)
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):  # torch's own mul does this
        zt = x * y
        y.mul_(10)
        zt.sum().backward()


@pytest.mark.parametrize("path", PATHS)
def test_an_input_the_op_did_not_save_may_be_written(sem_ops, path):
    x, y = _t(1.0, 2.0, 3.0, grad=True, path=path), _t(4.0, 5.0, 6.0, grad=True, path=path)
    z = _call(path, sem_ops, "add", x, y)  # Add saves nothing, as torch's add
    with torch.no_grad():
        y.mul_(10)
    z.sum().backward()
    torch.testing.assert_close(x.grad, _t(1.0, 1.0, 1.0))


@pytest.mark.parametrize("path", PATHS)
def test_a_non_leaf_saved_input_written_is_an_error(my_ops, path):
    a = _t(1.0, 2.0, 3.0, grad=True)
    x, y = a * 1, a * 2
    z = _call(path, my_ops, "mul", x, y)
    y.add_(1)
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()


# ---- #7: version counters shared with arguments returned or written ---------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_markdirty_bumps_the_callers_version_and_returns_the_argument(sem_ops, path):
    c = _t(1.0, 2.0)
    v = c._version
    r = _call(path, sem_ops, "scale_", c)
    assert c.tolist() == [2.0, 4.0]
    assert c._version > v  # torch's c.mul_(2) bumps it too
    a = _t(1.0, 2.0, 3.0, grad=True)
    b = a * 1
    v = b._version
    _call(path, sem_ops, "scale_", b)
    assert b._version > v
    if path == "eager":  # the eager path counts one write, as torch's b.mul_(2) (the registered
        assert b._version == v + 1  # operator's autograd counts it twice: torch allows more, never fewer)
    if path != "handle":  # the handle's schema returns a list of new tensors
        assert r is c


@pytest.mark.parametrize("path", PATHS)
def test_an_argument_returned_unchanged_shares_its_version_counter(sem_ops, my_ops, path):
    for name in ("plain_ident", "ident"):
        x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0)
        z = opbuilder.to_torch(my_ops).mul(x, y)  # saves y
        w = _call(path, sem_ops, name, y)  # y returned unchanged, no grad
        assert w.data_ptr() == y.data_ptr()
        w.add_(1)  # a write through the result is a write into y
        assert y.tolist() == [5.0, 6.0, 7.0]
        with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
            z.sum().backward()


@pytest.mark.parametrize("path", ("first", "eager", "handle", "mode"))
def test_markdirty_on_a_non_leaf_is_accepted_as_torch_does(sem_ops, path):
    a = _t(1.0, 2.0, 3.0, grad=True)
    b = a * 1
    r = _call(path, sem_ops, "scale_", b)
    assert r is b and b.tolist() == [2.0, 4.0, 6.0]
    (r * _t(1.0, 10.0, 100.0)).sum().backward()
    ref = a.detach().clone().requires_grad_()
    (ref * 1).mul_(2).mul(_t(1.0, 10.0, 100.0)).sum().backward()  # torch's own in-place op
    torch.testing.assert_close(a.grad, ref.grad)


@pytest.mark.parametrize("path", ("first", "eager", "handle", "mode"))
def test_markdirty_that_saves_its_result_differentiates_as_torch_does(sem_ops, path):
    a = _t(0.5, 1.0, 1.5, grad=True)
    b = a * 1
    r = _call(path, sem_ops, "exp_", b)
    assert r is b
    (r * _t(1.0, 10.0, 100.0)).sum().backward()  # the saved result was written by this op only: no error
    ref = a.detach().clone().requires_grad_()
    (ref * 1).exp_().mul(_t(1.0, 10.0, 100.0)).sum().backward()  # torch's own exp_
    torch.testing.assert_close(a.grad, ref.grad)
    b2 = a * 1
    r2 = _call(path, sem_ops, "exp_", b2)
    r2.add_(1)  # a later write into the saved result: an error, as for torch's exp_
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        r2.sum().backward()


@pytest.mark.parametrize("path", ("first", "eager", "handle", "mode"))
@pytest.mark.parametrize("what", ("leaf", "view", "no_grad view"))
def test_markdirty_on_a_leaf_that_requires_grad_is_refused_in_torchs_words(sem_ops, path, what):
    """On every route and call order, torch's own refusal of that write (what the C++ bridge says too),
    prefixed with the op's name; nothing is written. It said the runtime's words on the registered path
    and the first call of a signature, torch's on later bridged calls."""
    a = _t(1.0, 2.0, 3.0, grad=True)
    if what == "leaf":
        arg = a
    elif what == "view":
        arg = a[1:]
    else:
        with torch.no_grad():
            arg = a[1:]
    with pytest.raises(RuntimeError) as refused:
        _call(path, sem_ops, "scale_", arg)
    with pytest.raises(RuntimeError) as by_torch:
        arg.mul_(3.0)  # torch's own in-place op on the same tensor
    assert str(refused.value) == f"Scale: {by_torch.value}"
    assert a.tolist() == [1.0, 2.0, 3.0] and a._version == 0


# ---- #16: double backward is one named error ------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_double_backward_is_a_named_error_not_zeros(my_ops, path):
    x, y = _t(1.0, 2.0, 3.0, grad=True, path=path), _t(4.0, 5.0, 6.0, grad=True, path=path)
    z = _call(path, my_ops, "mul", x, y)
    (gx,) = torch.autograd.grad(z.sum(), x, create_graph=True)
    torch.testing.assert_close(gx.detach(), y.detach())  # the first gradient is right
    with pytest.raises(RuntimeError, match=r"^mul: double backward through an opbuilder operator is not supported: "
                                           r"its Backward is once-differentiable \(create_graph=True, then a "
                                           r"gradient of the gradient\)$"):
        gx.sum().backward()


# ---- #21: one answer on every path ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ("first", "eager", "mode", "parameter"))
def test_several_outputs_come_back_as_a_tuple(sem_ops, path):
    x = _t(1.0, 2.0, grad=True, path=path)
    out = _call(path, sem_ops, "two", x)
    assert type(out) is tuple and len(out) == 2
    (out[0] + out[1]).sum().backward()
    torch.testing.assert_close(x.grad, _t(5.0, 5.0))


@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_functions_returning_a_number_or_a_string_work(sem_ops, path):
    x = _t(1.0, 2.0, 3.5)
    assert _call(path, sem_ops, "total", x) == 6.5
    assert _call(path, sem_ops, "name", x) == "hello"


# ---- #15: the out= pattern ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_an_out_function_writes_and_returns_none(sem_ops, path):
    x, y, out = _t(1.0, 2.0, 3.0), _t(5.0, 4.0, 3.0), _t(0.0, 0.0, 0.0)
    assert _call(path, sem_ops, "add_out", x, y, out) is None
    assert out.tolist() == [6.0, 6.0, 6.0]


def test_an_out_function_keeps_its_write_under_compile(sem_ops):
    ns = opbuilder.to_torch(sem_ops)  # no shape rule: torch.compile runs the call eagerly

    def f(a, b):
        o = torch.zeros_like(a)
        ns.add_out(a, b, o)
        return o * 1
    x, y = _t(1.0, 2.0, 3.0), _t(5.0, 4.0, 3.0)
    assert torch.compile(f, backend="aot_eager")(x, y).tolist() == [6.0, 6.0, 6.0]


def test_a_declared_out_argument_is_in_the_schema_and_compiles_fullgraph(sem_ops):
    ns = opbuilder.to_torch(sem_ops, shape_fn={"add_out": lambda x, y, o: []}, mutates={"add_out": [2]})

    def f(a, b):
        o = torch.zeros_like(a)
        ns.add_out(a, b, o)
        return o * 1
    x, y = _t(1.0, 2.0, 3.0), _t(5.0, 4.0, 3.0)
    assert torch.compile(f, backend="aot_eager", fullgraph=True)(x, y).tolist() == [6.0, 6.0, 6.0]
    op = op_handle(ns.add_out, x, y, torch.zeros(3, dtype=DOUBLE))
    assert op._schema.arguments[2].alias_info.is_write
    torch.library.opcheck(op, (x, y, torch.zeros(3, dtype=DOUBLE)))


def test_bad_mutates(sem_ops):
    with pytest.raises(ValueError, match=r"^to_torch: mutates names 'nope', which the module does not define "):
        opbuilder.to_torch(sem_ops, mutates={"nope": [0]})
    with pytest.raises(TypeError, match=r"^to_torch: mutates\['add_out'\] must be a non-empty list of argument "
                                        r"positions \(ints >= 0\), got 2$"):
        opbuilder.to_torch(sem_ops, mutates={"add_out": 2})
    ns = opbuilder.to_torch(sem_ops, mutates={"total": [1]})
    with pytest.raises(TypeError, match=r"^total: mutates names argument 1, but in this call it is missing; "):
        ns.total(_t(1.0))


# ---- #12: shape rules are checked against real outputs ----------------------------------------------------------

@pytest.mark.parametrize("path", ("first", "eager"))
def test_a_wrong_shape_rule_is_a_named_error_on_eager_calls(my_ops, path):
    x = _t(1.0, 2.0, 3.0)
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec(a.shape, np.dtype("float32"))})
    if path == "eager":
        with pytest.raises(RuntimeError):
            ns.mul(x, x)
    with pytest.raises(RuntimeError, match=r"^mul: the shape rule says output 0 is float32\[3\], but the operator "
                                           r"returned float64\[3\]; torch.compile would read the output with the "
                                           r"rule's shape and dtype, so fix the rule"):
        ns.mul(x, x)
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec((1,) + a.shape, a.dtype)})
    with pytest.raises(RuntimeError, match=r"^mul: the shape rule says output 0 is float64\[1, 3\], but the "
                                           r"operator returned float64\[3\]"):
        ns.mul(x, x)


@pytest.mark.parametrize("first, second", [(1, True), (True, 1), (0.0, -0.0), (1, 1.0)])
def test_the_shape_rules_answers_are_kept_by_type_and_exact_value(first, second):
    """#8's class in to_torch: the rule's cached answer for one static value is never reused for another
    that merely compares equal (True == 1, -0.0 == 0.0)."""
    import types
    import runtime as rt

    def width(k):
        return 3 if isinstance(k, bool) else 2 if isinstance(k, float) and np.signbit(k) else 1

    ns = opbuilder.to_torch(types.SimpleNamespace(widen=lambda x, k: rt.Tensor(np.zeros(width(k)))),
                            shape_fn={"widen": lambda x, k: Spec((width(k),), np.float64)})
    x = torch.zeros(2)
    assert ns.widen(x, first).shape == (width(first),)
    assert ns.widen(x, second).shape == (width(second),)


def test_compile_with_a_shape_rule_and_several_shapes(my_ops):
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec(np.broadcast_shapes(a.shape, b.shape),
                                                                        a.dtype)})
    for dynamic in (False, True):
        f = torch.compile(lambda a, b: ns.mul(a, b) + 1, backend="aot_eager", fullgraph=True, dynamic=dynamic)
        for n in (3, 5, 7):
            x, y = torch.randn(n, dtype=DOUBLE), torch.randn(n, dtype=DOUBLE)
            torch.testing.assert_close(f(x, y), x * y + 1)


# ---- #22: a model holding a namespace is copied and saved; opcheck's handle ------------------------------------

class _Model(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.gate = torch.nn.Parameter(torch.ones(3, dtype=DOUBLE))

    def forward(self, x):
        return self.ops.mul(x, self.gate)


def test_deepcopy_and_torch_save_of_a_model_holding_a_namespace(my_ops):
    model = _Model(opbuilder.to_torch(my_ops))
    x = _t(1.0, 2.0, 3.0)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(x), model(x))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    torch.testing.assert_close(back(x), model(x))


def test_pickling_a_namespace_of_python_functions_is_a_named_error():
    ns = opbuilder.to_torch(type("M", (), {"f": staticmethod(lambda x: x)}))
    with pytest.raises(TypeError, match=r"cannot be pickled: its module has no library file to load again"):
        torch.save(ns, io.BytesIO())


def test_op_handle_is_what_opcheck_takes(my_ops):
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec(a.shape, a.dtype)})
    x, y = torch.randn(3, dtype=DOUBLE, requires_grad=True), torch.randn(3, dtype=DOUBLE, requires_grad=True)
    torch.library.opcheck(op_handle(ns.mul, x, y), (x, y))
    with pytest.raises(TypeError, match=r"^op_handle: 'len' is not a function of a to_torch namespace$"):
        op_handle(len, x)


# ---- #23: to_torch imports no compiler machinery ----------------------------------------------------------------

def test_to_torch_does_not_import_dynamo():
    code = ("import sys, torch, opbuilder, types\n"
            "ns = opbuilder.to_torch(types.SimpleNamespace(f=lambda x: x))\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


# ---- #22: torch.func ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ("first", "eager"))
def test_torch_func_grad_vjp_and_vmap(my_ops, path):
    ns = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3, dtype=DOUBLE), torch.randn(3, dtype=DOUBLE)
    if path == "eager":
        ns.mul(x, y)
    torch.testing.assert_close(torch.func.grad(lambda a: ns.mul(a, y).sum())(x), y)
    out, back = torch.func.vjp(lambda a: ns.mul(a, y), x)
    torch.testing.assert_close(out, x * y)
    torch.testing.assert_close(back(torch.full((3,), 2.0, dtype=DOUBLE))[0].detach(), 2 * y)
    xs = torch.randn(4, 3, dtype=DOUBLE)
    torch.testing.assert_close(torch.func.vmap(lambda a: ns.mul(a, y))(xs), xs * y)


@pytest.mark.parametrize("rule", (False, True))
@pytest.mark.parametrize("path", ("first", "eager"))
def test_torch_func_vmap_over_an_empty_batch(my_ops, path, rule):
    """torch.vmap(torch.mul) of no elements gives (0, 3); the operator's vmap rule read its first element's
    results: a bare IndexError (attack on 30a3d5f). Its shapes now come from one run on zeros, as torch's."""
    bcast = {"mul": lambda a, b: Spec(np.broadcast_shapes(a.shape, b.shape), a.dtype)}
    ns = opbuilder.to_torch(my_ops, shape_fn=bcast if rule else None)
    y = torch.randn(3, dtype=DOUBLE)
    if path == "eager":
        ns.mul(y, y)
    for xs, dim in ((torch.randn(0, 3, dtype=DOUBLE), 0), (torch.randn(3, 0, dtype=DOUBLE), 1)):
        got = torch.func.vmap(lambda a: ns.mul(a, y), in_dims=dim)(xs)
        assert got.shape == torch.func.vmap(lambda a: a * y, in_dims=dim)(xs).shape == (0, 3)
        assert got.dtype == DOUBLE
    xs = torch.randn(2, 3, dtype=DOUBLE)
    torch.testing.assert_close(torch.func.vmap(lambda a: ns.mul(a, y))(xs), xs * y)
    # in the graph as torch's own (attack on 581e460: it did not require grad, and backward raised)
    xs = torch.randn(0, 3, dtype=DOUBLE, requires_grad=True)
    got = torch.func.vmap(lambda a: ns.mul(a, y))(xs)
    assert got.requires_grad
    (g,) = torch.autograd.grad(got.sum(), xs)
    assert g.shape == (0, 3)


def test_torch_func_what_an_operator_cannot_do_is_a_named_error(my_ops):
    ns = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3, dtype=DOUBLE), torch.randn(3, dtype=DOUBLE)
    with pytest.raises(NotImplementedError, match=r"^mul: a batch of gradients \(torch\.func\.jacrev, jacfwd, "
                                                  r"hessian, or vmap of grad/vjp\) cannot go through an opbuilder "
                                                  r"operator's Backward, which takes one gradient; "):
        torch.func.jacrev(lambda a: ns.mul(a, y))(x)
    with pytest.raises(RuntimeError, match=r"^mul: double backward through an opbuilder operator is not supported"):
        torch.func.grad(lambda a: torch.func.grad(lambda b: ns.mul(b, b).sum())(a).sum())(x)


def test_torch_func_over_a_list_of_tensors_is_a_named_error(autograd_ops):
    """torch.func.grad over a function taking a list of tensors: the named error on every call, with the
    gradient through the list or beside it (before: torch's raw "must override the setup_context
    staticmethod"). vmap over its other arguments still runs."""
    ns = opbuilder.to_torch(autograd_ops)
    x, y = torch.randn(3, dtype=DOUBLE), torch.randn(3, dtype=DOUBLE)
    want = (r"^sum_list: torch\.func transforms \(grad, vjp, jacrev\) over a function taking a list of tensors "
            r"are not supported; pass the tensors as arguments of their own, or use torch\.autograd$")
    for _ in range(2):
        with pytest.raises(NotImplementedError, match=want):
            torch.func.grad(lambda a: ns.sum_list(a, [y]).sum())(x)
        with pytest.raises(NotImplementedError, match=want):
            torch.func.grad(lambda b: ns.sum_list(x, [b]).sum())(y)
    xs = torch.randn(4, 3, dtype=DOUBLE)
    torch.testing.assert_close(torch.func.vmap(lambda a: ns.sum_list(a, [y]))(xs), xs + y)


# ---- #12: a C++ InferShape names each output's dtype --------------------------------------------------------------

ARGMAX_SRC = r'''
#include "opbuilder/extension.h"
using namespace opbuilder;

// the largest element of each row and its index: a float64 output and an int64 one
struct RowMax : Function<RowMax> {
  static std::vector<OutputSpec> InferShape(const TensorPtr &x) {
    return {OutputSpec{{x->shape()[0]}, x->dtype()}, OutputSpec{{x->shape()[0]}, kInt64}};
  }
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    const int64_t rows = x->shape()[0], cols = x->shape()[1];
    auto best = std::make_shared<Tensor>(kFloat64, ShapeVector{rows});
    auto where = std::make_shared<Tensor>(kInt64, ShapeVector{rows});
    const double *p = x->data<double>();
    for (int64_t r = 0; r < rows; ++r) {
      int64_t k = 0;
      for (int64_t c = 1; c < cols; ++c) if (p[r * cols + c] > p[r * cols + k]) k = c;
      best->data<double>()[r] = p[r * cols + k];
      where->data<int64_t>()[r] = k;
    }
    return {best, where};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};
// claims an int64 output but returns float64 (a wrong rule)
struct WrongDtype : Function<WrongDtype> {
  static OutputSpec InferShape(const TensorPtr &x) { return {x->shape(), kInt64}; }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Tensor::zeros(kFloat64, x->shape()); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

OB_MODULE(m) {
  m.def("row_max", [](const TensorPtr &x) { return RowMax::Apply(x); });
  m.def("row_max_infer_shape", RowMax::InferShapeFunction());
  m.def("wrong_dtype", [](const TensorPtr &x) { return WrongDtype::Apply(x); });
  m.def("wrong_dtype_infer_shape", WrongDtype::InferShapeFunction());
}
'''


@pytest.fixture(scope="module")
def argmax_ops(cache_dir):
    return opbuilder.load_inline("torch_semantics_argmax", ARGMAX_SRC, cflags=["-Wall", "-Wextra", "-Werror"])


def test_infer_shape_names_an_int64_index_output(argmax_ops):
    x = torch.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], dtype=DOUBLE)
    meta = argmax_ops.row_max_infer_shape(x.numpy())
    assert [str(m._data.dtype) for m in meta] == ["float64", "int64"]
    ns = opbuilder.to_torch(argmax_ops)
    for _ in range(2):  # the first call, then the eager path: both checked against the rule
        best, where = ns.row_max(x)
        assert best.tolist() == [5.0, 7.0] and where.dtype == torch.int64 and where.tolist() == [1, 0]
    f = torch.compile(lambda a: ns.row_max(a)[1] + 1, backend="aot_eager", fullgraph=True)
    assert f(x).tolist() == [2, 1]
    torch.library.opcheck(op_handle(ns.row_max, x), (x,))


def test_a_wrong_infer_shape_dtype_is_caught_on_eager_calls(argmax_ops):
    ns = opbuilder.to_torch(argmax_ops)
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^wrong_dtype: the shape rule says output 0 is int64\[2\], but the "
                                               r"operator returned float64\[2\]"):
            ns.wrong_dtype(_t(1.0, 2.0))


# ---- #5 under torch.compile: a write inside the compiled region ------------------------------------------------

@pytest.mark.parametrize("shaped", (False, True))
def test_a_saved_input_written_inside_a_compiled_region_is_an_error(my_ops, shaped):
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec(a.shape, a.dtype)} if shaped else None)

    def f(x, y):
        z = ns.mul(x, y)
        y.mul_(10)
        return z
    x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0)
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):  # torch's x * y: the same
        torch.compile(f, backend="aot_eager")(x, y).sum().backward()


# ---- the C++ bridge gives the same answers (eager calls of a known signature) -----------------------------------

@pytest.fixture(params=["python", "bridge"])
def route(request, monkeypatch):
    if request.param == "bridge":
        request.getfixturevalue("torch_bridge")
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    return request.param


def test_a_rule_wrong_only_for_other_shapes_is_a_named_error_on_every_route(my_ops, route):
    """#12 on the bridge too: a signature the Python path defined (the rule right for 1-D inputs) called
    eagerly with 2-D inputs, where the rule is wrong, is a named error on either route: never a value
    that torch.compile's fake kernel would later describe with the wrong shape."""
    ns = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda a, b: Spec(a.shape[:1], a.dtype)})
    x = _t(1.0, 2.0, 3.0)
    for _ in range(3):  # the first call defines the signature; later ones take the bridge when it is on
        torch.testing.assert_close(ns.mul(x, x), x * x)
    if route == "bridge":
        assert ns.mul.bridged[0].fast_calls == 1  # the second call checked its shapes; the third was fast
    m = torch.ones(2, 3, dtype=DOUBLE)
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^mul: the shape rule says output 0 is float64\[2\], but the "
                                               r"operator returned float64\[2, 3\]"):
            ns.mul(m, m)


def test_bridge_parity_identity_after_an_op(sem_ops, my_ops, route):
    x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0)
    z = _call("eager", my_ops, "mul", x, y)
    w = _call("eager", sem_ops, "ident", z)
    (w * _t(1.0, 10.0, 100.0)).sum().backward()
    torch.testing.assert_close(x.grad, y * _t(1.0, 10.0, 100.0))


def test_bridge_parity_saved_input_written(my_ops, route):
    x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0)
    z = _call("eager", my_ops, "mul", x, y)
    y.mul_(10)
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()


def test_bridge_parity_double_backward(my_ops, route):
    x, y = _t(1.0, 2.0, 3.0, grad=True), _t(4.0, 5.0, 6.0, grad=True)
    z = _call("eager", my_ops, "mul", x, y)
    (gx,) = torch.autograd.grad(z.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"^mul: double backward through an opbuilder operator is not supported"):
        gx.sum().backward()


def test_bridge_parity_markdirty_and_tuples(sem_ops, route):
    c = _t(1.0, 2.0)
    v = c._version
    assert _call("eager", sem_ops, "scale_", c) is c and c._version > v
    out = _call("eager", sem_ops, "two", _t(1.0, 2.0, grad=True))
    assert type(out) is tuple and len(out) == 2


# ---- MarkDirty under torch.compile: out of the graph, or a named error; never silently wrong ---------------------

def test_markdirty_with_a_shape_rule_under_compile(sem_ops):
    weights = _t(1.0, 10.0, 100.0)

    def run(ns):
        x = _t(1.0, 2.0, 3.0, grad=True)
        b = x * 1
        r = torch.compile(ns.scale_, backend="aot_eager")(b)
        ((r * weights).sum() + (b * 1000).sum()).backward()
        return x.grad
    rule = {"scale_": lambda a: Spec(a.shape, a.dtype)}
    warm = opbuilder.to_torch(sem_ops, shape_fn=rule)
    warm.scale_(_t(1.0))  # seen writing its argument: compiled calls leave the graph
    torch.testing.assert_close(run(warm), 2 * weights + 2000)  # torch's (x * 1).mul_(2)
    torch._dynamo.reset()  # a fresh compile: the first call of a new namespace is traced
    with pytest.raises(RuntimeError, match=r"^scale_ writes its argument in place \(MarkDirty\), which a compiled "
                                          r"graph cannot express, and its first call was compiled: "
                                          r"torch.compile now leaves it out of the graph"):
        run(opbuilder.to_torch(sem_ops, shape_fn=rule))


def test_bridge_parity_torch_func(my_ops, route):
    ns = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3, dtype=DOUBLE), torch.randn(3, dtype=DOUBLE)
    ns.mul(x, y)
    ns.mul(x, y)  # the signature is known: plain calls take the bridge, if it is on
    torch.testing.assert_close(torch.func.grad(lambda a: ns.mul(a, y).sum())(x), y)
    xs = torch.randn(2, 3, dtype=DOUBLE)
    torch.testing.assert_close(torch.func.vmap(lambda a: ns.mul(a, y))(xs), xs * y)


def test_bridge_parity_markdirty_that_saves_its_result(sem_ops, route):
    a = _t(0.5, 1.0, 1.5, grad=True)
    r = _call("eager", sem_ops, "exp_", a * 1)
    (r * _t(1.0, 10.0, 100.0)).sum().backward()
    torch.testing.assert_close(a.grad, torch.exp(a.detach()) * _t(1.0, 10.0, 100.0))


# ---- non-tensor arguments: the kernel's call is matched by value, so no call is taken for a compiled one -----

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name, k", [("mulk", 2.5), ("mulki", 1000), ("mulki", 2)])
def test_a_saved_input_written_is_an_error_with_a_float_or_large_int_argument(sem_ops, path, name, k):
    x, y = _t(1.0, 2.0, grad=True, path=path), _t(3.0, 4.0)
    z = _call(path, sem_ops, name, x, y, k)
    y.mul_(10)
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()
    x2, y2 = _t(1.0, 2.0, grad=True, path=path), _t(3.0, 4.0)
    _call(path, sem_ops, name, x2, y2, k).sum().backward()  # unwritten: k * y
    torch.testing.assert_close(x2.grad, k * y2)


@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_markdirty_with_a_float_argument_on_its_first_call(sem_ops, path):
    a = _t(1.0, 2.0, 3.0, grad=True)
    w = _t(1.0, 10.0, 100.0)
    b = a * 1
    r = _call(path, sem_ops, "scale_k", b, 3.0)
    assert r is b and b.tolist() == [3.0, 6.0, 9.0]
    (r * w).sum().backward()  # torch's (a * 1).mul_(3.0): 3 * w, the forward run once
    torch.testing.assert_close(a.grad, 3 * w)


@pytest.mark.parametrize("path", PATHS)
def test_double_backward_is_a_named_error_when_the_input_is_also_used_elsewhere(sem_ops, path):
    x = _t(1.0, 2.0, grad=True, path=path)
    z = _call(path, sem_ops, "mulki", x, x, 2)  # 2 * x * x
    (g,) = torch.autograd.grad(z.sum(), x, create_graph=True)
    torch.testing.assert_close(g.detach(), 4 * x.detach())
    # torch's 2 * x * x gives 8x here; dropping the op's term would give 4x, silently
    with pytest.raises(RuntimeError, match=r"^mulki: double backward through an opbuilder operator is not "
                                           r"supported: its Backward is once-differentiable"):
        torch.autograd.grad((g * x).sum(), x)


# ---- the out= pattern with declared writes: torch's out= rules --------------------------------------------------

@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_a_declared_out_write_bumps_the_version_a_saved_tensor_checks(sem_ops, my_ops, path):
    x, o = _t(1.0, 2.0, 3.0, grad=True), _t(2.0, 2.0, 2.0)
    z = opbuilder.to_torch(my_ops).mul(x, o)  # saves o
    v = o._version
    mod = _ModNs(sem_ops)
    assert _call_ns(path, mod, "add_out", _t(50.0, 50.0, 50.0), _t(50.0, 50.0, 50.0), o) is None
    assert o.tolist() == [100.0, 100.0, 100.0] and o._version > v  # torch.add(a, b, out=o) bumps it
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()


@pytest.mark.parametrize("path", ("first", "eager", "mode"))
@pytest.mark.parametrize("which", ("out_nonleaf", "out_leaf", "input"))
def test_a_declared_out_write_with_an_argument_requiring_grad_is_refused_untouched(sem_ops, path, which):
    x = _t(1.0, 2.0, 3.0, grad=True)
    o = x * 1 if which == "out_nonleaf" else x if which == "out_leaf" else _t(0.0, 0.0, 0.0)
    a = x if which == "input" else _t(5.0, 5.0, 5.0)
    before = o.detach().clone()
    with pytest.raises(RuntimeError, match=r"^add_out\(\): functions with out=\.\.\. arguments don't support "
                                           r"automatic differentiation, but one of the arguments requires grad"):
        _call_ns(path, _ModNs(sem_ops), "add_out", a, _t(5.0, 5.0, 5.0), o)
    assert o.detach().tolist() == before.tolist()  # decided before the call: the data is untouched
    with torch.no_grad():  # torch's out= is allowed without grad recording
        _call_ns(path, _ModNs(sem_ops), "add_out", _t(1.0, 1.0, 1.0), _t(5.0, 5.0, 5.0), _t(0.0, 0.0, 0.0))


class _ModNs:
    """sem_ops with add_out's write declared (``mutates``)."""

    def __init__(self, module):
        self.ns = opbuilder.to_torch(module, mutates={"add_out": [2]})


def _call_ns(path, mod, name, *args):
    fn = getattr(mod.ns, name)
    if path == "eager":
        with torch.no_grad():
            fn(*[a.detach().clone() for a in args])
    if path == "mode":
        with _Passthrough():
            return fn(*args)
    return fn(*args)


@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_an_undeclared_out_write_bumps_the_version_a_saved_tensor_checks(sem_ops, my_ops, path):
    x, o = _t(1.0, 2.0, 3.0, grad=True), _t(2.0, 2.0, 2.0)
    z = opbuilder.to_torch(my_ops).mul(x, o)  # saves o
    v = o._version
    assert _call(path, sem_ops, "add_out", _t(50.0, 50.0, 50.0), _t(50.0, 50.0, 50.0), o) is None
    assert o.tolist() == [100.0, 100.0, 100.0] and o._version > v  # seen after the call: still counted
    with pytest.raises(RuntimeError, match=r"modified by an in-?place operation"):
        z.sum().backward()
    a, b = _t(1.0, 2.0), _t(3.0, 4.0)
    va, vb = a._version, b._version
    _call(path, sem_ops, "add_out", a, a, b)  # reads a: only b counts a write
    assert (a._version, b._version > vb) == (va, True)


@pytest.mark.parametrize("path", ("first", "eager", "mode"))
def test_an_undeclared_out_write_into_a_tensor_requiring_grad_is_a_named_error(sem_ops, path):
    x = _t(1.0, 2.0, 3.0, grad=True)
    with pytest.raises(RuntimeError, match=r"^add_out\(\) wrote tensor argument 2 in place, which requires grad; "
                                           r"functions with out=\.\.\. arguments don't support automatic "
                                           r"differentiation\. Its data has already changed: declare the write"):
        _call(path, sem_ops, "add_out", _t(5.0, 5.0, 5.0), _t(5.0, 5.0, 5.0), x * 1)


def test_an_op_returning_its_input_compiled_before_any_eager_call_is_never_silently_wrong(sem_ops):
    ns = opbuilder.to_torch(sem_ops, shape_fn={"ident": lambda a: Spec(a.shape, a.dtype)})

    def f(x):
        r = ns.ident(x)  # torch: an alias of x (view_as), which sees the write below
        x.add_(1)
        return r * 1
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"^ident returns its argument unchanged, which a compiled graph cannot "
                                           r"express .*its first call was compiled: torch.compile now leaves it out "
                                           r"of the graph"):
        torch.compile(f, backend="aot_eager")(_t(1.0, 2.0, 3.0))
    torch._dynamo.reset()
    assert torch.compile(f, backend="aot_eager")(_t(1.0, 2.0, 3.0)).tolist() == [2.0, 3.0, 4.0]
    assert f(_t(1.0, 2.0, 3.0)).tolist() == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("warm", (False, True))
def test_torch_func_through_a_markdirty_op_is_a_named_not_implemented_error(sem_ops, warm):
    ns = opbuilder.to_torch(sem_ops)
    if warm:
        ns.scale_k(_t(1.0, 2.0), 3.0)  # seen writing its argument: refused before it runs
    msg = (r"^scale_k: under torch.func an operator may not return its argument \(unchanged, a view of it, or written "
           r"in place")
    with pytest.raises(NotImplementedError, match=msg):
        torch.func.grad(lambda a: ns.scale_k(a * 1, 3.0).sum())(_t(1.0, 2.0))
    b = torch.ones(2, 2, dtype=DOUBLE)
    with pytest.raises(NotImplementedError, match=msg):
        torch.func.vmap(lambda r: ns.scale_k(r, 3.0))(b)
    if warm:
        assert b.tolist() == [[1.0, 1.0], [1.0, 1.0]]

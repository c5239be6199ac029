"""Built-in differentiable ops: each forward beside its derivative rules.

Every public function accepts Tensors, numpy arrays and Python numbers; a
Python number takes the dtype of the tensor it meets (see ``as_tensor``).
"""
from __future__ import annotations

import builtins
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from ..tensor import Tensor, as_number, as_tensor
from .op_entry import breaks_trace
from .primitive import Primitive, defvjp

Axis = Optional[Union[int, Sequence[int]]]

__all__ = [
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sin", "cos", "tanh", "sigmoid", "relu",
    "sqrt", "abs", "matmul", "sum", "mean", "reshape", "transpose", "broadcast_to", "sum_to", "cast",
    "where", "getitem", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
    "zeros_like", "ones_like", "to_device", "real", "imag", "conj",
]


def _pair(x: Any, y: Any) -> Tuple[Tensor, Tensor]:
    """Both operands as Tensors; a Python number takes the tensor's dtype, and a
    Python float next to an integer tensor makes both float32 (as MindSpore).
    A float tensor next to an integer or bool tensor casts that one to the
    float's dtype (as MindSpore and PyTorch: float32 * int32 is float32, where
    numpy would give float64)."""
    if isinstance(x, Tensor):
        if isinstance(y, Tensor):
            if x._data.dtype is y._data.dtype:
                return x, y
            return _float_wins(x, y)
        if type(y) is float:  # the common case, a float next to a float CPU tensor, without as_tensor's checks
            d = x._data
            if type(d) is np.ndarray and d.dtype.kind == "f":
                t = _new(Tensor)
                t._base_ref = None
                t._data = np.asarray(y, d.dtype)
                return x, t
        if type(y) is not int and isinstance(y, np.generic):
            y = as_number(y)
        if isinstance(y, float) and x._data.dtype.kind in "biu":
            x = cast(x, _dt.float32)
        t = as_tensor(y, like=x)
        return _float_wins(x, t) if isinstance(y, complex) else (x, t)  # (int32 * 1j: complex64)
    if isinstance(y, Tensor):
        if type(x) is not int and isinstance(x, np.generic):
            x = as_number(x)
        if isinstance(x, float) and y._data.dtype.kind in "biu":
            y = cast(y, _dt.float32)
        t = as_tensor(x, like=y)
        return _float_wins(t, y) if isinstance(x, complex) else (t, y)
    return _float_wins(as_tensor(x), as_tensor(y))  # two numbers: 1.0 + 2 is float32, as a float alone


_new = object.__new__


def _float_wins(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    kx, ky = x._data.dtype.kind, y._data.dtype.kind
    if kx in "fcV" and ky in "biu":  # V: bfloat16
        return x, cast(y, _dt.from_numpy_dtype(x._data.dtype))
    if ky in "fcV" and kx in "biu":
        return cast(x, _dt.from_numpy_dtype(y._data.dtype)), y
    return x, y


def _one(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else as_tensor(x)


def _c(t: Tensor) -> Tensor:
    """``conj(t)`` for a complex tensor, else ``t``. Complex gradients follow PyTorch: for a real loss L
    of z = x + iy the gradient is dL/dx + i dL/dy, so a holomorphic op's rule multiplies by conj(f'(z))."""
    return _conj(t) if t._data.dtype.kind == "c" else t


def _real_only(name: str, *xs: Tensor) -> None:
    """TypeError for a complex input to an op that orders values (complex numbers have no order)."""
    for x in xs:
        if x._data.dtype.kind == "c":
            raise TypeError(f"op '{name}' does not take complex tensors (got {x.dtype}): complex numbers "
                            f"have no order")


# ---- elementwise binary ---------------------------------------------------
_add = Primitive("add", np.add)
defvjp(_add, lambda g, ans, x, y: g, lambda g, ans, x, y: g, reads_output=False, reads_inputs=())

_sub = Primitive("sub", np.subtract)
defvjp(_sub, lambda g, ans, x, y: g, lambda g, ans, x, y: neg(g), reads_output=False, reads_inputs=())

_mul = Primitive("mul", np.multiply)
defvjp(_mul, lambda g, ans, x, y: mul(g, _c(y)), lambda g, ans, x, y: mul(g, _c(x)), reads_output=False,
       reads_inputs={0: (1,), 1: (0,)})  # per rule, as torch saves y only for x's gradient


def _true_divide(x, y):
    if x.dtype.kind in "biu" and y.dtype.kind in "biu":
        return np.true_divide(x, y, dtype=np.float32)
    return np.true_divide(x, y)


def _in_float32(fn):
    """``fn`` computed in float32 and rounded back once to bfloat16: numpy's bfloat16 sums accumulate in
    bfloat16, its bfloat16 matmul returns float32. The bfloat16 twins of matmul/sum/mean run it; the
    public functions pick them, so other dtypes call numpy directly."""
    def run(x, *args, **kwargs):
        return fn(x.astype(np.float32), *(a.astype(np.float32) for a in args), **kwargs).astype(x.dtype)
    return run


_div = Primitive("div", _true_divide)
# y's rule reads x, not the output (as torch's: -g x / y^2), so a write into the output is never refused
defvjp(_div, lambda g, ans, x, y: div(g, _c(y)), lambda g, ans, x, y: neg(mul(g, _c(div(div(x, y), y)))),
       reads_output=False, reads_inputs={0: (1,), 1: (0, 1)})

_pow = Primitive("pow", np.power)
defvjp(_pow,
       lambda g, ans, x, y: mul(g, _c(_pow_slope(x, y))),
       lambda g, ans, x, y: mul(g, _c(mul(ans, log(_pow_base(x))))), reads_output=(1,),
       reads_inputs={0: (0, 1), 1: (0,)})


def _pow_slope(x: Tensor, y: Tensor) -> Tensor:
    """d(x^y)/dx = y x^(y-1), and 0 where y is 0 (x^0 is 1 for every x: at x = 0, 0 * 0^-1 would be NaN;
    torch's 0 too)."""
    safe = where(equal(y, 0), 1, x)  # x^(y-1) is not used where y is 0: computed at 1 there, no 0^-1
    return mul(y, pow(safe, sub(y, 1)))


def _pow_base(x: Tensor) -> Tensor:
    """x where the base's log is defined (real x > 0; any complex x != 0), else 1."""
    if x._data.dtype.kind == "c":
        return where(not_equal(x, 0), x, 1)
    return where(greater(x, 0), x, 1)


def add(x: Any, y: Any) -> Tensor:
    return _add.call(_pair(x, y))


def sub(x: Any, y: Any) -> Tensor:
    return _sub.call(_pair(x, y))


def mul(x: Any, y: Any) -> Tensor:
    return _mul.call(_pair(x, y))


def div(x: Any, y: Any) -> Tensor:
    return _div.call(_pair(x, y))


def pow(x: Any, y: Any) -> Tensor:  # noqa: A001 (mirrors the op's name)
    return _pow.call(_pair(x, y))


# ---- elementwise unary ----------------------------------------------------
_neg = Primitive("neg", np.negative)
defvjp(_neg, lambda g, ans, x: neg(g), reads_output=False, reads_inputs=())
_exp = Primitive("exp", np.exp)
defvjp(_exp, lambda g, ans, x: mul(g, _c(ans)), reads_output=True, reads_inputs=())
_log = Primitive("log", np.log)
defvjp(_log, lambda g, ans, x: div(g, _c(x)), reads_output=False, reads_inputs=(0,))
_sin = Primitive("sin", np.sin)
defvjp(_sin, lambda g, ans, x: mul(g, _c(cos(x))), reads_output=False, reads_inputs=(0,))
_cos = Primitive("cos", np.cos)
defvjp(_cos, lambda g, ans, x: neg(mul(g, _c(sin(x)))), reads_output=False, reads_inputs=(0,))
_tanh = Primitive("tanh", np.tanh)
defvjp(_tanh, lambda g, ans, x: mul(g, _c(sub(1, mul(ans, ans)))), reads_output=True, reads_inputs=())
_sqrt = Primitive("sqrt", np.sqrt)
defvjp(_sqrt, lambda g, ans, x: div(g, _c(mul(ans, 2))), reads_output=True, reads_inputs=())


def _sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


_sigmoid_p = Primitive("sigmoid", _sigmoid)
defvjp(_sigmoid_p, lambda g, ans, x: mul(g, _c(mul(ans, sub(1, ans)))), reads_output=True, reads_inputs=())
_relu = Primitive("relu", lambda x: np.maximum(x, 0))
# relu's rule as one op, g * (x > 0) (NaN in g stays NaN, as a multiply by the mask does), linear in g
_relu_grad = Primitive("relu_grad", lambda g, x: g * (x > 0))
defvjp(_relu_grad, lambda gg, ans, g, x: _relu_grad(gg, x), None, reads_output=False, reads_inputs=(1,))
defvjp(_relu, lambda g, ans, x: _relu_grad(g, x), reads_output=False, reads_inputs=(0,))
def _sign_np(x):
    """sign(x); for complex x, x/|x| (0 at 0): the gradient of |x| (numpy 1.x's complex sign is that of
    the real part, numpy 2's is x/|x|: not left to the version)."""
    if x.dtype.kind == "c":
        a = np.abs(x)
        return x / np.where(a == 0, 1, a).astype(x.dtype)
    return np.sign(x)


_sign = Primitive("sign", _sign_np)
_abs = Primitive("abs", np.abs)
defvjp(_abs, lambda g, ans, x: mul(g, _sign(x)), reads_output=False, reads_inputs=(0,))
_real = Primitive("real", lambda x: np.real(x) if x.dtype.kind == "c" else x.view())
_imag = Primitive("imag", np.imag)
_conj = Primitive("conj", lambda x: np.conj(x) if x.dtype.kind == "c" else x.view())
# (their rules read x's dtype only: a write into x before backward changes nothing they compute)
defvjp(_real, lambda g, ans, x: _as_complex(g, x), reads_output=False, reads_inputs=())
defvjp(_imag, lambda g, ans, x: mul(_as_complex(g, x), 1j), reads_output=False, reads_inputs=())
defvjp(_conj, lambda g, ans, x: _conj(g), reads_output=False, reads_inputs=())


def _as_complex(g: Tensor, x: Tensor) -> Tensor:
    """A real gradient ``g`` in x's (complex) dtype; unchanged for a real x."""
    return cast(g, _dt.from_numpy_dtype(x._data.dtype)) if x._data.dtype.kind == "c" else g


def real(x: Any) -> Tensor:
    """The real part (x itself, as a view, for a real tensor); differentiable."""
    return _real(_one(x))


def imag(x: Any) -> Tensor:
    """The imaginary part of a complex tensor (zeros for a real one); differentiable."""
    return _imag(_one(x))


def conj(x: Any) -> Tensor:
    """The complex conjugate (x itself, as a view, for a real tensor); differentiable."""
    return _conj(_one(x))


def neg(x: Any) -> Tensor:
    return _neg(_one(x))


def _real_valued(x: Any) -> Tensor:
    """The input of an op whose values are fractions (exp, sin, sigmoid ...): an integer or bool tensor
    is taken as float32, as torch and mint take it (numpy would pick float64, or float16 for 8-bit
    integers, and sigmoid cast its result back to the integers: zeros)."""
    x = _one(x)
    return cast(x, _dt.float32) if x._data.dtype.kind in "biu" else x


def exp(x: Any) -> Tensor:
    return _exp(_real_valued(x))


def log(x: Any) -> Tensor:
    return _log(_real_valued(x))


def sin(x: Any) -> Tensor:
    return _sin(_real_valued(x))


def cos(x: Any) -> Tensor:
    return _cos(_real_valued(x))


def tanh(x: Any) -> Tensor:
    return _tanh(_real_valued(x))


def sigmoid(x: Any) -> Tensor:
    return _sigmoid_p(_real_valued(x))


def relu(x: Any) -> Tensor:
    x = _one(x)
    if x._data.dtype.kind == "c":
        _real_only("relu", x)
    return _relu(x)


def sqrt(x: Any) -> Tensor:
    return _sqrt(_real_valued(x))


def abs(x: Any) -> Tensor:  # noqa: A001
    return _abs(_one(x))


# ---- comparisons and selection (comparisons record nothing) ---------------
_less = Primitive("less", np.less)
_less_equal = Primitive("less_equal", np.less_equal)
_greater = Primitive("greater", np.greater)
_greater_equal = Primitive("greater_equal", np.greater_equal)
_equal = Primitive("equal", np.equal)
_not_equal = Primitive("not_equal", np.not_equal)


def less(x: Any, y: Any) -> Tensor:
    x, y = _pair(x, y)
    if x._data.dtype.kind == "c" or y._data.dtype.kind == "c":
        _real_only("less", x, y)
    return _less(x, y)


def less_equal(x: Any, y: Any) -> Tensor:
    x, y = _pair(x, y)
    if x._data.dtype.kind == "c" or y._data.dtype.kind == "c":
        _real_only("less_equal", x, y)
    return _less_equal(x, y)


def greater(x: Any, y: Any) -> Tensor:
    x, y = _pair(x, y)
    if x._data.dtype.kind == "c" or y._data.dtype.kind == "c":
        _real_only("greater", x, y)
    return _greater(x, y)


def greater_equal(x: Any, y: Any) -> Tensor:
    x, y = _pair(x, y)
    if x._data.dtype.kind == "c" or y._data.dtype.kind == "c":
        _real_only("greater_equal", x, y)
    return _greater_equal(x, y)


def equal(x: Any, y: Any) -> Tensor:
    return _equal(*_pair(x, y))


def not_equal(x: Any, y: Any) -> Tensor:
    return _not_equal(*_pair(x, y))


_where = Primitive("where", np.where)
defvjp(_where, None,
       lambda g, ans, c, x, y: where(c, g, 0),
       lambda g, ans, c, x, y: where(c, 0, g), reads_output=False, reads_inputs=(0,))


def where(condition: Any, x: Any, y: Any) -> Tensor:
    """Elementwise ``x if condition else y`` (differentiable in x and y)."""
    c = _one(condition)
    x, y = _pair(x, y)
    return _where(c, x, y)


# ---- linear algebra -------------------------------------------------------
def _as_matrices(g, x, y):
    """x, y and g with 1-D operands promoted to matrices (as matmul does)."""
    x2 = reshape(x, (1, x.shape[0])) if x.ndim == 1 else x
    y2 = reshape(y, (y.shape[0], 1)) if y.ndim == 1 else y
    batch = np.broadcast_shapes(x2.shape[:-2], y2.shape[:-2])
    g2 = reshape(g, batch + (x2.shape[-2], y2.shape[-1]))
    return g2, x2, y2


def _matmul_vjp_x(g, ans, x, y):
    g2, x2, y2 = _as_matrices(g, x, y)
    gx = matmul(g2, _swap_last(_c(y2)))  # batch + x2's matrix shape; the engine sums the batch
    return reshape(gx, gx.shape[:-2] + (x.shape[0],)) if x.ndim == 1 else gx


def _matmul_vjp_y(g, ans, x, y):
    g2, x2, y2 = _as_matrices(g, x, y)
    gy = matmul(_swap_last(_c(x2)), g2)
    return reshape(gy, gy.shape[:-1]) if y.ndim == 1 else gy


def _swap_last(t: Tensor) -> Tensor:
    axes = list(range(t.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return transpose(t, tuple(axes))


_matmul = Primitive("matmul", np.matmul)
defvjp(_matmul, _matmul_vjp_x, _matmul_vjp_y, reads_output=False, reads_inputs={0: (1,), 1: (0,)})
_matmul_bf16 = Primitive("matmul", _in_float32(np.matmul))
defvjp(_matmul_bf16, _matmul_vjp_x, _matmul_vjp_y, reads_output=False, reads_inputs={0: (1,), 1: (0,)})


def matmul(x: Any, y: Any) -> Tensor:
    x, y = _pair(x, y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"matmul needs tensors of at least 1 dimension, got shapes {list(x.shape)} "
                         f"and {list(y.shape)}")
    if x._data.dtype.kind == "V" or y._data.dtype.kind == "V":  # bfloat16
        return _matmul_bf16(x, y)
    return _matmul(x, y)


# ---- reductions -----------------------------------------------------------
def _norm_axis(axis: Axis, ndim: int) -> Optional[Tuple[int, ...]]:
    """The axes as a tuple of non-negative ints; None (every axis) for None or an empty tuple or list, as
    MindSpore's ``axis=()`` and torch's ``dim=()`` (numpy's ``axis=()`` would reduce none)."""
    if axis is None or (isinstance(axis, (tuple, list, range)) and len(axis) == 0):
        return None
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        axes: Tuple[Any, ...] = (axis,)
    elif isinstance(axis, (tuple, list, range)) or (isinstance(axis, np.ndarray) and axis.ndim == 1):
        axes = tuple(axis)
    else:
        raise TypeError(f"axis must be None, an int or a tuple of ints, got {type(axis).__name__} {axis!r}")
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {type(a).__name__} {a!r} in {axis!r}")
        a = int(a)
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"axis {a} is out of range for a tensor of {ndim} dimensions")
        a = a % ndim if ndim else 0
        if a in out:
            raise ValueError(f"axis {list(axes)} names dimension {a} twice (for a tensor of {ndim} dimensions)")
        out.append(a)
    return tuple(out)


def _kept_shape(shape, axis):
    if axis is None:
        return (1,) * len(shape)
    return tuple(1 if i in axis else s for i, s in enumerate(shape))


def _sum_vjp(g, ans, x, axis=None, keepdims=False):
    if not keepdims:
        g = reshape(g, _kept_shape(x.shape, axis))
    return broadcast_to(g, x.shape)


def _mean_vjp(g, ans, x, axis=None, keepdims=False):
    count = x.size if axis is None else int(np.prod([x.shape[a] for a in axis]))
    return div(_sum_vjp(g, None, x, axis, keepdims), count)


def _sum_np(x, axis=None, keepdims=False):
    return np.sum(x, axis=axis, keepdims=keepdims)


def _mean_np(x, axis=None, keepdims=False):
    return np.mean(x, axis=axis, keepdims=keepdims)


_sum = Primitive("sum", _sum_np)
defvjp(_sum, _sum_vjp, reads_output=False, reads_inputs=())
_mean = Primitive("mean", _mean_np)
defvjp(_mean, _mean_vjp, reads_output=False, reads_inputs=())
_sum_bf16 = Primitive("sum", _in_float32(_sum_np))
defvjp(_sum_bf16, _sum_vjp, reads_output=False, reads_inputs=())
_mean_bf16 = Primitive("mean", _in_float32(_mean_np))
defvjp(_mean_bf16, _mean_vjp, reads_output=False, reads_inputs=())


def sum(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    x = _one(x)
    return (_sum_bf16 if x._data.dtype.kind == "V" else _sum)(x, axis=_norm_axis(axis, x.ndim),
                                                               keepdims=bool(keepdims))


def mean(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    x = _one(x)
    return (_mean_bf16 if x._data.dtype.kind == "V" else _mean)(x, axis=_norm_axis(axis, x.ndim),
                                                                 keepdims=bool(keepdims))


# ---- shape ops -------------------------------------------------------------
_reshape = Primitive("reshape", lambda x, shape: np.reshape(x, shape))
defvjp(_reshape, lambda g, ans, x, shape: reshape(g, x.shape), reads_output=False, reads_inputs=())


def reshape(x: Any, shape: Sequence[int]) -> Tensor:
    x = _one(x)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    return _reshape(x, shape=shape)


_transpose = Primitive("transpose", lambda x, axes: np.transpose(x, axes))
defvjp(_transpose, lambda g, ans, x, axes: transpose(g, tuple(np.argsort(axes).tolist())), reads_output=False,
       reads_inputs=())


def transpose(x: Any, axes: Optional[Sequence[int]] = None) -> Tensor:
    x = _one(x)
    if axes is None:
        axes = tuple(range(x.ndim - 1, -1, -1))
    given = tuple(axes)
    if any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in given):
        raise TypeError(f"transpose axes must be ints, got {list(given)}")
    if any(not -x.ndim <= int(a) < builtins.max(x.ndim, 1) for a in given):  # not wrapped: (0, 5) is no (0, 1)
        raise ValueError(f"transpose axes {list(given)} are out of range for a tensor of {x.ndim} dimensions")
    axes = tuple(int(a) % builtins.max(x.ndim, 1) for a in given)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"transpose axes {list(given)} are not a permutation of {x.ndim} dimensions")
    return _transpose(x, axes=axes)


def _sum_to_array(x: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    if not axes:
        return np.reshape(x, shape)
    if x.dtype.kind == "V":  # bfloat16: summed in float32 and rounded once, as sum's twin and torch do
        return np.reshape(np.sum(x.astype(np.float32), axis=axes, keepdims=True).astype(x.dtype), shape)
    return np.reshape(np.sum(x, axis=axes, keepdims=True), shape)


def _expanded(x: Any, shape: Tuple[int, ...]) -> Any:
    """numpy's broadcast of ``x``, writable when ``x`` is, as torch's ``expand``: a write into elements that
    share memory is refused (writes.py, call_rules.has_internal_overlap), one element's reaches ``x``."""
    out = np.broadcast_to(x, shape)
    if type(out) is np.ndarray and type(x) is np.ndarray and x.flags.writeable:
        out.flags.writeable = True
    return out


_broadcast_to = Primitive("broadcast_to", _expanded)
defvjp(_broadcast_to, lambda g, ans, x, shape: sum_to(g, x.shape), reads_output=False, reads_inputs=())
_sum_to = Primitive("sum_to", _sum_to_array)
defvjp(_sum_to, lambda g, ans, x, shape: broadcast_to(g, x.shape), reads_output=False, reads_inputs=())


def broadcast_to(x: Any, shape: Sequence[int]) -> Tensor:
    """``x`` broadcast to ``shape``; -1 keeps the size of ``x``'s dimension there (MindSpore's rule)."""
    t = _one(x)
    dims = [int(s) for s in shape]
    lead = len(dims) - t.ndim
    for i, s in enumerate(dims):
        if s == -1:
            if i < lead:
                raise ValueError(f"broadcast_to: -1 at dimension {i} of {list(dims)}, which {list(t.shape)} does "
                                 f"not have (-1 keeps the size of an existing dimension)")
            dims[i] = t.shape[i - lead]
    return _broadcast_to(t, shape=tuple(dims))


def sum_to(x: Any, shape: Sequence[int]) -> Tensor:
    """Sum ``x`` down to ``shape`` (the inverse of broadcasting to x's shape)."""
    return _sum_to(_one(x), shape=tuple(int(s) for s in shape))


def _cast_array(x, dtype):
    if x.dtype == dtype.np:
        return x.view()
    if x.dtype.kind == "c" and dtype.np.kind != "c":
        raise TypeError(f"cast from {x.dtype.name} to {dtype.name} would drop the imaginary part; "
                        f"take real(x) or abs(x) first")
    return x.astype(dtype.np)


def _cast_vjp(g: Tensor, ans: Any, x: Tensor, dtype: Any) -> Tensor:
    if g._data.dtype.kind == "c" and x._data.dtype.kind != "c":  # real -> complex: the real part flows back
        g = real(g)
    return cast(g, _dt.from_numpy_dtype(x._data.dtype))


_cast = Primitive("cast", _cast_array)
defvjp(_cast, _cast_vjp, reads_output=False, reads_inputs=())


def cast(x: Any, dtype: Any) -> Tensor:
    return _cast(_one(x), dtype=_dt.to_dtype(dtype))


# ---- indexing ----------------------------------------------------------------
def _plain_index(index: Any) -> Any:
    if isinstance(index, Tensor) or (isinstance(index, tuple) and any(isinstance(i, Tensor) for i in index)):
        return _tensor_index(index)
    return index


@breaks_trace("a tensor used as an index turns its values into the op's attribute, which a graph would keep as "
              "traced")
def _tensor_index(index: Any) -> Any:
    """An index holding tensors, with their arrays in their place."""
    if isinstance(index, Tensor):
        return index._data
    return tuple(i._data if isinstance(i, Tensor) else i for i in index)


def _scatter_add(g, index, shape):
    out = _device.array_module(g).zeros(shape, dtype=g.dtype)
    _device.add_at(out, index, g)
    return out


def _index(x: Any, index: Any) -> Any:
    """``x[index]``; an index of integers only gives a 0-d view of ``x``, as torch's does (numpy gives a
    copied scalar, which a write would never reach ``x`` through)."""
    r = x[index]
    if isinstance(r, np.generic):
        r = x[(index if isinstance(index, tuple) else (index,)) + (Ellipsis,)]
    return r


_getitem = Primitive("getitem", _index)
_scatter = Primitive("scatter_add", _scatter_add)
defvjp(_getitem, lambda g, ans, x, index: _scatter(g, index=index, shape=x.shape), reads_output=False,
       reads_inputs=())
defvjp(_scatter, lambda g, ans, u, index, shape: _getitem(g, index=index), reads_output=False, reads_inputs=())


def getitem(x: Any, index: Any) -> Tensor:
    return _getitem(_one(x), index=_plain_index(index))


# ---- constructors (not recorded) ----------------------------------------
def zeros_like(x: Any) -> Tensor:
    x = _one(x)
    return Tensor._from_array(_device.array_module(x._data).zeros(x.shape, dtype=x._data.dtype))


def ones_like(x: Any) -> Tensor:
    x = _one(x)
    return Tensor._from_array(_device.array_module(x._data).ones(x.shape, dtype=x._data.dtype))


# ---- devices -------------------------------------------------------------------
_to_device = Primitive("to_device", lambda x, device: _device.to_device(x, device))
defvjp(_to_device, lambda g, ans, x, device: to_device(g, _device.device_of(x._data)), reads_output=False,
       reads_inputs=())


def to_device(x: Any, device: str) -> Tensor:
    """``x`` on ``device`` (a parsed name, see runtime.device); ``x`` itself when already there."""
    x = _one(x)
    if _device.device_of(x._data) == device:
        return x
    return _to_device(x, device=device)

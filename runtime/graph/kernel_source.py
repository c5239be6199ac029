"""C++ source for a fused group: one loop computing every op of the group per element.

The kernel is a plain aot C-ABI function (the ``ops.Custom`` convention:
inputs then outputs in ``params``, their shapes in ``shapes``), so it is built
by ``opbuilder.build_library`` and called through ``ops.Custom``'s compiled
call path. The source depends only on the ops, the dtype and each input's
kind, not on sizes, so one kernel serves every size with that pattern:

- ``full``: the input has the output's shape (element ``i``);
- ``scalar``: one element, read once;
- ``bcast``: any other broadcast; strides are worked out at run time from
  the shapes, per row of the innermost dimension.

The loop's shape is the broadcast of the inputs' shapes (every node of a
group has it). A group may end with a sum or mean over the last axis (one
result per row) or over all axes (one result): each row is summed into a
double (``omp simd`` reduction, compiled with ``-fopenmp-simd``, so it
vectorizes) and that output comes last.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Tuple

import numpy as np

from .. import vector_math as _vector_math
from .graph import Graph, Input, Output

__all__ = ["OPS", "REDUCTIONS", "input_kinds", "kernel_source"]

# op name -> C++ expression over its arguments {0}, {1} (T is the element type)
OPS: Dict[str, str] = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "pow": "{pow}({0}, {1})", "neg": "(-{0})", "exp": "{exp}({0})", "log": "{log}({0})",
    "sin": "{sin}({0})", "cos": "{cos}({0})", "tanh": "{tanh}({0})", "sqrt": "std::sqrt({0})",
    "abs": "std::abs({0})", "sigmoid": "(T(1) / (T(1) + {exp}(-{0})))",
    "relu": "(!({0} <= T(0)) ? {0} : T(0))",  # NaN stays NaN, as np.maximum(x, 0)
}
REDUCTIONS = ("sum", "mean")
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
# libm functions the ops call; declared with simd variants (glibc's libmvec) when vector_math() says so
MATH = ("exp", "log", "sin", "cos", "tanh", "pow")


def vector_math() -> bool:
    """Whether glibc's libmvec has vector tanh/exp/... (runtime/vector_math.py): loops then vectorize."""
    return _vector_math.available()


MAX_DIMS = 16


def input_kinds(sub: Graph) -> List[str]:
    """``full``, ``scalar`` or ``bcast`` for each input of the fused group."""
    shape = sub.nodes[0].out_shapes[0]
    kinds = []
    for s in sub.input_shapes:
        kinds.append("full" if tuple(s) == tuple(shape) else "scalar" if int(np.prod(s)) == 1 else "bcast")
    return kinds


def kernel_source(sub: Graph, simd: bool = False) -> Tuple[str, str]:
    """(symbol, C++ source) of the kernel for the fused group ``sub``; ``simd``: declare libmvec variants."""
    kinds = input_kinds(sub)
    ctype = _CTYPES[np.dtype(sub.nodes[0].out_dtypes[0])]
    fn = {m: m + ("f" if ctype == "float" else "") for m in MATH}
    used = sorted({m for n in sub.nodes for m in MATH if "{" + m + "}" in OPS.get(n.op, "")})
    decls = _vector_math.declarations(used, (ctype,)) if simd else ""
    nin, nout = len(kinds), len(sub.outputs)
    body: List[str] = []
    for j, k in enumerate(kinds):
        if k == "full":
            body.append(f"        const T a{j} = in{j}[base + i];")
        elif k == "bcast":
            body.append(f"        const T a{j} = in{j}[off{j} + i * st{j}[last]];")
    names = {}
    for j, k in enumerate(kinds):
        names[("in", j)] = f"s{j}" if k == "scalar" else f"a{j}"
    red = sub.nodes[-1] if sub.nodes[-1].op in REDUCTIONS else None
    for n in sub.nodes:
        if n is red:
            body.append(f"        acc += v{n.inputs[0].node};")  # type: ignore[union-attr]
            continue
        args = [names[("in", r.index)] if isinstance(r, Input) else f"v{r.node}" for r in n.inputs]
        body.append(f"        const T v{n.id} = {OPS[n.op].format(*args, **fn)};")
    for k, r in enumerate(sub.outputs):
        assert isinstance(r, Output)
        if red is None or r.node != red.id:
            body.append(f"        out{k}[base + i] = v{r.node};")
    before, after, done, fill = "", "", "", ""
    total: List[str] = []
    if red is not None:
        ro = len(sub.outputs) - 1
        all_axes = red.attrs.get("axis") is None or len(red.attrs["axis"]) == len(sub.nodes[0].out_shapes[0])
        scale = "/ double(rows * inner)" if all_axes else "/ double(inner)"
        scale = scale if red.op == "mean" else ""
        empty = "std::nan(\"\")" if red.op == "mean" else "0.0"
        before = "    double acc = 0;\n#pragma omp simd reduction(+ : acc)"
        if all_axes:
            total.append("  double total = 0;")
            after = "    total += acc;"
            done = f"  out{ro}[0] = static_cast<T>(total {scale});"
            fill = f"    out{ro}[0] = static_cast<T>({empty});"
        else:
            after = f"    out{ro}[r] = static_cast<T>(acc {scale});"
            fill = f"    for (int64_t r = 0; r < rows; ++r) out{ro}[r] = static_cast<T>({empty});"
    head = [f"    const T *in{j} = static_cast<const T *>(params[{j}]);" for j in range(nin)]
    head += [f"    T *out{k} = static_cast<T *>(params[{nin + k}]);" for k in range(nout)]
    head += [f"    const T s{j} = in{j}[0];" for j, k in enumerate(kinds) if k == "scalar"]
    bc = [j for j, k in enumerate(kinds) if k == "bcast"]
    head += [f"    int64_t st{j}[kMaxDims];\n    if (!Strides(ndims[{j}], shapes[{j}], nd, oshape, st{j})) return 3;"
             for j in bc]
    head += total
    row = [f"      int64_t off{j} = Offset(r, nd, oshape, st{j});" for j in bc]
    text = _TEMPLATE.format(decls=decls, ctype=ctype, nin=nin, nout=nout, head="\n".join(head), row="\n".join(row),
                            body="\n".join(body), max_dims=MAX_DIMS, ops=", ".join(n.op for n in sub.nodes),
                            before=before, after=after, done=done, fill=fill,
                            bshape="\n".join(f"  Broadcast(ndims[{j}], shapes[{j}], nd, oshape);" for j in range(nin)))
    digest = hashlib.blake2b(text.encode(), digest_size=10).hexdigest()
    symbol = f"ob_fused_{digest}"
    return symbol, text.replace("SYMBOL", symbol)


_TEMPLATE = """\
// Generated by runtime/graph/kernel_source.py: {ops}
#include <cmath>
#include <cstdint>
{decls}

namespace {{
constexpr int kMaxDims = {max_dims};
using T = {ctype};

// Per output dim, the step in an input of ndim/shape broadcast to the output (0 along broadcast dims).
bool Strides(int ndim, const int64_t *shape, int nd, const int64_t *oshape, int64_t *st) {{
  int64_t step = 1;
  for (int d = nd - 1; d >= 0; --d) {{
    const int k = d - (nd - ndim);
    if (k < 0 || shape[k] == 1) {{
      st[d] = 0;
    }} else if (shape[k] != oshape[d]) {{
      return false;
    }} else {{
      st[d] = step;
      step *= shape[k];
    }}
  }}
  return true;
}}

// Widen oshape (nd dims) by an input of ndim/shape, as numpy broadcasts (a 0 wins over a 1).
void Broadcast(int ndim, const int64_t *shape, int nd, int64_t *oshape) {{
  for (int k = 0; k < ndim; ++k) {{
    const int d = k + (nd - ndim);
    if (shape[k] != 1) oshape[d] = shape[k];
  }}
}}

// The input offset of the first element of row r (all dims but the last).
int64_t Offset(int64_t r, int nd, const int64_t *oshape, const int64_t *st) {{
  int64_t off = 0;
  for (int d = nd - 2; d >= 0; --d) {{
    off += (r % oshape[d]) * st[d];
    r /= oshape[d];
  }}
  return off;
}}
}}  // namespace

extern "C" int SYMBOL(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {{
  (void)dtypes;
  (void)stream;
  (void)extra;
  if (nparam != {nin} + {nout}) return 1;
  // the loop's shape: the inputs' shapes broadcast together
  int nd = 0;
  for (int j = 0; j < {nin}; ++j) nd = ndims[j] > nd ? ndims[j] : nd;
  if (nd > kMaxDims) return 2;
  int64_t oshape[kMaxDims];
  for (int d = 0; d < nd; ++d) oshape[d] = 1;
{bshape}
  const int last = nd > 0 ? nd - 1 : 0;
  (void)last;
  const int64_t inner = nd > 0 ? oshape[nd - 1] : 1;
  int64_t rows = 1;
  for (int d = 0; d + 1 < nd; ++d) rows *= oshape[d];
{head}
  if (inner == 0 || rows == 0) {{
{fill}
    return 0;
  }}
  for (int64_t r = 0; r < rows; ++r) {{
    const int64_t base = r * inner;
    (void)base;
{row}
{before}
    for (int64_t i = 0; i < inner; ++i) {{
{body}
    }}
{after}
  }}
{done}
  return 0;
}}
"""

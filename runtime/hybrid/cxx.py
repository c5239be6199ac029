"""C++ from a validated DSL function, specialized on the inputs' dtypes and ranks.

Shapes stay run-time values: each tensor ``x`` of rank r gets sizes
``u_x_n0 .. u_x_n{r-1}`` read from the aot ABI's ``shapes`` array, and an element
``x[i, j]`` is ``u_x[u_i * u_x_n1 + u_j]``; a new shape runs the same library. Every DSL name reaches
C++ through names.py, which keeps it apart from keywords, macros and the generator's own names. The
entry point is an aot C function (``extern "C" int symbol(nparam, params,
ndims, shapes, dtypes, stream, extra)``), called by ``ops.Custom``'s aot path.

Types follow dsl.py (numpy's promotion, Python numbers weak): each operation
is computed in its result type, so the generated code matches the Python
target. A scalar keeps one C++ type: the promotion of everything assigned to
it (found by iterating to a fixed point). Loop hints: ``vectorize`` and
``parallel`` assert independent iterations (``#pragma GCC ivdep``),
``unroll`` asks for unrolling; ``serial``/``reduce``/``range`` are plain loops.

Where numpy (or Python) raises, so does the kernel: a negative integer power,
int() of NaN or infinity, an element assignment out of an integer dtype's
range, a Python int out of the range of the integer dtype it meets. Each such
check is a "site" with its exception and message (file:line, the operation);
a failed check throws ``ob::Raise``, the entry function returns
``RAISE_BASE + site`` and the runtime raises the site's exception
(``Generated.raises``). A Python int known when the code is generated (a
literal, a module constant) is checked then: ``HybridOverflowError``.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

import numpy as np

from . import names
from .cxx_prelude import PRELUDE
from .dsl import CASTS, CTYPES, GRID, INTRINSICS, VType, promote, result_of
from .errors import HybridOverflowError, HybridTypeError, negative_size_message
from .shapes import _Unknown, static_dtype
from .source import ParsedKernel
from .validate import KernelInfo

__all__ = ["generate", "generate_kernel", "tensor_types", "Generated", "RAISE_BASE"]

RAISE_BASE = 1000  # a kernel's status for its check site k (an error numpy raises) is RAISE_BASE + k

_SMALL = ("float16", "int8", "int16", "uint8", "bool")  # C++ promotes these: cast each result back
_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitAnd: "&", ast.BitOr: "|",
          ast.BitXor: "^"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_INT64 = VType("int64", True)
_NARROW = ("int8", "int16", "int32", "uint8")  # integer dtypes a Python int (an int64 here) may not fit


def _fits(v: int, dtype: str) -> bool:
    info = np.iinfo(dtype)
    return int(info.min) <= v <= int(info.max)


def _c_string(text: str) -> str:
    """``text`` (a file name, DSL source) as the inside of a C++ string literal."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def _comment(text: str) -> str:
    """``text`` as the rest of a ``//`` comment line: no line break, no backslash that would continue it."""
    return text.replace("\n", " ").replace("\r", " ").rstrip("\\ \t")


class Generated(NamedTuple):
    """A generated kernel: its C++ and, per check site, the exception it raises (type and message)."""

    text: str
    raises: Tuple[Tuple[Type[Exception], str], ...]


class _NotYet(Exception):
    """A scalar's type is not known yet (the fixed-point pass retries)."""


def _rank_of(shape: ast.expr, ranks: Dict[str, int]) -> int:
    if isinstance(shape, ast.Attribute):
        assert isinstance(shape.value, ast.Name)
        return ranks[shape.value.id]
    assert isinstance(shape, (ast.Tuple, ast.List))
    return len(shape.elts)


def tensor_types(parsed: ParsedKernel, info: KernelInfo,
                 inputs: Sequence[Tuple[str, int]]) -> Dict[str, Tuple[str, int]]:
    """(dtype, rank) of every tensor (inputs, outputs, temporaries) for inputs of these dtypes and ranks."""
    types = dict(zip(info.inputs, inputs))
    for name, call in info.decls.items():
        try:
            dt = static_dtype(call.args[1], {k: v[0] for k, v in types.items()})
        except _Unknown as e:
            raise parsed.error(e.node, str(e), HybridTypeError) from None
        types[name] = (dt, _rank_of(call.args[0], {k: v[1] for k, v in types.items()}))
    return types


class _Gen:
    def __init__(self, parsed: ParsedKernel, info: KernelInfo, inputs: Sequence[Tuple[str, int]],
                 debug: bool) -> None:
        self.p = parsed
        self.info = info
        self.debug = debug
        self.needs_extra = False  # an output checks its declared sizes (output_check): opbuilder/aot.h
        self.tensors = tensor_types(parsed, info, inputs)
        self.scalars: Dict[str, Optional[VType]] = {n: None for n in info.scalars}
        self.lines: List[str] = []
        self.depth = 1
        self.tmp = 0
        self.grids: Dict[str, int] = {}
        self.nonneg_vars: set = set()  # loop indices in scope that never go negative
        self.raises: List[Tuple[Type[Exception], str]] = []  # check sites: status RAISE_BASE + index

    def err(self, node: ast.AST, msg: str) -> HybridTypeError:
        return self.p.error(node, msg, HybridTypeError)  # type: ignore[return-value]

    # ---- where numpy raises -------------------------------------------------
    def text(self, node: ast.AST) -> str:
        """The DSL text of ``node``, with an inlined callee's own names."""
        s = ast.unparse(node)
        for mangled, original in getattr(node, "ob_names", {}).items():
            s = re.sub(rf"\b{re.escape(mangled)}\b", original, s)
        return s

    def site(self, node: ast.AST, *problems: Tuple[Type[Exception], str]) -> int:
        """New check sites for ``node``, one per (exception, message); the status of the first."""
        first = RAISE_BASE + len(self.raises)
        where = f"{self.p.where(node)}:{getattr(node, 'lineno', 0)}: {self.text(node)}"
        kernel = getattr(node, "ob_kernel", self.p.name)
        self.raises += [(exc, f"{where}: {msg} (in hybrid kernel '{kernel}')") for exc, msg in problems]
        return first

    def static_int(self, e: ast.expr) -> Optional[int]:
        """The value of a Python int known when the code is generated (a literal, a module constant), or None."""
        if isinstance(e, ast.Constant):
            return e.value if type(e.value) is int else None
        if isinstance(e, ast.Name):
            n = e.id
            if n in self.tensors or n in self.scalars or n in self.info.loop_vars or n in self.info.grid_vars:
                return None
            v = self.info.constants.get(n)
            return v if type(v) is int else None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            v = self.static_int(e.operand)
            return None if v is None else -v if isinstance(e.op, ast.USub) else v
        return None

    def operand(self, code: str, t: VType, dtype: str, node: ast.AST, src: ast.expr) -> str:
        """``code`` (the value of ``src``, of type ``t``) as an operand of ``dtype`` in numpy's operation
        ``node``: a Python int out of an integer dtype's range is numpy's OverflowError."""
        if t.weak and t.kind == "i" and dtype in _NARROW:
            return self.fitted(code, t, dtype, node, src, f"a Python integer (here {self.text(src)}) out of "
                                                          f"bounds for {dtype}")
        return self.conv(code, t, dtype)

    def fitted(self, code: str, t: VType, dtype: str, node: ast.AST, src: ast.expr, message: str) -> str:
        """``code`` (an integer of type ``t``, the value of ``src``) as the integer ``dtype``, where numpy raises
        OverflowError for a value out of its range: a Python int known now (a literal, a module constant) is
        checked now (HybridOverflowError), anything else when the kernel runs (OverflowError: ``message``)."""
        v = self.static_int(src) if t.weak else None
        if v is not None:
            if not _fits(v, dtype):
                raise self.p.error(node, f"{self.text(node)}: Python integer {v} out of bounds for {dtype} "
                                         f"(numpy raises OverflowError here)", HybridOverflowError)
            return self.conv(code, t, dtype)
        s = self.site(node, (OverflowError, message))
        return f"ob::fit<{CTYPES[dtype]}>({code}, {s})"

    def float_to_int(self, code: str, dtype: str, node: ast.AST, out_of_range: str) -> str:
        """A float as ``dtype`` the way Python's int() and numpy's assignment do it: NaN is a ValueError, an
        infinity or a value out of range an OverflowError."""
        s = self.site(node, (ValueError, "cannot convert float NaN to integer"),
                      (OverflowError, "cannot convert float infinity to integer"),
                      (OverflowError, out_of_range))
        return f"ob::f2i_checked<{CTYPES[dtype]}>({code}, {s})"

    def store(self, code: str, t: VType, dtype: str, node: ast.AST, src: ast.expr) -> str:
        """``code`` (of type ``t``) assigned to an element of ``dtype``, as numpy's ``a[i] = v``: into an
        integer dtype, NaN is a ValueError and a value out of its range an OverflowError. numpy 2 checks every
        value stored into a signed integer dtype, but only Python numbers stored into uint8: a numpy scalar is
        cast into it (an int8 -1 is 255, a float NaN 0), as ``conv`` does."""
        if np.dtype(dtype).kind not in "iu" or t.kind == "b" or (dtype == "uint8" and not t.weak):
            return self.conv(code, t, dtype)
        if t.kind == "f":
            return self.float_to_int(code, dtype, node, f"the value is out of bounds for {dtype}")
        src_info, info = np.iinfo(t.dtype), np.iinfo(dtype)
        if not t.weak and info.min <= src_info.min and src_info.max <= info.max:
            return self.conv(code, t, dtype)
        if t.weak and dtype == "int64" and self.static_int(src) is None:
            return code
        return self.fitted(code, t, dtype, node, src, f"the value is out of bounds for {dtype}")

    # ---- types and conversions -------------------------------------------
    def conv(self, code: str, t: VType, dtype: str, node: Optional[ast.AST] = None) -> str:
        """``code`` (of type ``t``) as a value of ``dtype``."""
        if t.dtype == dtype and not (t.weak and dtype != "int64" and dtype != "float64"):
            return code
        ct = CTYPES[dtype]
        if t.kind == "f" and dtype not in ("float16", "float32", "float64", "bool"):
            return f"ob::f2i<{ct}>({code})"  # NaN and out-of-range values too: defined, never UB
        return f"static_cast<{ct}>({code})"

    def literal(self, value: object) -> Tuple[str, VType]:
        if isinstance(value, bool):
            return ("true" if value else "false"), VType("bool")
        if isinstance(value, int):
            if not -2 ** 63 <= value < 2 ** 63:
                raise ValueError(f"the integer {value} does not fit in int64")
            return (f"INT64_C({value})" if value >= 0 else f"(-INT64_C({-value}))"), _INT64
        r = repr(float(value))
        if r in ("inf", "-inf", "nan"):
            r = {"inf": "HUGE_VAL", "-inf": "(-HUGE_VAL)", "nan": "NAN"}[r]
        return r, VType("float64", True)

    # ---- expressions ------------------------------------------------------
    def expr(self, node: ast.expr) -> Tuple[str, VType]:
        if isinstance(node, ast.Constant):
            try:
                return self.literal(node.value)
            except ValueError as e:
                raise self.err(node, str(e)) from None
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node)
        if isinstance(node, ast.BoolOp):
            parts = []
            for v in node.values:
                code, tv = self.expr(v)
                if tv.dtype != "bool":
                    what = f"a Python {'int' if tv.kind == 'i' else 'float'}" if tv.weak else tv.dtype
                    raise self.err(node, f"'{self.text(node)}': 'and'/'or' of a non-bool value ({self.text(v)}, "
                                         f"{what}) gives one of the values in Python, not a bool; compare it "
                                         f"({self.text(v)} != 0) or convert it (bool_(...))")
                parts.append(code)
            op = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + op.join(parts) + ")", VType("bool")
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.IfExp):
            c = self.truth(node.test)
            a, ta = self.expr(node.body)
            b, tb = self.expr(node.orelse)
            t = promote(ta, tb)
            return f"({c} ? {self.conv(a, ta, t.dtype)} : {self.conv(b, tb, t.dtype)})", t
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.err(node, f"{type(node).__name__} is not a value here")

    def truth(self, node: ast.expr) -> str:
        if isinstance(node, ast.BoolOp):  # a condition: only the operands' truth matters, in both targets
            op = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + op.join(self.truth(v) for v in node.values) + ")"
        code, t = self.expr(node)
        return code if t.dtype == "bool" else f"({code} != 0)"

    def name(self, node: ast.Name) -> Tuple[str, VType]:
        n = node.id
        if n in self.tensors:
            dt, rank = self.tensors[n]
            if rank != 0:
                raise self.err(node, f"'{n}' is a tensor of rank {rank}; index it ({n}[...]) to read an element")
            return f"{names.var(n)}[0]", VType(dt)
        if n in self.scalars:
            t = self.scalars[n]
            if t is None:
                raise _NotYet(n)
            return names.var(n), t
        if n in self.info.loop_vars:
            return names.var(n), _INT64
        if n in self.info.grid_vars:
            raise self.err(node, f"'{n}' is a grid index (a tuple); use it as an index x[{n}] or read {n}[k]")
        if n in self.info.constants:
            return self.literal(self.info.constants[n])
        raise self.err(node, f"'{n}' is used before it is assigned")

    def binop(self, node: ast.BinOp) -> Tuple[str, VType]:
        a, ta = self.expr(node.left)
        b, tb = self.expr(node.right)
        op = type(node.op)
        if ta.dtype == "bool" and tb.dtype == "bool" and op not in (ast.BitAnd, ast.BitOr, ast.BitXor):
            raise self.err(node, "arithmetic on two bool values; convert one with int32(...) first")
        t = promote(ta, tb)
        if op in (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift) and t.kind == "f":
            raise self.err(node, f"the bitwise operator {type(node.op).__name__} needs integer operands")
        if op is ast.Div:
            if t.kind != "f":
                t = VType("float64", t.weak)
        ct = CTYPES[t.dtype]
        ca, cb = self.operand(a, ta, t.dtype, node, node.left), self.operand(b, tb, t.dtype, node, node.right)
        if op is ast.FloorDiv:
            code = f"ob::floordiv<{ct}>({ca}, {cb})"
        elif op is ast.Mod:
            code = f"ob::mod<{ct}>({ca}, {cb})"
        elif op is ast.Pow and t.kind == "i":
            code = f"ob::ipower<{ct}>({ca}, {cb}, {self.pow_site(node, t)})"
        elif op is ast.Pow:
            code = f"ob::power<{ct}>({ca}, {cb})"
        elif op in (ast.LShift, ast.RShift):  # a count past the width is 0 (or -1), as numpy's; never UB
            code = f"ob::{'shl' if op is ast.LShift else 'shr'}<{ct}>({ca}, {cb})"
        else:
            code = f"({ca} {_ARITH[op]} {cb})"
            if t.dtype in _SMALL:
                code = f"static_cast<{ct}>{code}"
        return code, t

    def pow_site(self, node: ast.AST, t: VType) -> int:
        msg = "Integers to negative integer powers are not allowed"
        if t.weak:  # two Python ints: Python's answer is a float, the DSL's type an int
            msg += " (Python gives a float for two Python ints, the DSL an int64: write float(a) ** b)"
        return self.site(node, (ValueError, msg))

    def unary(self, node: ast.UnaryOp) -> Tuple[str, VType]:
        if isinstance(node.op, ast.Not):
            return f"(!{self.truth(node.operand)})", VType("bool")
        a, t = self.expr(node.operand)
        if isinstance(node.op, ast.UAdd):
            return a, t
        if isinstance(node.op, ast.Invert):
            if t.kind == "f":
                raise self.err(node, "'~' needs an integer or bool operand")
            return (f"(!{a})" if t.dtype == "bool" else f"static_cast<{CTYPES[t.dtype]}>(~{a})"), t
        if t.dtype == "bool":
            raise self.err(node, "unary minus on a bool value")
        code = f"(-{a})"
        return (f"static_cast<{CTYPES[t.dtype]}>{code}" if t.dtype in _SMALL else code), t

    def compare(self, node: ast.Compare) -> Tuple[str, VType]:
        parts = []
        left = self.expr(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = self.expr(comp)
            t = promote(left[1], right[1])
            if t.kind in "iu" and (left[1].weak or right[1].weak):
                t = _INT64  # a Python int is compared by value (uint8 < -2 is False), as numpy 2 does
            parts.append(f"({self.conv(left[0], left[1], t.dtype)} {_CMP[type(op)]} "
                         f"{self.conv(right[0], right[1], t.dtype)})")
            left = right
        return ("(" + " && ".join(parts) + ")" if len(parts) > 1 else parts[0]), VType("bool")

    def index_code(self, node: ast.Subscript) -> Tuple[str, str]:
        """(C++ element reference, dtype) of ``x[i, j, ...]``."""
        assert isinstance(node.value, ast.Name)
        n = node.value.id
        dt, rank = self.tensors[n]
        sl = node.slice
        items: List[Tuple[str, bool]] = []
        for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]):
            if isinstance(e, ast.Name) and e.id in self.info.grid_vars:
                items += [(names.grid_index(e.id, k), True) for k in range(self.grids[e.id])]
                continue
            if isinstance(e, ast.Tuple) and not e.elts:
                continue  # x[()] of a rank-0 tensor
            code, t = self.expr(e)
            if t.kind not in "iu":
                raise self.err(e, f"an index must be an integer, got {t.dtype} ({ast.unparse(e)})")
            items.append((self.conv(code, t, "int64"), self.nonneg(e)))
        if len(items) != rank:
            raise self.err(node, f"'{n}' has rank {rank} but is indexed with {len(items)} index(es)")
        if self.debug:  # checks the index after wrapping a negative one once, as Python does
            text = getattr(node, "ob_text", None) or ast.unparse(node)
            where = _c_string(f"{self.p.where(node)}:{node.lineno}: {text}")
            items = [f"ob_check.at({c}, {names.size(n, k)}, \"{where}\")" for k, (c, _) in enumerate(items)]
        else:  # -1 is the last element: wrapped once, unless the index is known not to be negative
            items = [c if known else f"ob::wrap({c}, {names.size(n, k)})" for k, (c, known) in enumerate(items)]
        if rank == 0:
            return f"{names.var(n)}[0]", dt
        flat = items[0]
        for k in range(1, rank):
            flat = f"({flat}) * {names.size(n, k)} + {items[k]}"
        return f"{names.var(n)}[{flat}]", dt

    def nonneg(self, e: ast.expr) -> bool:
        """Whether the int expression ``e`` is known never to be negative (its index needs no wrapping)."""
        if isinstance(e, ast.Constant):
            return type(e.value) is int and e.value >= 0
        if isinstance(e, ast.Name):
            return e.id in self.nonneg_vars and e.id not in self.scalars
        if isinstance(e, ast.Subscript):
            return isinstance(e.value, ast.Attribute) or (isinstance(e.value, ast.Name) and
                                                          e.value.id in self.info.grid_vars)
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.Mod):  # Python's modulo takes the divisor's sign
                return isinstance(e.right, ast.Constant) and type(e.right.value) is int and e.right.value > 0
            if isinstance(e.op, (ast.Add, ast.Mult, ast.FloorDiv, ast.RShift, ast.BitAnd, ast.BitOr)):
                return self.nonneg(e.left) and self.nonneg(e.right)
        return False

    def subscript(self, node: ast.Subscript) -> Tuple[str, VType]:
        base = node.value
        if isinstance(base, ast.Attribute):  # x.shape[k]
            assert isinstance(base.value, ast.Name)
            n = base.value.id
            rank = self.tensors[n][1]
            k = ast.literal_eval(node.slice)
            if not -rank <= k < rank:
                raise self.err(node, f"{ast.unparse(node)}: '{n}' has rank {rank}")
            return names.size(n, k % rank), _INT64
        assert isinstance(base, ast.Name)
        if base.id in self.info.grid_vars:
            k = ast.literal_eval(node.slice)
            rank = self.grids[base.id]
            if not 0 <= k < rank:
                raise self.err(node, f"{ast.unparse(node)}: the grid has rank {rank}")
            return names.grid_index(base.id, k), _INT64
        code, dt = self.index_code(node)
        return code, VType(dt)

    def call(self, node: ast.Call) -> Tuple[str, VType]:
        assert isinstance(node.func, ast.Name)
        fn = INTRINSICS[node.func.id]
        args = [self.expr(a) for a in node.args]
        types = [t for _, t in args]
        if fn.name in ("max", "min", "power") and any(t.dtype == "bool" for t in types):
            raise self.err(node, f"{fn.name}() of bool values is not supported; cast them first "
                                 f"(int8(x), float32(x))")
        rt = result_of(fn, types)
        name = fn.name
        if name in ("float", "int") or name in CASTS:
            c, t = args[0]
            if rt.kind in "iu" and t.kind == "f" and (name == "int" or t.weak):
                # Python's int() (np.int8(2.5) too): NaN and infinities raise; the DSL's int is an int64
                return self.float_to_int(c, rt.dtype, node, f"the value is out of bounds for {rt.dtype}" if name != "int"
                                         else "the value is out of int64's range (the DSL's int is an int64)"), rt
            if name != "int":
                return self.operand(c, t, rt.dtype, node, node.args[0]), rt
            return self.conv(c, t, rt.dtype), rt
        if rt.dtype == "bool":  # isnan & co: in the argument's own (promoted) type
            t = types[0]
            work = "float" if t.dtype == "float16" else CTYPES[promote(t).dtype] if t.weak else CTYPES[t.dtype]
            return fn.cxx.format(f"static_cast<{work}>({args[0][0]})"), rt
        work_dt = "float32" if rt.dtype == "float16" else rt.dtype
        conv = [self.operand(c, t, work_dt, node, a) for (c, t), a in zip(args, node.args)]
        if name == "power" and rt.kind == "i":
            code = f"ob::ipower<{CTYPES[work_dt]}>({conv[0]}, {conv[1]}, {self.pow_site(node, rt)})"
        elif name in ("max", "min"):
            code = conv[-1]
            for c in reversed(conv[:-1]):
                code = f"ob::{name}<{CTYPES[work_dt]}>({c}, {code})"
        else:
            code = fn.cxx.format(*conv)
        if rt.dtype != work_dt or rt.dtype in _SMALL:
            code = f"static_cast<{CTYPES[rt.dtype]}>({code})"
        return code, rt

    # ---- statements -------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def assign(self, target: ast.expr, value: ast.expr, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            code, t = self.expr(value)
            n = target.id
            cur = self.scalars[n]
            new = t if cur is None else promote(cur, t)
            if new != cur:
                self.scalars[n] = new
                self.changed = True
            dest = self.scalars[n]
            assert dest is not None
            self.emit(f"{names.var(n)} = {self.conv(code, t, dest.dtype)};")
        else:
            assert isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
            val = self.stored(value, self.tensors[target.value.id][0], stmt)
            ref, _ = self.index_code(target)
            self.emit(f"{ref} = {val};")

    def stored(self, value: ast.expr, dtype: str, stmt: ast.stmt) -> str:
        """``value`` assigned to an element of ``dtype``. Of ``a if c else b``, Python stores the branch taken
        as it is (a Python float 0.1 stays 0.1, not a float16 0.1): each branch is converted on its own."""
        if isinstance(value, ast.IfExp):
            return (f"({self.truth(value.test)} ? {self.stored(value.body, dtype, stmt)} : "
                    f"{self.stored(value.orelse, dtype, stmt)})")
        code, t = self.expr(value)
        return self.store(code, t, dtype, stmt, value)

    def stmts(self, body: Sequence[ast.stmt]) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, (ast.Pass, ast.Expr, ast.Return)):
            return
        if isinstance(s, (ast.Assign, ast.AugAssign)):
            target = s.targets[0] if isinstance(s, ast.Assign) else s.target
            if isinstance(s, ast.Assign) and isinstance(target, ast.Name) and target.id in self.info.decls:
                self.decl(target.id)
                return
            self.emit(f"// {_comment(ast.unparse(s))}")
            value = s.value
            if isinstance(s, ast.AugAssign):
                load = ast.Name(target.id, ast.Load()) if isinstance(target, ast.Name) else target
                value = ast.copy_location(ast.BinOp(load, s.op, s.value), s)
            self.assign(target, value, s)
            return
        if isinstance(s, ast.If):
            self.emit(f"if ({self.truth(s.test)}) {{  // line {s.lineno}" if self.debug else
                      f"if ({self.truth(s.test)}) {{")
            self.block(s.body)
            orelse = s.orelse
            while len(orelse) == 1 and isinstance(orelse[0], ast.If):
                self.emit(f"}} else if ({self.truth(orelse[0].test)}) {{")
                self.block(orelse[0].body)
                orelse = orelse[0].orelse
            if orelse:
                self.emit("} else {")
                self.block(orelse)
            self.emit("}")
            return
        assert isinstance(s, ast.For)
        self.loop(s)

    def block(self, body: Sequence[ast.stmt]) -> None:
        self.depth += 1
        self.stmts(body)
        self.depth -= 1

    def loop(self, s: ast.For) -> None:
        it = s.iter
        assert isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and isinstance(s.target, ast.Name)
        var = s.target.id
        kind = it.func.id
        if kind == GRID:
            shape = it.args[0]
            if isinstance(shape, ast.Attribute):
                assert isinstance(shape.value, ast.Name)
                t = shape.value.id
                extents = [names.size(t, k) for k in range(self.tensors[t][1])]
            else:
                assert isinstance(shape, (ast.Tuple, ast.List))
                extents = [self.conv(*self.index_expr(e), "int64") for e in shape.elts]
            self.grids[var] = len(extents)
            opened = 0
            for k, ext in enumerate(extents):
                ix, ix_end = names.grid_index(var, k), names.grid_end(var, k)
                self.emit(f"for (int64_t {ix} = 0, {ix_end} = {ext}; {ix} < {ix_end}; ++{ix}) {{")
                self.depth += 1
                opened += 1
            self.stmts(s.body)
            for _ in range(opened):
                self.depth -= 1
                self.emit("}")
            return
        bounds = [self.conv(*self.index_expr(a), "int64") for a in it.args]
        start, stop = ("INT64_C(0)", bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        step = 1
        if len(it.args) == 3:
            try:
                step = ast.literal_eval(it.args[2])
            except ValueError:
                step = None
            if type(step) is not int or step == 0:
                raise self.err(it, f"the step of {kind}(...) must be a non-zero integer constant")
        if kind in ("vectorize", "parallel"):
            self.emit("#pragma GCC ivdep")
        elif kind == "unroll":
            self.emit("#pragma GCC unroll 8")
        cmp = "<" if step > 0 else ">"
        cv, cv_end = names.var(var), names.end(var)
        inc = f"++{cv}" if step == 1 else f"{cv} += {step}"
        self.emit(f"for (int64_t {cv} = {start}, {cv_end} = {stop}; {cv} {cmp} {cv_end}; {inc}) {{")
        if step > 0:
            known = len(it.args) == 1 or self.nonneg(it.args[0])
        else:  # counts down to just above the stop
            stop_node = it.args[1]
            known = self.nonneg(stop_node) or (isinstance(stop_node, ast.UnaryOp) and
                                               isinstance(stop_node.op, ast.USub) and
                                               isinstance(stop_node.operand, ast.Constant) and
                                               stop_node.operand.value == 1)
        outer = set(self.nonneg_vars)
        self.nonneg_vars = (outer | {var}) if known else (outer - {var})
        self.block(s.body)
        self.nonneg_vars = outer
        self.emit("}")

    def index_expr(self, e: ast.expr) -> Tuple[str, VType]:
        code, t = self.expr(e)
        if t.kind not in "iu":
            raise self.err(e, f"a loop bound or size must be an integer, got {t.dtype} ({ast.unparse(e)})")
        return code, t

    def decl(self, name: str) -> None:
        if name not in self.info.temporaries:
            self.output_check(name)  # an output: allocated by the runtime, its sizes read at entry
            return
        call = self.info.decls[name]
        dt, rank = self.tensors[name]
        shape = call.args[0]
        if isinstance(shape, ast.Attribute):
            assert isinstance(shape.value, ast.Name)
            dims = [names.size(shape.value.id, k) for k in range(rank)]
        else:
            assert isinstance(shape, (ast.Tuple, ast.List))
            dims = self.declared_dims(call)
        self.emit(f"// {_comment(ast.unparse(call))}")
        sizes = [names.size(name, k) for k in range(rank)]
        for n_k, d in zip(sizes, dims):
            self.emit(f"const int64_t {n_k} = {d};")
        size = " * ".join(sizes) or "1"
        ct, var, buf = CTYPES[dt], names.var(name), names.buffer(name)
        self.emit(f"std::unique_ptr<{ct}[]> {buf}(new {ct}[{size}]());")
        self.emit(f"{ct} *__restrict {var} = {buf}.get();")
        if self.debug and getattr(call, "ob_uninit", False) and dt.startswith("float"):
            # an output of an inlined DSL call: NaN-filled in debug builds, as the Python target's outputs are
            self.emit(f"for (int64_t i = 0, e = {size}; i < e; ++i) {var}[i] = static_cast<{ct}>(NAN);")
        self.emit(" ".join(f"(void){v};" for v in [var] + sizes))

    def declared_dims(self, call: ast.Call) -> List[str]:
        """The sizes of an ``output_tensor``/``allocate`` declared as a tuple, as C++ int64 expressions; a size
        that can be negative is checked first: numpy's ValueError, as the Python target's declaration raises."""
        shape = call.args[0]
        assert isinstance(shape, (ast.Tuple, ast.List))
        dims = [self.conv(*self.index_expr(e), "int64") for e in shape.elts]
        signed = [d for d, e in zip(dims, shape.elts) if not self.nonneg(e)]
        if signed:
            assert isinstance(call.func, ast.Name)
            message = negative_size_message(self.p.where(call), call.lineno, call.func.id,
                                            getattr(call, "ob_kernel", self.p.name))
            self.raises.append((ValueError, message))
            status = RAISE_BASE + len(self.raises) - 1
            self.emit(f"if ({' || '.join(f'{d} < 0' for d in signed)}) ob::raise({status});")
        return dims

    def output_check(self, name: str) -> None:
        """An output declared with sizes the kernel computes (``(n,)``, maybe from data) must have been
        allocated with them: out_shape may say otherwise, and the loops would then write past its end.
        A negative size is numpy's ValueError; a mismatch returns status 3 with a message, before anything
        is written."""
        call = self.info.decls[name]
        shape = call.args[0]
        if not isinstance(shape, (ast.Tuple, ast.List)) or not shape.elts:
            return  # x.shape: what the runtime allocated from the same inputs
        dims = self.declared_dims(call)
        self.needs_extra = True
        where = _c_string(f"{self.p.where(call)}:{call.lineno}").replace("%", "%%")  # in a printf format
        fmt = ", ".join(["%lld"] * len(dims)) + ("," if len(dims) == 1 else "")
        sizes = [names.size(name, k) for k in range(len(dims))]
        got = ", ".join(f"static_cast<long long>({n_k})" for n_k in sizes)
        want = ", ".join(f"static_cast<long long>({d})" for d in dims)
        cond = " || ".join(f"{d} != {n_k}" for d, n_k in zip(dims, sizes))
        self.emit(f"if ({cond}) {{")
        self.emit(f'  std::snprintf(static_cast<opbuilder::aot::ExtraData *>(extra)->error, 512, "{where}: output '
                  f"'{name}' is declared with shape ({fmt}) here, but was allocated as ({fmt}) (out_shape): "
                  f'make them agree", {want}, {got});')
        self.emit("  return 3;")
        self.emit("}")

    # ---- the whole kernel -------------------------------------------------
    def body(self) -> List[str]:
        """Statement lines; iterated until every scalar's type is fixed."""
        for _ in range(32):
            self.changed = False
            self.lines, self.depth, self.grids, self.nonneg_vars, self.raises = [], 1, {}, set(), []
            try:
                self.stmts(self.p.tree.body)
            except _NotYet:
                self.changed = True
                continue
            if not self.changed:
                return self.lines
        missing = sorted(n for n, t in self.scalars.items() if t is None)
        node = self._first_use(missing[0]) if missing else self.p.tree
        raise self.err(node, f"scalar '{missing[0] if missing else '?'}' is used before it is assigned")

    def _first_use(self, name: str) -> ast.AST:
        uses = [n for n in ast.walk(self.p.tree) if isinstance(n, ast.Name) and n.id == name
                and isinstance(n.ctx, ast.Load)]
        return min(uses, key=lambda n: (n.lineno, n.col_offset)) if uses else self.p.tree


def generate_kernel(parsed: ParsedKernel, info: KernelInfo, symbol: str, inputs: Sequence[Tuple[str, int]],
                    debug: bool = False) -> Generated:
    """The C++ source of ``symbol`` for inputs of these (dtype, rank), and its check sites."""
    g = _Gen(parsed, info, inputs, debug)
    body = g.body()
    params = info.inputs + info.outputs
    sig = ", ".join(f"{g.tensors[n][0]}[{g.tensors[n][1]}d]" for n in info.inputs)
    outs = ", ".join(f"{g.tensors[n][0]}[{g.tensors[n][1]}d]" for n in info.outputs)
    out = [f"// hybrid kernel '{_comment(parsed.name)}' ({_comment(parsed.filename)}), generated by runtime.hybrid",
           f"// inputs: {sig or 'none'} -> outputs: {outs}" + ("; debug build" if debug else ""),
           PRELUDE]
    if debug or g.needs_extra:
        out.append('#include "opbuilder/aot.h"\n')
    out.append(f'extern "C" int {symbol}(int nparam, void **params, int *ndims, int64_t **shapes, '
               f'const char **dtypes, void *stream, void *extra) {{')
    out.append("  (void)ndims; (void)dtypes; (void)stream; (void)extra;")
    out.append(f"  if (nparam < {len(params)}) return 1;")
    if debug:
        out.append("  ob::Check ob_check{static_cast<opbuilder::aot::ExtraData *>(extra)->error};")
    for i, n in enumerate(params):
        dt, rank = g.tensors[n]
        const = "const " if n in info.inputs else ""
        ct, var = CTYPES[dt], names.var(n)
        sizes = [names.size(n, k) for k in range(rank)]
        out.append(f"  {const}{ct} *__restrict {var} = static_cast<{const}{ct} *>(params[{i}]);")
        out += [f"  const int64_t {n_k} = shapes[{i}][{k}];" for k, n_k in enumerate(sizes)]
        out.append("  " + " ".join(f"(void){v};" for v in [var] + sizes))
    if debug:
        for n in info.outputs:
            dt, rank = g.tensors[n]
            if dt.startswith("float"):  # NaN-filled: a read of an element never written shows
                size = " * ".join(names.size(n, k) for k in range(rank)) or "1"
                out.append(f"  for (int64_t i = 0, e = {size}; i < e; ++i) {names.var(n)}[i] = "
                           f"static_cast<{CTYPES[dt]}>(NAN);")
    for n in sorted(g.scalars):
        t = g.scalars[n]
        assert t is not None
        out.append(f"  {CTYPES[t.dtype]} {names.var(n)} = {CTYPES[t.dtype]}();")
    if g.raises:  # only kernels with a check pay for the handler (none on the path that does not throw)
        out.append("  try {")
        out += ["  " + line for line in body]
        out.append("  } catch (const ob::Raise &r) {")
        out.append("    return r.status;  // the first error, as Python stops at it; the outputs are dropped")
        out.append("  }")
    else:
        out += body
    out.append("  return " + ("ob_check.failed ? 1 : 0;" if debug else "0;"))
    out.append("}")
    return Generated("\n".join(out) + "\n", tuple(g.raises))


def generate(parsed: ParsedKernel, info: KernelInfo, symbol: str, inputs: Sequence[Tuple[str, int]],
             debug: bool = False) -> str:
    """The C++ source of ``symbol`` for inputs of these (dtype, rank)."""
    return generate_kernel(parsed, info, symbol, inputs, debug).text

"""Differential test: every operator, intrinsic and cast of the hybrid DSL, run by the compiled C++ and by the
Python target (numpy), on inputs with negatives, zeros, -0.0, NaN, +-inf, the integer extremes and values
that overflow, and on empty inputs. Results are compared bit for bit (NaN positions equal, the sign of zeros
too), except the float math functions (sin, exp, erf, ...), allowed a few ulp: glibc's libm, which the C++
calls, and numpy's own SIMD implementations (float32 sin/cos/exp/log, float64 ones on AVX-512) are each
within a few ulp of the exact result, not always the same rounding. Every case also checks that the DSL
gives the expression numpy's result dtype.

Where numpy raises (a negative integer power, int() of NaN or of an infinity, an element assignment out of an
integer dtype's range, a Python int that does not fit the integer dtype it meets), the error cases run one
operation per (p, q) pair of input elements through both targets: the same value, or the same exception type;
a Python int constant that does not fit is refused when the compiled kernel is generated (OverflowError too).

All cases are a few generated kernels built as one library (one compiler run, ``build_together``); each
takes one input per dtype, so one specialization covers every mixed-dtype pair. The same library is built
once more with -fsanitize=address,undefined (and float-cast-overflow) and every case run in a child
process: no case may be undefined behaviour in the generated C++.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
N = 12  # values per input
FLOAT_MATH = ["sqrt", "rsqrt", "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "sin", "cos", "tan",
              "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf"]
ULP = {"float16": 1, "float32": 4, "float64": 4}  # allowed for FLOAT_MATH and the atan2/power of floats


def values(dtype: str) -> np.ndarray:
    """N special values of ``dtype``."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        big = {"float16": 60000.0, "float32": 3e38, "float64": 1e300}[dtype]
        v = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, big, np.nan, np.inf, -np.inf]
    elif dt.kind == "b":
        v = [False, True] * (N // 2)
    else:
        info = np.iinfo(dt)
        v = [0, 1, -1, 2, -7, 7, 3, info.min, info.max, info.min + 1, info.max - 1, -2]
        if dt.kind == "u":
            v = [0, 1, 255, 2, 249, 7, 3, 128, 127, 254, 200, 8]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array(v, dtype=object).astype(dt)


INPUTS = {d: f"x_{d}" for d in DTYPES}
BINOPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**", "and": "&",
          "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">="}
ARITH = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "lshift", "rshift")
FUNCS2 = ["max", "min", "power", "fmod", "atan2"]
MIXED = [("int8", "uint8"), ("uint8", "int8"), ("int16", "int32"), ("int32", "int64"), ("int8", "float16"),
         ("int16", "float32"), ("int32", "float32"), ("int64", "float64"), ("float16", "float32"),
         ("float32", "float64"), ("bool", "int8"), ("uint8", "float16"), ("int64", "uint8"), ("bool", "float32")]
WEAK = ["3", "-2", "2.5", "-0.0"]  # Python numbers (NEP 50 "weak" scalars), on the right and on the left


def _np_dtype(expr: str, env: Dict[str, object]) -> "np.dtype | None":
    """numpy's dtype of ``expr`` on scalars of the inputs' dtypes; None if numpy refuses the operation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return np.asarray(eval(expr, {"np": np, **env})).dtype
        except (TypeError, ValueError, OverflowError):
            return None


class Case:
    """One expression over ``a`` (index i) and maybe ``b`` (index j); its output is (N,) or (N, N)."""

    def __init__(self, name: str, expr: str, np_expr: str, dtype: np.dtype, two: bool, math: bool = False,
                 ulp_dtype: str = "") -> None:
        self.name, self.expr, self.np_expr, self.dtype, self.two = name, expr, np_expr, dtype, two
        self.math, self.ulp_dtype = math, ulp_dtype


def _sample_env() -> Dict[str, object]:
    return {INPUTS[d]: np.dtype(d).type(1) for d in DTYPES}


def binary_cases() -> List[Case]:
    env = _sample_env()
    pairs = [(d, d) for d in DTYPES] + MIXED
    cases = []
    for a, b in pairs:
        xa, xb = f"{INPUTS[a]}[i]", f"{INPUTS[b]}[j]"
        for op, sym in BINOPS.items():
            expr = f"{xa} {sym} {xb}"
            if op == "pow" and _raises_on_negative_power(a, b):
                continue  # numpy refuses negative integer powers: an error case (error_cases)
            dt = _np_dtype(f"{INPUTS[a]} {sym} {INPUTS[b]}", env)
            if a == b == "bool" and op in ARITH:
                continue  # the DSL refuses arithmetic on two bools (tests/test_hybrid_errors.py)
            if dt is not None:
                cases.append(Case(f"{op}_{a}_{b}", expr, "", dt, True, ulp_dtype=dt.name if op == "pow" else ""))
        for fn in FUNCS2:
            if fn == "power" and _raises_on_negative_power(a, b):
                continue  # an error case
            dt = _np_dtype(f"np.{ {'max': 'maximum', 'min': 'minimum', 'atan2': 'arctan2'}.get(fn, fn)}"
                           f"({INPUTS[a]}, {INPUTS[b]})", env)
            if fn in ("fmod", "atan2") and np.dtype(a).kind != "f" and np.dtype(b).kind != "f":
                dt = np.dtype("float64")  # the DSL's rule: int arguments give float64 (numpy: float16/32 too)
            if dt is not None and not (fn in ("max", "min", "power") and "bool" in (a, b)):
                cases.append(Case(f"{fn}_{a}_{b}", f"{fn}({xa}, {xb})", "", dt, True,
                                  ulp_dtype=dt.name if fn in ("atan2", "power") else ""))
    for d in DTYPES:
        xa = f"{INPUTS[d]}[i]"
        for w in WEAK:
            for op, sym in BINOPS.items():
                for left in (False, True):
                    expr = f"{w} {sym} {xa}" if left else f"{xa} {sym} {w}"
                    npx = f"{w} {sym} {INPUTS[d]}" if left else f"{INPUTS[d]} {sym} {w}"
                    if op == "pow" and "." not in w and (np.dtype(d).kind == "i" if left else
                                                         (w == "-2" and np.dtype(d).kind in "iub")):
                        continue  # an int to a negative int power: an error case (error_cases)
                    dt = _np_dtype(npx, env)
                    if dt is not None:
                        tag = w.replace("-", "m").replace(".", "p")
                        cases.append(Case(f"{op}_{d}_{tag}{'_l' if left else ''}", expr, "", dt, False,
                                          ulp_dtype=dt.name if op == "pow" else ""))
    return cases


def unary_cases() -> List[Case]:
    env = _sample_env()
    cases = []
    for d in DTYPES:
        x = f"{INPUTS[d]}[i]"
        kind = np.dtype(d).kind
        forms = {"neg": (f"-{x}", f"-{INPUTS[d]}"), "pos": (f"+{x}", f"+{INPUTS[d]}"),
                 "inv": (f"~{x}", f"~{INPUTS[d]}"), "not": (f"not {x}", "np.bool_(True)"),
                 "isnan": (f"isnan({x})", "np.bool_(True)"), "isinf": (f"isinf({x})", "np.bool_(True)"),
                 "isfinite": (f"isfinite({x})", "np.bool_(True)")}
        for fn in ("abs", "sign", "floor", "ceil", "trunc", "round"):
            if kind != "b":  # keep the argument's dtype (numpy's rint of an int is a float: the DSL's rule)
                forms[fn] = (f"{fn}({x})", f"{INPUTS[d]}")
        for fn in FLOAT_MATH:
            forms[fn] = (f"{fn}({x})", f"np.float64(1)" if kind != "f" else INPUTS[d])
        for name, (expr, npx) in forms.items():
            dt = _np_dtype(npx, env)
            if dt is not None:
                cases.append(Case(f"{name}_{d}", expr, "", dt, False, math=name in FLOAT_MATH,
                                  ulp_dtype=dt.name if name in FLOAT_MATH else ""))
        for t in DTYPES:  # casts
            fn = "bool_" if t == "bool" else t
            cases.append(Case(f"cast_{d}_{t}", f"{fn}({x})", "", np.dtype(t), False))
        cases.append(Case(f"float_{d}", f"float({x})", "", np.dtype("float64"), False))
        if kind != "f":  # int() of NaN, of an infinity: error cases
            cases.append(Case(f"int_{d}", f"int({x})", "", np.dtype("int64"), False))
    for d in ("float32", "int32", "uint8"):
        x, y = f"{INPUTS[d]}[i]", f"{INPUTS['float64']}[i]"
        cases += [Case(f"max3_{d}", f"max({x}, {y}, 0)", "", np.dtype("float64"), False),
                  Case(f"min4_{d}", f"min({x}, 1, {y}, {x})", "", np.dtype("float64"), False),
                  Case(f"select_{d}", f"({x} if {y} > 0 else {y})", "", np.dtype("float64"), False),
                  Case(f"chain_{d}", f"(0 <= {x} < 4)", "", np.dtype("bool"), False),
                  Case(f"logic_{d}", f"({x} > 0 and not {y} < 0 or {x} == {y})", "", np.dtype("bool"), False)]
    return cases


def _raises_on_negative_power(a: str, b: str) -> bool:
    """Whether ``a ** b`` is numpy's integer power with a signed exponent (ValueError when it is negative)."""
    return np.dtype(b).kind == "i" and np.dtype(a).kind in "iub"


def _kernel_source(name: str, cases: List[Case]) -> str:
    params = ", ".join(INPUTS[d] for d in DTYPES)
    n = f"{INPUTS['int8']}.shape[0]"
    lines = [f"def {name}({params}):"]
    for c in cases:
        shape = f"({n}, {n})" if c.two else f"({n},)"
        lines.append(f"    o_{c.name} = output_tensor({shape}, \"{c.dtype.name}\")")
    lines.append(f"    for i in range({n}):")
    lines.append(f"        for j in range({n}):")
    lines.append("            pass")
    for c in cases:
        if c.two:
            lines.append(f"            v_{c.name} = {c.expr}")
            lines.append(f"            o_{c.name}[i, j] = v_{c.name}")
    lines.append(f"        for j in range(1):")
    lines.append("            pass")
    for c in cases:
        if not c.two:
            lines.append(f"            v_{c.name} = {c.expr}")
            lines.append(f"            o_{c.name}[i] = v_{c.name}")
    lines.append("    return " + ", ".join(f"o_{c.name}" for c in cases))
    return "\n".join(lines) + "\n"


CHUNK = 120  # outputs per kernel


def _groups() -> List[Tuple[str, List[Case]]]:
    cases = binary_cases() + unary_cases()
    return [(f"diff_{k // CHUNK}", cases[k:k + CHUNK]) for k in range(0, len(cases), CHUNK)]


def make_module(path: Path):
    """Write the generated kernels' module to ``path`` and import it: (module, [(name, cases)])."""
    groups = _groups()
    text = "from runtime.hybrid import kernel\n\n\n" + "\n\n".join(
        ["@kernel\n" + _kernel_source(name, cases) for name, cases in groups] +
        ["@kernel\n" + _error_kernel_source(name, cases) for name, cases in _error_groups()])
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, groups


def inputs(n: int = N) -> List[np.ndarray]:
    return [values(d)[:n] for d in DTYPES]


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """How many representable values apart two float arrays are (same dtype; finite or equal infinities)."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[got.dtype.itemsize]
    g, w = got.view(bits).astype(np.int64), want.view(bits).astype(np.int64)
    g = np.where(g < 0, np.iinfo(bits).min - g, g)  # a monotonic integer line through -0.0/0.0
    w = np.where(w < 0, np.iinfo(bits).min - w, w)
    return np.abs(g - w)


def compare(case: Case, got: np.ndarray, want: np.ndarray) -> str:
    """'' when the two results agree, else what differs (first few elements)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{case.name}: {got.dtype}{got.shape} vs python target {want.dtype}{want.shape}"
    if got.dtype.kind != "f":
        bad = got != want
    else:
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        same = (got.view(f"u{got.itemsize}") == want.view(f"u{got.itemsize}")) | (nan_g & nan_w)
        if case.ulp_dtype:
            ok = np.isfinite(got) & np.isfinite(want) & (np.signbit(got) == np.signbit(want))
            ulp = np.zeros(got.shape, np.int64)
            ulp[ok] = _ulps(got[ok], want[ok])
            same |= ok & (ulp <= ULP[case.ulp_dtype])
        bad = ~same
    if not bad.any():
        return ""
    idx = np.argwhere(bad)[:4]
    return f"{case.name} [{case.expr}]: " + "; ".join(
        f"at {tuple(int(k) for k in ix)} C++ {got[tuple(ix)]!r} python {want[tuple(ix)]!r}" for ix in idx)


def run_all(mod, groups, n: int = N) -> List[str]:
    """Run every case through both targets; the disagreements."""
    from runtime import Tensor, ops
    xs = inputs(n)
    problems = []
    for name, cases in groups:
        k = getattr(mod, name)
        got = ops.Custom(k)(*[Tensor(x) for x in xs])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = k(*xs)
        for c, g, w in zip(cases, got, want):
            msg = compare(c, g.asnumpy(), np.asarray(w))
            if msg:
                problems.append(msg)
    return problems


def declared_types(mod, groups) -> List[str]:
    """Cases whose DSL type (the generated scalar's C++ type) is not numpy's result dtype."""
    from runtime.hybrid.dsl import CTYPES
    from runtime.hybrid.names import var as cxx_var
    sig = tuple((d, 1) for d in DTYPES)
    bad = []
    for name, cases in groups:
        src = getattr(mod, name).source(*sig)
        for c in cases:
            m = re.search(rf"^  (\w+) {cxx_var('v_' + c.name)} = ", src, re.M)
            if m is None or m.group(1) != CTYPES[c.dtype.name]:
                bad.append(f"{c.name} [{c.expr}]: the DSL types it {m.group(1) if m else '?'}, numpy "
                           f"{c.dtype.name}")
    return bad


def test_every_case_has_numpys_result_dtype(diff_kernels):
    mod, groups = diff_kernels
    assert declared_types(mod, groups) == []


def test_compiled_and_python_targets_agree_on_every_case(diff_kernels):
    mod, groups = diff_kernels
    problems = run_all(mod, groups)
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:400])


def test_empty_inputs_run_no_iteration_in_both_targets(diff_kernels):
    mod, groups = diff_kernels
    assert run_all(mod, groups, n=0) == []


# ---- where numpy raises --------------------------------------------------------------------------------------
# Each error case is one statement over x_a[p] (and x_b[q]), run by both targets once per (p, q) (values(d)
# holds NaN, infinities and each type's extremes): both give the same value, or both raise the same exception
# type. A case marked ``raises`` must raise for some input (a case that never raises could not catch a
# divergence). The cases are statements of a few kernels selected by a rank-0 ``sel`` input.
NARROW = ["int8", "int16", "int32", "uint8"]  # integer dtypes a Python int may not fit
BIG = {"int8": 300, "int16": 70000, "int32": 2 ** 31, "uint8": -1}  # a Python int out of each one's range


class ErrorCase:
    def __init__(self, name: str, stmt: str, dtype: str, two: bool, raises: bool = True) -> None:
        self.name, self.stmt, self.dtype, self.two, self.raises = name, stmt, dtype, two, raises


def _weak(expr: str) -> str:
    """A Python int made from run-time data, which neither target knows before the line runs."""
    return f"int({expr})"


def error_cases() -> List[ErrorCase]:
    env = _sample_env()
    out: List[ErrorCase] = []

    def add(name: str, expr: str, two: bool, raises: bool = True, dtype: str = "") -> None:
        if not dtype:
            py = re.sub(r"int\((\w+)\[[pq]\]\)", "1", expr)  # numpy's dtype, on scalars of the inputs' dtypes
            dtype = _np_dtype(re.sub(r"\[[pq]\]", "", py.replace("power(", "np.power(")), env).name
        out.append(ErrorCase(name, f"o_{name}[0] = {expr}", dtype, two, raises))

    ints = ["int8", "int16", "int32", "int64", "uint8"]
    pairs = [(d, d) for d in ints] + MIXED
    for a, b in pairs:  # a negative integer power: ValueError
        if _raises_on_negative_power(a, b):
            xa, xb = f"{INPUTS[a]}[p]", f"{INPUTS[b]}[q]"
            add(f"pow_{a}_{b}", f"{xa} ** {xb}", True)
            if "bool" not in (a, b):
                add(f"power_{a}_{b}", f"power({xa}, {xb})", True)
    for d in ["int8", "int16", "int32", "int64", "bool"]:  # uint8 ** -2: -2 does not fit (a constant case)
        x = f"{INPUTS[d]}[p]"
        add(f"pow_{d}_m2", f"{x} ** -2", False, dtype="int64" if d == "bool" else d)
        if d != "bool":
            add(f"pow_3_{d}", f"3 ** {x}", False, dtype=d)
            add(f"pow_m2_{d}", f"(-2) ** {x}", False, dtype=d)
    for f in ("float16", "float32", "float64"):
        x = f"{INPUTS[f]}[p]"
        add(f"int_{f}", f"int({x})", False)  # NaN: ValueError; an infinity, past int64: OverflowError
        for d in ints:  # stores into an integer element: numpy's a[i] = v
            add(f"store_{f}_{d}", x, False, raises=d != "uint8", dtype=d)  # numpy casts a numpy scalar into uint8
    for d in ints:  # a Python float cast to an integer type: numpy takes it as Python's int() does
        add(f"castf_{d}", f"{d}(float({INPUTS['float64']}[p]))", False, dtype=d)
    for src in ints:
        for dst in ints:
            si, di = np.iinfo(src), np.iinfo(dst)
            if not (di.min <= si.min and si.max <= di.max):  # a value of src may not fit dst
                add(f"store_{src}_{dst}", f"{INPUTS[src]}[p]", False, raises=dst != "uint8", dtype=dst)
    for d in NARROW:  # a Python int from data meets a narrower integer: numpy's OverflowError when out of range
        x, w = f"{INPUTS[d]}[p]", _weak(f"{INPUTS['int64']}[q]")
        for name, expr in {"add": f"{x} + {w}", "rsub": f"{w} - {x}", "mul": f"{x} * {w}",
                           "floordiv": f"{x} // {w}", "and": f"{x} & {w}", "lshift": f"{x} << {w}",
                           "max": f"max({x}, {w})", "min": f"min({w}, {x})"}.items():
            add(f"weak_{name}_{d}", expr, True)
        add(f"weak_lt_{d}", f"{x} < {w}", True, raises=False)  # a comparison is by value: never raises
        add(f"weak_div_{d}", f"{x} / {w}", True, raises=False)  # true division is float64: never raises
        add(f"weak_cast_{d}", f"{d}({_weak(INPUTS['int64'] + '[p]')})", False, dtype=d)
        add(f"weak_store_{d}", _weak(f"{INPUTS['int64']}[p]"), False, dtype=d)
    return out


ECHUNK = 40


def _error_groups() -> List[Tuple[str, List[ErrorCase]]]:
    cases = error_cases()
    return [(f"errs_{k // ECHUNK}", cases[k:k + ECHUNK]) for k in range(0, len(cases), ECHUNK)]


def _error_kernel_source(name: str, cases: List[ErrorCase]) -> str:
    params = ", ".join(INPUTS[d] for d in DTYPES)
    lines = [f"def {name}({params}, sel, pos):"]
    lines += [f"    o_{c.name} = output_tensor((1,), \"{c.dtype}\")" for c in cases]
    lines += ["    p = pos[0]", "    q = pos[1]"]
    for k, c in enumerate(cases):
        lines += [f"    if sel[()] == {k}:", f"        {c.stmt}"]
    lines.append("    return " + ", ".join(f"o_{c.name}" for c in cases))
    return "\n".join(lines) + "\n"


def _outcome(fn) -> "tuple[str, object]":
    """('value', result) or ('raise', exception type name), numpy's warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "value", fn()
        except (ValueError, OverflowError, ZeroDivisionError, TypeError) as e:
            return "raise", type(e).__name__


def run_errors(mod, groups) -> Tuple[List[str], Dict[str, set]]:
    """Every error case through both targets for every (p, q): the disagreements, and what each case raised."""
    from runtime import Tensor, ops
    xs = inputs()
    ts = [Tensor(x) for x in xs]
    problems, raised = [], {}
    for name, cases in groups:
        k = getattr(mod, name)
        op = ops.Custom(k)
        for i, c in enumerate(cases):
            sel = np.array(i, np.int64)
            raised[c.name] = set()
            for p in range(N):
                for q in range(N if c.two else 1):
                    pos = np.array([p, q], np.int64)
                    got = _outcome(lambda: op(*ts, Tensor(sel), Tensor(pos))[i].asnumpy())
                    want = _outcome(lambda: np.asarray(k(*xs, sel, pos)[i]))
                    if got[0] == "raise":
                        raised[c.name].add(got[1])
                    where = f"{c.name} [{c.stmt}] at p={p} q={q}"
                    if got[0] != want[0] or got[0] == "raise" and got[1] != want[1]:
                        problems.append(f"{where}: C++ {got[0]} {got[1]!r}, python {want[0]} {want[1]!r}")
                    elif got[0] == "value":
                        msg = compare(Case(c.name, c.stmt, "", np.dtype(c.dtype), False), got[1], want[1])
                        if msg:
                            problems.append(f"{where}: {msg}")
    return problems, raised


@pytest.fixture(scope="session")
def diff_kernels(tmp_path_factory, cache_dir):
    from runtime.hybrid import build_together
    mod, groups = make_module(tmp_path_factory.mktemp("hybrid_diff") / "hybrid_diff_cases.py")
    sig = tuple((d, 1) for d in DTYPES)
    esig = sig + (("int64", 0), ("int64", 1))
    build_together([(getattr(mod, name), sig) for name, _ in groups] +
                   [(getattr(mod, name), esig) for name, _ in _error_groups()])
    return mod, groups


def test_where_numpy_raises_both_targets_raise_the_same_exception(diff_kernels):
    mod, _ = diff_kernels
    groups = _error_groups()
    problems, raised = run_errors(mod, groups)
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:200])
    cases = [c for _, cs in groups for c in cs]
    assert [c.name for c in cases if c.raises and not raised[c.name]] == []
    assert [c.name for c in cases if not c.raises and raised[c.name]] == []
    kinds = {c.name.split("_")[0]: set() for c in cases}
    for c in cases:
        kinds[c.name.split("_")[0]] |= raised[c.name]
    assert kinds["pow"] == kinds["power"] == {"ValueError"}
    assert kinds["int"] == kinds["castf"] == {"ValueError", "OverflowError"}  # NaN; infinities, past the range
    assert kinds["store"] == {"ValueError", "OverflowError"} and kinds["weak"] == {"OverflowError"}


def _constant_cases() -> List[Tuple[str, str, str]]:
    """(name, dtype of x, statement) where a Python int constant does not fit the integer dtype it meets."""
    out = []
    for d in NARROW:
        c = BIG[d]
        forms = {f"{sym}": f"x[i] {sym} {c}" for sym in ("+", "-", "*", "//", "%", "**", "&", "|", "^", "<<", ">>")}
        forms.update({"left_sub": f"{c} - x[i]", "max": f"max(x[i], {c})", "cast": f"{d}({c})",
                      "pos": f"x[i] + (+{c})", "const": f"x[i] * BIG_{d}"})
        for k, expr in enumerate(forms.values()):
            out.append((f"const_{d}_{k}", d, f"y[i] = {expr}"))
        out.append((f"const_{d}_store", d, f"y[i] = {c}"))
    return out


@pytest.mark.build
def test_a_python_int_constant_out_of_range_is_refused_when_generated_as_numpy_refuses_it(tmp_path):
    """numpy raises OverflowError for int8 + 300 when the line runs; with the constant known, the compiled
    target refuses the kernel for those dtypes when it generates it (nothing is built), naming file:line."""
    from runtime.hybrid import HybridOverflowError
    cases = _constant_cases()
    text = "from runtime.hybrid import kernel\n" + "".join(f"BIG_{d} = {c}\n" for d, c in BIG.items())
    for name, d, stmt in cases:
        text += (f"\n\n@kernel\ndef {name}(x):\n    y = output_tensor(x.shape, x.dtype)\n"
                 f"    for i in range(x.shape[0]):\n        {stmt}\n    return y\n")
    path = tmp_path / "hybrid_const_cases.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = text.splitlines()
    for name, d, stmt in cases:
        k = getattr(mod, name)
        line = next(n for n, t in enumerate(lines, 1) if t.strip() == stmt and lines[n - 4] == f"def {name}(x):")
        c = BIG[d]
        with pytest.raises(HybridOverflowError, match=re.escape(f"{path}:{line}: ") + r".*" +
                           re.escape(f"Python integer {c} out of bounds for {d}")) as e:
            k.source((d, 1))
        assert isinstance(e.value, OverflowError)
        with pytest.raises(OverflowError, match=re.escape(f"Python integer {c} out of bounds for {d}")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                k(values(d))  # the Python target: numpy itself
    wide = mod.const_int8_0  # the same line for int16 values: 300 fits, both targets agree
    from runtime import Tensor, ops
    x = np.array([1, -2, 32000], np.int16)
    assert np.array_equal(ops.Custom(wide)(Tensor(x)).asnumpy(), wide(x))


# -O0: nothing the sanitizers check is optimized away, and the bundle compiles in 40% of -O1's CPU time
# (44 -> 17 s); ASan's advice of -O1 is for the speed of the program, which here runs for seconds
SANITIZE = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-O0"]


@pytest.mark.build
def test_no_case_is_undefined_behaviour_under_asan_and_ubsan(diff_kernels):
    from builder_util import require_asan, run_sanitized_child
    require_asan()
    mod, _ = diff_kernels
    run_sanitized_child([__file__, mod.__file__], "sanitized: OK", cwd=Path(__file__).resolve().parents[1])


if __name__ == "__main__":  # the sanitized child: build every case with the sanitizers, run both sizes
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from runtime.hybrid import build_together
    spec = importlib.util.spec_from_file_location("hybrid_diff_sanitized", sys.argv[1])
    _mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_mod)
    _groups_ = _groups()
    build_together([(getattr(_mod, name), tuple((d, 1) for d in DTYPES)) for name, _ in _groups_], SANITIZE,
                   ["-fsanitize=address,undefined,float-cast-overflow"])
    _problems = run_all(_mod, _groups_) + run_all(_mod, _groups_, n=0)
    print("\n".join(_problems[:20]))
    print("sanitized: OK" if not _problems else "sanitized: disagreements")

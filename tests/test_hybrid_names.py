"""Every DSL identifier reaches C++ under a name of its own (runtime/hybrid/names.py): C++ keywords, macros of
the prelude's headers, the generator's own names (``i_end`` beside a loop over ``i``, ``x_n1`` beside a tensor
``x``, ``g_0`` beside a grid index ``g``), names with leading underscores and non-ASCII names all give the
Python target's results. Kernels are generated from a seeded pool of such names, each name in several roles
(input, output, temporary, scalar, loop and grid index), and built as one library (one compiler run)."""
import importlib.util
import keyword
import random
import re
import subprocess
import unicodedata
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from runtime import Tensor, ops
from runtime.hybrid import build_together, kernel
from runtime.hybrid import names
from runtime.hybrid.cxx_prelude import PRELUDE
from runtime.hybrid.dsl import DECLS, GRID, INTRINSICS, LOOPS

from builder_util import run_python

ROOT = Path(__file__).resolve().parents[1]

CXX_KEYWORDS = """alignas alignof asm auto bool break case catch char char8_t char16_t char32_t class concept const
consteval constexpr constinit const_cast continue co_await co_return co_yield decltype default delete do double
dynamic_cast else enum explicit export extern false float for friend goto if inline int long mutable namespace new
noexcept nullptr operator private protected public register reinterpret_cast requires return short signed sizeof
static static_assert static_cast struct switch template this thread_local throw true try typedef typeid typename
union unsigned using virtual void volatile wchar_t while and and_eq bitand bitor compl not not_eq or or_eq xor
xor_eq final override import module _Float16 _Bool _Complex __int128 __restrict __attribute__""".split()
MACROS = """errno NULL M_PI M_E M_SQRT2 assert EOF stdin stdout stderr BUFSIZ INFINITY NAN HUGE_VAL HUGE_VALF INT64_C
UINT64_C INT64_MAX INT64_MIN INT32_MIN INT8_MIN UINT8_MAX SIZE_MAX FILENAME_MAX FP_NAN FP_INFINITE MATH_ERRNO
math_errhandling L_tmpnam SEEK_SET TMP_MAX offsetof va_arg setjmp unix linux i386 __cplusplus __GNUC__ __FILE__
__LINE__ _GNU_SOURCE __STDC__ __x86_64__ __builtin_expect isnan signbit fpclassify""".split()
GENERATED = """params nparam ndims shapes dtypes stream extra ob_check ob std opbuilder r e i j k n x y z i0 i0_end
i_end x_n0 x_n1 g_0 g_0_end t_buf u_i u_i_end u_x_n0 u_0x u_i_0end u_10003b1 u_ u__ static_cast main
_10003b1 x_0 x_00 i_0end""".split()  # the last ones spell the escapes of other names (α, x_, ...)
UNDERSCORED = "_ __ ___ _x __x _X __X __init__ _0 _1000 _n0 x_ x__ a__b _end _buf".split()
UNICODE = "α β_1 变量 ñ Ωmega x_α 日本 ǅ ﬁx π_end ζ_n0".split()
DSL = set(INTRINSICS) | set(DECLS) | set(LOOPS) | {GRID}


def _pool() -> List[str]:
    """The identifiers to try, as Python sees them (NFKC-normalized), without Python keywords or DSL names."""
    seen: Dict[str, None] = {}
    for raw in CXX_KEYWORDS + MACROS + GENERATED + UNDERSCORED + UNICODE:
        n = unicodedata.normalize("NFKC", raw)
        if n.isidentifier() and not keyword.iskeyword(n) and n not in DSL and n not in ("range", "grid"):
            seen[n] = None
    return list(seen)


POOL = _pool()
ROUNDS = 2  # each name is given a role in this many kernels (different roles: the pool is shuffled anew)
PER_KERNEL = 24  # names of the pool per kernel; the generator's look-alikes of some of them are added


def _lookalikes(a: str, b: str, t: str, loops: List[str], grids: List[str]) -> List[List[str]]:
    """Scalar names, per loop group, that spell what the generator derives (or derived) from this kernel's
    own names: a loop's end bound, a tensor's sizes, a grid coordinate, a temporary's buffer."""
    old = [[f"{loops[1]}_end", f"{a}_n0", f"{t}_buf", f"{grids[0]}_0", f"{grids[0]}_1_end"],
           [f"{loops[2]}_end", f"{b}_n1", f"{grids[1]}_0_end"],
           [f"{loops[3]}_end", f"{b}_n0", f"{grids[1]}_1"]]
    new = [[names.end(loops[1]), names.size(a, 0), names.buffer(t), names.grid_index(grids[0], 0)],
           [names.end(loops[2]), names.var(loops[2]), names.size(b, 1)],
           [names.end(loops[3]), names.grid_end(grids[1], 1), names.var(b)]]
    return [o + n for o, n in zip(old, new)]


def _kernel_source(fname: str, chosen: List[str]) -> str:
    """A kernel using ``chosen`` names in every role; its scalars are updated inside loops over look-alike
    bounds, so a name the C++ shares with another changes a result (or the build)."""
    tensors, rest = chosen[:5], chosen[5:]
    a, b, o, p, t = tensors
    loops, grids, scalars = rest[:4], rest[4:6], rest[6:]
    taken = set(chosen)
    groups: List[List[str]] = [[], [], []]
    for k, s in enumerate(scalars):
        groups[k % 3].append(s)
    for g, extra in zip(groups, _lookalikes(a, b, t, loops, grids)):
        for s in extra:
            if s.isidentifier() and s not in taken and s not in DSL:
                taken.add(s)
                g.append(s)
    every = [s for g in groups for s in g]
    col = {s: k for k, s in enumerate(every)}
    L0, L1, L2, L3 = loops
    G0, G1 = grids
    lines = [f"def {fname}({a}, {b}):",
             f"    {o} = output_tensor(({a}.shape[0], {len(every)}), \"float64\")",
             f"    {p} = output_tensor({b}.shape, \"float64\")",
             f"    {t} = allocate(({a}.shape[0],), \"float64\")"]
    lines += [f"    {s} = {col[s]} + 0.25" for s in every]
    lines += [f"    for {L0} in range({a}.shape[0]):",
              f"        {t}[{L0}] = {a}[{L0}] * 2.0 + {b}[{L0}, 1]",
              f"    for {L1} in range({a}.shape[0]):",
              f"        for {L2} in range(1, 4):"]
    lines += [f"            {s} = {s} + {L2} * {col[s] + 2} + {a}[{L1}] + 1000.0" for s in groups[1]]
    lines += [f"        for {L3} in range({b}.shape[1] - 1, -1, -1):"]
    lines += [f"            {s} = {s} * 0.5 + {L3} * {col[s] + 3} + {b}[{L1}, {L3}]" for s in groups[2]]
    lines += [f"        {s} = {s} + {t}[{L1}] + {L1} * {col[s] + 1}" for s in groups[0]]
    lines += [f"        {o}[{L1}, {col[s]}] = {s}" for s in every]
    lines += [f"    for {G0} in grid({b}.shape):",
              f"        {p}[{G0}] = {b}[{G0}] * 3.0 + {G0}[0] * 10.0 + {G0}[1]",
              f"    for {G1} in grid(({a}.shape[0], 2)):",
              f"        {p}[{G1}[0], {G1}[1]] = {p}[{G1}[0], {G1}[1]] + {G1}[1] * 100.0 + {t}[{G1}[0]]",
              f"    return {o}, {p}"]
    return "\n".join(lines) + "\n"


def _plan(seed: int = 2026) -> List[List[str]]:
    """The names of each kernel: the pool shuffled ROUNDS times and cut into kernels of PER_KERNEL names."""
    rng = random.Random(seed)
    plans = []
    for _ in range(ROUNDS):
        order = POOL[:]
        rng.shuffle(order)
        order += order[:(-len(order)) % PER_KERNEL]  # the last kernel is filled up from the start
        for k in range(0, len(order), PER_KERNEL):
            plans.append(order[k:k + PER_KERNEL])
    return plans


KERNEL_NAMES = ["names_k", "_kernel_α", "new", "__x__", "变换", "k__2"]


@pytest.fixture(scope="module")
def name_module(tmp_path_factory):
    """The generated kernels' module, written to a file and imported: (module, kernel function names)."""
    plans = _plan()
    fnames = [f"{KERNEL_NAMES[k % len(KERNEL_NAMES)]}{k}" for k in range(len(plans))]
    path = tmp_path_factory.mktemp("names") / "name_kernels.py"
    path.write_text("\n\n".join(_kernel_source(f, c) for f, c in zip(fnames, plans)), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("name_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, fnames


@pytest.fixture(scope="module")
def name_kernels(name_module):
    """The generated kernels, those of the first round also as debug builds (which name the sizes in their
    index checks), built as one library."""
    mod, fnames = name_module
    debug = fnames[:len(fnames) // ROUNDS]  # every name of the pool once in a debug build
    ks = [kernel(getattr(mod, f)) for f in fnames] + [kernel(getattr(mod, f), debug=True) for f in debug]
    sig = (("float64", 1), ("float64", 2))
    build_together([(k, sig) for k in ks])
    return ks


def _inputs():
    a = np.arange(5, dtype=np.float64) * 1.5 - 2.0
    b = np.arange(15, dtype=np.float64).reshape(5, 3) * 0.5 - 3.0
    return a, b


def test_every_identifier_gives_the_python_targets_results(name_kernels):
    a, b = _inputs()
    used = set()
    for k in name_kernels:
        info = k.check()
        used |= set(info.inputs) | set(info.decls) | info.scalars | info.loop_vars | info.grid_vars
        got = ops.Custom(k)(Tensor(a), Tensor(b))
        want = k(a, b)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.asnumpy(), w, err_msg=f"kernel {k.__name__} (debug={k.debug})")
    assert set(POOL) <= used  # every name of the pool took part


@pytest.mark.build
def test_generated_names_are_ascii_c_identifiers_apart_from_keywords_and_every_macro(tmp_path):
    # the macros the prelude's headers (and opbuilder/aot.h, which debug builds include) define, as g++ sees them
    header = tmp_path / "prelude.cpp"
    header.write_text(PRELUDE + '#include "opbuilder/aot.h"\n')
    out = subprocess.run(["g++", "-std=c++17", "-dM", "-E", "-I", str(ROOT / "include"), str(header)],
                         capture_output=True, text=True, check=True).stdout
    macros = set(re.findall(r"^#define (\w+)", out, re.M))
    assert {"errno", "NULL", "M_PI", "EOF", "stdin", "INT64_C"} <= macros
    reserved = macros | set(CXX_KEYWORDS)
    mapped = {}
    for n in POOL + [unicodedata.normalize("NFKC", s) for s in UNICODE] + ["a" * 50, "ab_cd_ef"]:
        derived = [names.var(n), names.end(n), names.buffer(n)] + \
                  [f(n, k) for k in range(12) for f in (names.size, names.grid_index, names.grid_end)]
        for d in derived:
            assert re.fullmatch(r"u_[A-Za-z0-9]\w*", d) and "__" not in d and d.isascii(), (n, d)
            assert d not in reserved, (n, d)
            assert mapped.setdefault(d, n) == n, f"{n!r} and {mapped[d]!r} share the C++ name {d}"


def test_symbols_are_ascii_whatever_the_kernels_name(name_module):
    mod, fnames = name_module
    for f in fnames:
        symbol = kernel(getattr(mod, f)).symbol((("float64", 1), ("float64", 2)))
        assert re.fullmatch(r"hybrid_[A-Za-z0-9]+(_[A-Za-z0-9]+)*", symbol), symbol


# the issue's cases: a scalar named like a loop's bound (read in the loop; updated in it), a loop index named
# like a tensor's size, C++ keywords and a macro as scalars
ISSUE_SOURCE = '''
from runtime.hybrid import kernel


@kernel
def read_bound(x):
    y = output_tensor(x.shape, x.dtype)
    i_end = 100.0
    for i in range(x.shape[0]):
        y[i] = x[i] + i_end
    return y


@kernel
def write_bound(x):
    y = output_tensor(x.shape, x.dtype)
    i_end = 0.0
    for i in range(x.shape[0]):
        i_end = i_end + 1000
        y[i] = x[i] + i_end
    return y


@kernel
def size_index(x):
    y = output_tensor(x.shape, x.dtype)
    for x_n1 in range(x.shape[0]):
        for j in range(x.shape[1]):
            y[x_n1, j] = x[x_n1, j] + 1.0
    return y


@kernel
def keywords(x):
    y = output_tensor(x.shape, x.dtype)
    new = 2.0
    delete = 3.0
    this = 0.5
    errno = 1.0
    for i in range(x.shape[0]):
        y[i] = x[i] * new + delete * this + errno
    return y
'''

CHILD = '''
import importlib.util, sys
import numpy as np
from runtime import Tensor, ops
spec = importlib.util.spec_from_file_location("issue_kernels", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
x1 = np.arange(4, dtype=np.float32)
x2 = np.arange(12, dtype=np.float32).reshape(4, 3)
for name, x in (("read_bound", x1), ("write_bound", x1), ("size_index", x2), ("keywords", x1)):
    k = getattr(mod, name)
    got = ops.Custom(k)(Tensor(x)).asnumpy()
    want = k(x)
    print(name, "same" if np.array_equal(got, want) else f"differs: {got.tolist()} vs {want.tolist()}", flush=True)
'''


@pytest.mark.build
def test_the_issues_kernels_agree_with_the_python_target(tmp_path):
    """Before the fix: read_bound gave x + 4, size_index zeros, keywords did not build, and write_bound rewrote
    its loop's real bound (a crash): run in a child process, whose crash is its exit status."""
    path = tmp_path / "issue_kernels.py"
    path.write_text(ISSUE_SOURCE)
    r = run_python(CHILD, str(path))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.split(" ")[0] in ("read_bound", "write_bound", "size_index",
                                                                       "keywords")]
    assert lines == ["read_bound same", "write_bound same", "size_index same", "keywords same"]


ODD_SOURCE = '''
def odd(x):
    n = int(x[0])
    y = output_tensor((n,), x.dtype)
    for i in range(n):
        y[i] = x[i] * 2.0
    return y


odd.__name__ = 'odd"name\\nwith%s\\\\'
'''


@pytest.mark.build
def test_file_and_kernel_names_reach_cxx_as_text(tmp_path):
    """The kernel's file and name appear in the generated code (comments, the debug index check's and the
    output size check's messages): quotes, backslashes, line breaks and printf's '%' are text there."""
    directory = tmp_path / 'we"ird%d\\dir'
    directory.mkdir()
    path = directory / "odd_kernels.py"
    path.write_text(ODD_SOURCE)
    spec = importlib.util.spec_from_file_location("odd_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.array([3.0, 1.0, 2.0], np.float32)
    ks = [kernel(mod.odd), kernel(mod.odd, debug=True)]
    build_together([(k, (("float32", 1),)) for k in ks])
    for k in ks:
        np.testing.assert_array_equal(ops.Custom(k, out_shape=[3], out_dtype=np.float32)(Tensor(x)).asnumpy(), k(x))
        with pytest.raises(RuntimeError, match=re.escape(f"{path}:4: output 'y' is declared with shape (3,) here, "
                                                         f"but was allocated as (2,) (out_shape): make them agree")):
            ops.Custom(k, out_shape=[2], out_dtype=np.float32)(Tensor(x))

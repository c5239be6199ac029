"""Evaluate 40 generated variants of an elementwise kernel, as a kernel-search harness does.

    python examples/many_variants.py [--jobs 2] [--timeout 60] [--count 40]

Each variant is ``out[i] = f(x[i])`` for some ``f`` written as C++; a few do not compile and a few
compute the wrong values (as generated code does). ``opbuilder.load_many`` builds them in parallel
(each distinct source once; cached ones in milliseconds), and each is checked against numpy. One JSON
line per variant goes to stdout: its status (``ok``, ``wrong``, ``compile_error``, ``timeout``), its
build time, and the first compiler diagnostic (file, line in the variant's string, message) or the
largest error against numpy. A ``tqdm`` progress bar goes to stderr: ``pip install -e ".[examples]"``
(without tqdm the script runs the same, with no bar).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from opbuilder import BuildTimeout, Inline, LoadResult, load_many  # noqa: E402

KERNEL = """\
#include <algorithm>
#include <cmath>
using namespace opbuilder;

TensorPtr kernel(const TensorPtr &x) {{
  auto out = std::make_shared<Tensor>(x->dtype(), x->shape());
  const float *a = x->data<float>();
  float *o = out->data<float>();
  for (int64_t i = 0; i < x->numel(); ++i) {{
    const float v = a[i];
    o[i] = {expr};
  }}
  return out;
}}
"""

Reference = Callable[[np.ndarray], np.ndarray]


def variants(count: int) -> List[Tuple[str, str, Reference]]:
    """(name, C++ expression of ``v``, what numpy says it should compute), ``count`` of them. Every
    fifth is generated with a typo (it does not compile); every seventh forgets a term (wrong values)."""
    out = []
    for k in range(count):
        c = 0.5 + 0.25 * k
        family = k % 4
        if family == 0:
            expr, ref = f"{c}f * v + 1.0f", (lambda x, c=c: c * x + 1)
        elif family == 1:
            expr, ref = f"std::tanh(v) * {c}f", (lambda x, c=c: np.tanh(x) * c)
        elif family == 2:
            expr, ref = f"std::max(v, 0.0f) * {c}f", (lambda x, c=c: np.maximum(x, 0) * c)
        else:
            expr, ref = f"v / (1.0f + std::abs(v)) + {c}f", (lambda x, c=c: x / (1 + np.abs(x)) + c)
        if k % 5 == 4:
            expr = expr.replace("v", "vv", 1)  # a typo: no such variable
        elif k % 7 == 6:
            expr = expr.rsplit(" ", 2)[0]  # a dropped last term: compiles, computes something else
        out.append((f"variant_{k:02d}", expr, ref))
    return out


def check(result: LoadResult, ref: Reference, x: np.ndarray) -> Dict[str, object]:
    """One variant's JSON record."""
    record: Dict[str, object] = {"seconds": round(result.seconds, 3)}
    if result.error is not None:
        record["status"] = "timeout" if isinstance(result.error, BuildTimeout) else "compile_error"
        first = next(iter(result.error.diagnostics), None)
        if first is not None:
            record["diagnostic"] = {"file": Path(first.file).name, "line": first.line, "column": first.column,
                                    "message": first.message}
        else:
            record["error"] = str(result.error).splitlines()[0]
        return record
    from runtime import Tensor

    got = result.module.kernel(Tensor(x)).asnumpy()
    err = float(np.max(np.abs(got - ref(x))))
    record["status"] = "ok" if err <= 1e-5 * (1 + float(np.max(np.abs(ref(x))))) else "wrong"
    record["max_abs_err"] = err
    return record


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None, help="builds at once (default: the cores)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per build")
    ap.add_argument("--count", type=int, default=40, help="how many variants")
    args = ap.parse_args(argv)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
        print("(no progress bar: tqdm is not installed; pip install -e \".[examples]\")", file=sys.stderr)

    todo = variants(args.count)
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    bar = tqdm(total=len(todo), desc="variants", unit="op", file=sys.stderr) if tqdm else None
    tally: Dict[str, int] = {}
    # load_many returns when its whole list is done: a few lists, so the bar moves while they build
    step = 2 * (args.jobs or 2)
    for start in range(0, len(todo), step):
        chunk = todo[start:start + step]
        items = [Inline(name, KERNEL.format(expr=expr), functions=["kernel"]) for name, expr, _ in chunk]
        for (name, expr, ref), result in zip(chunk, load_many(items, jobs=args.jobs, timeout=args.timeout)):
            record = {"name": name, "expr": expr, **check(result, ref, x)}
            tally[record["status"]] = tally.get(record["status"], 0) + 1
            line = json.dumps(record)
            if bar is not None:
                bar.write(line, file=sys.stdout)
                bar.update(1)
            else:
                print(line, flush=True)
    if bar is not None:
        bar.close()
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

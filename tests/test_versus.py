"""benchmarks/versus.py reads every figure a benchmark prints: table cells and the figure lines of
train.py, load_and_call.py and builder.py (before, those rows were silently left out of the verdict)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import versus  # noqa: E402

OUTPUT = """\
MLP 784-32-32-10 Adam step: runtime 1.23 ms (1.20-1.30), torch 1.00 ms (0.90-1.10), runtime / torch 1.23x
warm load() in a new process (9 processes)             4.50 ms (4.10-4.90)
nanobind README op, runtime built             0.83 s (0.83-0.83)        0.84 s (0.84-0.84)
| case | nanobind | pybind11 |
|---|---|---|
| forward, no grad, 1 element | 0.55 us (0.55-0.56) | 600 ns (590-610) |
goal: new nanobind operator, runtime built <= 1.0 s wall (issue 21): 0.83 s: MET
"""


def test_tables_and_figure_lines_are_rows():
    got = versus.cells(OUTPUT)
    want = {("MLP 784-32-32-10 Adam step", "figure"): 1.23e-3,
            ("warm load() in a new process (9 processes)", "figure"): 4.5e-3,
            ("nanobind README op, runtime built", "figure"): 0.83,
            ("forward, no grad, 1 element", "nanobind"): 0.55e-6,
            ("forward, no grad, 1 element", "pybind11"): 600e-9}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert abs(got[k] - v) <= 1e-12 * max(1.0, v), k

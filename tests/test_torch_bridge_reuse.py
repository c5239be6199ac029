"""The core library reuses what a to_torch call allocates (src/core/tensor.cpp): the small blocks of the Tensors it
makes, their reference counts and shape buffers, kept per thread and freed when the thread ends. A reused block or
shape buffer must describe the new call only: every rank, in any order, on any thread, with results that outlive the
thread that made them."""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")


pytestmark = pytest.mark.build

# ranks below, at and above the shape buffers kept (at most 8 dimensions), then back down
SHAPES = [(), (3,), (2, 3), (2, 1, 3), (1,) * 8, (2,) * 9, (4,), (), (1, 2, 1, 2, 1), (5,)]


@pytest.fixture
def ops(bridged_mul):
    return bridged_mul


def _check(ns, shape, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    out = ns.mul(x, y)
    assert out.shape == torch.Size(shape)
    torch.testing.assert_close(out, x * y)
    return out, x * y


def test_each_rank_in_turn_gets_its_own_shape(ops):
    before = ops.mul.bridged[0].fast_calls
    kept = [_check(ops, shape, 10 * r + i) for r in range(3) for i, shape in enumerate(SHAPES)]
    assert ops.mul.bridged[0].fast_calls - before == 3 * len(SHAPES)  # every call took the C++ path
    for out, want in kept:  # earlier results are untouched by the calls after them
        torch.testing.assert_close(out, want)


def test_results_outlive_the_threads_that_made_them(ops):
    made, errors = [], []

    def work(seed):
        try:
            made.extend(_check(ops, shape, seed + i) for i, shape in enumerate(SHAPES))
        except BaseException as e:  # noqa: BLE001  (reported on the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(100 * k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(made) == 4 * len(SHAPES)
    for out, want in made:  # each thread has ended, and freed the blocks it kept
        torch.testing.assert_close(out, want)
    del made[::2]  # freed here, on the main thread: their blocks join this thread's lists
    for i, shape in enumerate(SHAPES):
        _check(ops, shape, 1000 + i)
    for out, want in made:
        torch.testing.assert_close(out, want)

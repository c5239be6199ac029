"""C++ Functions whose kernels release the GIL, called from several Python threads at once."""
import sys
import threading

import numpy as np

import runtime as rt
from runtime import Tensor


def _run_threads(target, n=6):
    errors = []

    def guarded(k):
        try:
            target(k)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_forward_and_backward_from_many_threads(autograd_ops):
    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(30):
            xa, ya = rng.standard_normal((64,)), rng.standard_normal((64,))
            x, y = Tensor(xa, requires_grad=True), Tensor(ya, requires_grad=True)
            z = autograd_ops.releasing_mul(x, y, 20)
            np.testing.assert_allclose(z.asnumpy(), xa * ya)
            (z * z).sum().backward()
            np.testing.assert_allclose(x.grad.asnumpy(), 2 * xa * ya * ya)
            np.testing.assert_allclose(y.grad.asnumpy(), 2 * xa * xa * ya)
            with rt.no_grad():  # the untracked path too
                np.testing.assert_allclose(autograd_ops.releasing_mul(x, y, 5).asnumpy(), xa * ya)

    _run_threads(work)


def test_value_and_grad_from_many_threads(autograd_ops):
    def work(k):
        x, y = Tensor(np.full(8, k + 1.0)), Tensor(np.full(8, 2.0))
        vg = rt.value_and_grad(lambda a, b: autograd_ops.releasing_mul(a, b, 10).sum(), (0, 1))
        for _ in range(30):
            out, (gx, gy) = vg(x, y)
            assert out.item() == 16.0 * (k + 1)
            np.testing.assert_array_equal(gx.asnumpy(), np.full(8, 2.0))
            np.testing.assert_array_equal(gy.asnumpy(), np.full(8, k + 1.0))

    _run_threads(work)


def test_tensors_dropped_on_a_thread_without_the_gil(autograd_ops):
    arrays = [np.arange(5.0) + k for k in range(4)]
    tensors = [Tensor(a) for a in arrays]
    before = [sys.getrefcount(a) for a in arrays] + [sys.getrefcount(t) for t in tensors]
    autograd_ops.drop_in_thread(tensors + arrays)  # runtime.Tensors and bare arrays
    after = [sys.getrefcount(a) for a in arrays] + [sys.getrefcount(t) for t in tensors]
    assert after == before
    for k, a in enumerate(arrays):
        np.testing.assert_array_equal(a, np.arange(5.0) + k)


def test_last_references_dropped_on_threads_without_the_gil(autograd_ops):
    """C++ threads without the GIL drop the last references to Python-owned tensors while this
    thread keeps allocating Python objects: the drops must take the GIL (else the allocator is
    corrupted) and every object must be freed."""
    import gc
    import threading
    import weakref
    for _ in range(3):
        tensors = [Tensor(np.full(16, float(k))) for k in range(1000)]
        refs = [weakref.ref(t) for t in tensors]
        autograd_ops.hold(tensors)
        del tensors
        assert all(r() is not None for r in refs)  # only C++ holds them now
        done = threading.Event()
        worker = threading.Thread(target=lambda: (autograd_ops.drop_held_concurrently(8), done.set()))
        worker.start()
        churn = 0
        while not done.is_set():
            junk = [{"k": [i] * 4} for i in range(200)]  # allocation and deallocation, under the GIL
            churn += len(junk)
            del junk
        worker.join()
        gc.collect()
        assert churn > 0 and [r() for r in refs] == [None] * 1000

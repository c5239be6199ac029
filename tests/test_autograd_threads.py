"""C++ Functions whose kernels release the GIL, called from several Python threads at once."""
import sys
import threading

import numpy as np
import pytest

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


def _drop_last_references_while_allocating(autograd_ops):
    """Hand 1000 tensors to C++ only, have C++ threads without the GIL drop them while this thread
    allocates; every tensor must be freed. The order is forced, not left to timing: the drops start
    only once this thread has allocated (churning), and it allocates until they are all done."""
    import gc
    import threading
    import weakref
    tensors = [Tensor(np.full(16, float(k))) for k in range(1000)]
    refs = [weakref.ref(t) for t in tensors]
    autograd_ops.hold(tensors)
    del tensors
    assert all(r() is not None for r in refs)  # only C++ holds them now
    churning, done = threading.Event(), threading.Event()

    def drop():
        try:
            if churning.wait(60):
                autograd_ops.drop_held_concurrently(8)
        finally:
            done.set()

    worker = threading.Thread(target=drop)
    worker.start()
    churn = churn_before_drops = 0
    while not done.is_set():
        junk = [{"k": [i] * 4} for i in range(200)]  # allocation and deallocation, under the GIL
        churn += len(junk)
        del junk
        if not churning.is_set():
            churn_before_drops = churn
            churning.set()
    worker.join()
    gc.collect()
    assert churn_before_drops > 0 and [r() for r in refs] == [None] * 1000


def test_last_references_dropped_on_threads_without_the_gil(autograd_ops):
    """C++ threads without the GIL drop the last references to Python-owned tensors while this
    thread keeps allocating Python objects: the drops must take the GIL (else the allocator is
    corrupted) and every object must be freed."""
    for _ in range(3):
        _drop_last_references_while_allocating(autograd_ops)


def test_the_drops_wait_for_a_late_allocating_thread(autograd_ops):
    """The interleaving does not depend on scheduling: this thread is held up for 0.5 s right after it
    starts the dropping thread (as a loaded machine may hold it up). The drops still happen while it
    allocates; before, they could all finish first and the loop never ran (churn == 0)."""
    import threading
    import time

    def late_after_start(frame, event, arg):
        if event == "return" and frame.f_code is threading.Thread.start.__code__:
            sys.setprofile(None)
            time.sleep(0.5)  # releases the GIL: the other thread runs on meanwhile

    sys.setprofile(late_after_start)  # this thread only
    try:
        _drop_last_references_while_allocating(autograd_ops)
    finally:
        sys.setprofile(None)


def test_one_no_grad_object_used_by_two_threads_restores_each_threads_own_mode():
    """The object kept one stack for every thread: a decorator's no_grad entered by two threads restored
    the other thread's mode, and a training thread was left with recording off for good."""
    import threading
    import runtime as rt
    in_a, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    @rt.no_grad()
    def predict(wait_for=None, then=None):
        if then is not None:
            then.set()
        if wait_for is not None:
            wait_for.wait(10)
        return rt.is_grad_enabled()

    def a():
        seen["a inside"] = predict(b_entered, in_a)  # enters first, leaves while b is inside
        seen["a after"] = rt.is_grad_enabled()
        a_left.set()

    def b():
        in_a.wait(10)
        with rt.no_grad():
            seen["b inside"] = predict(a_left, b_entered)
            seen["b after its predict"] = rt.is_grad_enabled()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(20), tb.join(20)
    assert seen == {"a inside": False, "a after": True, "b inside": False, "b after its predict": False}


def test_one_saved_tensors_hooks_object_used_by_two_threads_restores_each_threads_own():
    import threading
    import runtime as rt
    shared = rt.autograd.saved_tensors_hooks(lambda t: t, lambda t: t)
    mine = rt.autograd.saved_tensors_hooks(lambda t: t, lambda t: t)
    from runtime.autograd.saved_hooks import current_saved_hooks
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with shared:
            a_in.set()
            b_in.wait(10)
        seen["a after"] = current_saved_hooks()
        a_out.set()

    def b():
        a_in.wait(10)
        with mine:
            with shared:
                b_in.set()
                a_out.wait(10)
            seen["b in its own"] = current_saved_hooks()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(20), tb.join(20)
    assert seen == {"a after": None, "b in its own": mine.hooks}


def test_set_grad_enabled_called_as_a_function_sets_the_mode():
    """As torch's: the function form switched nothing (it only worked as a context manager)."""
    import runtime as rt
    try:
        rt.set_grad_enabled(False)
        assert not rt.is_grad_enabled()
        with rt.set_grad_enabled(True):
            assert rt.is_grad_enabled()
        assert not rt.is_grad_enabled()  # the `with` restores the mode before it
    finally:
        rt.set_grad_enabled(True)
    assert rt.is_grad_enabled()

    @rt.set_grad_enabled(False)  # a decorator changes nothing until the function runs
    def f():
        return rt.is_grad_enabled()
    assert rt.is_grad_enabled() and f() is False and rt.is_grad_enabled()


def test_a_no_grad_generator_function_runs_its_body_without_recording():
    """The decorator covered only the creation of the generator: each step recorded (torch's does not),
    and a C++ op inside it too. Also ``@no_grad`` without parentheses, as torch accepts it."""
    import runtime as rt
    x = rt.Parameter(np.ones(2, np.float32), name="x")

    @rt.no_grad()
    def batches():
        got = yield (x * 2).requires_grad
        yield got, rt.is_grad_enabled()
        return "done"

    gen = batches()
    assert next(gen) is False and rt.is_grad_enabled()
    assert gen.send(7) == (7, False) and rt.is_grad_enabled()
    with pytest.raises(StopIteration) as end:
        next(gen)
    assert end.value.value == "done"

    @rt.no_grad
    def bare():
        return (x * 2).requires_grad
    assert bare() is False and rt.is_grad_enabled()

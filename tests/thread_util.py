"""Running op calls in several threads in a set order (tests/test_custom_aot_threads.py, test_hybrid_raises.py)."""
import sys
import threading


def run_in_threads(fns):
    """Run each fn in its own thread, started together; their results (or exceptions) in order."""
    results = [None] * len(fns)
    start = threading.Barrier(len(fns))

    def work(i):
        start.wait()
        try:
            results[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def stopped_after_its_kernel_call(fn, stopped, resume):
    """``fn()`` in this thread, stopped right after the aot call path (runtime/ops/aot_call.cpp) returns or
    raises to the op's Python code, before that code looks at what the call left: ``stopped`` is set, and the
    call goes on once ``resume`` is. The gap where another thread's call of the same op can run whole."""
    from runtime.ops.aot_trampoline import trampoline
    path = trampoline()

    def hook(frame, event, arg):
        if event in ("c_return", "c_exception") and getattr(arg, "__self__", None) is path:
            sys.setprofile(None)
            stopped.set()
            assert resume.wait(10), "the other call did not finish"

    sys.setprofile(hook)  # this thread only
    try:
        return fn()
    finally:
        sys.setprofile(None)


def in_the_gap(fn, stopped, resume):
    """``fn()`` run whole while another thread is stopped by ``stopped_after_its_kernel_call``."""
    assert stopped.wait(10), "the other call never reached the aot call path"
    try:
        return fn()
    finally:
        resume.set()

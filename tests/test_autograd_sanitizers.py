"""tests/cpp/autograd_ops.cpp built with -fsanitize=address,undefined and exercised in a subprocess.

The subprocess preloads the compiler's libasan (Python itself is not
instrumented) and runs this file as a script: forward and backward, multiple
outputs, MarkDirty, saved tensors and their version errors, the fingerprint on
large and strided inputs, every Backward error path, exceptions, and the
GIL-releasing kernel from several threads. Any ASan report or undefined
behaviour ends the process with an error.
"""
import gc
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

CPP = Path(__file__).resolve().parent / "cpp"
# -O0: the sanitizers check at every level, and at -O0 nothing they check is optimized away (ASan advises
# -O1 for the speed of the program, which here runs for a second); the builds take half the compiler's
# CPU time of -O1 (autograd_ops.cpp: nanobind 28 -> 14 s, pybind11 85 -> 40 s; seed_style_ops.cpp 21 -> 12 s)
FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-O0"]


def _run_sanitized(name: str, source: str, *mode: str, binding=None) -> None:
    """Build `source` with ASan and UBSan and run this file's exercise on it in a child process
    (which first loads nanobind's shared runtime, for a nanobind build, as load() does)."""
    from builder_util import require_asan, run_sanitized_child
    require_asan()
    from opbuilder import CustomOpBuilder
    b = CustomOpBuilder(name, [str(CPP / source)], cflags=FLAGS, ldflags=["-fsanitize=address,undefined"],
                        binding=binding)
    lib = b.build()
    runtime = b.runtime_library()
    run_sanitized_child([__file__, str(lib), *mode, *([f"--preload={runtime}"] if runtime else [])], "exercise: OK")


@pytest.mark.parametrize("binding", ["nanobind", "pybind11"])
def test_autograd_ops_are_clean_under_asan_and_ubsan(cache_dir, binding):
    _run_sanitized(f"autograd_ops_asan_{binding}", "autograd_ops.cpp", binding=binding)


def test_seed_style_ops_on_views_are_clean_under_asan_and_ubsan(cache_dir):
    # private contiguous copies, strided write-back, broadcast gradients, refused read-only writes
    _run_sanitized("seed_style_ops_asan", "seed_style_ops.cpp", "views")


def exercise_views(lib_path: str) -> None:
    """The view paths of tests/cpp/seed_style_ops.cpp, once each (run under the sanitizers)."""
    import importlib.util

    import runtime as rt
    from runtime import Tensor, ops
    spec = importlib.util.spec_from_file_location("seed_style_ops_asan", lib_path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    xa = np.random.default_rng(0).standard_normal((5, 6))
    for v in (Tensor(xa).T, Tensor(xa)[::-1, ::2], ops.broadcast_to(Tensor(xa)[0:1], (3, 5, 6)), xa[:, 1]):
        arr = np.asarray(v.asnumpy() if isinstance(v, Tensor) else v)
        assert np.array_equal(m.square(v).asnumpy(), arr * arr)
        assert np.array_equal(m.view_square(v).asnumpy(), arr * arr)
    for f in (m.square, m.view_square):
        g = rt.grad(lambda t: ops.sum(f(t.T), 0))(Tensor(xa))
        assert np.allclose(g.asnumpy(), 2 * xa)
    base = np.zeros((4, 6))
    m.add_(rt.from_numpy(base[:, ::2]), Tensor(np.ones((4, 3))))
    assert base[:, ::2].sum() == 12 and base[:, 1::2].sum() == 0
    ro = xa.copy()
    ro.flags.writeable = False
    _expect(ValueError, m.add_, rt.from_numpy(ro), Tensor(xa))
    m.sneaky_write(rt.from_numpy(ro))
    _expect(ValueError, m.raw_first, Tensor(xa).T)
    _expect(MemoryError, m.empty, [1 << 60, 4])
    assert m.sum_list([Tensor(xa).T, xa.T]).shape == (6, 5)
    print("exercise: OK")


def _expect(exc, fn, *args):
    try:
        fn(*args)
    except exc:
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def exercise(lib_path: str) -> None:
    """Everything the operators can do, once (run under the sanitizers)."""
    import importlib.util

    import runtime as rt
    from runtime import Tensor
    spec = importlib.util.spec_from_file_location(Path(lib_path).name.split(".")[0], lib_path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    rng = np.random.default_rng(0)

    def T(*shape, grad=False):
        return Tensor(rng.standard_normal(shape), requires_grad=grad)

    for materialize in (True, False):
        x = T(3, grad=True)
        a, b = m.two_scales(x, materialize)
        (a * b).sum().backward(retain_graph=True)
        a.sum().backward()
        _expect(RuntimeError, a.sum().backward)  # freed
    x = T(4, grad=True)
    sq, sign = m.square_and_sign(x)
    (sq + sign).sum().backward()
    w = T(3, grad=True) * 1
    m.add_(w, T(3)).sum().backward()
    m.add_(T(3), T(3))
    _expect(RuntimeError, m.add_, T(2, grad=True), T(2))
    for mode in ("not_returned", "not_input"):
        _expect(RuntimeError, m.bad_dirty, T(2, grad=True) * 1, mode)
        _expect(RuntimeError, m.bad_dirty, T(2), mode)
    for shape, mode in (((3,), "all"), ((3,), "one"), ((700, 700), "all")):
        _expect(RuntimeError, m.sneaky_scale, T(*shape, grad=True) * 1, mode)
    _expect(RuntimeError, m.sneaky_scale, (T(300, 40, grad=True) * 1)[:, ::2], "all")
    m.sneaky_scale(T(5), "all")
    x, y = T(3, grad=True), T(3)
    z = m.mul_saved(x, y)
    m.add_(y, T(3))
    _expect(RuntimeError, z.sum().backward)
    out = m.exp_saves_output(T(3, grad=True))
    out.sum().backward(retain_graph=True)
    m.add_(out, T(3))
    _expect(RuntimeError, out.sum().backward)
    for mode in ("too_few", "too_many", "extra_nulls", "bad_shape", "broadcast", "bad_dtype", "non_tensor",
                 "need_grad", "invalid_argument", "out_of_range", "runtime_error", "ok"):
        try:
            m.misbehave(T(2, 3, grad=True), T(2, 3, grad=True), mode).sum().backward()
        except (RuntimeError, TypeError, ValueError, IndexError):
            pass
    for kind in ("invalid_argument", "out_of_range", "runtime_error"):
        _expect(Exception, m.failing_forward, T(3, grad=True) * 1, kind)
    _expect(RuntimeError, rt.grad(rt.grad(lambda t: m.mul_saved(t, t).sum())), T(2))
    m.mul_saved(np.ones(3), np.ones(3))  # bare numpy arrays
    rt.value_and_grad(lambda p, q: m.mul_saved(p, q).sum(), (0, 1))(T(4), T(4))

    errors = []

    def work(k):
        try:
            for _ in range(10):
                p, q = T(32, grad=True), T(32, grad=True)
                (m.releasing_mul(p, q, 5) ** 2).sum().backward()
        except BaseException as e:  # a thread's exception would otherwise only be printed
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    m.hold([Tensor(np.full(8, float(k))) for k in range(200)])
    m.drop_held_concurrently(4)  # last references dropped on threads without the GIL
    arrays = [np.arange(4.0) for _ in range(3)]
    m.drop_in_thread([Tensor(a) for a in arrays] + arrays)
    gc.collect()
    print("exercise: OK")


if __name__ == "__main__":
    args = [a for a in sys.argv[2:] if not a.startswith("--preload=")]
    for a in sys.argv[2:]:
        if a.startswith("--preload="):  # nanobind's shared runtime, before the module
            import ctypes
            import os
            ctypes.CDLL(a.split("=", 1)[1], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    (exercise_views if args == ["views"] else exercise)(sys.argv[1])

"""DSL functions in a module of their own, called by kernels in tests/test_hybrid_calls.py: their constants
(SCALE here is not the caller's SCALE) and their file:line travel with them when they are inlined."""
from runtime.hybrid import kernel

SCALE = 3


@kernel
def scaled(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        acc = x[i] * SCALE
        y[i] = acc
    return y


@kernel
def bad_rank(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i, 0]  # <- bad rank
    return y


@kernel
def shifted(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i + 1]  # <- out of range
    return y

"""``runtime.jit``: capture a function's ops as a graph and run it on a backend.

    @jit(jit_level="O1")
    def gelu(x):
        return 0.5 * x * (1 + mint.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

Capture is by tracing (capture.py): the function runs once per input
signature (signature.py) while its ops are recorded into a
``runtime.graph.Graph``; the backend builds that graph once, and later calls
with the same signature run the built graph (function.py). See docs/jit.md.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["jit", "JitFunction"]

# Ops import jit.tracing while the runtime itself is importing, so this package
# imports the rest (graph, backends) on first use.
JIT_LEVELS = ("O0", "O1")
CAPTURE_MODES = ("trace",)


def __getattr__(name: str) -> Any:
    if name == "JitFunction":
        from .function import JitFunction
        return JitFunction
    raise AttributeError(name)


def jit(function: Optional[Callable[..., Any]] = None, *, capture_mode: str = "trace", jit_level: str = "O0",
        backend: str = "ms_backend", **options: Any) -> Any:
    """Decorator (``@jit``, ``@jit(...)``) or call: ``function`` run through a graph built per signature.

    ``jit_level``: ``"O0"`` runs the graph op by op; ``"O1"`` also fuses
    elementwise/broadcast chains into generated C++ kernels (``ms_backend``).
    ``backend``: a name from ``runtime.graph.list_backends()``. ``options``
    are handed to the backend in its config.
    """
    if capture_mode not in CAPTURE_MODES:
        raise ValueError(f"jit: capture_mode {capture_mode!r} is not supported; supported: "
                         f"{', '.join(CAPTURE_MODES)} (ast and bytecode capture are MindSpore's, not ours)")
    if jit_level not in JIT_LEVELS:
        raise ValueError(f"jit: jit_level {jit_level!r} is not one of {', '.join(JIT_LEVELS)}")
    from ..graph.registry import get_backend
    from .function import JitFunction
    get_backend(backend)  # an unknown name fails here, listing the registered ones
    config = dict(options, jit_level=jit_level)

    def wrap(fn: Callable[..., Any]) -> "JitFunction":
        if not callable(fn):
            raise TypeError(f"jit: expected a function or method, got {type(fn).__name__}")
        return JitFunction(fn, backend, config)

    return wrap if function is None else wrap(function)

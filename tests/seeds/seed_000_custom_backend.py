# Seed 000: a custom graph backend in C++ (seed_000_custom_backend.cpp, the seed's plugin) registered
# with runtime.graph.register_custom_backend and chosen with jit(backend=...). Changed from the seed: the
# imports (mindspore -> runtime, and numpy, which the seed uses without importing); the library is built
# with opbuilder.build_library instead of the seed's CMake file, so custom_path is its cache path rather
# than /data1/libcustom_backend.so; the results are printed (the seed prints nothing).
# Run from the repository root: python tests/seeds/seed_000_custom_backend.py
import numpy as np
import runtime as mindspore
from runtime import jit, mint
from opbuilder import build_library

custom_path = build_library("custom_backend", ["tests/seeds/seed_000_custom_backend.cpp"])
success = mindspore.graph.register_custom_backend(backend_name="my_custom_backend", path=custom_path)
assert success, "Plugin registration failed"

x = mindspore.Tensor(np.ones([2, 2], np.float32))
y = mindspore.Tensor(np.zeros([2, 2], np.float32))


@jit(backend="my_custom_backend")
def net1(x):
    return mint.sin(x)


x = net1(x)


@jit(backend="ms_backend")
def net2(x):
    return mint.cos(x)


y = net2(y)
print(x)
print(y)

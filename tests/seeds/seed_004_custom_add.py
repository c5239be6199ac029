# Seed 004, first script (test_custom_ops.py): an aot CustomAdd, printed with ops.print_.
# CPU variant. Changed from the seed: the imports (mindspore -> runtime), device_target "GPU" -> "CPU", and
# the func: the seed's nvcc-built ./custom_add.so becomes the same operator in C++
# (custom_src/aot_add.cpp), which ops.Custom builds itself. GRAPH_MODE runs eagerly here.
# Run from the repository root: python tests/seeds/seed_004_custom_add.py
import runtime as ms
from runtime import ops, Tensor, context
ms.set_context(device_target="CPU", mode=context.GRAPH_MODE)
t1 = Tensor([1., 2., 3.], ms.float32)
t2 = Tensor([3., 2., 1.], ms.float32)
CustomAdd = ops.Custom("./custom_src/aot_add.cpp:CustomAdd",
                       out_shape=[t1.shape[0]],
                       out_dtype=ms.float32,
                       func_type="aot"
                       )
res = CustomAdd(t1, t2)
ops.print_(res)

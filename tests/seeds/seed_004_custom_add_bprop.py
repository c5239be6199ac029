# Seed 004, second script: the aot CustomAdd inside an nn.Cell whose bprop gives its gradient.
# CPU variant, changed from the seed as seed_004_custom_add.py is.
# Run from the repository root: python tests/seeds/seed_004_custom_add_bprop.py
import runtime as ms
from runtime import ops, Tensor, context
from runtime import nn, grad
ms.set_context(device_target="CPU", mode=context.GRAPH_MODE)
t1 = Tensor([1., 2., 3.], ms.float32)
t2 = Tensor([3., 2., 1.], ms.float32)
CustomAdd = ops.Custom("./custom_src/aot_add.cpp:CustomAdd",
                       out_shape=[t1.shape[0]],
                       out_dtype=ms.float32,
                       func_type="aot"
                       )


class Add(nn.Cell):
    # 反向传播函数 (the backward function)
    def bprop(self, x, y, out, dout):
        return (y, )

    # 计算函数 (the forward function)
    def construct(self, x, y):
        return CustomAdd(x, y)


# 把Cell类加载为custom_add函数 (the Cell as the function custom_add)
custom_add = Add()
# 计算求和结果 (the sum)
res = custom_add(t1, t2)
# 计算自动微分结果 (its gradient)
res_g = grad(custom_add, grad_position=(0, ))(t1, t2)
print(res)
print(res_g)

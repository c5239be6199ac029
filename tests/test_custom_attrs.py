"""AotExtra: attributes from reg_info reach the kernel; Init, kernel data and workspaces."""
import gc
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops import CustomRegOp, DataType

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")
ATTR = str(ROOT / "tests" / "cpp" / "aot_attr_ops.cpp")


def scale_shift_info(**attrs):
    reg = CustomRegOp("scale_shift").input(0, "x").output(0, "y")
    for name, kw in attrs.items():
        reg = reg.attr(name, "required", "float", **kw)
    return reg.dtype_format(DataType.F32_Default, DataType.F32_Default).target("CPU").get_op_info()


def test_attributes_reach_the_kernel_through_aot_extra():
    info = scale_shift_info(scale={"value": 3.0}, shift={"default_value": "0.5"})
    op = ops.Custom(f"{OPS}:ScaleShift", out_shape=lambda x: x, out_dtype=lambda x: x, reg_info=info)
    np.testing.assert_array_equal(op(Tensor([1.0, 2.0])).asnumpy(), [3.5, 6.5])


def test_every_attribute_kind_and_cpp_type():
    reg = (CustomRegOp("read_attrs").output(0, "y")
           .attr("i", "required", "int", value=7)
           .attr("f", "required", "float", default_value="2.5")
           .attr("b", "required", "bool", default_value="true")
           .attr("s", "required", "str", value="hello")
           .attr("li", "required", "listInt", default_value="1,2,3")
           .attr("lf", "required", "listFloat", value=[0.5, 0.25])
           .attr("lb", "required", "listBool", value=[True, False, True])
           .attr("ls", "required", "listStr", value=["ab", "cde"])
           .attr("ll", "required", "all", value=[[1, 2], [3], [4, 5, 6]])
           .dtype_format(DataType.F64_Default).get_op_info())
    op = ops.Custom(f"{ATTR}:ReadAttrs", out_shape=[12], out_dtype=rt.float64, reg_info=reg)
    assert op().asnumpy().tolist() == [7, 2.5, 1, 5, 6, 0.75, 2, 5, 3, 21, 7, 2.5]


def test_add_prim_attr_gives_a_value():
    info = scale_shift_info(scale={})  # required, no value in the op-info
    with pytest.raises(ValueError, match="required attribute 'scale' has no value"):
        ops.Custom(f"{OPS}:ScaleShift", out_shape=lambda x: x, out_dtype=lambda x: x, reg_info=info)
    op = ops.Custom(f"{OPS}:ScaleShift", out_shape=lambda x: x, out_dtype=lambda x: x,
                    reg_info=scale_shift_info(scale={"value": 1.0}))
    assert op.add_prim_attr("scale", 4).add_prim_attr("shift", -1.0) is op
    np.testing.assert_array_equal(op(Tensor([1.0, 2.0])).asnumpy(), [3.0, 7.0])
    with pytest.raises(RuntimeError, match="attributes must be set before the first call"):
        op.add_prim_attr("scale", 2.0)


def test_a_missing_attribute_is_reported_after_the_call():
    op = ops.Custom(f"{OPS}:ScaleShift", out_shape=lambda x: x, out_dtype=lambda x: x)
    with pytest.raises(RuntimeError, match=r"aot operator 'ScaleShiftInit' in .*\.so: attribute 'scale' is not "
                                           r"set on this op; it has no attributes"):
        op(Tensor([1.0]))


def test_a_wrongly_typed_attribute_is_reported_every_time():
    info = scale_shift_info(scale={"value": 2.0})
    op = ops.Custom(f"{ATTR}:ScaleAsString", out_shape=[1], out_dtype=rt.float32, reg_info=info)
    for _ in range(2):  # the error is not left behind: each call reports its own
        with pytest.raises(RuntimeError, match="attribute 'scale' is float, which cannot be read as std::string"):
            op(Tensor([1.0]))


def test_attribute_values_are_checked_against_value_type():
    info = scale_shift_info(scale={"value": "abc"})
    with pytest.raises(ValueError, match="attribute 'scale' is declared float, got 'abc'"):
        ops.Custom(f"{OPS}:ScaleShift", out_shape=[1], out_dtype=rt.float32, reg_info=info)
    info = scale_shift_info(scale={"default_value": "x1"})
    with pytest.raises(ValueError, match="default_value 'x1' of attribute 'scale' is not a float"):
        ops.Custom(f"{OPS}:ScaleShift", out_shape=[1], out_dtype=rt.float32, reg_info=info)
    op = ops.Custom(f"{OPS}:ScaleShift", out_shape=[1], out_dtype=rt.float32)
    with pytest.raises(TypeError, match="attribute 'scale' has a value aot kernels cannot read"):
        op.add_prim_attr("scale", {"a": 1})


def test_init_runs_once_and_its_workspace_is_passed_after_the_outputs():
    op = ops.Custom(f"{ATTR}:CountCalls", out_shape=[5], out_dtype=rt.float64)
    x = np.arange(6, dtype=np.float32)
    first = op(Tensor(x)).asnumpy()
    inits = first[0]
    for calls in (2, 3):
        out = op(Tensor(x)).asnumpy().tolist()
        assert out == [inits, calls, out[2], 24, 15.0]  # Init not run again; 24 workspace bytes
    assert first.tolist()[1:] == [1, out[2], 24, 15.0]
    # another op of the same symbol has its own Init and kernel data
    other = ops.Custom(f"{ATTR}:CountCalls", out_shape=[5], out_dtype=rt.float64)
    assert other(Tensor(x)).asnumpy().tolist()[:2] == [inits + 1, 1]


def test_kernel_data_is_freed_with_the_op():
    live = ops.Custom(f"{ATTR}:LiveCounters", out_shape=[1], out_dtype=rt.int64)
    gc.collect()
    before = live().item()
    op = ops.Custom(f"{ATTR}:CountCalls", out_shape=[5], out_dtype=rt.float64)
    op(Tensor([1.0]))
    assert live().item() == before + 1
    del op
    gc.collect()
    assert live().item() == before


def test_a_failing_init_names_it_and_its_status():
    op = ops.Custom(f"{ATTR}:BadInit", out_shape=[1], out_dtype=rt.float32)
    with pytest.raises(RuntimeError, match=r"aot operator 'BadInitInit' in .*\.so returned status 9"):
        op(Tensor([1.0]))

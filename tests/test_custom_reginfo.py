"""CustomRegOp / DataType / custom_info_register: the op-info and the dtype check it drives."""
import json
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops import CustomRegOp, DataType, custom_info_register

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")


def add_info(*rows, target="CPU"):
    reg = CustomRegOp("custom_add").input(0, "x1").input(1, "x2").output(0, "y")
    for row in rows:
        reg = reg.dtype_format(*row)
    return reg.target(target).get_op_info()


F32 = (DataType.F32_Default,) * 3
F16 = (DataType.F16_Default,) * 3


def test_get_op_info_has_mindsporeish_keys():
    info = add_info(F32)
    assert info["op_name"] == "custom_add" and info["target"] == "CPU"
    assert [i["name"] for i in info["inputs"]] == ["x1", "x2"] and info["outputs"][0]["name"] == "y"
    assert info["dtype_format"] == [[["float32", "DefaultFormat"]] * 3]
    json.dumps(info)  # serializable
    assert DataType.None_None == ("", "")
    names = ["F16", "F32", "F64", "I8", "I16", "I32", "I64", "U8", "BOOL"]
    assert all(getattr(DataType, f"{n}_Default")[1] == "DefaultFormat" for n in names)


def test_dtypes_outside_the_registered_combinations_are_rejected():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=lambda x, _: x, out_dtype=lambda x, _: x,
                    reg_info=add_info(F32, F16))
    np.testing.assert_array_equal(op(Tensor([1.0]), Tensor([2.0])).asnumpy(), [3.0])
    with pytest.raises(TypeError) as e:
        op(Tensor([1.0], rt.float64), Tensor([2.0], rt.float64))
    assert str(e.value) == ("Custom 'CustomAdd': dtypes (float64, float64) -> (float64) are not supported by its "
                            "reg_info 'custom_add'; supported (inputs -> outputs): (float32, float32) -> "
                            "(float32); (float16, float16) -> (float16)")
    # the output dtype is part of the combination
    bad_out = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float64, reg_info=add_info(F32))
    with pytest.raises(TypeError, match=r"dtypes \(float32, float32\) -> \(float64\) are not supported"):
        bad_out(Tensor([1.0]), Tensor([2.0]))


@pytest.mark.parametrize("const,dtype", [("BOOL_Default", rt.bool_), ("I8_Default", rt.int8),
                                         ("I16_Default", rt.int16), ("I32_Default", rt.int32),
                                         ("I64_Default", rt.int64), ("U8_Default", rt.uint8),
                                         ("F16_Default", rt.float16), ("F32_Default", rt.float32),
                                         ("F64_Default", rt.float64), ("U16_Default", rt.uint16),
                                         ("U32_Default", rt.uint32), ("U64_Default", rt.uint64),
                                         ("BF16_Default", rt.bfloat16), ("C64_Default", rt.complex64),
                                         ("C128_Default", rt.complex128)])
def test_each_datatype_constant_admits_its_dtype_only(const, dtype):
    row = getattr(DataType, const)
    info = CustomRegOp("ident").input(0, "x").output(0, "y").dtype_format(row, row).get_op_info()
    op = ops.Custom(lambda a: a.copy(), out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc",
                    reg_info=info)
    assert op(Tensor(np.ones(2), dtype)).dtype == dtype
    other = rt.int8 if dtype is rt.bool_ else rt.bool_
    other_name = "int8" if dtype is rt.bool_ else "bool"
    with pytest.raises(TypeError, match=rf"dtypes \({other_name}\) -> \({other_name}\) are not supported by its "
                                        rf"reg_info 'ident'; supported \(inputs -> outputs\): \({row[0]}\) -> "
                                        rf"\({row[0]}\)$"):
        op(Tensor(np.ones(2), other))


def test_none_none_accepts_any_dtype():
    info = CustomRegOp("lr").input(0, "x").output(0, "y").dtype_format(DataType.None_None, DataType.None_None) \
        .get_op_info()
    op = ops.Custom(f"{OPS}:LeakyRelu", out_shape=lambda x: x, out_dtype=lambda x: x, reg_info=info)
    for dt in (rt.float32, rt.float64):
        assert op(Tensor([-1.0], dt)).dtype == dt


def test_the_number_of_inputs_and_outputs_is_checked():
    op = ops.Custom(f"{OPS}:LeakyRelu", out_shape=lambda x: x, out_dtype=lambda x: x, reg_info=add_info(F32))
    with pytest.raises(TypeError, match="Custom 'LeakyRelu' takes 2 inputs \\(its reg_info\\), got 1"):
        op(Tensor([1.0]))
    op = ops.Custom(f"{OPS}:SinCos", out_shape=lambda x: [x, x], out_dtype=lambda x: [x, x],
                    reg_info=CustomRegOp().input(0, "x").output(0, "s").get_op_info())
    with pytest.raises(ValueError, match="reg_info declares 1 outputs, out_shape gives 2"):
        op(Tensor([1.0]))


def test_the_info_for_this_target_is_used():
    gpu_only = add_info(F16, target="GPU")
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info=[gpu_only, add_info(F32)])
    assert op(Tensor([1.0]), Tensor([1.0])).item() == 2.0
    # a GPU-only op-info says nothing about the CPU: no restriction
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info=gpu_only)
    assert op(Tensor([1.0]), Tensor([1.0])).item() == 2.0


def test_reg_info_may_be_json_or_the_builder():
    reg = CustomRegOp("custom_add").input(0, "x1").input(1, "x2").output(0, "y").dtype_format(*F16)
    for info in (json.dumps(reg.get_op_info()), reg):
        op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info=info)
        with pytest.raises(TypeError, match="not supported by its reg_info"):
            op(Tensor([1.0]), Tensor([1.0]))
    with pytest.raises(ValueError, match="reg_info string is not JSON"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info="{nope")
    with pytest.raises(TypeError, match="reg_info must be the dict from CustomRegOp"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info=3)


def test_custom_info_register_and_reg_info_precedence():
    f32_info = CustomRegOp().input(0, "x").output(0, "y").dtype_format(DataType.F32_Default, DataType.F32_Default) \
        .target("CPU").get_op_info()
    f64_info = CustomRegOp().input(0, "x").output(0, "y").dtype_format(DataType.F64_Default, DataType.F64_Default) \
        .target("CPU").get_op_info()

    @custom_info_register(f32_info)
    def double(x):
        return x * 2

    assert double.reg_info == [f32_info]
    by_decorator = ops.Custom(double, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc")
    assert by_decorator(Tensor([1.0])).item() == 2.0
    with pytest.raises(TypeError, match=r"\(float64\) -> \(float64\) are not supported"):
        by_decorator(Tensor([1.0], rt.float64))
    explicit = ops.Custom(double, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc",
                          reg_info=f64_info)
    assert explicit(Tensor([1.0], rt.float64)).item() == 2.0
    with pytest.raises(TypeError, match=r"\(float32\) -> \(float32\) are not supported"):
        explicit(Tensor([1.0]))


def test_builder_arguments_are_checked():
    with pytest.raises(ValueError, match="dtype_format argument 1 is 'float32'"):
        CustomRegOp().dtype_format(DataType.F32_Default, "float32")
    with pytest.raises(ValueError, match="target 'Ascend' is not supported; accepted: CPU, GPU"):
        CustomRegOp().target("Ascend")
    with pytest.raises(ValueError, match="value_type 'double' is not one of"):
        CustomRegOp().attr("a", "required", "double")
    with pytest.raises(ValueError, match="param_type 'maybe' is not one of"):
        CustomRegOp().attr("a", "maybe", "int")
    with pytest.raises(ValueError, match="a dtype_format row has 2 entries, but 2 inputs and 1 outputs"):
        CustomRegOp().input(0, "a").input(1, "b").output(0, "y") \
            .dtype_format(DataType.F32_Default, DataType.F32_Default).get_op_info()


def test_pyfunc_without_out_shape_still_checks_input_dtypes():
    op = ops.Custom(lambda a, b: a + b, func_type="pyfunc", reg_info=add_info(F32))
    np.testing.assert_array_equal(op(Tensor(np.ones(2, np.float32)), Tensor(np.ones(2, np.float32))).asnumpy(),
                                  [2.0, 2.0])
    with pytest.raises(TypeError, match=r"dtypes \(float64, float64\).* are not supported by its reg_info "
                                        r"'custom_add'; supported .*float32, float32"):
        op(Tensor(np.ones(2)), Tensor(np.ones(2)))

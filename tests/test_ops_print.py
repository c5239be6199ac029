"""ops.print_ / ops.Print: values printed as MindSpore prints them (examples from its documentation)."""
import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, ops


def printed(capsys, *values):
    assert ops.print_(*values) is None
    return capsys.readouterr().out


def test_mindspores_example_int_tensors_one_per_line(capsys):
    x = Tensor(np.ones([2, 1]).astype(np.int32))
    y = Tensor(np.ones([2, 2]).astype(np.int32))
    assert printed(capsys, "Print Tensor x and Tensor y:", x, y) == (
        "Print Tensor x and Tensor y:\n"
        "Tensor(shape=[2, 1], dtype=Int32, value=\n[[1],\n [1]])\n"
        "Tensor(shape=[2, 2], dtype=Int32, value=\n[[1, 1],\n [1, 1]])\n")


def test_floats_print_in_e_notation_and_scalars_shortest(capsys):
    assert printed(capsys, Tensor([4.0, 4.0, 4.0], rt.float32)) == (
        "Tensor(shape=[3], dtype=Float32, value= [ 4.00000000e+00,  4.00000000e+00,  4.00000000e+00])\n")
    assert printed(capsys, Tensor([0.7], rt.float32), Tensor(-1.5, rt.float64)) == (
        "Tensor(shape=[1], dtype=Float32, value= [ 6.99999988e-01])\n"
        "Tensor(shape=[], dtype=Float64, value= -1.5)\n")
    assert printed(capsys, Tensor(0.7, rt.float32), Tensor(6.0)) == (
        "Tensor(shape=[], dtype=Float32, value= 0.7)\nTensor(shape=[], dtype=Float32, value= 6)\n")
    assert printed(capsys, Tensor(np.array([[1.0, -2.0], [3.0, 4.0]]))) == (
        "Tensor(shape=[2, 2], dtype=Float64, value=\n"
        "[[ 1.00000000e+00, -2.00000000e+00],\n [ 3.00000000e+00,  4.00000000e+00]])\n")


def test_a_long_row_stays_on_one_line(capsys):
    out = printed(capsys, Tensor(np.arange(12, dtype=np.float32)))
    assert out.count("\n") == 1 and out.count("e+") == 12


def test_bool_int_tuples_lists_parameters_and_the_primitive(capsys):
    assert printed(capsys, True, 3, 2.5, (Tensor(3, rt.int64),), [1, "a"]) == (
        "True\n3\n2.5\n(Tensor(shape=[], dtype=Int64, value= 3),)\n[1, a]\n")
    assert printed(capsys, Tensor(np.array([True, False]))) == "Tensor(shape=[2], dtype=Bool, value= [ True, False])\n"
    assert printed(capsys, Parameter(Tensor([1.0, 2.0]), name="w")) == (
        "Tensor(shape=[2], dtype=Float32, value= [ 1.00000000e+00,  2.00000000e+00])\n")
    assert ops.Print()("p", Tensor(1, rt.int32)) is None
    assert capsys.readouterr().out == "p\nTensor(shape=[], dtype=Int32, value= 1)\n"


def test_other_values_are_a_type_error_and_nothing_is_printed(capsys):
    with pytest.raises(TypeError, match=r"print_: input 1 is a dict; print_ takes Tensors, bool, int, float, str, "
                                        r"and tuples or lists of them"):
        ops.print_("x", {"a": 1})
    with pytest.raises(TypeError, match="input 0 is a ndarray"):
        ops.print_(np.ones(2))
    assert capsys.readouterr().out == ""

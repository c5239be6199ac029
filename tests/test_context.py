"""runtime.set_context / get_context / runtime.context: MindSpore's run settings, with their errors."""
import re

import pytest

import runtime as rt
from runtime import context


@pytest.fixture(autouse=True)
def restore_context():
    saved = {k: rt.get_context(k) for k in ("mode", "device_target", "device_id")}
    yield
    rt.set_context(**saved)


def test_the_modes_are_mindspores_constants_on_both_names():
    assert (rt.GRAPH_MODE, rt.PYNATIVE_MODE) == (context.GRAPH_MODE, context.PYNATIVE_MODE) == (0, 1)
    assert rt.set_context is context.set_context and rt.get_context is context.get_context


def test_defaults_are_pynative_on_the_cpu():
    assert rt.get_context("mode") == rt.PYNATIVE_MODE
    assert rt.get_context("device_target") == "CPU"
    assert rt.get_context("device_id") == 0


def test_cpu_and_both_modes_are_stored():
    rt.set_context(mode=context.GRAPH_MODE, device_target="CPU")
    assert context.get_context("mode") == rt.GRAPH_MODE
    assert rt.get_context("device_target") == "CPU"
    rt.set_context(mode=rt.PYNATIVE_MODE, device_id=0)
    assert rt.get_context("mode") == rt.PYNATIVE_MODE


def test_graph_mode_runs_eagerly_with_the_same_results():
    x = rt.Tensor([1.0, 2.0, 3.0])
    eager = rt.value_and_grad(lambda t: (t * t).sum())(x)
    rt.set_context(mode=rt.GRAPH_MODE)
    graph = rt.value_and_grad(lambda t: (t * t).sum())(x)
    assert eager[0].item() == graph[0].item() == 14.0
    assert eager[1].tolist() == graph[1].tolist() == [2.0, 4.0, 6.0]


def test_ascend_names_the_targets_this_machine_has():
    with pytest.raises(ValueError, match=r"device_target 'Ascend' is not available: this runtime has no Ascend "
                                         r"support; available device targets: " + ", ".join(context.available_targets()) + "$"):
        rt.set_context(device_target="Ascend")
    assert rt.get_context("device_target") == "CPU"


def test_gpu_without_a_usable_device_says_why_and_keeps_the_cpu():
    why = rt.cuda.unavailable_reason()
    if why is None:
        pytest.skip("a GPU is usable here (tests/test_gpu_runtime.py covers set_context(device_target='GPU'))")
    assert why.startswith(("CuPy is not installed", "CuPy could not be imported", "no CUDA device",
                           "the NVIDIA driver is too old", "CUDA could not be initialised"))
    with pytest.raises(ValueError, match=r"^device_target 'GPU' is not usable here: " + re.escape(why) +
                       r"; available device targets: CPU$"):
        context.set_context(device_target="GPU")
    assert rt.get_context("device_target") == "CPU" and context.default_device() == "CPU"
    assert rt.Tensor([1.0]).device == "CPU"


def test_an_unknown_target_lists_mindspores_and_the_available_ones():
    with pytest.raises(ValueError, match=r"device_target 'TPU' is not a device target \(MindSpore's are CPU, "
                                         r"GPU, Ascend\); available device targets: CPU"):
        rt.set_context(device_target="TPU")


@pytest.mark.parametrize("mode", [2, -1, "GRAPH_MODE", True, None])
def test_a_mode_that_is_not_one_names_both(mode):
    with pytest.raises(ValueError, match=r"is not a run mode; use context.GRAPH_MODE \(0\) or "
                                         r"context.PYNATIVE_MODE \(1\)"):
        rt.set_context(mode=mode)


@pytest.mark.parametrize("device_id", [-1, 1.0, "0", False])
def test_device_id_must_be_a_non_negative_int(device_id):
    with pytest.raises(ValueError, match="device_id must be a non-negative int"):
        rt.set_context(device_id=device_id)


def test_nothing_is_set_when_one_setting_is_bad():
    with pytest.raises(ValueError, match="device_target 'Ascend'"):
        rt.set_context(mode=rt.GRAPH_MODE, device_target="Ascend")
    assert rt.get_context("mode") == rt.PYNATIVE_MODE


def test_unknown_settings_are_named():
    with pytest.raises(ValueError, match=r"set_context: 'save_graphs' is not a setting of this runtime; "
                                         r"settings: mode, device_target, device_id"):
        rt.set_context(save_graphs=True)
    with pytest.raises(ValueError, match=r"get_context: 'jit_level' is not a setting of this runtime"):
        rt.get_context("jit_level")


def test_custom_op_builder_is_opbuilders_and_ascend_is_not_available():
    import opbuilder
    from runtime.ops import CustomOpBuilder
    assert CustomOpBuilder is opbuilder.CustomOpBuilder is rt.ops.CustomOpBuilder
    with pytest.raises(ValueError, match=r"unknown backend 'Ascend'; accepted values: 'CPU', 'GPU' \(the Ascend "
                                         r"backend is not available"):
        CustomOpBuilder("my_ops", ["custom_src/function_ops.cpp"], backend="Ascend")
    with pytest.raises(AttributeError, match="module 'runtime.ops' has no attribute 'CustomOpBuilders'"):
        rt.ops.CustomOpBuilders  # noqa: B018

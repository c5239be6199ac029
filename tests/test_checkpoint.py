"""Checkpoints: a round trip through a safetensors file (a model with a custom C++ op included),
a file other tools read, atomic saves, clear errors on truncated/corrupt files and mismatches."""
import os

import numpy as np
import pytest
import safetensors.numpy

import runtime as rt
from runtime import Parameter, Tensor, nn

from op_util import CUSTOM_SRC, load_op
from safetensors_util import safetensors_bytes  # noqa: E402


class CustomNet(nn.Cell):
    """Dense -> the C++ ``mul`` op (my_ops, custom_src/function_ops.cpp) by a Parameter -> Dense."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.fc1 = nn.Dense(4, 6)
        self.scale = Parameter(np.full(6, 0.5, np.float32), name="scale")
        self.head = nn.SequentialCell([nn.ReLU(), nn.Dense(6, 3)])

    def construct(self, x):
        return self.head(self.ops.mul(self.fc1(x), self.scale))


@pytest.fixture(scope="session")
def mul_ops(cache_dir):
    return load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"])


def test_round_trip_with_a_custom_op_model(tmp_path, mul_ops):
    rt.set_seed(1)
    net = CustomNet(mul_ops)
    x = Tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    y = Tensor(np.array([0, 1, 2, 0, 1]))
    opt = nn.Adam(net.trainable_params(), 0.05)
    grad_fn = rt.value_and_grad(lambda a, b: nn.CrossEntropyLoss()(net(a), b), None, opt.parameters)
    for _ in range(3):  # train a little, so the values are not the initial ones
        _, grads = grad_fn(x, y)
        opt(grads)
    assert np.abs(grads[2].asnumpy()).sum() > 0  # the C++ op passes gradients to its Parameter
    path = tmp_path / "net.safetensors"
    rt.save_checkpoint(net, path)
    assert [p.name for p in tmp_path.iterdir()] == ["net.safetensors"]  # no temporary left behind

    on_disk = safetensors.numpy.load_file(str(path))  # other tools read it
    names = ["fc1.weight", "fc1.bias", "scale", "head.1.weight", "head.1.bias"]
    assert sorted(on_disk) == sorted(names)
    np.testing.assert_array_equal(on_disk["scale"], net.scale.asnumpy())

    loaded = rt.load_checkpoint(path)
    assert set(loaded) == set(names) and all(isinstance(p, Parameter) and p.name == n for n, p in loaded.items())
    rt.set_seed(2)
    fresh = CustomNet(mul_ops)
    before = fresh.fc1.weight
    assert not np.array_equal(fresh(x).asnumpy(), net(x).asnumpy())
    assert rt.load_param_into_net(fresh, loaded) == ([], [])
    assert fresh.fc1.weight is before  # loaded in place
    np.testing.assert_array_equal(fresh(x).asnumpy(), net(x).asnumpy())


def test_lists_dicts_and_names_left_over(tmp_path):
    p = Parameter(np.arange(3.0), name="a")
    q = Parameter(np.zeros((0, 2), np.float32), name="empty")
    rt.save_checkpoint([p, q, {"name": "step", "data": np.int64(7)}], tmp_path / "l.ckpt")
    loaded = rt.load_checkpoint(tmp_path / "l.ckpt")
    assert loaded["a"].tolist() == [0, 1, 2] and loaded["empty"].shape == (0, 2)
    assert loaded["step"].tolist() == 7 and loaded["step"].dtype == rt.int64

    net = nn.Dense(2, 2)
    rt.save_checkpoint({"weight": np.ones((2, 2), np.float32), "extra": np.ones(1)}, tmp_path / "d.ckpt")
    not_loaded, unused = rt.load_param_into_net(net, rt.load_checkpoint(tmp_path / "d.ckpt"))
    assert (not_loaded, unused) == (["bias"], ["extra"])
    assert net.weight.tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match=r"strict_load=True.*not in the checkpoint: \['bias'\]"):
        rt.load_param_into_net(net, rt.load_checkpoint(tmp_path / "d.ckpt"), strict_load=True)


def test_a_save_over_an_existing_file_is_atomic(tmp_path):
    path = tmp_path / "c.ckpt"
    rt.save_checkpoint({"w": np.ones(4)}, path)
    good = path.read_bytes()
    with pytest.raises(TypeError, match="list entries must be Parameters"):
        rt.save_checkpoint([Parameter(np.zeros(2), name="x"), 3], path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["c.ckpt"]


def test_truncated_and_corrupt_files_are_clear_errors(tmp_path):
    path = tmp_path / "c.ckpt"
    rt.save_checkpoint({"w": np.ones((10, 10))}, path)
    data = path.read_bytes()
    for name, content in [("truncated", data[: len(data) - 17]), ("header_cut", data[:20]),
                          ("garbage", b"\x00\xffnot a checkpoint" * 3), ("empty", b"")]:
        bad = tmp_path / f"{name}.ckpt"
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=rf"{name}.ckpt is not a readable checkpoint: the file is truncated "
                                             rf"or corrupt"):
            rt.load_checkpoint(bad)
    with pytest.raises(FileNotFoundError):
        rt.load_checkpoint(tmp_path / "missing.ckpt")


def test_mismatches_leave_the_net_unchanged(tmp_path):
    net = nn.Dense(2, 3)
    w = net.weight.asnumpy().copy()
    with pytest.raises(ValueError, match=r"'bias' has shape \[2\] in the checkpoint and \[3\] in the net"):
        rt.load_param_into_net(net, {"weight": np.zeros((3, 2), np.float32), "bias": np.zeros(2, np.float32)})
    with pytest.raises(TypeError, match="'weight' is float64 in the checkpoint and float32 in the net"):
        rt.load_param_into_net(net, {"weight": np.zeros((3, 2))})
    np.testing.assert_array_equal(net.weight.asnumpy(), w)
    with pytest.raises(TypeError, match="save_obj must be a Cell, an optimizer, a list of Parameters or a dict"):
        rt.save_checkpoint(Tensor(np.ones(2)), tmp_path / "x.ckpt")
    with pytest.raises(ValueError, match="parameter 0 of the list has no name"):
        rt.save_checkpoint([Parameter(np.ones(2))], tmp_path / "x.ckpt")
    with pytest.raises(TypeError, match="net must be a Cell"):
        rt.load_param_into_net({}, {})


class TwoLayers(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(3, 4)
        self.fc2 = nn.Dense(4, 2)
        self.seq = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])


def test_parameter_names_carry_their_cell_path_so_a_list_of_them_saves_and_loads(tmp_path):
    """auto_prefix (MindSpore's): `fc1.weight`, not two `weight`s; the names are the paths load_param_into_net uses."""
    net = TwoLayers()
    names = [p.name for p in net.trainable_params()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "seq.0.weight", "seq.0.bias"]
    assert names == [n for n, _ in net.parameters_and_names()]
    path = str(tmp_path / "list.ckpt")
    rt.save_checkpoint(net.trainable_params(), path)
    other = TwoLayers()
    assert rt.load_param_into_net(other, rt.load_checkpoint(path), strict_load=True) == ([], [])
    for a, b in zip(net.trainable_params(), other.trainable_params()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_auto_prefix_false_keeps_the_sub_cells_names():
    class Wrapper(nn.Cell):
        def __init__(self, backbone):
            super().__init__(auto_prefix=False)
            self.backbone = backbone

    inner = TwoLayers()
    Wrapper(inner)
    assert [p.name for p in inner.trainable_params()][:2] == ["fc1.weight", "fc1.bias"]


def _mlp():
    return nn.SequentialCell([nn.Dense(3, 5, activation="tanh"), nn.Dense(5, 2)])


@pytest.mark.parametrize("make_opt", [
    lambda ps: nn.Adam(ps, 0.05, weight_decay=0.01),
    lambda ps: nn.Momentum(ps, 0.1, 0.9, use_nesterov=True),
    lambda ps: nn.SGD(ps, 0.1, momentum=0.9, dampening=0.2),
    lambda ps: nn.AdamWeightDecay(ps, 0.05, weight_decay=0.1),
], ids=["Adam", "Momentum", "SGD", "AdamWeightDecay"])
def test_an_optimizer_checkpoint_resumes_training_exactly(tmp_path, make_opt):
    """save_checkpoint(optimizer) writes its parameters and state (MindSpore's names: global_step,
    moment1.<name> ...); loading it into a fresh net and optimizer continues the very same run (the
    optimizer could not be saved at all: a resumed Adam restarted its moments and bias correction)."""
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((8, 3)).astype(np.float32))
    y = Tensor(rng.standard_normal((8, 2)).astype(np.float32))

    def steps(net, opt, n):
        grad_fn = rt.value_and_grad(lambda a, b: nn.MSELoss()(net(a), b), None, opt.parameters)
        for _ in range(n):
            opt(grad_fn(x, y)[1])

    rt.set_seed(0)
    net = _mlp()
    opt = make_opt(net.trainable_params())
    steps(net, opt, 3)
    path = tmp_path / "opt.safetensors"
    rt.save_checkpoint(opt, path)
    stored = safetensors.numpy.load_file(str(path))
    assert stored["global_step"].tolist() == [3] and stored["global_step"].dtype == np.int32
    assert {"0.weight", "0.bias", "1.weight", "1.bias"} <= set(stored)
    steps(net, opt, 4)

    rt.set_seed(1)  # other initial weights: all must come from the checkpoint
    net2 = _mlp()
    opt2 = make_opt(net2.trainable_params())
    assert rt.load_param_into_net(opt2, rt.load_checkpoint(path)) == ([], [])
    assert opt2.global_step == 3
    steps(net2, opt2, 4)
    for a, b in zip(net.trainable_params(), net2.trainable_params()):  # Adam stores m, v: float32 rounding
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
    assert opt2.global_step == opt.global_step == 7


def test_an_optimizer_checkpoint_refuses_part_of_its_state_and_wrong_entries(tmp_path):
    net = _mlp()
    opt = nn.Adam(net.trainable_params())
    opt([Tensor(np.ones(p.shape, np.float32)) for p in opt.parameters])
    state = dict(opt.parameters_and_names())
    assert sorted(n for n in state if n.startswith("moment1.")) == ["moment1.0.bias", "moment1.0.weight",
                                                                    "moment1.1.bias", "moment1.1.weight"]
    fresh = nn.Adam(_mlp().trainable_params())
    before = [p.asnumpy().copy() for p in fresh.parameters]
    partial = {k: v for k, v in state.items() if k != "moment2.1.bias"}
    with pytest.raises(ValueError, match=r"holds part of the optimizer's state; missing: \['moment2.1.bias'\]"):
        rt.load_param_into_net(fresh, partial)
    bad = dict(state, **{"moment1.0.weight": Tensor(np.zeros((5, 3)))})  # float64, not float32
    with pytest.raises(TypeError, match="'moment1.0.weight' is float64 in the checkpoint and float32 in the net"):
        rt.load_param_into_net(fresh, bad)
    with pytest.raises(ValueError, match="'global_step' must be one non-negative integer, got float32"):
        rt.load_param_into_net(fresh, dict(state, global_step=np.array([1.0], np.float32)))
    assert fresh.global_step == 0 and all(np.array_equal(p.asnumpy(), b) for p, b in zip(fresh.parameters, before))
    # weights alone (a net's checkpoint) load into an optimizer, the state listed as not loaded
    not_loaded, unused = rt.load_param_into_net(fresh, dict(net.parameters_and_names()))
    assert unused == [] and "global_step" in not_loaded and "0.weight" not in not_loaded
    unnamed = nn.SGD([Parameter(np.zeros(2))], momentum=0.9)
    with pytest.raises(ValueError, match="SGD: parameter 0 has no name, so its state cannot be saved"):
        rt.save_checkpoint(unnamed, tmp_path / "x.safetensors")


def test_a_directory_as_the_target_is_a_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory; give the path of the file to write"):
        rt.save_checkpoint(_mlp(), tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["dict", "list", "parameters"])
def test_a_reserved_name_is_refused_and_the_file_left_intact(tmp_path, how):
    path = tmp_path / "c.ckpt"
    rt.save_checkpoint({"w": np.ones(4)}, path)
    good = path.read_bytes()
    if how == "dict":
        obj = {"w": np.ones(2), "__metadata__": np.zeros(2, np.float32)}
    elif how == "list":
        obj = [{"name": "__metadata__", "data": np.zeros(2)}]
    else:
        obj = [Parameter(np.ones(2, np.float32), name="b"), Parameter(np.zeros(2, np.float32), name="__metadata__")]
    with pytest.raises(ValueError, match=r"save_checkpoint: the name '__metadata__' is reserved by the safetensors "
                                         r"format \(its header's metadata\); rename that entry. Nothing was written"):
        rt.save_checkpoint(obj, path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["c.ckpt"]
    assert rt.load_checkpoint(path)["w"].asnumpy().tolist() == [1.0] * 4


@pytest.mark.parametrize("dtype", ["F8_E4M3", "F8_E5M2"])  # BF16 loads now (tests/test_dtypes_extended.py)
def test_a_dtype_the_loader_lacks_is_named(tmp_path, dtype):
    size = 1
    path = tmp_path / "m.safetensors"
    path.write_bytes(safetensors_bytes({"ok": ("F32", [1], b"\0" * 4), "w": (dtype, [3], b"\0" * 3 * size)}))
    with pytest.raises(TypeError, match=rf"m.safetensors: entry 'w' has dtype {dtype}, which load_checkpoint cannot "
                                        rf"load \(supported: BOOL, U8, .*, BF16, .*, F64, C64\)"):
        rt.load_checkpoint(path)


def test_a_file_written_by_hand_with_known_dtypes_loads():
    """The hand-made files above are well formed: with a dtype the loader has, they load."""
    arrays = safetensors.numpy.load(safetensors_bytes({"w": ("F32", [2], np.float32([1.5, 2]).tobytes())}))
    assert arrays["w"].tolist() == [1.5, 2.0]


def _sgd_step(net, opt, i):
    r = np.random.RandomState(i)
    x, y = Tensor(r.randn(8, 4).astype(np.float32)), Tensor(r.randn(8, 4).astype(np.float32))
    _, g = rt.value_and_grad(lambda a, b: nn.MSELoss()(net(a), b), None, list(opt.parameters))(x, y)
    opt(g)


def _stack():
    rt.set_seed(0)
    return nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 4), nn.Dense(4, 4)])


@pytest.mark.parametrize("make_opt", [lambda ps: nn.Momentum(ps, 0.1, 0.9), lambda ps: nn.Adam(ps, 0.01)],
                         ids=["Momentum", "Adam"])
def test_a_resume_is_the_very_same_run_even_after_the_cells_were_put_in_another_container(tmp_path, make_opt):
    """The optimizer saved its state under the parameters' names at save time: a container built from the
    network's cells (reversed, for a look) named them anew, and the state went into the wrong layers of a
    fresh network with nothing said. Adam kept m / (1 - b1) and v / (1 - b2): the division back on load
    rounded, so a resumed run differed in the last bits. Both resume exactly now."""
    ref = _stack()
    oref = make_opt(ref.trainable_params())
    for i in range(4):
        _sgd_step(ref, oref, i)
    net = _stack()
    opt = make_opt(net.trainable_params())
    for i in range(2):
        _sgd_step(net, opt, i)
    nn.SequentialCell(list(net)[::-1])  # renames the network's Parameters
    rt.save_checkpoint(net, tmp_path / "net.safetensors")
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    fresh = _stack()
    fopt = make_opt(fresh.trainable_params())
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "net.safetensors")) == ([], [])
    assert rt.load_param_into_net(fopt, rt.load_checkpoint(tmp_path / "opt.safetensors")) == ([], [])
    for i in range(2, 4):
        _sgd_step(fresh, fopt, i)
    for p, q in zip(ref.get_parameters(), fresh.get_parameters()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())


def test_a_train_wrappers_checkpoint_loads_into_the_bare_network(tmp_path):
    """Cells' checkpoints were keyed by path: TrainOneStepCell(WithLossCell(net)) saved
    'network._backbone.body.0.weight', which a fresh network did not take (nothing loaded, nothing said
    but the returned lists). Keyed by name now, as MindSpore's: the wrappers name nothing."""
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell([nn.Dense(3, 3), nn.ReLU(), nn.Dense(3, 2)])

        def construct(self, x):
            return self.body(x)

    net = Net()
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    train(Tensor(np.ones((4, 3), np.float32)), Tensor(np.ones((4, 2), np.float32)))
    rt.save_checkpoint(train, tmp_path / "train.safetensors")
    state = {"global_step"} | {f"moments.{p.name}" for p in net.get_parameters()}  # the optimizer's (MindSpore's too)
    assert set(rt.load_checkpoint(tmp_path / "train.safetensors")) == {p.name for p in net.get_parameters()} | state
    fresh = Net()
    not_loaded, unused = rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "train.safetensors"))
    assert not_loaded == [] and set(unused) == state
    for a, b in zip(net.get_parameters(), fresh.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


@pytest.mark.parametrize("make_opt", [
    lambda ps: nn.Adam(ps, 0.05),
    lambda ps: nn.Momentum(ps, 0.1, 0.9),
], ids=["Adam", "Momentum"])
def test_a_train_cells_checkpoint_holds_its_optimizers_state_and_resumes_exactly(tmp_path, make_opt):
    """MindSpore's TrainOneStepCell holds its optimizer as a Cell, so its checkpoint holds global_step and
    the moments too, and loading it resumes the same run. Here the optimizer was left out: a resumed
    Adam restarted its moments and bias correction (the losses below differed)."""
    x, y = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)), Tensor(np.ones((4, 2), np.float32))

    def make(seed):
        rt.set_seed(seed)
        net = _mlp()
        return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), make_opt(net.trainable_params()))

    train = make(0)
    for _ in range(3):
        train(x, y)
    rt.save_checkpoint(train, tmp_path / "train.safetensors")
    expected = [float(train(x, y).asnumpy()) for _ in range(3)]
    fresh = make(1)
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "train.safetensors"),
                                  strict_load=True) == ([], [])
    assert fresh.optimizer.global_step == 3
    np.testing.assert_allclose([float(fresh(x, y).asnumpy()) for _ in range(3)], expected, rtol=1e-6)
    # a network's own checkpoint (no optimizer state) loads the weights and names the state not loaded
    rt.save_checkpoint(train.network, tmp_path / "net.safetensors")
    not_loaded, unused = rt.load_param_into_net(make(2), rt.load_checkpoint(tmp_path / "net.safetensors"))
    assert "global_step" in not_loaded and unused == []


def test_two_training_cells_in_one_model_save_their_optimizers_apart_and_resume(tmp_path):
    """A GAN holds two TrainOneStepCells: each optimizer's state is named under its cell (tg.global_step,
    td.global_step), as MindSpore's prefix names them; both resume. Before, the two global_steps
    clashed and the model could not be saved."""
    x, y = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)), Tensor(np.ones((4, 2), np.float32))

    class GAN(nn.Cell):
        def __init__(self, seed):
            super().__init__()
            rt.set_seed(seed)
            self.g, self.d = nn.Dense(3, 2), nn.Dense(3, 2)
            self.tg = nn.TrainOneStepCell(nn.WithLossCell(self.g, nn.MSELoss()), nn.Adam(self.g.trainable_params(), 0.05))
            self.td = nn.TrainOneStepCell(nn.WithLossCell(self.d, nn.MSELoss()),
                                          nn.Momentum(self.d.trainable_params(), 0.05, 0.9))

        def construct(self, a, b):
            return self.tg(a, b) + self.td(a, b)

    gan = GAN(0)
    gan(x, y)
    gan(x, y)
    rt.save_checkpoint(gan, tmp_path / "gan.safetensors")
    names = set(rt.load_checkpoint(tmp_path / "gan.safetensors"))
    assert {"tg.global_step", "td.global_step", "tg.moment1.g.weight", "td.moments.d.weight"} <= names
    expected = [float(gan(x, y).asnumpy()) for _ in range(3)]
    fresh = GAN(1)
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "gan.safetensors"), strict_load=True) == ([], [])
    assert fresh.tg.optimizer.global_step == fresh.td.optimizer.global_step == 2
    np.testing.assert_allclose([float(fresh(x, y).asnumpy()) for _ in range(3)], expected, rtol=1e-6)


def test_another_optimizers_state_loads_the_weights_and_lists_the_state():
    """An Adam training cell's checkpoint into a Momentum one: they share only the name global_step. The
    weights load; Momentum's state is not loaded (listed), Adam's entries and its step are unused. Before,
    the shared global_step made it look like part of Momentum's state: an error, nothing loaded."""
    x, y = Tensor(np.ones((4, 3), np.float32)), Tensor(np.ones((4, 2), np.float32))
    net = nn.Dense(3, 2)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.01))
    train(x, y)
    other = nn.Dense(3, 2)
    momentum = nn.TrainOneStepCell(nn.WithLossCell(other, nn.MSELoss()), nn.Momentum(other.trainable_params(), 0.1, 0.9))
    saved = {k: Tensor(v) for k, v in {"weight": net.weight.asnumpy(), "bias": net.bias.asnumpy(),
                                       "global_step": np.array([1], np.int32),
                                       "moment1.weight": np.zeros((2, 3), np.float32)}.items()}
    not_loaded, unused = rt.load_param_into_net(momentum, saved)
    assert set(not_loaded) == {"global_step", "moments.weight", "moments.bias"}
    assert set(unused) == {"global_step", "moment1.weight"}
    np.testing.assert_array_equal(other.weight.asnumpy(), net.weight.asnumpy())
    assert momentum.optimizer.global_step == 0
    with pytest.raises(ValueError, match=r"^load_param_into_net: the checkpoint holds part of the optimizer's "
                                         r"state; missing: \['moments.weight', 'moments.bias'\]"):
        rt.load_param_into_net(momentum.optimizer, saved)  # the optimizer's own load stays all or nothing


def test_a_cell_holding_two_optimizers_names_each_by_its_attribute(tmp_path):
    """A custom training cell holding ``self.opt_g`` and ``self.opt_d`` (a GAN's): MindSpore names a
    sub-cell's Parameters by the attribute, so opt_g.global_step and opt_d.global_step. Both were named
    global_step here, and the cell could not be saved."""
    class Part(nn.Cell):
        def __init__(self, out):
            super().__init__()
            self.fc = nn.Dense(2, out)

        def construct(self, x):
            return self.fc(x)

    class Trainer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.g, self.d = Part(2), Part(1)
            self.opt_g = nn.Adam(self.g.trainable_params(), 0.1)
            self.opt_d = nn.Momentum(self.d.trainable_params(), 0.1, 0.9)

    t = Trainer()
    grads_g = [Tensor(np.full(p.shape, 0.5, np.float32)) for p in t.opt_g.parameters]
    grads_d = [Tensor(np.full(p.shape, -0.25, np.float32)) for p in t.opt_d.parameters]
    t.opt_g(grads_g)
    t.opt_d(grads_d)
    rt.save_checkpoint(t, tmp_path / "t.safetensors")
    names = set(rt.load_checkpoint(tmp_path / "t.safetensors"))
    assert {"opt_g.global_step", "opt_g.moment1.g.fc.weight", "opt_d.global_step", "opt_d.moments.d.fc.bias"} <= names
    fresh = Trainer()
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "t.safetensors"), strict_load=True) == ([], [])
    for a, b in ((t.opt_g, fresh.opt_g), (t.opt_d, fresh.opt_d)):
        assert b.global_step == 1
        a(grads_g if a is t.opt_g else grads_d)
        b(grads_g if b is fresh.opt_g else grads_d)
        for p, q in zip(a.parameters, b.parameters):
            np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())


def test_a_training_cells_optimizer_state_is_named_as_its_weights_are(tmp_path):
    """An optimizer made before its layers were combined names its parameters by their names when they
    were not unique (fc.weight twice): the current names, which a later container changes. A training
    cell's checkpoint now names the state after the weights' names from the cell's structure, so the
    moments come back; before, every one was listed as not loaded and the run resumed with fresh ones."""
    class Part(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 3)

        def construct(self, x):
            return self.fc(x)

    class AE(nn.Cell):
        def __init__(self, e, d):
            super().__init__()
            self.enc, self.dec = e, d

        def construct(self, x):
            return self.dec(self.enc(x))

    x = Tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    enc, dec = Part(), Part()
    opt = nn.Adam(enc.trainable_params() + dec.trainable_params(), 0.01)
    model = AE(enc, dec)
    train = nn.TrainOneStepCell(nn.WithLossCell(model, nn.MSELoss()), opt)
    for _ in range(3):
        train(x, x)
    rt.save_checkpoint(train, tmp_path / "ae.safetensors")
    assert "moment1.enc.fc.weight" in rt.load_checkpoint(tmp_path / "ae.safetensors")
    nn.SequentialCell([model, nn.Dense(3, 1)])  # another container renames the model's Parameters
    saved = [m.copy() for m in opt.moment1]
    opt._m = [np.zeros_like(m) for m in opt._m]  # as a new process would have them
    assert rt.load_param_into_net(train, rt.load_checkpoint(tmp_path / "ae.safetensors")) == ([], [])
    for a, b in zip(opt.moment1, saved):
        np.testing.assert_array_equal(a, b)


def test_a_parameter_named_as_the_optimizers_state_is_a_named_error(tmp_path):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 1)
            self.global_step = rt.Parameter(np.zeros(1, np.float32), name="global_step", requires_grad=False)

        def construct(self, x):
            return self.fc(x)

    net = Net()
    rt.save_checkpoint(net, tmp_path / "net.safetensors")  # the network alone has no optimizer: fine
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    message = (r"parameter 'network._backbone.global_step' and the state of optimizer Momentum 'optimizer' are "
               r"both named 'global_step'; give one another name")
    with pytest.raises(ValueError, match=r"^save_checkpoint: " + message):
        rt.save_checkpoint(train, tmp_path / "train.safetensors")
    with pytest.raises(ValueError, match=r"^load_param_into_net: " + message):
        rt.load_param_into_net(train, rt.load_checkpoint(tmp_path / "net.safetensors"))
    assert not (tmp_path / "train.safetensors").exists()


def test_a_parameter_only_the_optimizer_holds_is_saved_with_the_training_cell(tmp_path):
    """A learnt loss weight (uncertainty weighting) is trained by the optimizer but held by no cell. MindSpore's
    TrainOneStepCell holds the optimizer's parameters, so its checkpoint has the weight; here only its
    moments were saved, and a strict resume diverged silently."""
    x, y = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)), Tensor(np.ones((4, 2), np.float32))

    def make(seed):
        rt.set_seed(seed)
        net, log_var = nn.Dense(3, 2), rt.Parameter(np.zeros(1, np.float32), name="log_var")
        mse = nn.MSELoss()
        loss = nn.WithLossCell(net, lambda out, t: mse(out, t) * (-log_var).exp() + log_var)
        return nn.TrainOneStepCell(loss, nn.Adam(net.trainable_params() + [log_var], 0.1)), log_var

    train, log_var = make(0)
    for _ in range(3):
        train(x, y)
    rt.save_checkpoint(train, tmp_path / "t.safetensors")
    assert {"log_var", "moment1.log_var"} <= set(rt.load_checkpoint(tmp_path / "t.safetensors"))
    expected = [train(x, y).asnumpy().item() for _ in range(3)]
    fresh, fresh_log_var = make(1)
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "t.safetensors"), strict_load=True) == ([], [])
    np.testing.assert_array_equal(fresh_log_var.asnumpy(), np.asarray(rt.load_checkpoint(tmp_path / "t.safetensors")
                                                                      ["log_var"].asnumpy()))
    np.testing.assert_allclose([fresh(x, y).asnumpy().item() for _ in range(3)], expected, rtol=1e-6)


def test_names_that_would_hold_two_things_are_named_errors(tmp_path):
    """One name for two entries would load one into both (two moments collapsed into one, two optimizers
    given one global_step): refused, naming both, on save and on load."""
    class Holder(nn.Cell):
        def __init__(self, net, extra, opt):
            super().__init__(auto_prefix=False)
            self.net, self.extra, self.opt = net, extra, opt

    net, extra = nn.Dense(3, 3), [nn.Dense(3, 3)]  # a head in a plain list: the cell does not hold it
    holder = Holder(net, extra, nn.Adam(net.trainable_params() + extra[0].trainable_params(), 0.1))
    with pytest.raises(ValueError, match=r"^save_checkpoint: parameter 'net.weight' and parameter 2 of optimizer Adam "
                                         r"'opt' are both named 'weight'; give one another name"):
        rt.save_checkpoint(holder, tmp_path / "h.safetensors")
    with pytest.raises(ValueError, match=r"^load_param_into_net: parameter 'net.weight' and parameter 2 of optimizer"):
        rt.load_param_into_net(holder, {})

    class Trainer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)
            self.opt = nn.Momentum(self.fc.trainable_params(), 0.1, 0.9)

    class Two(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.a, self.b = Trainer(), Trainer()

    with pytest.raises(ValueError, match=r"^save_checkpoint: parameters 'a.fc.weight' and 'b.fc.weight' are both "
                                         r"named 'fc.weight'"):
        rt.save_checkpoint(Two(), tmp_path / "two.safetensors")
    assert not list(tmp_path.iterdir())


def test_optimizers_in_a_list_attribute_are_saved_under_their_index(tmp_path):
    class Trainer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.g, self.d = nn.Dense(2, 2), nn.Dense(2, 1)
            self.opts = [nn.Adam(self.g.trainable_params(), 0.1), nn.Adam(self.d.trainable_params(), 0.1)]

    t = Trainer()
    t.opts[0]([Tensor(np.ones(p.shape, np.float32)) for p in t.opts[0].parameters])
    rt.save_checkpoint(t, tmp_path / "t.safetensors")
    names = set(rt.load_checkpoint(tmp_path / "t.safetensors"))
    assert {"opts.0.global_step", "opts.1.global_step", "opts.0.moment1.g.weight", "opts.1.moment2.d.bias"} <= names
    fresh = Trainer()
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "t.safetensors"), strict_load=True) == ([], [])
    assert [o.global_step for o in fresh.opts] == [1, 0]


def test_an_optimizers_own_checkpoint_names_a_parameter_named_as_its_state(tmp_path):
    w = rt.Parameter(np.zeros(2, np.float32), name="global_step")
    opt = nn.SGD([w], 0.1)
    message = r"'global_step' names both a parameter of optimizer SGD and its state; rename the parameter"
    with pytest.raises(ValueError, match=r"^save_checkpoint: " + message):
        rt.save_checkpoint(opt, tmp_path / "o.safetensors")
    with pytest.raises(ValueError, match=r"^load_param_into_net: " + message):
        rt.load_param_into_net(opt, {"global_step": Tensor(np.zeros(2, np.float32))})


def test_a_bad_step_count_names_its_optimizer_and_what_is_wrong():
    class Trainer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)
            self.opt_d = nn.Momentum(self.fc.trainable_params(), 0.1, 0.9)

    t = Trainer()
    entries = {"fc.weight": t.fc.weight, "fc.bias": t.fc.bias, "opt_d.moments.fc.weight": np.zeros((2, 2), np.float32),
               "opt_d.moments.fc.bias": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match=r"^load_param_into_net: 'opt_d.global_step' must be one non-negative "
                                         r"integer, got -3$"):
        rt.load_param_into_net(t, {**entries, "opt_d.global_step": np.array([-3], np.int32)})


def test_what_is_not_loaded_is_logged_as_mindspore_logs_it(caplog):
    net = nn.Dense(2, 2)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.1))
    with caplog.at_level("WARNING", logger="runtime"):
        not_loaded, _ = rt.load_param_into_net(train, {"weight": net.weight, "bias": net.bias})
    assert not_loaded and caplog.records[-1].getMessage().startswith(
        f"load_param_into_net: {len(not_loaded)} of the net's parameters and optimizer state are not loaded")
    caplog.clear()
    with caplog.at_level("WARNING", logger="runtime"):
        rt.load_param_into_net(net, {"weight": net.weight, "bias": net.bias})
    assert not caplog.records


def test_two_parameters_of_one_name_cannot_be_saved_or_loaded_by_name(tmp_path):
    class Two(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)  # names nothing: both Dense keep "weight" and "bias"
            self.a, self.b = nn.Dense(2, 2), nn.Dense(2, 2)

        def construct(self, x):
            return self.b(self.a(x))

    with pytest.raises(ValueError, match=r"^save_checkpoint: parameters 'a.weight' and 'b.weight' are both named "
                                         r"'weight'; give one another name"):
        rt.save_checkpoint(Two(), tmp_path / "two.safetensors")
    with pytest.raises(ValueError, match=r"^load_param_into_net: parameters 'a.weight' and 'b.weight' are both "
                                         r"named 'weight'"):
        rt.load_param_into_net(Two(), {})
    assert not (tmp_path / "two.safetensors").exists()


def test_a_networks_checkpoint_ignores_names_another_container_gave_its_parameters(tmp_path):
    """c70471a keyed a cell's checkpoint by Parameter.name, which a container built from the network's
    cells (a reversed look at the stack) changes: layers 0 and 2 loaded into each other, strict_load
    saying nothing. Keys are worked out from the cell's structure now; the optimizer's, made before the
    look, agree with them."""
    def build():
        rt.set_seed(0)
        net = nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 4), nn.Dense(4, 4)])
        return net, nn.SGD(net.trainable_params(), 0.1)

    net, opt = build()
    rng = np.random.default_rng(1)
    for p in net.get_parameters():  # each layer its own values
        p.set_data(Tensor(rng.random(p.shape).astype(np.float32)))
    nn.SequentialCell(list(net)[::-1])  # names net's Parameters anew
    rt.save_checkpoint(net, tmp_path / "net.safetensors")
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    for file, target in (("net", 0), ("opt", 0), ("net", 1), ("opt", 1)):
        fresh, fopt = build()
        rt.load_param_into_net((fresh, fopt)[target], rt.load_checkpoint(tmp_path / f"{file}.safetensors"))
        for p, q in zip(net.get_parameters(), fresh.get_parameters()):
            np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=f"{file} file into {target}")


def test_an_optimizer_made_before_its_layers_were_assembled_saves_under_their_names_then(tmp_path):
    """Its parameters were all named 'weight' and 'bias' when it was made: 1713c50 saved its state under
    those and the save failed ("the name 'weight' appears twice"). Names that do not tell each parameter
    apart give way to the names they have when saved."""
    enc, dec = nn.Dense(4, 4), nn.Dense(4, 4)
    opt = nn.Momentum(enc.trainable_params() + dec.trainable_params(), 0.1, 0.9)
    nn.SequentialCell([enc, dec])
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    assert {"0.weight", "1.weight", "moments.0.weight", "moments.1.bias"} <= set(rt.load_checkpoint(
        tmp_path / "opt.safetensors"))


class _Names(nn.Cell):
    """Holds the cells given (auto_prefix as given)."""

    def __init__(self, auto_prefix=True, **cells):
        super().__init__(auto_prefix=auto_prefix)
        for k, v in cells.items():
            setattr(self, k, v)


def _shared():
    shared = nn.Dense(2, 2)
    return _Names(shared=shared, body=nn.SequentialCell([shared, nn.ReLU(), shared])), shared


def _nested():
    x, y = nn.Dense(2, 2, has_bias=False), nn.Dense(2, 2, has_bias=False)
    return _Names(a=_Names(auto_prefix=False, x=x, y=_Names(x=y))), x


@pytest.mark.parametrize("build", [_shared, _nested], ids=["shared_sub_cell", "nested_wrapper"])
def test_parameter_names_and_checkpoint_keys_agree(tmp_path, build):
    """Parameters were named by their full path from the cell assigned (a nested auto_prefix=False cell's
    name included; a shared layer by its last place), while a cell's checkpoint keys skip such names and
    take a shared layer's first place: an optimizer's file (keyed by names) loaded a layer's weights into
    another ('a.x.weight' named y's weight) or nothing. They are one walk now."""
    net, _ = build()
    keys = [name for name, _ in rt.checkpoint._cell_checkpoint(net, "test")[0]]
    assert [p.name for p in net.get_parameters()] == keys
    rng = np.random.default_rng(2)
    for p in net.get_parameters():
        p.set_data(Tensor(rng.random(p.shape).astype(np.float32)))
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    fresh, _ = build()
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "opt.safetensors"))[0] == []
    for p, q in zip(net.get_parameters(), fresh.get_parameters()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())

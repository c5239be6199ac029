"""Layers, containers, initializers and set_seed: values, MindSpore's parameter paths and
defaults, gradients against central differences in float64, and bad inputs."""
import math

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn
from runtime.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(3)


def weights_fn(cell, x):
    """x, *params -> cell(x) with the gradcheck's leaves standing in for the params (so it moves them too)."""
    slots = [(c, n, p) for _, c in cell.cells_and_names() for n, p in c._params.items() if p.requires_grad]

    def fn(xx, *ws):
        for (c, n, _), w in zip(slots, ws):
            object.__setattr__(c, n, w)  # bypass registration: the Cell keeps its Parameter
        try:
            return cell(xx)
        finally:
            for c, n, p in slots:
                object.__setattr__(c, n, p)
    return fn, [Tensor(p._data.astype(np.float64)) for _, _, p in slots]


def test_dense_defaults_shapes_and_paths():
    rt.set_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 8, activation="relu"), nn.Dense(8, 2, has_bias=False)])
    assert [n for n, _ in net.parameters_and_names()] == ["0.weight", "0.bias", "1.weight"]
    w, b = net[0].weight.asnumpy(), net[0].bias.asnumpy()
    assert w.shape == (8, 16) and w.dtype == np.float32 and b.shape == (8,)
    bound = 1 / math.sqrt(16)  # HeUniform(sqrt(5)) and the bias' uniform both give 1/sqrt(fan_in)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.abs(b).max() <= bound
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    expect = np.maximum(x @ w.T + b, 0) @ net[1].weight.asnumpy().T
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), expect, rtol=1e-5, atol=1e-6)

    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell(nn.Dense(2, 2), nn.ReLU())
            self.heads = nn.CellList([nn.Dense(2, 1)])

    assert [n for n, _ in Model().parameters_and_names()] == ["body.0.weight", "body.0.bias", "heads.0.weight",
                                                                "heads.0.bias"]


def test_set_seed_makes_initializers_and_dropout_repeatable():
    def draw():
        rt.set_seed(42)
        d = nn.Dense(5, 3)
        drop = nn.Dropout(p=0.5).set_train()
        return d.weight.asnumpy().copy(), drop(Tensor(np.ones((4, 4), np.float32))).asnumpy()
    (w1, m1), (w2, m2) = draw(), draw()
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(m1, m2)
    rt.set_seed(43)
    assert not np.array_equal(nn.Dense(5, 3).weight.asnumpy(), w1)
    assert rt.get_seed() == 43


def test_dropout_train_and_eval():
    rt.set_seed(1)
    drop = nn.Dropout(p=0.25)
    x = Tensor(np.ones((200, 50), np.float32))
    assert drop(x) is x  # a new cell is in evaluation mode
    drop.set_train()
    out = drop(x).asnumpy()
    assert set(np.unique(out).tolist()) == {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.02
    g = rt.grad(lambda x: drop(x).sum())(x).asnumpy()
    assert set(np.unique(g).tolist()) == {0.0, np.float32(1 / 0.75)}
    drop.set_train(False)
    assert drop(x) is x
    assert nn.Dropout(keep_prob=0.9).p == pytest.approx(0.1)


def test_activations_and_flatten_values():
    x = Tensor(np.array([[-1.0, 0.5], [2.0, -3.0]]))
    assert nn.ReLU()(x).tolist() == [[0.0, 0.5], [2.0, 0.0]]
    np.testing.assert_allclose(nn.Tanh()(x).asnumpy(), np.tanh(x.asnumpy()))
    np.testing.assert_allclose(nn.Sigmoid()(x).asnumpy(), 1 / (1 + np.exp(-x.asnumpy())))
    np.testing.assert_allclose(nn.Softmax()(x).asnumpy().sum(1), [1.0, 1.0])
    assert nn.Flatten()(Tensor(np.zeros((2, 3, 4)))).shape == (2, 12)
    assert nn.Flatten(0, 1)(Tensor(np.zeros((2, 3, 4)))).shape == (6, 4)


CELLS = {
    "dense": lambda: nn.Dense(3, 4),
    "dense_tanh_no_bias": lambda: nn.Dense(3, 2, has_bias=False, activation="tanh"),
    "sequential": lambda: nn.SequentialCell([nn.Dense(3, 4, activation=nn.Sigmoid()), nn.GELU(), nn.Dense(4, 2),
                                             nn.Softmax()]),
    "gelu_erf": lambda: nn.SequentialCell(nn.Dense(3, 3), nn.GELU(approximate=False)),
    "flatten_relu": lambda: nn.SequentialCell(nn.Flatten(), nn.Dense(3, 2), nn.ReLU()),
}


@pytest.mark.parametrize("name", sorted(CELLS))
def test_layer_gradients_against_central_differences(name):
    rt.set_seed(5)
    cell = CELLS[name]()
    fn, ws = weights_fn(cell, None)
    x = Tensor(RNG.standard_normal((5, 3)) + 0.1)
    assert gradcheck(fn, [x] + ws)


def test_dense_on_a_strided_view_and_an_empty_batch():
    cell = nn.Dense(3, 2, dtype=rt.float64)
    base = RNG.standard_normal((3, 8))
    x = Tensor(base.T[::2])  # (4, 3), not contiguous
    fn, ws = weights_fn(cell, None)
    assert gradcheck(fn, [x] + ws)
    empty = Tensor(np.zeros((0, 3)))
    (out, grads) = rt.value_and_grad(lambda x: cell(x).sum(), None, cell.trainable_params())(empty)
    assert out.tolist() == 0.0 and [g.tolist() for g in grads] == [[[0.0] * 3] * 2, [0.0, 0.0]]


def test_initializers():
    rt.set_seed(0)
    from runtime.nn import init
    assert init.initializer("zeros", (2, 3)).tolist() == [[0.0] * 3] * 2
    assert init.initializer(2.5, 2, rt.float64).tolist() == [2.5, 2.5]
    t = init.initializer(init.TruncatedNormal(sigma=1.0), (1000,))
    assert np.abs(t.asnumpy()).max() <= 2.0
    x = init.initializer("xavier_uniform", (30, 20)).asnumpy()
    assert np.abs(x).max() <= math.sqrt(6 / 50)
    n = init.initializer(init.Normal(sigma=0.5, mean=1.0), (4000,)).asnumpy()
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 0.5) < 0.05
    assert init.initializer(np.ones((2, 2)), (2, 2)).dtype == rt.float32
    with pytest.raises(ValueError, match="unknown name 'glorot'"):
        init.initializer("glorot", (2, 2))
    with pytest.raises(ValueError, match=r"need a shape of at least 2 dimensions, got \[3\]"):
        init.initializer("he_uniform", (3,))
    with pytest.raises(ValueError, match=r"the given array has shape \[2\], expected \[3\]"):
        init.initializer(np.ones(2), (3,))
    with pytest.raises(TypeError, match="shape must be an int or a tuple of non-negative ints"):
        init.initializer("ones", (2, -1))


def test_containers():
    seq = nn.SequentialCell([nn.ReLU()])
    seq.append(nn.Tanh())
    assert len(seq) == 2 and isinstance(seq[-1], nn.Tanh) and isinstance(seq[0:1], nn.SequentialCell)
    cl = nn.CellList([nn.Dense(2, 2)])
    cl.insert(0, nn.Dense(2, 3))
    assert [n for n, _ in cl.parameters_and_names()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [c.out_channels for c in cl] == [3, 2]


def _names_are_paths(cell):
    return all(p.name == path for path, p in cell.parameters_and_names())


def test_parameter_names_are_paths_however_the_network_was_put_together():
    """MindSpore's auto_prefix names each Parameter by its path from the cell it is assigned to (after that
    cell's own place). The runtime put the attribute name in front of the old name instead, every time:
    slicing net.body renamed net's Parameters ('0.body.0.weight'), CellList.insert gave '1.0.weight', a
    deepcopied layer kept the original's names (a ParameterTuple refused the duplicates), and an append to a
    nested container collided with the outer one's ('1.weight' twice)."""
    import copy
    import pickle

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell([nn.Dense(2, 3), nn.ReLU(), nn.Dense(3, 1)])
            self.fc = nn.Dense(1, 1)
            self.fc2 = copy.deepcopy(self.fc)  # a clone: its own names

        def construct(self, x):
            return self.fc2(self.fc(self.body(x)))

    net = Net()
    assert _names_are_paths(net) and [p.name for p in net.get_parameters()][-2:] == ["fc2.weight", "fc2.bias"]
    feat = net.body[:2]  # a view of net's cells: net's names stay
    wrapped = nn.WithLossCell(net, nn.MSELoss())
    assert _names_are_paths(net) and [p.name for p in feat.get_parameters()] == ["body.0.weight", "body.0.bias"]
    assert [p.name for p in wrapped.get_parameters()] == [p.name for p in net.get_parameters()]
    net.body.append(nn.Dense(1, 1))  # nested: after the container's own place
    net.body.insert(0, nn.Dense(2, 2))
    assert _names_are_paths(net)
    model = nn.SequentialCell([nn.SequentialCell([nn.Dense(2, 2)]), nn.Dense(2, 2)])
    model[0].append(nn.Dense(2, 2))
    assert _names_are_paths(model) and len({p.name for p in model.get_parameters()}) == 6
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        other[0].insert(0, nn.Dense(2, 2))
        assert _names_are_paths(other)


def test_append_to_a_sequential_cell_of_numbered_names_replaces_none():
    from collections import OrderedDict
    seq = nn.SequentialCell(OrderedDict([("1", nn.Dense(2, 2)), ("2", nn.Dense(2, 3))]))
    seq.append(nn.Dense(3, 3))  # "2" was replaced: two layers, the second 3 -> 3
    assert len(seq) == 3 and [c.out_channels for c in seq] == [2, 3, 3]
    assert seq(Tensor(np.ones((1, 2), np.float32))).shape == (1, 3)


def test_an_attribute_assigned_again_keeps_its_place_in_the_order():
    """It was popped and put back last: parameters_and_names (so trainable_params and the gradients' order)
    differed from MindSpore's and torch's."""
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(2, 2)
            self.fc2 = nn.Dense(2, 2)
            self.fc1 = nn.Dense(2, 2)
            self.fc2.weight = self.fc1.weight

        def construct(self, x):
            return self.fc2(self.fc1(x))

    assert [n for n, _ in Net().parameters_and_names()] == ["fc1.weight", "fc1.bias", "fc2.bias"]


def test_appending_a_new_layer_names_its_parameters_only():
    """Naming the whole container on each append made building N layers O(N^2) (1000 appends to one
    CellList: 0.78 s, 0.02 s now); a layer held nowhere else names only its own part. Seen here: a name
    set by hand on another layer is not walked over; a shared layer still names the container anew."""
    cl = nn.CellList([nn.Dense(2, 2) for _ in range(3)])
    cl[0].weight.name = "kept"
    cl.append(nn.Dense(2, 2))
    assert cl[0].weight.name == "kept" and cl[3].weight.name == "3.weight"
    cl.append(cl[1])  # held twice now: the walk from the list names it by its first place
    assert cl[0].weight.name == "0.weight" and cl[4].weight.name == "1.weight"


def test_a_reordered_network_resumes_its_optimizer_by_path(tmp_path):
    """Names are paths, so an optimizer checkpoint of a network whose layers were reordered loads into a
    fresh network place by place (e08e469 named by first holder instead: the load put body.1's trained
    weights into body.0 and said nothing)."""
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell([nn.Dense(2, 2), nn.Dense(2, 2)])

        def construct(self, x):
            return self.body(x)

    net = Net()
    net.body = net.body[::-1]
    assert _names_are_paths(net)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    fresh = Net()
    fopt = nn.Momentum(fresh.trainable_params(), 0.1, 0.9)
    assert rt.load_param_into_net(fopt, rt.load_checkpoint(tmp_path / "opt.safetensors")) == ([], [])
    for (path, p), (fpath, fp) in zip(net.parameters_and_names(), fresh.parameters_and_names()):
        assert path == fpath and np.array_equal(p.asnumpy(), fp.asnumpy())


def test_a_bfloat16_dense_gives_bfloat16_rounded_once_from_float32():
    """numpy's bfloat16 matmul returns float32: Dense gave float32, and a second bfloat16 layer raised
    "dense: input is Float32 but weight is BFloat16". Now bfloat16, the float32 result rounded once."""
    import ml_dtypes
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((4, 3)), rt.bfloat16)
    fc1, fc2 = nn.Dense(3, 5, dtype=rt.bfloat16), nn.Dense(5, 2, dtype=rt.bfloat16)
    h = fc1(x)
    assert h.dtype == rt.bfloat16 and fc2(h).dtype == rt.bfloat16
    f32 = [a.asnumpy().astype(np.float32) for a in (x, fc1.weight, fc1.bias)]
    want = (f32[0] @ f32[1].T + f32[2]).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(h.asnumpy(), want)
    g = rt.grad(lambda a: fc2(fc1(a)).sum())(x)
    assert g.dtype == rt.bfloat16 and g.shape == (4, 3)
    # the bias' gradient sums the rows in float32, rounded once (bfloat16 sums were one step off torch's)
    gy = Tensor(rng.standard_normal((64, 5)) * 0.1, rt.bfloat16)
    gb = rt.grad(lambda b: (rt.ops.dense(Tensor(np.ones((64, 3)), rt.bfloat16), fc1.weight, b) * gy).sum())(fc1.bias)
    want_b = gy.asnumpy().astype(np.float32).sum(0).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(gb.asnumpy(), want_b)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="in_channels must be a positive int, got 0"):
        nn.Dense(0, 2)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.Dense(2, 2, activation="swish")
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\), got 1.0"):
        nn.Dropout(p=1.0)
    with pytest.raises(ValueError, match="give p or keep_prob, not both"):
        nn.Dropout(keep_prob=0.5, p=0.5)
    with pytest.raises(TypeError, match="SequentialCell: expected a Cell, got int"):
        nn.SequentialCell([nn.ReLU(), 3])
    with pytest.raises(IndexError, match="index 5 is out of range for a CellList of 1 cells"):
        nn.CellList([nn.ReLU()])[5]
    with pytest.raises(ValueError, match=r"input of shape \[2, 4\] does not match weight of shape \[2, 3\]"):
        nn.Dense(3, 2)(Tensor(np.ones((2, 4), np.float32)))
    with pytest.raises(TypeError, match="seed must be an int"):
        rt.set_seed(1.5)
    with pytest.raises(ValueError, match="seed must be non-negative"):
        rt.set_seed(-1)
    assert isinstance(nn.Dense(2, 2).weight, Parameter)

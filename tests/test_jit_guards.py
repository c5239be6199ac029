"""A trace is reused only while what it read besides its arguments still holds (issue 33, item 11): the
globals, closure variables, class attributes and object fields a jitted function (or a GRAPH_MODE cell)
reads, the contents of a global numpy array, which tensor a global names; a Cell inside a plain list or
dict attribute and a field of a plain object attribute in GRAPH_MODE. Results and gradients equal eager;
the same values reuse the trace."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, mint, nn
from runtime.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(11)

SCALE = 2.0
TABLE = np.array([1.0, 2.0, 3.0])
WEIGHT = Tensor(np.array([1.0, -1.0, 0.5]))


class Cfg:
    """A plain object holding settings."""

    def __init__(self, scale):
        self.scale = scale


CFG = Cfg(2.0)


def _scaled(t):
    return t * SCALE  # a helper reading a global


def check(j, f, *args):
    """The jitted ``j`` gives what ``f`` gives eagerly, value and gradient (and the gradient matches central
    differences)."""
    np.testing.assert_allclose(j(*args).asnumpy(), f(*args).asnumpy(), rtol=1e-14)
    want = rt.grad(lambda *a: mint.sum(f(*a)))(*args)
    got = rt.grad(lambda *a: mint.sum(j(*a)))(*args)
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-14)


@pytest.fixture
def restore():
    global SCALE, TABLE, WEIGHT
    saved = SCALE, TABLE.copy(), WEIGHT, CFG.scale
    yield
    SCALE, TABLE, WEIGHT = saved[0], saved[1], saved[2]
    CFG.scale = saved[3]


@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.build)])  # O1 compiles
def test_a_rebound_global_float_is_seen_and_equal_values_reuse_the_trace(restore, level):
    global SCALE

    def f(t):
        return mint.sin(t) * SCALE

    j = jit(f, jit_level=level)
    x = Tensor(RNG.standard_normal(3))
    check(j, f, x)
    SCALE = -3.5
    check(j, f, x)
    assert j.traces == 2
    SCALE = 2.0  # the first trace's value again: its graph, no new trace
    check(j, f, x)
    SCALE = float("2")
    check(j, f, x)
    assert j.traces == 2
    gradcheck(j, [x])


def test_a_global_read_by_a_helper_function_is_seen(restore):
    global SCALE
    j = jit(lambda t: _scaled(t) + 1.0)
    x = Tensor(RNG.standard_normal(3))
    np.testing.assert_allclose(j(x).asnumpy(), x.asnumpy() * 2.0 + 1.0, rtol=1e-15)
    SCALE = 10.0
    np.testing.assert_allclose(j(x).asnumpy(), x.asnumpy() * 10.0 + 1.0, rtol=1e-15)


def test_a_closure_variable_changed_is_seen():
    def make():
        s = 2.0

        def f(t):
            return t * s

        def set_s(v):
            nonlocal s
            s = v
        return f, set_s

    f, set_s = make()
    j = jit(f)
    x = Tensor(RNG.standard_normal(3))
    check(j, f, x)
    set_s(-7.0)
    check(j, f, x)
    set_s(2)  # an int for a float: another value, another trace
    check(j, f, x)
    assert j.traces == 3


def test_class_attributes_read_through_self_or_the_class_are_seen():
    class Model:
        k = 2.0

        @jit
        def through_self(self, t):
            return t * self.k

    by_class = jit(lambda t: t * Model.k)
    m, x = Model(), Tensor(RNG.standard_normal(3))
    np.testing.assert_allclose(m.through_self(x).asnumpy(), x.asnumpy() * 2.0, rtol=1e-15)
    np.testing.assert_allclose(by_class(x).asnumpy(), x.asnumpy() * 2.0, rtol=1e-15)
    Model.k = 5.0
    np.testing.assert_allclose(m.through_self(x).asnumpy(), x.asnumpy() * 5.0, rtol=1e-15)
    np.testing.assert_allclose(by_class(x).asnumpy(), x.asnumpy() * 5.0, rtol=1e-15)
    m.k = -1.0  # the instance's own value now shadows the class's
    np.testing.assert_allclose(m.through_self(x).asnumpy(), -x.asnumpy(), rtol=1e-15)


def test_a_field_of_a_global_object_is_seen(restore):
    f = jit(lambda t: t * CFG.scale)
    x = Tensor(RNG.standard_normal(3))
    np.testing.assert_allclose(f(x).asnumpy(), x.asnumpy() * 2.0, rtol=1e-15)
    CFG.scale = 0.25
    np.testing.assert_allclose(f(x).asnumpy(), x.asnumpy() * 0.25, rtol=1e-15)


def test_a_global_numpy_array_changed_in_place_is_seen(restore):
    def f(t):
        return t + Tensor(TABLE.copy())

    j = jit(f)
    x = Tensor(RNG.standard_normal(3))
    check(j, f, x)
    TABLE[1] = 100.0
    check(j, f, x)
    assert j.traces == 2


def test_a_rebound_global_tensor_is_seen_and_one_written_in_place_needs_no_new_trace(restore):
    global WEIGHT

    def f(t):
        return mint.exp(t * WEIGHT)

    j = jit(f)
    x = Tensor(RNG.standard_normal(3))
    check(j, f, x)
    WEIGHT = Tensor(np.array([3.0, 0.0, -2.0]))
    check(j, f, x)
    assert j.traces == 2
    with rt.no_grad():
        WEIGHT *= 0.5  # the graph holds the tensor by reference: it sees the write
    check(j, f, x)
    assert j.traces == 2


def test_a_value_changed_by_every_call_runs_eagerly_after_eight_traces():
    state = {"k": 0.0}

    def f(t):
        return t * state["k"]

    j = jit(f)
    x = Tensor(np.array([1.0, 2.0]))
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            state["k"] = float(i)
            got.append(j(x).asnumpy()[1])
    assert got == [2.0 * i for i in range(12)]
    assert j.traces == 8
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and msgs[0].startswith(
        "jit(test_a_value_changed_by_every_call_runs_eagerly_after_eight_traces.<locals>.f): not cached: what "
        "it reads (closure variable 'state' of ") and "changed after each of 8 traces of this signature" in msgs[0]


def test_a_list_the_function_appends_to_is_not_read_as_a_change():
    calls = []

    def f(t):
        calls.append(1)  # runs when traced only
        return t * 2.0

    j = jit(f)
    x = Tensor(np.array([1.0]))
    for _ in range(3):
        j(x)
    assert len(calls) == 1 and j.traces == 1


# ---- GRAPH_MODE ---------------------------------------------------------------------------------

class Scale(nn.Cell):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def construct(self, x):
        return x * self.s


class InList(nn.Cell):
    """Sub-cells in a plain list and a plain dict attribute (not registered as cells)."""

    def __init__(self):
        super().__init__()
        self.layers = [Scale(2.0), Scale(3.0)]
        self.named = {"last": Scale(0.5)}
        self.w = Parameter(Tensor(RNG.standard_normal(3)), name="w")

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return mint.sum(mint.tanh(self.named["last"](x * self.w)))


class WithConfig(nn.Cell):
    """A field of a plain object attribute, and a global read by a helper."""

    def __init__(self):
        super().__init__()
        self.cfg = Cfg(1.5)
        self.w = Parameter(Tensor(RNG.standard_normal(3)), name="w")

    def construct(self, x):
        return mint.sum(mint.sin(_scaled(x) * self.w) * self.cfg.scale)


def grads(net, x, mode):
    rt.set_context(mode=mode)
    try:
        v, (gx, gw) = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    return [v.asnumpy(), gx.asnumpy()] + [g.asnumpy() for g in gw]


def assert_graph_matches_pynative(net, x):
    want = grads(net, x, rt.PYNATIVE_MODE)
    for _ in range(2):
        for got, exp in zip(grads(net, x, rt.GRAPH_MODE), want):
            np.testing.assert_allclose(got, exp, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("change", ["list_item_attribute", "dict_item_attribute", "list_item_replaced"])
def test_graph_mode_sees_a_cell_inside_a_plain_container_attribute(change):
    net, x = InList(), Tensor(RNG.standard_normal(3))
    assert_graph_matches_pynative(net, x)
    traces = net._graph_jit.traces
    if change == "list_item_attribute":
        net.layers[1].s = -4.0
    elif change == "dict_item_attribute":
        net.named["last"].s = 3.0
    else:
        net.layers[0] = Scale(7.0)
    assert_graph_matches_pynative(net, x)
    assert net._graph_jit.traces == traces + 1


@pytest.mark.parametrize("change", ["object_field", "global_in_helper"])
def test_graph_mode_sees_a_field_of_a_plain_object_and_a_global_a_helper_reads(restore, change):
    global SCALE
    net, x = WithConfig(), Tensor(RNG.standard_normal(3))
    assert_graph_matches_pynative(net, x)
    if change == "object_field":
        net.cfg.scale = -2.0
    else:
        SCALE = 0.75
    assert_graph_matches_pynative(net, x)
    assert net._graph_jit.traces == 2


class DenseList(nn.Cell):
    """A runtime Cell (nn.Dense) in a plain list attribute."""

    def __init__(self):
        super().__init__()
        self.layers = [nn.Dense(3, 2, has_bias=False)]

    def construct(self, x):
        return mint.sum(mint.tanh(self.layers[0](x)))


def test_graph_mode_sees_a_runtime_cell_in_a_plain_list_get_a_new_parameter():
    net, x = DenseList(), Tensor(RNG.standard_normal((2, 3)).astype(np.float32))
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        net(x)
        net.layers[0].weight = Parameter(Tensor(np.full((2, 3), 0.5, np.float32)), name="weight")
        got = net(x).asnumpy()
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    np.testing.assert_allclose(got, net(x).asnumpy(), rtol=1e-6)
    assert net._graph_jit.traces == 2


def test_a_global_runtime_cell_given_a_new_parameter_is_seen():
    dense = nn.Dense(3, 2, has_bias=False)
    j = jit(lambda t: dense(t) * 1.0)
    x = Tensor(RNG.standard_normal((2, 3)).astype(np.float32))
    j(x)
    dense.weight = Parameter(Tensor(np.full((2, 3), 2.0, np.float32)), name="weight")
    np.testing.assert_allclose(j(x).asnumpy(), dense(x).asnumpy(), rtol=1e-6)
    assert j.traces == 2


def test_an_attribute_read_by_getattr_with_a_string_is_seen():
    cfg = Cfg(3.0)
    j = jit(lambda t: t * getattr(cfg, "scale"))
    x = Tensor(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(j(x).asnumpy(), [3.0, 6.0])
    cfg.scale = -1.0
    np.testing.assert_array_equal(j(x).asnumpy(), [-1.0, -2.0])


# ---- reads a replay would get wrong (an attack's finds; each fails on b5d0fc0) ----------------------------

def test_a_gradient_read_inside_is_the_one_of_the_call():
    # a jitted optimizer step reading p.grad: every replay subtracted the first step's gradient
    def step(p, lr):
        return p - lr * p.grad

    def train(update):
        p = Parameter(Tensor(np.array([1.0, -2.0])))
        got = []
        for _ in range(3):
            p.grad = None
            mint.sum(p * p * p).backward()  # 3 p^2: a new tensor each step
            with rt.no_grad():
                p.set_data(update(p, 0.1))
            got.append(p.asnumpy().copy())
        return got

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        jitted = train(jit(step))
    np.testing.assert_allclose(jitted, train(step), rtol=1e-12)


class RunningMean(nn.Cell):
    def __init__(self):
        super().__init__()
        self.running = Tensor(np.zeros(2))

    def construct(self, x):
        self.running = self.running * 0.5 + x * 0.5
        return self.running * 1.0


STATE = Tensor(np.zeros(1))


def _accumulate(x):
    global STATE
    STATE = STATE + x
    return STATE * 1.0


def test_a_function_rebinding_what_it_reads_runs_eagerly_with_a_warning():
    # running statistics and a global accumulator: replays read the tensor from before the trace and
    # never rebound it (the state stayed at the trace's value)
    eager, cell = RunningMean(), RunningMean()
    j = jit(cell.construct)
    xs = [Tensor(np.array([float(i), 1.0])) for i in range(4)]
    with pytest.warns(RuntimeWarning, match=r"^jit\(RunningMean\.construct\): not cached: it changes what it reads "
                                            r"\(attribute 'running' of a RunningMean\) on each call, which a replay "
                                            r"of its graph would not; this signature runs eagerly"):
        got = [j(x).asnumpy() for x in xs]
    np.testing.assert_allclose(got, [eager(x).asnumpy() for x in xs], rtol=1e-12)
    np.testing.assert_allclose(cell.running.asnumpy(), eager.running.asnumpy(), rtol=1e-12)
    ja = jit(_accumulate)
    with pytest.warns(RuntimeWarning, match=r"it changes what it reads \(global 'STATE' of _accumulate\)"):
        got = [ja(Tensor(np.ones(1))).asnumpy()[0] for _ in range(4)]
    assert got == [1.0, 2.0, 3.0, 4.0] and STATE.asnumpy()[0] == 4.0


def test_a_branch_on_the_grad_mode_is_guarded():
    def f(x):
        return x * 2.0 if rt.is_grad_enabled() else x * 3.0

    j = jit(f)
    x = Tensor(np.array([1.0]), requires_grad=True)
    assert j(x).asnumpy()[0] == 2.0
    with rt.no_grad():
        assert j(x).asnumpy()[0] == 3.0  # the trace's 2.0 before
        assert j(x).asnumpy()[0] == 3.0
    assert j(x).asnumpy()[0] == 2.0 and j.traces == 2
    # a function that does not ask keeps one trace for both modes
    k = jit(lambda x: x * 2.0)
    k(x)
    with rt.no_grad():
        k(x)
    assert k.traces == 1


class _Lazy(nn.Cell):
    """Set-up on the first call: self.scale made when None."""

    def __init__(self):
        super().__init__()
        self.scale = None

    def construct(self, x):
        if self.scale is None:
            self.scale = Tensor(np.array([2.0, 3.0]))
        return x * self.scale


def test_a_first_call_that_sets_up_state_is_traced_again_and_then_replayed():
    # lazy set-up (self.scale = ... when None) rebinds on the first call only: not sent to eager for it
    cell = _Lazy()
    j = jit(cell.construct)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = [j(Tensor(np.array([float(i), 1.0]))).asnumpy() for i in range(4)]
    np.testing.assert_allclose(got, [[0.0, 3.0], [2.0, 3.0], [4.0, 3.0], [6.0, 3.0]])
    assert j.traces == 1  # the first call's trace is not kept; the second's is, and replayed


def test_the_grad_of_a_new_argument_each_call_is_read_eagerly_with_a_warning():
    # the guard read the trace's own argument's .grad, which never changed: a new Parameter per call (or in
    # a list) got the first call's gradient (an attack on fdce2ab's guard)
    def f(ps):
        return [q - 0.1 * q.grad for q in ps]

    j = jit(f)
    for i in range(3):
        p = Parameter(Tensor(np.array([1.0, 2.0]) * (i + 1)))
        mint.sum(p * p).backward()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = j([p])[0].asnumpy()
        np.testing.assert_allclose(got, p.asnumpy() * 0.8, rtol=1e-12)
        if i == 0:
            assert [str(x.message) for x in w] == [
                "jit(test_the_grad_of_a_new_argument_each_call_is_read_eagerly_with_a_warning.<locals>.f): not cached: "
                "it reads the .grad of an argument, which a graph would hold as the first call's; this signature "
                "runs eagerly, op by op, with the same results and gradients as without jit"]


def test_the_grad_of_a_held_parameter_is_guarded_wherever_it_is_read_from():
    # through a runtime Dense in a user Cell (trainable_params(), an optimizer's list): step 1's gradient was
    # replayed on every later step
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(2, 1)

        def construct(self, x):
            return self.dense(x)

    def run(update):
        rt.set_seed(3)
        net = Net()
        x = Tensor(np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32))
        got = []
        for _ in range(3):
            for p in net.trainable_params():
                p.grad = None
            mint.sum(net(x) ** 2).backward()
            news = update(net)
            with rt.no_grad():
                for p, v in zip(net.trainable_params(), news):
                    p.set_data(v)
            got.append([p.asnumpy().copy() for p in net.trainable_params()])
        return got

    def step(net):
        return [p - 0.05 * p.grad for p in net.trainable_params()]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        jitted = run(jit(step))
    for a, b in zip(jitted, run(step)):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6)


def test_state_the_trace_creates_or_changes_inside_a_container_is_kept_as_eager_would():
    # an attribute that did not exist before the first call, and a dict of tensors updated in place: a
    # replay never wrote them
    class Logger(nn.Cell):
        def construct(self, x):
            y = x * 3.0
            self.last = y
            return y

    class DictState(nn.Cell):
        def __init__(self):
            super().__init__()
            self.state = {"m": Tensor(np.zeros(2))}

        def construct(self, x):
            self.state["m"] = self.state["m"] * 0.5 + x * 0.5
            return self.state["m"] * 1.0

    xs = [Tensor(np.array([float(i), 1.0])) for i in range(4)]
    for make in (Logger, DictState):
        eager, cell = make(), make()
        j = jit(cell.construct)
        with pytest.warns(RuntimeWarning, match=r"it changes what it reads \(attribute '(last|state)' of a"):
            got = [j(x).asnumpy() for x in xs]
        np.testing.assert_allclose(got, [eager(x).asnumpy() for x in xs], rtol=1e-12)
        state = cell.last if make is Logger else cell.state["m"]
        want = eager.last if make is Logger else eager.state["m"]
        np.testing.assert_allclose(state.asnumpy(), want.asnumpy(), rtol=1e-12)


def test_a_layer_whose_training_calls_rebind_state_still_gets_a_graph_in_eval():
    # training calls rebind the running mean (so they run eagerly); eval reads it: once sent to eager, the
    # whole signature stayed eager, eval too (an attack's find; fails on 15a07a7)
    class BN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.mean = Tensor(np.zeros(2))

        def construct(self, x):
            if self.training:
                m = mint.mean(x, dim=0)
                self.mean = self.mean * 0.9 + m * 0.1
                return x - m
            return x - self.mean

    def run(call, cell):
        got = []
        for train, n in ((True, 3), (False, 3), (True, 2), (False, 2)):
            cell.set_train(train)
            got += [call(Tensor(np.array([[1.0, 1.0], [2.0, 3.0 + i]]))).asnumpy() for i in range(n)]
        return got

    eager, cell = BN(), BN()
    j = jit(cell.construct)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = run(j, cell)
    np.testing.assert_allclose(got, run(eager, eager), rtol=1e-12)
    np.testing.assert_allclose(cell.mean.asnumpy(), eager.mean.asnumpy(), rtol=1e-12)
    assert j.traces == 2  # eval gets a graph (again after training rebound the mean it reads); training runs eagerly


# ---- a review of the above (each fails on b17ecee) ------------------------------------------------------------

class _Block(nn.Cell):
    def __init__(self, i):
        super().__init__()
        self.scale = float(i % 3 + 1) * 0.1
        self.bias = 0.01 * i

    def construct(self, x):
        y = mint.relu(x * self.scale + self.bias)
        return mint.add(y.reshape(x.shape).astype(x.dtype), x)


class _Deep(nn.Cell):
    """Many user blocks, then a running mean: the reads before the trace were cut at the guard limit."""

    def __init__(self, n):
        super().__init__()
        self.blocks = [_Block(i) for i in range(n)]
        self.norm = RunningMean()

    def construct(self, x):
        for b in self.blocks:
            x = b(x)
        return self.norm(x)


class _Nested(nn.Cell):
    """Optimizer-like state: a tensor two containers down, updated in place."""

    def __init__(self):
        super().__init__()
        self.state = {"w": {"m": Tensor(np.zeros(2))}}

    def construct(self, x):
        s = self.state["w"]
        s["m"] = s["m"] * 0.9 + x * 0.1
        return x + s["m"]


@pytest.mark.parametrize("make", [lambda: _Deep(60), _Nested], ids=["60 blocks", "nested dict"])
def test_rebound_state_deep_in_a_model_or_a_container_is_seen(make):
    eager, cell = make(), make()
    j = jit(cell.construct)
    xs = [Tensor(np.array([float(i), 1.0])) for i in range(5)]
    with pytest.warns(RuntimeWarning, match=r"it changes what it reads"):
        got = [j(x).asnumpy() for x in xs]
    np.testing.assert_allclose(got, [eager(x).asnumpy() for x in xs], rtol=1e-12)


P_SET = Parameter(Tensor(np.array([1.0, -2.0])))


def test_a_grad_the_function_reads_and_sets_is_not_replayed_from_the_trace():
    # p.grad = p.grad * 0.5, then used: the guard checked the .grad after the trace (the new one), the graph
    # held the one read during it
    def step(lr):
        P_SET.grad = P_SET.grad * 0.5
        return P_SET - lr * P_SET.grad

    def train(update):
        P_SET.set_data(Tensor(np.array([1.0, -2.0])))
        P_SET.grad = None
        got = []
        for _ in range(4):
            mint.sum(P_SET * P_SET).backward()
            with rt.no_grad():
                got.append((update(0.1).asnumpy().copy(), P_SET.grad.asnumpy().copy()))
        return got

    with pytest.warns(RuntimeWarning, match=r"it changes what it reads \(the \.grad of a Parameter of shape \(2,\)\)"):
        jitted = train(jit(step))
    for (x, gx), (y, gy) in zip(jitted, train(step)):
        np.testing.assert_allclose(x, y, rtol=1e-12)
        np.testing.assert_allclose(gx, gy, rtol=1e-12)


def test_graph_of_a_function_whose_first_call_sets_up_state_is_given():
    j = jit(_Lazy().construct)
    assert [n.op for n in j.graph(Tensor(np.array([1.0, 1.0]))).nodes] == ["mul"]  # a RuntimeError before


# ---- the last attack (each fails on 886c545; wrong at b578f51 too) -----------------------------------------

class _Holder:
    pass


class _Ema(nn.Cell):
    def __init__(self):
        super().__init__()
        self.h = _Holder()
        self.h.v = Tensor(np.zeros(2))

    def construct(self, x):
        self.h.v = self.h.v * 0.5 + x
        return self.h.v * 1.0


class _Smooth:
    """The mean of the last three sums, kept in a deque."""

    def __init__(self):
        import collections
        self.hist = collections.deque(maxlen=3)

    def __call__(self, x):
        self.hist.append(mint.sum(x * x))
        tot = self.hist[0]
        for h in list(self.hist)[1:]:
            tot = tot + h
        return tot / len(self.hist)


class _Boxed:
    """A dict holding an object holding the state, the object replaced each call."""

    def __init__(self):
        self.cache = {"s": _Holder()}
        self.cache["s"].v = Tensor(np.zeros(2))

    def __call__(self, x):
        box = _Holder()
        box.v = self.cache["s"].v * 0.5 + x
        self.cache["s"] = box
        return box.v * 1.0


@pytest.mark.parametrize("make", [lambda: nn.SequentialCell([_Ema()]), _Smooth, _Boxed],
                         ids=["a user cell in a SequentialCell", "a deque", "an object in a dict"])
def test_state_in_runtime_containers_deques_and_boxes_is_seen(make):
    eager, held = make(), make()
    j = jit(lambda x: held(x))
    xs = [Tensor(np.array([float(i), 1.0])) for i in range(5)]
    with pytest.warns(RuntimeWarning, match=r"it changes what it reads"):
        got = [j(x).asnumpy() for x in xs]
    np.testing.assert_allclose(got, [eager(x).asnumpy() for x in xs], rtol=1e-12)


P_ASSIGNED = Parameter(Tensor(np.array([1.0, 2.0])))


def test_a_grad_set_without_being_read_is_a_write_a_replay_would_not_do():
    def assign(g, scale):
        P_ASSIGNED.grad = g / scale
        return mint.sum(g)

    def run(f):
        P_ASSIGNED.grad = None
        got = []
        for i in range(4):
            f(Tensor(np.array([i + 1.0, 1.0])), 2.0)
            got.append(P_ASSIGNED.grad.asnumpy().copy())
        return got

    with pytest.warns(RuntimeWarning, match=r"it changes what it reads \(the \.grad of a Parameter of shape \(2,\)\)"):
        jitted = run(jit(assign))
    np.testing.assert_allclose(jitted, run(assign), rtol=1e-12)

"""Optimizers: each update against a numpy implementation of its formula for a few steps,
learning-rate schedules, MindSpore's training idiom on regression and classification, bad inputs."""
import math

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn

RNG = np.random.default_rng(5)
STEPS = 4


def run(opt_cls, **kw):
    """Parameters after STEPS updates by ``opt_cls`` with fixed gradients, and those inputs."""
    w0 = [RNG.standard_normal((3, 2)), RNG.standard_normal(2)]
    grads = [[RNG.standard_normal(w.shape) for w in w0] for _ in range(STEPS)]
    params = [Parameter(w.copy(), name=f"p{i}") for i, w in enumerate(w0)]
    opt = opt_cls(params, **kw)
    for g in grads:
        assert opt(tuple(Tensor(a) for a in g)) is True
    return [p.asnumpy() for p in params], w0, grads, params


def ref_sgd(w0, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    ws, bufs = [w.copy() for w in w0], [None] * len(w0)
    for gs in grads:
        for i, g in enumerate(gs):
            g = g + weight_decay * ws[i]
            if momentum:
                bufs[i] = g.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            ws[i] = ws[i] - lr * g
    return ws


def ref_momentum(w0, grads, lr, momentum, weight_decay=0.0, nesterov=False):
    ws, vs = [w.copy() for w in w0], [np.zeros_like(w) for w in w0]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g + weight_decay * ws[i]
            vs[i] = momentum * vs[i] + g
            ws[i] = ws[i] - lr * (g + momentum * vs[i] if nesterov else vs[i])
    return ws


def ref_adam(w0, grads, lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, nesterov=False):
    ws = [w.copy() for w in w0]
    ms, vs = [np.zeros_like(w) for w in w0], [np.zeros_like(w) for w in w0]
    for t, gs in enumerate(grads, 1):
        for i, g in enumerate(gs):
            g = g + weight_decay * ws[i]
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            num = b1 * ms[i] + (1 - b1) * g if nesterov else ms[i]
            ws[i] = ws[i] - lr_t * num / (np.sqrt(vs[i]) + eps)
    return ws


def ref_adamw(w0, grads, lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0):
    ws = [w.copy() for w in w0]
    ms, vs = [np.zeros_like(w) for w in w0], [np.zeros_like(w) for w in w0]
    for gs in grads:
        for i, g in enumerate(gs):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            ws[i] = ws[i] - lr * (ms[i] / (np.sqrt(vs[i]) + eps) + weight_decay * ws[i])
    return ws


CASES = [
    ("sgd", nn.SGD, dict(learning_rate=0.1), lambda w, g: ref_sgd(w, g, 0.1)),
    ("sgd_momentum_wd", nn.SGD, dict(learning_rate=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
     lambda w, g: ref_sgd(w, g, 0.05, 0.9, 0.1, 0.01)),
    ("sgd_nesterov", nn.SGD, dict(learning_rate=0.05, momentum=0.8, nesterov=True),
     lambda w, g: ref_sgd(w, g, 0.05, 0.8, nesterov=True)),
    ("momentum", nn.Momentum, dict(learning_rate=0.1, momentum=0.9), lambda w, g: ref_momentum(w, g, 0.1, 0.9)),
    ("momentum_nesterov_wd", nn.Momentum, dict(learning_rate=0.1, momentum=0.9, weight_decay=0.1,
                                               use_nesterov=True),
     lambda w, g: ref_momentum(w, g, 0.1, 0.9, 0.1, True)),
    ("adam", nn.Adam, dict(learning_rate=0.01), lambda w, g: ref_adam(w, g, 0.01)),
    ("adam_wd_nesterov", nn.Adam, dict(learning_rate=0.02, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                                       use_nesterov=True),
     lambda w, g: ref_adam(w, g, 0.02, 0.8, 0.99, 1e-6, 0.1, True)),
    ("adamw", nn.AdamWeightDecay, dict(learning_rate=0.01, weight_decay=0.05),
     lambda w, g: ref_adamw(w, g, 0.01, weight_decay=0.05)),
]


@pytest.mark.parametrize("name,cls,kw,ref", CASES, ids=[c[0] for c in CASES])
def test_update_matches_the_numpy_formula(name, cls, kw, ref):
    got, w0, grads, params = run(cls, **kw)
    for a, b in zip(got, ref(w0, grads)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert all(p._version == STEPS for p in params)  # in place: one version per step


def test_learning_rate_schedules():
    got, w0, grads, _ = run(nn.SGD, learning_rate=[0.1, 0.2])  # the last one holds after the end
    ws = [w.copy() for w in w0]
    for lr, gs in zip([0.1, 0.2, 0.2, 0.2], grads):
        ws = [w - lr * g for w, g in zip(ws, gs)]
    for a, b in zip(got, ws):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    opt = nn.Adam([Parameter(np.zeros(2))], learning_rate=lambda step: 0.5 ** step)
    assert opt.get_lr() == 1.0
    opt((Tensor(np.ones(2)),))
    assert opt.get_lr() == 0.5 and opt.global_step == 1


class MLP(nn.Cell):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(n_in, 16, activation="tanh"), nn.Dense(16, n_out)])

    def construct(self, x):
        return self.body(x)


def train(net, loss_fn, opt, x, y, steps):
    def forward_fn(data, label):
        logits = net(data)
        return loss_fn(logits, label), logits

    grad_fn = rt.value_and_grad(forward_fn, None, opt.parameters, has_aux=True)  # MindSpore's idiom
    losses = []
    for _ in range(steps):
        (loss, logits), grads = grad_fn(x, y)
        opt(grads)
        losses.append(loss.item())
    return losses, logits


def test_regression_and_classification_loops_reduce_the_loss():
    rt.set_seed(0)
    x = RNG.standard_normal((64, 3)).astype(np.float32)
    y = (np.sin(x.sum(1, keepdims=True))).astype(np.float32)
    net = MLP(3, 1)
    params = net.trainable_params()
    losses, _ = train(net, nn.MSELoss(), nn.Adam(params, 0.02), Tensor(x), Tensor(y), 60)
    assert losses[-1] < 0.2 * losses[0]
    assert net.trainable_params() == params and all(isinstance(p, Parameter) for p in params)

    labels = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    net = MLP(3, 3)
    losses, logits = train(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                           Tensor(x), Tensor(labels), 60)
    assert losses[-1] < 0.5 * losses[0]
    accuracy = (rt.ops.argmax(logits, 1).asnumpy() == labels).mean()
    assert accuracy > 0.8


def test_bad_optimizer_inputs():
    p = Parameter(np.zeros((2, 2), np.float32), name="w")
    with pytest.raises(ValueError, match="the parameter list is empty"):
        nn.SGD([])
    with pytest.raises(TypeError, match="parameters must be Parameters, got Tensor"):
        nn.Adam([Tensor(np.zeros(2))])
    with pytest.raises(TypeError, match="parameters must be a list of Parameters"):
        nn.Adam(p)
    with pytest.raises(ValueError, match="a parameter is listed twice"):
        nn.SGD([p, p])
    with pytest.raises(ValueError, match="learning_rate must be >= 0, got -0.1"):
        nn.SGD([p], -0.1)
    with pytest.raises(ValueError, match=r"beta1 must be in \[0, 1.0\), got 1.0"):
        nn.Adam([p], beta1=1.0)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0"):
        nn.SGD([p], nesterov=True)
    with pytest.raises(TypeError, match="only floating parameters train"):
        nn.SGD([Parameter(np.zeros(2, np.int32), requires_grad=False)])
    opt = nn.SGD([p])
    with pytest.raises(ValueError, match="got 2 gradients for 1 parameters"):
        opt((Tensor(np.zeros((2, 2))), Tensor(np.zeros((2, 2)))))
    with pytest.raises(TypeError) as info:  # it said: "has shape [], the parameter [2, 2]"
        opt([None])
    assert str(info.value) == ("SGD: the gradient for parameter 'w' is None; pass a gradient for every parameter "
                               "(value_and_grad gives zeros for one the loss does not use)")
    assert p.asnumpy().tolist() == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match=r"the gradient for parameter 'w' has shape \[3\], the parameter \[2, 2\]"):
        opt((Tensor(np.zeros(3)),))
    assert p.tolist() == [[0, 0], [0, 0]] and opt.global_step == 0


def test_adam_moment1_and_moment2_are_the_moments_of_its_formula():
    b1, b2 = 0.8, 0.95
    w0 = RNG.standard_normal((3, 2))
    grads = [RNG.standard_normal((3, 2)) for _ in range(STEPS)]
    opt = nn.Adam([Parameter(w0.copy())], learning_rate=0.01, beta1=b1, beta2=b2)
    m, v = np.zeros_like(w0), np.zeros_like(w0)
    for g in grads:
        opt((Tensor(g),))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
    np.testing.assert_allclose(opt.moment1[0], m, rtol=1e-12)
    np.testing.assert_allclose(opt.moment2[0], v, rtol=1e-12)


@pytest.mark.parametrize("opt_cls", [nn.Momentum, nn.Adam, nn.SGD])
def test_weight_decay_is_not_divided_by_the_loss_scale_as_in_mindspore(opt_cls):
    """MindSpore's Optimizer keeps weight_decay * loss_scale, decays, then divides by loss_scale:
    (g + wd ls w) / ls = g / ls + wd w (SGD's kernel: g / ls, then + wd w). The decay must not shrink
    with the loss scale (it did: (g + wd w) / ls)."""
    kw = dict(momentum=0.9) if opt_cls is nn.Momentum else {}
    w = Parameter(np.array([1.0]), name="w")
    scaled = opt_cls([w], learning_rate=0.1, weight_decay=0.1, loss_scale=4.0, **kw)
    scaled((Tensor(np.array([4.0])),))
    w_ref = Parameter(np.array([1.0]), name="w_ref")
    plain = opt_cls([w_ref], learning_rate=0.1, **kw)
    plain((Tensor(np.array([4.0 / 4.0 + 0.1 * 1.0])),))
    np.testing.assert_allclose(w.asnumpy(), w_ref.asnumpy(), rtol=1e-15)
    if opt_cls is not nn.Adam:  # v = 1.1, w = 1 - 0.1 * 1.1
        np.testing.assert_allclose(w.asnumpy(), [0.89], rtol=1e-15)


@pytest.mark.parametrize("opt_cls", [nn.Momentum, nn.Adam, nn.AdamWeightDecay])
def test_weight_decay_skips_beta_and_gamma_parameters_as_in_mindspore(opt_cls):
    """Ungrouped, MindSpore decays only parameters without 'beta' or 'gamma' in their names (a norm
    layer's shift and scale); the others take the plain update."""
    kw = dict(momentum=0.9) if opt_cls is nn.Momentum else {}
    names = ["fc.weight", "norm.gamma", "norm.beta", "fc.bias"]
    params = [Parameter(np.array([1.0, -2.0]), name=n) for n in names]
    opt = opt_cls(params, learning_rate=0.1, weight_decay=0.5, **kw)
    assert opt.decay_flags == (True, False, False, True)
    refs = [Parameter(np.array([1.0, -2.0]), name=n) for n in names]
    decayed = opt_cls(refs[:1] + refs[3:], learning_rate=0.1, weight_decay=0.5, **kw)
    plain = opt_cls(refs[1:3], learning_rate=0.1, **kw)
    for g in (np.array([0.3, 0.1]), np.array([-0.2, 0.4])):
        opt([Tensor(g)] * 4)
        decayed([Tensor(g)] * 2)
        plain([Tensor(g)] * 2)
    for p, r in zip(params, refs):
        np.testing.assert_allclose(p.asnumpy(), r.asnumpy(), rtol=1e-15)
    assert not np.allclose(params[0].asnumpy(), params[1].asnumpy())  # the decay did something


def test_sgd_takes_mindspores_loss_scale():
    w = Parameter(np.array([1.0, 2.0]), name="w")
    nn.SGD([w], learning_rate=0.5, momentum=0.9, loss_scale=8.0)((Tensor(np.array([8.0, -16.0])),))
    np.testing.assert_allclose(w.asnumpy(), [0.5, 3.0], rtol=1e-15)
    for bad in (0.0, -1.0, "2"):
        with pytest.raises(ValueError, match=f"SGD: loss_scale must be a positive number, got {bad!r}"):
            nn.SGD([w], loss_scale=bad)


@pytest.mark.parametrize("g", [300.0, -300.0, 1e-4])
def test_adam_weight_decay_on_float16_parameters_keeps_float32_moments(g):
    """g * g overflowed float16 from |g| = 256: the second moment became inf and that element never moved
    again (m / inf is 0, b2 * inf stays inf), silently. Now its moments are float32, as Adam's; a checkpoint
    round trip keeps them float32."""
    w16 = Parameter(np.ones(3, np.float16), name="w16")
    w64 = Parameter(np.ones(3), name="w64")
    o16 = nn.AdamWeightDecay([w16], learning_rate=0.01, weight_decay=0.01)
    o64 = nn.AdamWeightDecay([w64], learning_rate=0.01, weight_decay=0.01)
    for _ in range(20):
        o16((Tensor(np.full(3, g, np.float16)),))
        o64((Tensor(np.full(3, np.float16(g), np.float64)),))
    assert w16.dtype == rt.float16 and o16.moments2[0].dtype == np.float32
    assert np.all(np.isfinite(o16.moments2[0]))
    np.testing.assert_allclose(w16.asnumpy().astype(np.float64), w64.asnumpy(), atol=0.01)
    assert abs(w16.asnumpy()[0] - 1.0) > 0.1  # it moved



def test_adam_weight_decay_float16_moments_resume_from_a_checkpoint_as_float32(tmp_path):
    w = Parameter(np.ones(3, np.float16), name="w")
    opt = nn.AdamWeightDecay([w], learning_rate=0.01)
    opt((Tensor(np.full(3, 300.0, np.float16)),))
    rt.save_checkpoint(opt, tmp_path / "opt.safetensors")
    w2 = Parameter(np.ones(3, np.float16), name="w")
    opt2 = nn.AdamWeightDecay([w2], learning_rate=0.01)
    assert rt.load_param_into_net(opt2, rt.load_checkpoint(tmp_path / "opt.safetensors")) == ([], [])
    assert opt2.moments2[0].dtype == np.float32
    np.testing.assert_array_equal(opt2.moments2[0], opt.moments2[0])


@pytest.mark.parametrize("g", [20.0, 1e-4])
def test_adam_on_float16_parameters_keeps_float32_moments(g):
    """The second moment is kept scaled by 1/(1-beta2) (1000x): in float16 it overflowed to inf after
    ~160 steps of g = 20 (the parameter stopped moving), and g^2 of a small g underflowed to 0, so a
    step was m / (eps / sqrt(1 - beta2)) (the parameter jumped by thousands)."""
    w16 = Parameter(np.ones(3, np.float16), name="w16")
    w64 = Parameter(np.ones(3), name="w64")
    o16, o64 = nn.Adam([w16], learning_rate=0.01), nn.Adam([w64], learning_rate=0.01)
    for _ in range(300):
        o16((Tensor(np.full(3, g, np.float16)),))
        o64((Tensor(np.full(3, np.float16(g), np.float64)),))
    assert w16.dtype == rt.float16 and o16.moment2[0].dtype == np.float32
    assert np.all(np.isfinite(o16.moment2[0]))
    # float16 weights round each step of 0.01 (their spacing near 2 is 0.002): close, not equal
    np.testing.assert_allclose(w16.asnumpy().astype(np.float64), w64.asnumpy(), atol=0.1)


def test_sgd_momentum_on_bfloat16_resumes_from_a_checkpoint(tmp_path):
    """With weight decay or a loss scale, bfloat16 arithmetic made the first step's buffer float32, and a
    fresh optimizer's (bfloat16) refused it on load: "'accum.w' is float32 in the checkpoint"."""
    bf = rt.bfloat16.np
    opt = nn.SGD([Parameter(np.ones(3, bf), name="w")], 0.1, momentum=0.9, weight_decay=0.01)
    opt([Tensor(np.full(3, 0.5, bf))])
    assert opt.accum[0].dtype == bf
    rt.save_checkpoint(opt, tmp_path / "o.safetensors")
    fresh = nn.SGD([Parameter(np.ones(3, bf), name="w")], 0.1, momentum=0.9, weight_decay=0.01)
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "o.safetensors")) == ([], [])
    np.testing.assert_array_equal(fresh.accum[0], opt.accum[0])

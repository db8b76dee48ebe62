"""fflow.pipeline: the pipelined loss and gradients equal the plain model's (NumPy-free
reference: value_and_grad of the un-pipelined function), for every schedule, m in
{1, 2, 5} micro-batches and uneven layer counts per stage; the schedules' bubble
fractions and activation counts match the textbook figures; bad input fails clearly."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.pipeline_schedule import Schedule
from fflow.test_util import primitive_names

LAYERS = [1, 3, 2, 1]  # uneven layer counts per stage
WIDTH = 6
CLASSES = 3


def make_params(layers=LAYERS, seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for s, n in enumerate(layers):
        stage = []
        for i in range(n):
            d_in = 4 if s == 0 and i == 0 else WIDTH
            d_out = CLASSES if s == len(layers) - 1 and i == n - 1 else WIDTH
            w = (rng.normal(size=(d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
            b = (0.1 * rng.normal(size=(d_out,))).astype(np.float32)
            stage.append({"w": w, "b": b})
        params.append(stage)
    return params


def hidden(stage_params, h):
    for layer in stage_params:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    return h


def inner_stage(stage_params, xy):
    x, y = xy
    return hidden(stage_params, x), y  # the labels travel along with the activations


def last_stage(stage_params, xy):
    x, y = xy
    for layer in stage_params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    logits = x @ stage_params[-1]["w"] + stage_params[-1]["b"]
    logp = logits - jax_logsumexp(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def jax_logsumexp(z):
    mx = jnp.max(z, axis=1, keepdims=True)
    return mx + jnp.log(jnp.sum(jnp.exp(z - mx), axis=1, keepdims=True))


def stage_fns(n):
    return [inner_stage] * (n - 1) + [last_stage]


def plain_loss(params, batch):
    xy = batch
    for fn, p in zip(stage_fns(len(params)), params):
        xy = fn(p, xy)
    return xy


def data(n=10, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, CLASSES, size=n).astype(
        np.int32
    )


def close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def check_against_plain(f, params, batch):
    loss, grads = fflow.value_and_grad(f)(params, batch)
    want_loss, want_grads = fflow.value_and_grad(plain_loss)(params, batch)
    close(loss, want_loss)
    got = fflow.tree_util.tree_leaves(grads)
    want = fflow.tree_util.tree_leaves(want_grads)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        close(g, w)
    close(f(params, batch), want_loss)  # forward-only schedule
    return grads


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_pipelined_loss_and_grads_equal_plain(schedule, m):
    pls = [fflow.placement("cpu", [i]) for i in range(4)]
    f = fflow.pipeline(stage_fns(4), pls, m, schedule=schedule)
    check_against_plain(f, make_params(), data())


@pytest.mark.parametrize("m", [1, 2, 5])
def test_interleaved_equals_plain(m):
    # 4 stages over 2 placements: 2 virtual stages per device
    pls = [fflow.placement("cpu", [0]), fflow.placement("cpu", [1])]
    f = fflow.pipeline(stage_fns(4), pls, m, schedule="interleaved")
    assert f.schedule.v == 2
    check_against_plain(f, make_params(), data())


def test_stages_on_several_devices_and_batch_gradient():
    # two stages, each data-parallel over two devices; gradient w.r.t. the inputs too
    layers = [2, 2]
    params = make_params(layers, seed=3)
    pls = [fflow.placement("cpu", [0, 1]), fflow.placement("cpu", [2, 3])]
    S, B = fflow.sbp.split, fflow.sbp.broadcast
    f = fflow.pipeline(stage_fns(2), pls, 2, in_sbp=[(B, (S(0), S(0))), (B, (S(0), S(0)))])
    x, y = data(8)

    def loss_x(fun):
        return lambda x: fun(params, (x, y))

    close(fflow.grad(loss_x(f))(x), fflow.grad(loss_x(plain_loss))(x))
    grads = check_against_plain(f, params, (x, y))
    fflow.grad(f)(params, (x, y))
    text = f.describe_transfers()  # of the last run
    # 4 rows of 6 activations + 4 int labels per micro-batch, split (S(0)) 2 -> 2 devices
    assert "stage 0 -> 1 activations: 112 B per micro-batch" in text
    assert "stage 1 -> 0 cotangents: 96 B per micro-batch" in text
    w = grads[1][0]["w"]
    assert w.placement == pls[1] and w.sbp == (B,)
    # each micro-batch's parameter gradients come out partial (no all-reduce), and are
    # summed over micro-batches before the one reduction of the step
    for st in f.pipe._compiled.values():
        for _, bwd in st._bwd.values():
            n_p = len(st.p_sbps)
            assert all(nd == (fflow.sbp.partial_sum,) for nd in bwd.out_sbps[:n_p])
            assert bwd.count("all_reduce") == 0


def test_grads_live_on_their_stage_and_train():
    pls = [fflow.placement("cpu", [i]) for i in range(4)]
    f = fflow.pipeline(stage_fns(4), pls, 2)
    params, batch = make_params(), data()
    first = None
    for _ in range(5):
        loss, grads = fflow.value_and_grad(f)(params, batch)
        first = float(loss) if first is None else first
        params = fflow.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads)
    assert float(loss) < first
    assert params[2][0]["w"].placement == pls[2]  # updated parameters stay on their stage


# -- schedules ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_bubble_equals_theory(kind):
    for p in (1, 2, 3, 4):
        for m in (1, 2, 4, 5, 8, 16):
            s = Schedule(kind, p, m)
            assert s.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1))
            assert s.busy_ticks() == 2 * m * p


def test_interleaved_bubble_and_memory():
    for p in (2, 4):
        for v in (2, 3):
            for m in (p, 2 * p, 4 * p):
                s = Schedule("interleaved", p, m, v)
                assert s.bubble_fraction() == pytest.approx((p - 1) / (v * m + p - 1))
    assert (
        Schedule("interleaved", 4, 8, 2).bubble_fraction()
        < Schedule("1f1b", 4, 8).bubble_fraction()
    )


def test_1f1b_holds_at_most_p_microbatches():
    for p, m in [(4, 16), (4, 8), (2, 5), (4, 2)]:
        one = Schedule("1f1b", p, m).peak_in_flight()
        gpipe = Schedule("gpipe", p, m).peak_in_flight()
        assert one[0] == min(p, m) and gpipe[0] == m
        assert all(a <= b for a, b in zip(one, gpipe))


def test_dependencies_hold_in_every_schedule():
    for kind, p, m, v in [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1), ("interleaved", 2, 5, 3)]:
        s = Schedule(kind, p, m, v)
        tick = {(o.kind, o.stage, o.mb): o.tick for d in s.device_ops for o in d}
        last = p * v - 1
        for (kind_, st, mb), t in tick.items():
            if kind_ == "F" and st > 0:
                assert t > tick[("F", st - 1, mb)]
            if kind_ == "B":
                assert t > tick[("F", st, mb)]
                if st < last:
                    assert t > tick[("B", st + 1, mb)]
        per_device = [sorted(o.tick for o in d) for d in s.device_ops]
        assert all(len(set(ts)) == len(ts) for ts in per_device)  # one op per tick


def test_schedule_picture():
    s = Schedule("1f1b", 2, 3)
    assert s.picture() == (
        "tick    0   1   2   3   4   5   6   7\n"
        "dev0   F0  F1   .  B0  F2  B1   .  B2\n"
        "dev1    .  F0  B0  F1  B1  F2  B2   ."
    )
    text = str(s)
    assert "bubble 0.250 (theory 0.250)" in text
    assert "t1 dev1 F0: recv from dev0\n" in text
    assert "t2 dev1 B0: send to dev0\n" in text
    assert "t3 dev0 B0: recv from dev1\n" in text


def test_activation_bytes_1f1b_vs_gpipe():
    pls = [fflow.placement("cpu", [i]) for i in range(4)]
    params, batch = make_params(), data(16)
    peaks = {}
    for kind in ("gpipe", "1f1b"):
        f = fflow.pipeline(stage_fns(4), pls, 8, schedule=kind)
        fflow.grad(f)(params, batch)
        peaks[kind] = f.stats["peak_activation_bytes"]
    assert peaks["1f1b"][0] * 8 == peaks["gpipe"][0] * 4  # p of m micro-batches


# -- bad input --------------------------------------------------------------------------


def test_errors_name_the_fix():
    pls = [fflow.placement("cpu", [i]) for i in range(4)]
    f = fflow.pipeline(stage_fns(4), pls, 3)
    with pytest.raises(ValueError, match="divisible by num_microbatches"):
        f(make_params(), data(10))
    with pytest.raises(ValueError, match="list of 4 parameter"):
        f(make_params()[:3], data(9))
    with pytest.raises(ValueError, match="cannot be spread over 4 placements"):
        fflow.pipeline(stage_fns(3), pls, 2)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        fflow.pipeline(stage_fns(4), pls, 2, schedule="zigzag")
    with pytest.raises(ValueError, match="schedule='interleaved'"):
        fflow.pipeline(stage_fns(4), pls[:2], 2, schedule="1f1b")
    g = fflow.pipeline([inner_stage, inner_stage], pls[:2], 1)
    with pytest.raises(ValueError, match="scalar loss"):
        g(make_params([1, 1]), data(4))
    with pytest.raises(TypeError, match="not under jit"):
        fflow.jit(fflow.grad(f))(make_params(), data(9))


@pytest.mark.parametrize(
    "name",
    ["fflow.pipelining", "fflow.pipeline_schedule", "fflow.pipeline_trace", "fflow.grad_accum"],
)
def test_docstring_examples_run(name):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(name)).failed == 0


# -- residuals: B reads what F saved, recomputing only under fflow.checkpoint ----------


def _backward_prims(f):
    names = set()
    for st in f.pipe._compiled.values():
        for _, sp in st._bwd.values():
            names |= primitive_names(sp.program)
    return names


def test_backward_reads_residuals_instead_of_recomputing():
    pls = [fflow.placement("cpu", [i]) for i in range(4)]
    params, batch = make_params(), data(8)
    f = fflow.pipeline(stage_fns(4), pls, 2)
    check_against_plain(f, params, batch)
    assert "tanh" not in _backward_prims(f)  # tanh' comes from the saved tanh output
    fflow.grad(f)(params, batch)
    peak = f.stats["peak_activation_bytes"]
    ckpt = fflow.pipeline([fflow.checkpoint(fn) for fn in stage_fns(4)], pls, 2)
    check_against_plain(ckpt, params, batch)
    assert "tanh" in _backward_prims(ckpt)  # asked for: B recomputes the stage forward
    fflow.grad(ckpt)(params, batch)
    # stage 1 has three layers: saving each layer's activations (3 x 4x6 inputs and
    # 3 x 4x6 tanh outputs per micro-batch) costs more than its 4x6 input and labels
    mb_input = 4 * WIDTH * 4
    assert peak[1] >= 2 * 5 * mb_input
    assert 2 * mb_input <= ckpt.stats["peak_activation_bytes"][1] < peak[1] / 2


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_timed_replay_idle_per_device(kind):
    p, m = 4, 8
    s = Schedule(kind, p, m)
    keys = [(o.kind, o.stage, o.mb) for ops in s.device_ops for o in ops]
    # equal stages, B twice F: every device idles (p-1)/(m+p-1) of the time
    _, idle = s.replay_devices({k: 1.0 if k[0] == "F" else 2.0 for k in keys})
    np.testing.assert_allclose(idle, [(p - 1) / (m + p - 1)] * p)
    # stage 2 twice as slow: it is the bottleneck; its idle time is the fill and
    # drain only, m*6 busy of (m-1)*6 + 3+3+6+3 (GPipe), the others idle longer
    durations = {k: (1.0 if k[0] == "F" else 2.0) * (2 if k[1] == 2 else 1) for k in keys}
    _, idle = s.replay_devices(durations)
    assert min(idle) == idle[2] and max(idle) > (p - 1) / (m + p - 1)
    if kind == "gpipe":
        assert idle[2] == pytest.approx(1 - m * 6 / ((m - 1) * 6 + 15))

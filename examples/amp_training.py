"""Mixed-precision training of the digits MLP: fp32 vs amp bf16 vs amp fp16 + loss scaling.

    python examples/amp_training.py             # full run
    python examples/amp_training.py --tiny      # a few steps (used by the tests)

The model (`fflow.nn.MLP`) and the optimizer (`fflow.optim.adam`) are the same for the
three runs; only the loss function changes: `loss_fn`, `fflow.amp(loss_fn, "bf16")`
and `fflow.amp(loss_fn, "fp16")`. The parameters (master weights) and the optimizer
state stay fp32; the rewritten loss computes its matmuls in bf16/fp16 with fp32
accumulation and its softmax/log/sum in fp32. fp16 training wraps Adam in
`fflow.optim.mixed_precision`: the dynamic loss scale lives in the optimizer state
(with fp32 master weights), the step multiplies its loss by `opt_state.loss_scale`,
and an update whose gradients overflow is skipped while the scale backs off.
"""

import argparse
import time

import numpy as np
from _common import load_digits_split

import fflow
import fflow.numpy as jnp
from fflow import nn, optim


def init_params(sizes, seed):
    return nn.MLP(sizes[0], sizes[-1], sizes[1], len(sizes) - 2, key=fflow.random.PRNGKey(seed))


def loss_fn(model, x, y):
    logp = nn.log_softmax(model(x))
    return -jnp.mean(jnp.sum(nn.one_hot(y, 10) * logp, axis=-1))


def make_optimizer(policy):
    """Adam; for fp16 inside `mixed_precision` (loss scale 2^16, grown every 2000 good
    steps), whose state holds the scale. bf16 has fp32's exponent range: no scaling."""
    if policy == "fp16":
        return optim.mixed_precision(optim.adam(1e-3), init_scale=2.0**16, period=2000)
    return optim.adam(1e-3)


def make_train_step(policy, tx):
    """A jitted step for `policy` in (None, "bf16", "fp16"); returns the new state."""
    loss = loss_fn if policy is None else fflow.amp(loss_fn, policy)
    scaled = policy == "fp16"

    @fflow.jit
    def train_step(model, opt_state, x, y):
        scale = opt_state.loss_scale if scaled else 1.0

        def scaled_loss(m):  # fp32 product: 2^16 does not fit in fp16
            return loss(m, x, y).astype(jnp.float32) * scale

        value, grads = fflow.value_and_grad(scaled_loss)(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return optim.apply_updates(model, updates), opt_state, value / scale

    return train_step


@fflow.jit
def accuracy(model, x, y):
    return jnp.mean((jnp.argmax(model(x), axis=-1) == y).astype(jnp.float32))


def describe_program(policy, params, x, y):
    """Count where the rewritten loss computes: matmul, fp32-class and cast equations."""
    prog = fflow.make_jaxpr(fflow.amp(loss_fn, policy))(params, x, y)
    names = [e.primitive.name for e in prog.eqns]
    dots = [e for e in prog.eqns if e.primitive.name == "dot_general"]
    dot_dtypes = sorted({str(e.inputs[0].aval.str_short().split("[")[0]) for e in dots})
    fp32 = [e for e in prog.eqns if e.primitive.name in ("exp", "log", "reduce_sum")]
    fp32_ok = all(e.outputs[0].aval.dtype == np.float32 for e in fp32)
    return (
        f"{policy}: {len(dots)} matmuls with {'/'.join(dot_dtypes)} inputs, "
        f"{len(fp32)} exp/log/sum equations {'all in f32' if fp32_ok else 'NOT all f32'}, "
        f"{names.count('convert_element_type')} casts in {len(names)} equations"
    )


def train(policy, data, steps, batch_size, hidden, seed, log_every):
    (x_train, y_train), (x_test, y_test) = data
    params = init_params([64, hidden, hidden, 10], seed)
    tx = make_optimizer(policy)
    opt_state = tx.init(params)
    step_fn = make_train_step(policy, tx)
    rng = np.random.default_rng(seed)
    curve, scales = [], []
    for step in range(1, steps + 1):
        idx = rng.integers(0, len(x_train), batch_size)
        params, opt_state, loss = step_fn(params, opt_state, x_train[idx], y_train[idx])
        if step % log_every == 0 or step == steps:
            curve.append((step, float(loss)))
            scales.append(float(getattr(opt_state, "loss_scale", 1.0)))
    skipped = int(getattr(opt_state, "skipped", 0))
    acc = float(accuracy(params, x_test, y_test))
    return {"curve": curve, "scales": scales, "skipped": skipped, "accuracy": acc, "params": params}


def count_underflow(params, x, y):
    """Gradient entries that fp32 sees as nonzero but fp16 flushes to zero, without
    and with loss scaling (late in training the gradients are small)."""
    from fflow.tree_util import tree_leaves

    def flat(tree):
        return np.concatenate([np.asarray(leaf).ravel() for leaf in tree_leaves(tree)])

    fp16_loss = fflow.amp(loss_fn, "fp16")
    ref = flat(fflow.grad(loss_fn)(params, x, y))
    plain = flat(fflow.grad(fp16_loss)(params, x, y))
    scaled = fflow.amp.scaled_value_and_grad(fp16_loss)(fflow.amp.DynamicLossScale(), params, x, y)[
        1
    ]
    nonzero = ref != 0
    return (
        int(nonzero.sum()),
        int((plain[nonzero] == 0).sum()),
        int((flat(scaled)[nonzero] == 0).sum()),
    )


def main(steps=600, batch_size=128, hidden=128, seed=0, log_every=50):
    data = load_digits_split(seed)
    (x_train, y_train), _ = data
    probe = init_params([64, hidden, hidden, 10], seed)
    for policy in ("bf16", "fp16"):
        print(describe_program(policy, probe, x_train[:batch_size], y_train[:batch_size]))
    results = {}
    for name, policy in (("fp32", None), ("bf16", "bf16"), ("fp16", "fp16")):
        start = time.perf_counter()
        results[name] = train(policy, data, steps, batch_size, hidden, seed, log_every)
        results[name]["seconds"] = time.perf_counter() - start

    print(f"\n{'step':>6} {'fp32 loss':>10} {'bf16 loss':>10} {'fp16 loss':>10} {'fp16 scale':>11}")
    for i, (step, loss32) in enumerate(results["fp32"]["curve"]):
        lb = results["bf16"]["curve"][i][1]
        lh = results["fp16"]["curve"][i][1]
        scale = results["fp16"]["scales"][i]
        print(f"{step:6d} {loss32:10.4f} {lb:10.4f} {lh:10.4f} {scale:11.0f}")
    print()
    n, plain, scaled = count_underflow(results["fp16"]["params"], *data[0])
    print(
        f"fp16 gradients of the trained model on the training set: of {n} nonzero entries, "
        f"{plain} flush to zero without loss scaling, {scaled} with it"
    )
    base = results["fp32"]["accuracy"]
    for name in ("fp32", "bf16", "fp16"):
        r = results[name]
        extra = f", {r['skipped']} skipped steps" if name == "fp16" else ""
        print(
            f"{name}: test accuracy {r['accuracy']:.3f} ({r['accuracy'] - base:+.3f} vs fp32)"
            f"{extra}, {r['seconds']:.1f} s"
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--tiny", action="store_true", help="a few steps, for the tests")
    args = parser.parse_args()
    if args.tiny:
        main(steps=20, batch_size=32, hidden=32, log_every=5)
    else:
        main(args.steps, args.batch_size, args.hidden)

"""A character-level RNN written with `lax.scan`, trained with
`jit(value_and_grad(loss))` and `fflow.optim` (Adam after global-norm clipping) on
the source text of Python's own `textwrap` and `json` modules (read with
`inspect.getsource`; no download), then sampled.

    python examples/rnn_scan.py          # full run (~half a minute)
    python examples/rnn_scan.py --tiny   # quick run (used by the tests)

The time loop is one `scan` primitive: `grad` turns it into a forward scan that
stacks what the backward pass needs and a reverse scan (the transpose).
"""

import argparse
import inspect
import json
import textwrap
import time

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import lax, optim


def load_text():
    return inspect.getsource(textwrap) + inspect.getsource(json.decoder)


def init_params(vocab, hidden, seed=0):
    rng = np.random.default_rng(seed)

    def normal(*shape, scale):
        return jnp.asarray(rng.normal(0, scale, shape).astype(np.float32))

    return {
        "embed": normal(vocab, hidden, scale=0.1),
        "w_hh": normal(hidden, hidden, scale=1 / np.sqrt(hidden)),
        "b_h": jnp.zeros(hidden),
        "w_out": normal(hidden, vocab, scale=1 / np.sqrt(hidden)),
        "b_out": jnp.zeros(vocab),
    }


def rnn_step(params, h, char):
    """One time step for a batch: h [B, H], char [B] -> (new h, logits [B, V])."""
    h = jnp.tanh(params["embed"][char] + h @ params["w_hh"] + params["b_h"])
    return h, h @ params["w_out"] + params["b_out"]


def loss_fn(params, inputs, targets):
    """Mean next-character cross-entropy; inputs/targets are [T, B] int arrays."""
    batch = inputs.shape[1]
    h0 = jnp.zeros((batch, params["w_hh"].shape[0]))

    def step(h, xt):
        char, target = xt
        h, logits = rnn_step(params, h, char)
        logits = logits - jnp.max(logits, axis=-1, keepdims=True)
        logp = logits - jnp.log(jnp.sum(jnp.exp(logits), axis=-1, keepdims=True))
        nll = -jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
        return h, jnp.mean(nll)

    _, losses = lax.scan(step, h0, (inputs, targets))
    return jnp.mean(losses)


def make_optimizer(lr):
    """Adam after clipping the global gradient norm to 5 (RNNs like it)."""
    return optim.chain(optim.clip_by_global_norm(5.0), optim.adam(lr))


def make_train_step(tx):
    @fflow.jit
    def train_step(params, state, inputs, targets):
        loss, grads = fflow.value_and_grad(loss_fn)(params, inputs, targets)
        updates, state = tx.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    return train_step


def sample(params, first, length, temperature=0.7, seed=0):
    """Sampling with `scan` over a stack of PRNG keys (one per generated character)."""
    hidden = params["w_hh"].shape[0]

    def step(carry, key):
        h, char = carry
        h, logits = rnn_step(params, h, char[None])
        nxt = fflow.random.categorical(key, logits[0] / temperature).astype(jnp.int32)
        return (h, nxt), nxt

    keys = fflow.random.split(fflow.random.PRNGKey(seed), length)
    init = (jnp.zeros((1, hidden)), jnp.asarray(first, jnp.int32))
    return fflow.jit(lambda c, k: lax.scan(step, c, k)[1])(init, keys)


def main(steps=300, seq_len=64, batch_size=32, hidden=128, lr=3e-3, log_every=25, seed=0):
    text = load_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], np.int32)
    params = init_params(len(chars), hidden, seed)
    tx = make_optimizer(lr)
    train_step = make_train_step(tx)
    state = tx.init(params)
    rng = np.random.default_rng(seed)
    print(f"{len(text)} characters, vocabulary {len(chars)}, hidden {hidden}")
    losses = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        offsets = rng.integers(0, len(data) - seq_len - 1, batch_size)
        window = np.stack([data[o : o + seq_len + 1] for o in offsets], axis=1)  # [T+1, B]
        params, state, loss = train_step(params, state, window[:-1], window[1:])
        losses.append(float(loss))
        if step % log_every == 0 or step == 1 or step == steps:
            print(f"step {step:4d}  loss {np.mean(losses[-log_every:]):.3f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.1f} s ({elapsed / steps * 1e3:.1f} ms/step)")
    out = sample(params, index["d"], 80)
    print("sample:", repr("d" + "".join(chars[i] for i in np.asarray(out))))
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="a few steps, for the tests")
    args = parser.parse_args()
    if args.tiny:
        main(steps=30, seq_len=16, batch_size=8, hidden=32, lr=1e-2, log_every=10)
    else:
        main(steps=args.steps)

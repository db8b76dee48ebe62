"""Train a small GPT on Python's own standard library, one character at a time.

    python examples/gpt_chars.py                  # 2 data x 2 model; ~1 CPU-minute
    python -m fflow.launch -n 4 examples/gpt_chars.py   # the same on 4 MPI ranks
    python examples/gpt_chars.py --resume         # continue from the last checkpoint
    python examples/gpt_chars.py --tiny           # a few steps (used by the tests)

The text is the standard library's own source (`*.py` next to `os.py`); every tenth
file is held out for validation. The model is a causal transformer written with
`fflow.nn` (token and position embeddings, pre-LayerNorm blocks of
`MultiHeadAttention` and an MLP, an output layer tied to the token embedding).

One training step is `fflow.shard(step, mesh, ...)` on a 2x2 mesh (axis 0: data,
axis 1: model). The parameters live Megatron-style over the model axis:
column-parallel q/k/v and first MLP weights, row-parallel output weights, annotated on
the layers and collected with `fflow.nn.sbp_of`; the batch comes split over the data
axis. Inside, the loss runs under `fflow.amp(..., "bf16")` (bf16 matmuls and attention
with fp32 accumulation, fp32 master weights), and the update is `fflow.optim`'s AdamW
with warmup + cosine decay and global-norm clipping; its state is sharded like the
parameters. The planner inserts every collective and picks each operation's layout
by cost; no `with_sbp` hint is needed. At this size (tests/test_examples_plans.py)
the weights stay split Megatron-style: every matmul of the blocks runs on a quarter
of the work, the block's activations are all-reduced over the model axis (two per
block forward), the tied output layer (vocabulary 40) runs on the data split alone,
the loss's `take_along_axis` keeps the batch split, and the weight gradients are
all-reduced over the data axis in their layout. The run prints a one-line summary of
that plan.

Batches come from `fflow.data.DataLoader` (shuffled windows, each device gets its own
rows), checkpoints from `fflow.CheckpointManager` (every --ckpt-every steps; --resume
reloads model, optimizer state and step onto the mesh). At the end it reports
validation bits per character next to a bigram model fit on the same training text,
writes a loss-curve PNG and prints a generated sample.

Measured on a 2-core machine shared with other jobs, with the defaults. Both runs give
the same numbers: validation 2.660 bits/char vs the bigram's 3.517.

| run | load average | wall | CPU |
|---|---|---|---|
| 4 simulated devices, one process | 11-16 | 5 min 00 s | 65 s |
| `fflow.launch -n 4` | 10-14 | 4 min 15 s | 198 s over the 4 ranks |

An earlier pair, before the bf16 casts became C loops, ran at load average 15-20: it
took 7 min 08 s and 7 min 41 s. A rank that waits for a collective keeps polling, so
the MPI run uses more CPU. The CPU time is the figure that does not depend on the
other jobs.
"""

import argparse
import math
import os
import re
import sys
import sysconfig
import tempfile
import time
from collections import Counter

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.data import DataLoader
from fflow.progress import plot_losses, progress
from fflow.sharding import B, S, device_count, runtime

# ----------------------------------------------------------------------------
# Data: the standard library's source text


_ASCII = re.compile(r"[^\n\x20-\x7e]")  # anything but printable ASCII and newlines


def load_corpus(max_train_chars, max_val_chars):
    """(train text, validation text) from the stdlib's top-level .py files (sorted,
    every tenth one held out), non-ASCII characters replaced by '?'."""
    lib = os.path.dirname(os.__file__) or sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in os.listdir(lib) if f.endswith(".py"))
    train, val = [], []
    for i, name in enumerate(files):
        with open(os.path.join(lib, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        text = _ASCII.sub("?", text)
        (val if i % 10 == 0 else train).append(text)
    return "".join(train)[:max_train_chars], "".join(val)[:max_val_chars]


class Vocab:
    def __init__(self, text):
        self.chars = sorted(set(text) | {"?"})
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars)

    def encode(self, text):
        table = np.full(128, self.index["?"], np.int32)  # the text is ASCII (load_corpus)
        for c, i in self.index.items():
            table[ord(c)] = i
        return table[np.frombuffer(text.encode("ascii", "replace"), np.uint8)]

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)


def bigram_bits_per_char(train_ids, val_ids, vocab_size):
    """Validation bits/char of an add-k smoothed bigram fit on the training text (k
    picked on the validation text: the strongest bigram baseline)."""
    counts = np.zeros((vocab_size, vocab_size))
    np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1)
    best = None
    for k in (0.01, 0.03, 0.1, 0.3, 1.0):
        p = (counts + k) / (counts + k).sum(1, keepdims=True)
        bits = -np.mean(np.log2(p[val_ids[:-1], val_ids[1:]]))
        best = bits if best is None else min(best, bits)
    return float(best)


def windows(ids, length, stride):
    starts = np.arange(0, len(ids) - length, stride)
    return np.stack([ids[s : s + length] for s in starts])


# ----------------------------------------------------------------------------
# The model


class Block(nn.Module):
    ln1: nn.LayerNorm
    attn: nn.MultiHeadAttention
    ln2: nn.LayerNorm
    fc1: nn.Linear
    fc2: nn.Linear

    def __init__(self, d, heads, *, key, tp):
        k1, k2, k3 = fflow.random.split(key, 3)
        col, row = ((B, S(1)), (B, S(0))) if tp else (None, None)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(heads, d, key=k1, qkv_sbp=col, out_sbp=row)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d, key=k2, sbp=col, bias_sbp=(B, S(0)) if tp else None)
        self.fc2 = nn.Linear(4 * d, d, key=k3, sbp=row)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.fc2(nn.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    tok: nn.Embedding
    pos: object
    blocks: tuple
    ln_f: nn.LayerNorm

    def __init__(self, vocab, d, heads, layers, context, *, key, tp=True):
        keys = fflow.random.split(key, layers + 2)
        self.tok = nn.Embedding(vocab, d, key=keys[0])
        self.pos = 0.02 * fflow.random.normal(keys[1], (context, d))
        self.blocks = tuple(Block(d, heads, key=k, tp=tp) for k in keys[2:])
        self.ln_f = nn.LayerNorm(d)

    def __call__(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.tok.attend(self.ln_f(x))  # the output layer is the embedding, tied


def loss_fn(model, ids):
    """Mean next-character cross-entropy (nats) of windows `ids` [batch, context + 1]."""
    x, y = ids[:, :-1], ids[:, 1:]
    logp = nn.log_softmax(model(x).astype(jnp.float32))
    picked = jnp.take_along_axis(logp, y[..., None], axis=-1)
    return -jnp.mean(picked)


# ----------------------------------------------------------------------------
# Training


def make_optimizer(steps, lr, warmup):
    schedule = optim.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, end_value=lr / 10)
    return optim.chain(
        optim.clip_by_global_norm(1.0),
        optim.adamw(schedule, b2=0.99, weight_decay=0.1, mask=matrices_only),
    )


def matrices_only(model):
    """Weight decay on matrices only (not on biases, norms or position embeddings)."""
    return fflow.tree_util.tree_map(lambda p: p.ndim == 2, model)


def make_mesh():
    n = device_count()
    if n >= 4:
        return fflow.placement("cpu", [[0, 1], [2, 3]])
    if n == 2:
        return fflow.placement("cpu", [[0, 1]])  # 1 x 2: model parallel only
    return None


def build_step(tx, mesh, model, amp):
    loss = fflow.amp(loss_fn, "bf16") if amp else loss_fn

    def step(model, opt_state, batch):
        value, grads = fflow.value_and_grad(loss)(model, batch)
        updates, opt_state = tx.update(grads, opt_state, model)
        return optim.apply_updates(model, updates), opt_state, value

    if mesh is None:
        return fflow.jit(step), fflow.jit(loss_fn)
    model_sbp = nn.sbp_of(model, default=(B, B))  # pinned: parameters keep their layout
    state_sbp = optim.state_sbp(tx, model, model_sbp, mesh)
    data = (S(0), B)
    sharded = fflow.shard(
        step, mesh, in_sbp=(model_sbp, state_sbp, data), out_sbp=(model_sbp, state_sbp, (B, B))
    )
    evaluate = fflow.shard(loss_fn, mesh, in_sbp=(model_sbp, data), out_sbp=(B, B))
    return sharded, evaluate


def plan_summary(plan):
    """One line: the communicating collectives of one step and the bytes they move."""
    local = ("shard_slice", "shard_pad", "keep_one")  # boxing without messages
    counts = Counter(n for n in plan.collectives() if n not in local)
    ops = ", ".join(f"{name} x{k}" for name, k in sorted(counts.items()))
    return f"planner: per step {ops}; {plan.bytes / 2**20:.1f} MiB moved between devices"


def place(tree, sbp_tree, mesh):
    """`tree`'s arrays as global arrays on `mesh` with their annotated SBP (broadcast
    where none), so a checkpoint restores onto the same layout."""
    if mesh is None:
        return tree
    leaves, treedef = fflow.tree_util.tree_flatten(tree)
    specs = fflow.tree_util.prefix_broadcast(_boxed(sbp_tree, mesh.ndim), tree, "sbp")
    placed = [
        fflow.to_global(x, mesh, (B,) * mesh.ndim if s is None else s.sbp)
        for x, s in zip(leaves, specs)
    ]
    return fflow.tree_util.tree_unflatten(treedef, placed)


class _Box:
    def __init__(self, sbp):
        self.sbp = sbp


def _boxed(spec, ndim):
    def is_leaf(s):
        return s is None or isinstance(s, tuple) and len(s) == ndim and not isinstance(s[0], tuple)

    leaves, treedef = fflow.tree_util.tree_flatten(spec, is_leaf=is_leaf)
    return fflow.tree_util.tree_unflatten(treedef, [None if s is None else _Box(s) for s in leaves])


def generate(model, vocab, prompt, length, context, seed=0, temperature=0.8):
    """Sample `length` characters after `prompt` (the model as local arrays)."""
    model = fflow.tree_util.tree_map(lambda p: jnp.asarray(np.asarray(p)), model)
    forward = fflow.jit(lambda m, ids: m(ids))
    ids = list(vocab.encode(prompt))
    rng = np.random.default_rng(seed)
    for _ in range(length):
        window = ids[-context:]
        pad = context - len(window)
        x = np.array([window + [0] * pad], np.int32)  # causal: the padding is never seen
        logits = np.asarray(forward(model, x))[0, len(window) - 1].astype(np.float64)
        p = np.exp((logits - logits.max()) / temperature)
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-chars", type=int, default=2_000_000)
    parser.add_argument("--val-chars", type=int, default=50_000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--ckpt-dir", default="gpt_chars_ckpt", help="(--tiny: a temp dir)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--no-amp", action="store_true", help="train in fp32")
    parser.add_argument("--png", default="gpt_chars_loss.png", help="loss-curve PNG")
    parser.add_argument("--stop-after", type=int, default=None, help="stop at this step "
                        "(as if interrupted; --resume continues)")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, default=None, help="stop early after this")
    parser.add_argument("--tiny", action="store_true", help="a few steps (tests)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.batch, args.context, args.d_model, args.layers = 6, 8, 16, 32, 1
        args.heads, args.train_chars, args.val_chars, args.eval_every = 2, 20_000, 4_000, 3
        args.ckpt_every = 3
        # one scratch dir for all ranks: under fflow.launch the job's own directory
        job = os.environ.get("FFLOW_LAUNCH_DIR")
        scratch = job.rstrip("/") + "-gpt_chars" if job else tempfile.mkdtemp(prefix="gpt_chars_")
        os.makedirs(scratch, exist_ok=True)
        args.ckpt_dir = args.ckpt_dir if "--ckpt-dir" in (argv or sys.argv) else scratch
        args.png = args.png if "--png" in (argv or sys.argv) else os.path.join(scratch, "loss.png")
    rank0 = runtime().rank == 0

    def say(*a):
        if rank0:
            print(*a, flush=True)

    train_text, val_text = load_corpus(args.train_chars, args.val_chars)
    vocab = Vocab(train_text)
    train_ids, val_ids = vocab.encode(train_text), vocab.encode(val_text)
    bigram = bigram_bits_per_char(train_ids, val_ids, len(vocab))
    say(f"train {len(train_ids):,} chars, validation {len(val_ids):,} chars (held-out files), "
        f"vocab {len(vocab)}; bigram baseline: {bigram:.3f} bits/char")  # fmt: skip

    mesh = make_mesh()
    model = GPT(len(vocab), args.d_model, args.heads, args.layers, args.context,
                key=fflow.random.PRNGKey(0), tp=mesh is not None)  # fmt: skip
    say(nn.summary(model))
    tx = make_optimizer(args.steps, args.lr, max(args.steps // 20, 1))
    step_fn, eval_fn = build_step(tx, mesh, model, amp=not args.no_amp)
    layout = "single device" if mesh is None else f"mesh {mesh.hierarchy} (data x model)"
    say(f"{layout}, {'bf16 amp' if not args.no_amp else 'fp32'}, {runtime().describe()}")

    opt_state = tx.init(model)
    if mesh is not None:
        model_sbp = nn.sbp_of(model)
        model = place(model, model_sbp, mesh)
        opt_state = place(opt_state, optim.state_sbp(tx, model, model_sbp, mesh), mesh)
    state = {"model": model, "opt": opt_state, "step": 0}
    manager = fflow.CheckpointManager(args.ckpt_dir, max_to_keep=2, save_interval=args.ckpt_every)
    if args.resume and manager.latest_step() is not None:
        state = manager.restore(like=state)
        say(f"resumed from step {state['step']} ({manager.path(state['step'])})")

    timings = {"first step": 0.0, "later steps": 0.0, "validation": 0.0}
    start, cpu_start = time.perf_counter(), time.process_time()
    if mesh is not None:  # what the planner chose for one step (planned once, then cached)
        probe = fflow.to_global(np.zeros((args.batch, args.context + 1), np.int32), mesh, (S(0), B))
        say(plan_summary(step_fn.plan(state["model"], state["opt"], probe)))
        timings["first step"] += time.perf_counter() - start

    placement = mesh
    train_windows = windows(train_ids, args.context + 1, args.context // 2)
    loader = DataLoader(train_windows, args.batch, key=fflow.random.PRNGKey(1),
                        placement=placement, sbp=None if mesh is None else (S(0), B))  # fmt: skip
    val_windows = windows(val_ids, args.context + 1, args.context)
    # validation: 4x the rows per call (no gradients to keep), so fewer, cheaper calls
    val_loader = DataLoader(val_windows, 4 * args.batch, shuffle=False, placement=placement,
                            sbp=None if mesh is None else (S(0), B))  # fmt: skip

    def validate(model):
        t0 = time.perf_counter()
        total = [float(eval_fn(model, b)) for b in val_loader.epoch(0)]
        timings["validation"] += time.perf_counter() - t0
        return float(np.mean(total)) / math.log(2)

    curve, val_curve = [], []
    bar = progress(total=args.steps, initial=state["step"], desc="train", disable=not rank0)
    model, opt_state = state["model"], state["opt"]
    stopped = None
    for i, batch in enumerate(loader.steps(args.steps, start=state["step"]), state["step"] + 1):
        t0 = time.perf_counter()
        model, opt_state, loss = step_fn(model, opt_state, batch)
        loss = float(loss)
        timings["first step" if not curve else "later steps"] += time.perf_counter() - t0
        curve.append((i, loss / math.log(2)))
        bar.update(1)
        bar.set_postfix(bits=loss / math.log(2))
        manager.save(i, {"model": model, "opt": opt_state, "step": i})
        if i % args.eval_every == 0 and i < args.steps:
            val_curve.append((i, validate(model)))
        minutes = (time.perf_counter() - start) / 60
        if args.max_minutes is not None and minutes > args.max_minutes or i == args.stop_after:
            stopped = i
            break
    bar.close()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if fflow.process_count() > 1:  # every rank's CPU time
        cpu = runtime().comm.allreduce(cpu)
    final_step = stopped or args.steps
    val_bits = validate(model)
    val_curve.append((final_step, val_bits))
    steps_run = len(curve)
    where = "all ranks" if fflow.process_count() > 1 else "this process"
    say(f"\n{steps_run} steps in {seconds:.0f} s wall, {cpu:.0f} s CPU ({where}; "
        f"{seconds / max(steps_run, 1):.2f} s/step; planning and compiling included), "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        + (f", stopped early at step {stopped}" if stopped else ""))  # fmt: skip
    later = timings["later steps"] / max(steps_run - 1, 1)
    say(f"wall time: first step {timings['first step']:.0f} s (planning, compiling), then "
        f"{later:.2f} s/step; validation {timings['validation']:.0f} s in all")  # fmt: skip
    say(f"validation: GPT {val_bits:.3f} bits/char vs bigram {bigram:.3f} bits/char "
        f"({bigram - val_bits:+.3f})")  # fmt: skip
    if rank0 and plot_losses(args.png, {"train (bits/char)": curve, "validation": val_curve},
                             title="gpt_chars", ylabel="bits per character",
                             hlines={"bigram (validation)": bigram}):  # fmt: skip
        say("loss curve written" if args.tiny else f"loss curve: {args.png}")  # tiny: a temp dir
    sample = generate(model, vocab, "def ", 200 if not args.tiny else 20, args.context)
    say("sample:\n" + sample)
    return {"val_bits": val_bits, "bigram_bits": bigram, "curve": curve, "steps": steps_run}


if __name__ == "__main__":
    main()

"""GPU check: the CUDA tests on a real GPU, then fflow vs a copy, torch and JAX.

    python benchmarks/gpu_check.py            # on a machine with an NVIDIA GPU (< 5 min)
    python benchmarks/gpu_check.py --tiny --backend cuda_shim   # smoke run on a CPU

Needs: cupy-cuda13x, nvidia-cuda-nvrtc==13.0.*, and for the comparisons torch and
jax[cuda] (each comparison is skipped, with a note, if its package is missing).
It prints one table:

* fused elementwise chain (8 ops, 3 inputs, f32) bandwidth as a fraction of a plain
  device-to-device copy measured in the same run (target >= 0.8);
* row softmax and layernorm vs torch and JAX (target: within 1.2x of torch);
* an MLP and a transformer-block training step (value_and_grad + SGD) vs JAX jit
  and torch (target: within 1.2x of JAX).

See docs/gpu.md.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fflow  # noqa: E402
import fflow.numpy as jnp  # noqa: E402
from fflow import nn  # noqa: E402

# -- models (plain functions over pytrees; also run by tests/test_cuda_examples.py) ----------


def mlp_init(rng, sizes):
    return [
        {
            "w": (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32),
            "b": np.zeros(b, np.float32),
        }
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def mlp_loss(params, x, y):
    h = x
    for layer in params[:-1]:
        h = nn.relu(h @ layer["w"] + layer["b"])
    logits = h @ params[-1]["w"] + params[-1]["b"]
    logp = nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def block_init(rng, d, hidden):
    def w(a, b):
        return (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)

    return {
        "ln1": {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)},
        "qkv": w(d, 3 * d),
        "proj": w(d, d),
        "ln2": {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)},
        "fc1": w(d, hidden),
        "fc2": w(hidden, d),
    }


def layernorm(p, x):
    return nn.standardize(x, axis=-1) * p["g"] + p["b"]


def block(params, x, heads):
    b, t, d = x.shape
    h = layernorm(params["ln1"], x)
    qkv = (h @ params["qkv"]).reshape(b, t, 3, heads, d // heads)
    q, k, v = (jnp.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
    att = nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / float(np.sqrt(d // heads)), axis=-1)
    o = jnp.transpose(jnp.einsum("bhqk,bhkd->bhqd", att, v), (0, 2, 1, 3)).reshape(b, t, d)
    x = x + o @ params["proj"]
    h = layernorm(params["ln2"], x)
    return x + nn.gelu(h @ params["fc1"]) @ params["fc2"]


def block_loss(params, x, heads=4):
    return jnp.mean(jnp.square(block(params, x, heads)))


def sgd_step(loss_fn, lr=1e-3):
    def step(params, *batch):
        loss, grads = fflow.value_and_grad(loss_fn)(params, *batch)
        return fflow.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss

    return step


def elementwise_chain(x, y, z):
    return jnp.tanh(x * y + z) * 0.5 + jnp.exp(-jnp.abs(z)) - y * y


# -- timing ----------------------------------------------------------------------------------


def bench(fn, sync, reps):
    fn()
    sync()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


class Row:
    def __init__(self, name, fflow_s, **others):
        self.name, self.fflow_s, self.others = name, fflow_s, others


def run_fflow(args, device):
    """fflow timings for every row (works on the real GPU and on the simulated one)."""
    sizes = dict(
        n=args.n_elem, rows=args.rows, cols=args.cols, batch=args.batch, hidden=args.hidden
    )
    put = lambda tree: fflow.device_put(tree, device)  # noqa: E731
    sync = _sync(device)
    rng = np.random.default_rng(0)
    out = {}
    xs = [put(rng.standard_normal(sizes["n"]).astype(np.float32)) for _ in range(3)]
    f = fflow.jit(elementwise_chain)
    out["chain"] = bench(lambda: f(*xs), sync, args.reps)
    r = put(rng.standard_normal((sizes["rows"], sizes["cols"])).astype(np.float32))
    g = put(np.ones(sizes["cols"], np.float32))
    sm = fflow.jit(lambda x: nn.softmax(x, axis=-1))
    ln = fflow.jit(lambda x, g: layernorm({"g": g, "b": g}, x))
    out["softmax"] = bench(lambda: sm(r), sync, args.reps)
    out["layernorm"] = bench(lambda: ln(r, g), sync, args.reps)
    params = put(mlp_init(rng, [sizes["hidden"]] * 3 + [16]))
    x = put(rng.standard_normal((sizes["batch"], sizes["hidden"])).astype(np.float32))
    y = put(rng.integers(0, 16, sizes["batch"]).astype(np.int32))
    step = fflow.jit(sgd_step(mlp_loss))
    out["mlp"] = bench(lambda: step(params, x, y), sync, args.reps)
    bp = put(block_init(rng, args.d_model, 4 * args.d_model))
    bx = put(rng.standard_normal((args.bsz, args.seq, args.d_model)).astype(np.float32))
    bstep = fflow.jit(sgd_step(block_loss))
    out["block"] = bench(lambda: bstep(bp, bx), sync, args.reps)
    return out


def _sync(device):
    if device.platform == "gpu":
        import cupy

        return cupy.cuda.Device(device.id).synchronize
    return lambda: None


def run_copy(args):
    import cupy

    a = cupy.random.standard_normal(args.n_elem, dtype=cupy.float32)
    b = cupy.empty_like(a)
    t = bench(lambda: cupy.copyto(b, a), cupy.cuda.Device().synchronize, args.reps)
    return 2 * a.nbytes / t  # bytes moved per second


def run_torch(args):
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # as fflow and JAX do on GPUs
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out = {}
    xs = [torch.randn(args.n_elem, device=dev) for _ in range(3)]

    def chain(x, y, z):
        return torch.tanh(x * y + z) * 0.5 + torch.exp(-torch.abs(z)) - y * y

    out["chain"] = bench(lambda: chain(*xs), sync, args.reps)
    r = torch.randn(args.rows, args.cols, device=dev)
    g = torch.ones(args.cols, device=dev)
    out["softmax"] = bench(lambda: torch.softmax(r, -1), sync, args.reps)
    out["layernorm"] = bench(
        lambda: torch.nn.functional.layer_norm(r, (args.cols,), g, g), sync, args.reps
    )
    h = args.hidden
    ws = [torch.randn(h, h, device=dev, requires_grad=True) for _ in range(2)]
    ws.append(torch.randn(h, 16, device=dev, requires_grad=True))
    x = torch.randn(args.batch, h, device=dev)
    y = torch.randint(0, 16, (args.batch,), device=dev)

    def mlp_step():
        a = x
        for w in ws[:-1]:
            a = torch.relu(a @ w)
        loss = torch.nn.functional.cross_entropy(a @ ws[-1], y)
        grads = torch.autograd.grad(loss, ws)
        with torch.no_grad():
            for w, gr in zip(ws, grads):
                w -= 1e-3 * gr
        return loss

    out["mlp"] = bench(mlp_step, sync, args.reps)
    layer = torch.nn.TransformerEncoderLayer(
        args.d_model, 4, 4 * args.d_model, dropout=0.0, batch_first=True, norm_first=True,
        activation="gelu", device=dev,
    )  # fmt: skip
    bx = torch.randn(args.bsz, args.seq, args.d_model, device=dev)

    def block_step():
        loss = layer(bx).square().mean()
        grads = torch.autograd.grad(loss, list(layer.parameters()))
        with torch.no_grad():
            for p, gr in zip(layer.parameters(), grads):
                p -= 1e-3 * gr
        return loss

    out["block"] = bench(block_step, sync, args.reps)
    return out


def run_jax(args):
    import jax
    import jax.numpy as xnp

    def sync_of(x):
        return lambda: jax.block_until_ready(x())

    out = {}
    key = jax.random.PRNGKey(0)
    xs = [jax.random.normal(jax.random.fold_in(key, i), (args.n_elem,)) for i in range(3)]

    @jax.jit
    def chain(x, y, z):
        return xnp.tanh(x * y + z) * 0.5 + xnp.exp(-xnp.abs(z)) - y * y

    out["chain"] = _jbench(lambda: chain(*xs), args.reps)
    r = jax.random.normal(key, (args.rows, args.cols))
    out["softmax"] = _jbench(lambda: jax.jit(jax.nn.softmax)(r), args.reps)

    @jax.jit
    def ln(x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5)

    out["layernorm"] = _jbench(lambda: ln(r), args.reps)
    rng = np.random.default_rng(0)
    params = mlp_init(rng, [args.hidden] * 3 + [16])
    x = rng.standard_normal((args.batch, args.hidden)).astype(np.float32)
    y = rng.integers(0, 16, args.batch).astype(np.int32)

    def loss(params, x, y):
        h = x
        for layer in params[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        logp = jax.nn.log_softmax(h @ params[-1]["w"] + params[-1]["b"])
        return -xnp.mean(xnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def step(params, x, y):
        lv, g = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, gg: p - 1e-3 * gg, params, g), lv

    params, x, y = jax.device_put((params, x, y))
    out["mlp"] = _jbench(lambda: step(params, x, y), args.reps)
    bp = jax.device_put(block_init(rng, args.d_model, 4 * args.d_model))
    bx = jax.device_put(rng.standard_normal((args.bsz, args.seq, args.d_model)).astype(np.float32))

    def jblock(p, x, heads=4):
        b, t, d = x.shape

        def ln(q, x):
            m = x.mean(-1, keepdims=True)
            v = (x * x).mean(-1, keepdims=True) - m * m
            return (x - m) * jax.lax.rsqrt(v + 1e-5) * q["g"] + q["b"]

        h = ln(p["ln1"], x)
        qkv = (h @ p["qkv"]).reshape(b, t, 3, heads, d // heads)
        q, k, v = (xnp.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
        att = jax.nn.softmax(xnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d // heads), -1)
        o = xnp.transpose(xnp.einsum("bhqk,bhkd->bhqd", att, v), (0, 2, 1, 3)).reshape(b, t, d)
        x = x + o @ p["proj"]
        h = ln(p["ln2"], x)
        return xnp.mean(xnp.square(x + jax.nn.gelu(h @ p["fc1"]) @ p["fc2"]))

    @jax.jit
    def bstep(p, x):
        lv, g = jax.value_and_grad(jblock)(p, x)
        return jax.tree_util.tree_map(lambda a, gg: a - 1e-3 * gg, p, g), lv

    out["block"] = _jbench(lambda: bstep(bp, bx), args.reps)
    del sync_of
    return out


def _jbench(fn, reps):
    import jax

    return bench(lambda: jax.block_until_ready(fn()), lambda: None, reps)


def run_tests(args):
    # exact float32 products in the tests (the benchmarks use TF32, as JAX does)
    env = dict(os.environ, FFLOW_CUDA_TEST_BACKEND=args.backend, FFLOW_GPU_TF32="0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "tests/test_cuda_primitives.py",
           "tests/test_cuda_fusion.py"]  # fmt: skip
    print("$", " ".join(cmd), f"(FFLOW_CUDA_TEST_BACKEND={args.backend})", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda", choices=["cuda", "cuda_shim"])
    p.add_argument("--tiny", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    big = not args.tiny
    args.n_elem = 1 << 26 if big else 4096
    args.rows, args.cols = (8192, 4096) if big else (8, 40)
    args.batch, args.hidden = (8192, 2048) if big else (8, 16)
    args.bsz, args.seq, args.d_model = (16, 512, 768) if big else (2, 4, 16)
    if args.tiny:
        args.reps = 1
    rc = 0
    if not args.skip_tests:
        rc = run_tests(args)
        if rc:
            print("CUDA tests FAILED; timings follow anyway")
    device = fflow.devices("gpu" if args.backend == "cuda" else "cuda_shim")[0]
    ours = run_fflow(args, device)
    others = {}
    if args.backend == "cuda":
        for name, fn in (("torch", run_torch), ("jax", run_jax)):
            try:
                others[name] = fn(args)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"({name} comparison skipped: {type(e).__name__}: {e})")
        try:
            copy_bw = run_copy(args)
        except Exception as e:  # noqa: BLE001
            print(f"(copy bandwidth skipped: {e})")
            copy_bw = None
    else:
        copy_bw = None
    print_table(args, ours, others, copy_bw)
    return rc


def print_table(args, ours, others, copy_bw):
    print()
    print(f"{'benchmark':<34}{'fflow':>12}{'torch':>12}{'jax':>12}{'vs target':>22}")
    chain_bytes = 4 * 4 * args.n_elem  # 3 reads + 1 write of f32
    for key, label in (("chain", "fused elementwise chain"), ("softmax", "row softmax"),
                       ("layernorm", "row layernorm"), ("mlp", "MLP train step"),
                       ("block", "transformer block train step")):  # fmt: skip
        t = ours[key]
        cells = [f"{t * 1e3:9.3f} ms"]
        for lib in ("torch", "jax"):
            v = others.get(lib, {}).get(key)
            cells.append(f"{v * 1e3:9.3f} ms" if v else f"{'-':>12}")
        note = ""
        if key == "chain" and copy_bw:
            frac = chain_bytes / t / copy_bw
            note = f"{frac:.2f} of copy BW (>=0.80)"
        elif key in ("softmax", "layernorm") and others.get("torch", {}).get(key):
            note = f"{t / others['torch'][key]:.2f}x torch (<=1.2)"
        elif key in ("mlp", "block") and others.get("jax", {}).get(key):
            note = f"{t / others['jax'][key]:.2f}x JAX (<=1.2)"
        print(f"{label:<34}" + "".join(f"{c:>12}" for c in cells) + f"{note:>22}")
    if copy_bw:
        print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (H200 peak ~4.8 TB/s)")


if __name__ == "__main__":
    sys.exit(main())

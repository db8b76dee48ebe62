"""GPU check: correctness at full size on NaN-poisoned memory and timings, in one run.

    python benchmarks/gpu_check.py --budget 280          # an H200 machine, no install needed
    python benchmarks/gpu_check.py --shim --budget 60    # here: tiny sizes through the host shim

It needs no install and no network: it maps fflow's folders itself (fflow,
fflow.primitives -> primitives/, fflow.transforms -> transforms/, fflow.lowering ->
lowering/) from the checkout it sits in; on the GPU machine it needs cupy-cuda13x
and nvidia-cuda-nvrtc, torch and JAX only for the side-by-side columns.

Every case runs its jitted program on memory poisoned with NaN bytes (a CuPy
allocator that fills each allocation with 0xFF; on the shim the runtime's `empty`)
and compares it with a float64 NumPy reference written here, independently of
fflow. Per program it records the wall time (median, synchronised), the host
enqueue time (the call without a sync), the first call (trace + compile + run), and
on a GPU each kernel timed with CUDA events, its registers and local memory. Cases
run in order until `--budget` seconds are spent; the rest are listed as skipped.
The results go to `--json` (default gpu_check.json) and a table on stdout.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FOLDERS = {
    "fflow": "fflow",
    "fflow.primitives": "primitives",
    "fflow.transforms": "transforms",
    "fflow.lowering": "lowering",
}


class _CheckoutFinder:
    """Finds fflow's four top packages in this checkout (pyproject's package-dir,
    without an install); their submodules then load through the packages' __path__."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        folder = _FOLDERS.get(name)
        if folder is None:
            return None
        init = os.path.join(ROOT, folder, "__init__.py")
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[os.path.dirname(init)]
        )


sys.meta_path.insert(0, _CheckoutFinder)

import fflow  # noqa: E402
import fflow.numpy as jnp  # noqa: E402
from fflow import nn  # noqa: E402

# -- the programs and their float64 references ------------------------------------------------


def chain(x, y, z):
    return jnp.tanh(x * y + z) * 0.5 + jnp.exp(-jnp.abs(z)) - y * y


def chain_ref(x, y, z):
    return np.tanh(x * y + z) * 0.5 + np.exp(-np.abs(z)) - y * y


def chain_grad_ref(x, y, z):
    t = np.tanh(x * y + z)
    return 0.5 * (1 - t * t) * y  # d/dx of sum(chain)


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax_ref(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def layernorm(x, g, b):
    return nn.standardize(x, axis=-1) * g + b


def layernorm_ref(x, g, b, ct):
    """Forward and the gradients of sum(out * ct) for x, g, b (float64)."""
    n = x.shape[-1]
    mu = x.mean(-1, keepdims=True)
    inv = 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    xh = (x - mu) * inv
    dxh = ct * g
    dx = inv / n * (n * dxh - dxh.sum(-1, keepdims=True) - xh * (dxh * xh).sum(-1, keepdims=True))
    return xh * g + b, dx, (ct * xh).reshape(-1, n).sum(0), ct.reshape(-1, n).sum(0)


def attention(q, k, v):
    """Causal attention on [b, heads, seq, d]: the fused primitive (one kernel per direction)."""
    t = lambda a: jnp.transpose(a, (0, 2, 1, 3))  # noqa: E731  (JAX's [b, seq, heads, d])
    return t(nn.dot_product_attention(t(q), t(k), t(v), is_causal=True))


def attention_ref(q, k, v, ct):
    """Causal attention forward and the gradients of sum(out * ct) (float64)."""
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = softmax_ref(s)
    out = np.einsum("bhqk,bhkd->bhqd", p, v)
    dv = np.einsum("bhqk,bhqd->bhkd", p, ct)
    dp = np.einsum("bhqd,bhkd->bhqk", ct, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return out, np.einsum("bhqk,bhkd->bhqd", ds, k), np.einsum("bhqk,bhqd->bhkd", ds, q), dv


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
    logp = nn.log_softmax(h @ params[-1]["w"] + params[-1]["b"])
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def mlp_grad_ref(params, x, y):
    """Loss and parameter gradients of mlp_loss by hand (float64 backprop)."""
    hs, h = [x], x
    for layer in params[:-1]:
        h = np.maximum(h @ layer["w"] + layer["b"], 0)
        hs.append(h)
    logits = h @ params[-1]["w"] + params[-1]["b"]
    logp = log_softmax_ref(logits)
    loss = -logp[np.arange(len(y)), y].mean()
    d = np.exp(logp)
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = {"w": hs[i].T @ d, "b": d.sum(0)}
        if i:
            d = (d @ params[i]["w"].T) * (hs[i] > 0)
    return loss, grads


def block_init(rng, d, hidden):
    def w(a, b):
        return (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)

    ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
    return {"ln1": {"g": ones, "b": zeros}, "qkv": w(d, 3 * d), "proj": w(d, d),
            "ln2": {"g": ones, "b": zeros}, "fc1": w(d, hidden), "fc2": w(hidden, d)}  # fmt: skip


def block_loss(params, x, heads=4):
    b, t, d = x.shape
    h = layernorm(x, params["ln1"]["g"], params["ln1"]["b"])
    qkv = (h @ params["qkv"]).reshape(b, t, 3, heads, d // heads)
    q, k, v = (jnp.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
    o = jnp.transpose(attention(q, k, v), (0, 2, 1, 3)).reshape(b, t, d)
    x = x + o @ params["proj"]
    h = layernorm(x, params["ln2"]["g"], params["ln2"]["b"])
    return jnp.mean(jnp.square(x + nn.gelu(h @ params["fc1"]) @ params["fc2"]))


def sgd_step(loss_fn, lr=1e-3):
    def step(params, *batch):
        loss, grads = fflow.value_and_grad(loss_fn)(params, *batch)
        return fflow.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss

    return step


# -- sizes --------------------------------------------------------------------------------------


def sizes(full):
    if full:
        return dict(
            n=1 << 26,
            rows=(8192, 4096),
            attn=(8, 16, 512, 64),
            attn16=(8, 16, 512, 64),  # bf16: the tensor-core forward (head dim % 16 == 0)
            mlp=(128, 784, 512, 10),
            block=(8, 512, 1024, 16),
            epilogue=(4096, 1024, 4096),  # x [m, k] @ w [k, n] + b, gelu: an MLP's fc1
            tall=(5_000_000, 8),
            scan=1 << 24,
            sort=1 << 20,
        )
    return dict(
        n=4096,
        rows=(16, 40),
        attn=(1, 2, 8, 4),
        attn16=(1, 2, 24, 16),
        mlp=(8, 12, 16, 4),
        block=(2, 4, 16, 4),
        epilogue=(24, 16, 32),
        tall=(70, 8),
        scan=9000,  # > cuda_scan.MIN_LENGTH: the chunked device scan
        sort=2500,
    )


# -- the run --------------------------------------------------------------------------------------


class Check:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.results, self.skipped = [], []
        self.shim = args.shim
        self.device = fflow.devices("cuda_shim" if self.shim else "gpu")[0]
        self.sz = sizes(not self.shim and not args.tiny)
        self.rng = np.random.default_rng(0)
        self.cp = None if self.shim else _cupy()

    def left(self):
        return self.args.budget - (time.perf_counter() - self.t0)

    def put(self, tree):
        return fflow.device_put(tree, self.device)

    def sync(self):
        if self.cp is not None:
            self.cp.cuda.Device(self.device.id).synchronize()

    def program(self, name, fn, args, refs, tol, reference="float64 NumPy"):
        """Run a jitted `fn` on `args` (host arrays), compare with `refs`, time it."""
        jf = fflow.jit(fn)
        dev_args = self.put(args)
        t0 = time.perf_counter()
        del _LT_TAKEN[:]
        outs = jf(*dev_args)
        self.sync()
        first = time.perf_counter() - t0
        lt = list(_LT_TAKEN)  # which GEMMs ran a cuBLASLt epilogue (or why not)
        got = [np.asarray(o, np.float64) for o in fflow.tree_util.tree_leaves(outs)]
        refs = [np.asarray(r, np.float64) for r in fflow.tree_util.tree_leaves(refs)]
        err = max(_rel_err(g, r) for g, r in zip(got, refs))
        ok = len(got) == len(refs) and err <= tol and all(np.isfinite(g).all() for g in got)
        row = dict(name=name, ok=bool(ok), max_rel_err=err, tol=tol, reference=reference,
                   first_call_s=first, lt_epilogues=lt)  # fmt: skip
        reps = self.args.reps
        walls, enq = [], []
        for _ in range(reps):
            self.sync()
            t0 = time.perf_counter()
            jf(*dev_args)
            t1 = time.perf_counter()
            self.sync()
            enq.append(t1 - t0)
            walls.append(time.perf_counter() - t0)
        row.update(wall_s=float(np.median(walls)), enqueue_s=float(np.median(enq)))
        if self.cp is not None and self.args.kernels:
            row["kernels"] = _kernel_times(self.cp, jf, dev_args)
        self.results.append(row)
        return row

    def case(self, name, fn):
        if self.left() <= 0:
            self.skipped.append(name)
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a failing case is reported, the rest run
            self.results.append(dict(name=name, ok=False, error=f"{type(e).__name__}: {e}"))


_LT_TAKEN = []  # (label, cuBLASLt epilogue, path taken) of each Lt step of a first call


def _record_lt():
    from fflow.lowering import cuda_runtime

    for cls in (cuda_runtime.CupyRuntime, cuda_runtime.ShimRuntime):
        orig = cls.lt_matmul

        def lt_matmul(self, step, lhs, rhs, bias, mask=None, orig=orig):
            out = orig(self, step, lhs, rhs, bias, mask)
            _LT_TAKEN.append(f"{step.epi.label} {step.epi.name}: {step.taken}")
            return out

        cls.lt_matmul = lt_matmul


def _rel_err(got, ref):
    if got.shape != ref.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-30)
    return float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0


def _cupy():
    import cupy

    pool = cupy.cuda.MemoryPool()

    def poisoned(size):  # every allocation starts as NaN bytes, so unwritten output shows
        mem = pool.malloc(size)
        cupy.cuda.runtime.memset(mem.ptr, 0xFF, size)
        return mem

    cupy.cuda.set_allocator(poisoned)
    return cupy


def _poison_shim():
    from fflow.lowering import cuda_runtime

    empty = cuda_runtime.ShimRuntime.empty

    def poisoned(self, aval):
        out = empty(self, aval)
        out.reshape(-1).view(np.uint8)[...] = 0xFF
        return out

    cuda_runtime.ShimRuntime.empty = poisoned


def _kernel_times(cp, jf, dev_args):
    """One call with CUDA events around every kernel and GEMM: [(name, us, bytes, regs)]."""
    from fflow.lowering import cuda_runtime

    rows = []
    launch, matmul = cuda_runtime.CupyRuntime.launch, cuda_runtime.CupyRuntime.matmul
    lt_matmul = cuda_runtime.CupyRuntime.lt_matmul

    def timed(kind, call, nbytes, regs=None):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        out = call()
        b.record()
        b.synchronize()
        rows.append(dict(kernel=kind, us=cp.cuda.get_elapsed_time(a, b) * 1e3, bytes=nbytes,
                         regs=regs))  # fmt: skip
        return out

    def t_launch(self, fn, kernel, args):
        nbytes = sum(int(getattr(a, "nbytes", 0)) for a in args)
        regs = (getattr(fn, "num_regs", None), getattr(fn, "local_size_bytes", None))
        return timed(kernel.name, lambda: launch(self, fn, kernel, args), nbytes, regs)

    def t_matmul(self, eqn, lhs, rhs):
        nbytes = int(lhs.nbytes + rhs.nbytes)
        return timed("gemm " + str(eqn.outputs[0].aval), lambda: matmul(self, eqn, lhs, rhs),
                     nbytes)  # fmt: skip

    def t_lt(self, step, lhs, rhs, bias, mask=None):
        nbytes = int(lhs.nbytes + rhs.nbytes)
        return timed(f"{step.epi.label} (cuBLASLt {step.epi.name}) {step.epi.out.aval}",
                     lambda: lt_matmul(self, step, lhs, rhs, bias, mask), nbytes)  # fmt: skip

    cuda_runtime.CupyRuntime.launch, cuda_runtime.CupyRuntime.matmul = t_launch, t_matmul
    cuda_runtime.CupyRuntime.lt_matmul = t_lt
    try:
        jf(*dev_args)
    finally:
        cuda_runtime.CupyRuntime.launch, cuda_runtime.CupyRuntime.matmul = launch, matmul
        cuda_runtime.CupyRuntime.lt_matmul = lt_matmul
    return rows


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_cases(c):
    sz, rng = c.sz, c.rng
    bf16 = np.dtype(fflow.numpy.bfloat16)

    def elementwise():
        x, y, z = (f32(rng, sz["n"]) for _ in range(3))
        d = [a.astype(np.float64) for a in (x, y, z)]
        c.program("elementwise chain", chain, [x, y, z], [chain_ref(*d)], 1e-5)
        g = fflow.grad(lambda x, y, z: jnp.sum(chain(x, y, z)))
        c.program("elementwise chain grad", g, [x, y, z], [chain_grad_ref(*d)], 1e-5)

    def rows(dtype, tol):
        x = f32(rng, *sz["rows"]).astype(dtype)
        xd = x.astype(np.float64)
        label = np.dtype(dtype).name
        c.program(f"softmax {label}", lambda x: nn.softmax(x, axis=-1), [x], [softmax_ref(xd)],
                  tol)  # fmt: skip
        c.program(f"log_softmax {label}", lambda x: nn.log_softmax(x, axis=-1), [x],
                  [log_softmax_ref(xd)], tol)  # fmt: skip

    def layernorm_case():
        x, g, b, ct = f32(rng, *sz["rows"]), f32(rng, sz["rows"][1]), f32(rng, sz["rows"][1]), None
        ct = f32(rng, *sz["rows"])
        out, dx, dg, db = layernorm_ref(*(a.astype(np.float64) for a in (x, g, b, ct)))
        c.program("layernorm fwd", layernorm, [x, g, b], [out], 1e-4)

        def bwd(x, g, b, ct):
            return fflow.grad(lambda *a: jnp.sum(layernorm(*a) * ct), argnums=(0, 1, 2))(x, g, b)

        c.program("layernorm bwd", bwd, [x, g, b, ct], [dx, dg, db], 1e-4)

    def attention_case():
        q, k, v, ct = (f32(rng, *sz["attn"]) for _ in range(4))
        out, dq, dk, dv = attention_ref(*(a.astype(np.float64) for a in (q, k, v, ct)))
        c.program("attention fwd (fused, causal)", attention, [q, k, v], [out], 1e-4)

        def bwd(q, k, v, ct):
            return fflow.grad(lambda *a: jnp.sum(attention(*a) * ct), argnums=(0, 1, 2))(q, k, v)

        c.program("attention bwd (fused, causal)", bwd, [q, k, v, ct], [dq, dk, dv], 1e-4)

        # bf16 in, fp32 accumulate: the forward runs on tensor cores (mma.m16n8k16)
        q, k, v, ct = (f32(rng, *sz["attn16"]).astype(bf16) for _ in range(4))
        out, dq, dk, dv = attention_ref(*(a.astype(np.float64) for a in (q, k, v, ct)))
        c.program("attention fwd bf16 (mma, causal)", attention, [q, k, v], [out], 2e-2)
        c.program("attention bwd bf16 (mma, causal)", bwd, [q, k, v, ct], [dq, dk, dv], 3e-2)

    def mlp():
        b, *widths = sz["mlp"]
        params = mlp_init(rng, widths)
        x = f32(rng, b, widths[0])
        y = rng.integers(0, widths[-1], b).astype(np.int32)
        p64 = fflow.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        loss, grads = mlp_grad_ref(p64, x.astype(np.float64), y)
        step = fflow.value_and_grad(mlp_loss)
        # TF32 GEMMs on a GPU: products keep 10 mantissa bits
        c.program("MLP train step (value_and_grad)", step, [params, x, y], [loss, grads],
                  1e-4 if c.shim else 5e-3)  # fmt: skip

    def block_bf16():
        b, t, d, heads = sz["block"]
        params = block_init(rng, d, 4 * d)
        x = f32(rng, b, t, d)

        def loss(p, x):
            return block_loss(p, x, heads)

        fn = fflow.value_and_grad(fflow.amp(loss, "bf16"))
        ref = fflow.value_and_grad(loss)(params, x)  # f32 on the host (NumPy backend)
        c.program("transformer block step bf16 amp", fn, [params, x], ref, 6e-2,
                  reference="fflow f32 on the host")  # fmt: skip

    def epilogue():
        # GEMM + bias + gelu (tanh) in bf16: one cuBLASLt call (GELU_BIAS) against the
        # GEMM + fused epilogue kernel (FFLOW_CUBLASLT=0 while that one compiles)
        m, k, n = sz["epilogue"]
        x, w = f32(rng, m, k).astype(bf16), (f32(rng, k, n) / np.sqrt(k)).astype(bf16)
        b = f32(rng, n).astype(bf16)
        z = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
        ref = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
        c.program("GEMM+bias+gelu bf16 (cuBLASLt)", lambda x, w, b: nn.gelu(x @ w + b),
                  [x, w, b], [ref], 1.6e-2)  # fmt: skip
        os.environ["FFLOW_CUBLASLT"] = "0"
        try:
            c.program("GEMM+bias+gelu bf16 (GEMM+kernel)", lambda x, w, b: nn.gelu(x @ w + b),
                      [x, w, b], [ref], 1.6e-2)  # fmt: skip
        finally:
            del os.environ["FFLOW_CUBLASLT"]

    def tall():
        from fflow.lowering import cuda_kernels

        rows_n, n = sz["tall"]
        x = f32(rng, rows_n, n)
        cap = cuda_kernels.MAX_GRID
        if c.shim:  # tiny rows: shrink the grid cap so rows past it need the row loop
            cuda_kernels.MAX_GRID = 4
        try:
            c.program(f"row sum [{rows_n}, {n}]", lambda x: jnp.sum(x, axis=1), [x],
                      [x.astype(np.float64).sum(1)], 1e-5)  # fmt: skip
        finally:
            cuda_kernels.MAX_GRID = cap

    def cumsum():
        x = f32(rng, sz["scan"])
        c.program(f"cumsum {sz['scan']}", jnp.cumsum, [x], [np.cumsum(x.astype(np.float64))],
                  1e-4)  # fmt: skip

    def sort():
        x = f32(rng, sz["sort"])
        c.program(f"sort {sz['sort']}", jnp.sort, [x], [np.sort(x.astype(np.float64))], 0.0)

    c.case("elementwise", elementwise)
    c.case("rows f32", lambda: rows(np.float32, 1e-5))
    c.case("layernorm", layernorm_case)
    c.case("tall row reduction", tall)
    c.case("rows bf16", lambda: rows(bf16, 1.6e-2))
    c.case("MLP step", mlp)
    c.case("GEMM+bias+gelu epilogue", epilogue)
    c.case("attention", attention_case)
    c.case("cumsum", cumsum)
    c.case("sort", sort)
    c.case("transformer block bf16", block_bf16)


# -- ceilings and the other frameworks (GPU only) --------------------------------------------------


def _time(fn, sync, reps):
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def ceilings(c):
    cp, sync, out = c.cp, c.sync, {}
    a = cp.random.standard_normal(1 << 26, dtype=cp.float32)
    b = cp.empty_like(a)
    out["copy_bytes_per_s"] = 2 * a.nbytes / _time(lambda: cp.copyto(b, a), sync, c.args.reps)
    m = cp.random.standard_normal((8192, 8192), dtype=cp.float32)
    t = _time(lambda: m @ m, sync, c.args.reps)
    out["tf32_gemm_flops"] = 2 * 8192**3 / t
    return out


def others(c):
    """torch and JAX times of the same programs, where importable."""
    res = {}
    sz, rng = c.sz, c.rng
    x = f32(rng, *sz["rows"])
    q, k, v = (f32(rng, *sz["attn"]) for _ in range(3))
    try:
        import torch
        import torch.nn.functional as F

        dev, sync = "cuda", torch.cuda.synchronize
        tx = torch.tensor(x, device=dev)
        tq, tk, tv = (torch.tensor(a, device=dev, requires_grad=True) for a in (q, k, v))

        tb = [a.detach().bfloat16().requires_grad_() for a in (tq, tk, tv)]

        def attn_fb(*qkv):  # forward + backward, as fflow's grad rows run
            o = F.scaled_dot_product_attention(*qkv, is_causal=True)
            return torch.autograd.grad(o.sum(), qkv)

        res["torch"] = {
            "softmax float32": _time(lambda: torch.softmax(tx, -1), sync, c.args.reps),
            "layernorm fwd": _time(lambda: F.layer_norm(tx, tx.shape[-1:]), sync, c.args.reps),
            # keys are gpu_check's row names (the table looks them up)
            "attention bwd (fused, causal)": _time(lambda: attn_fb(tq, tk, tv), sync, c.args.reps),
            "attention fwd bf16 (mma, causal)": _time(
                lambda: F.scaled_dot_product_attention(*tb, is_causal=True), sync, c.args.reps
            ),
            "attention bwd bf16 (mma, causal)": _time(lambda: attn_fb(*tb), sync, c.args.reps),
        }
    except Exception as e:  # noqa: BLE001 - optional column
        res["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        import jax

        jx = jax.device_put(x)
        sm = jax.jit(lambda x: jax.nn.softmax(x, -1))
        res["jax"] = {"softmax float32": _time(lambda: sm(jx).block_until_ready(), lambda: None,
                                               c.args.reps)}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - optional column
        res["jax_error"] = f"{type(e).__name__}: {e}"
    return res


# -- output ------------------------------------------------------------------------------------


def table(report):
    lines = [f"{'program':<36}{'ok':>4}{'rel err':>10}{'wall ms':>10}{'enqueue ms':>11}"
             f"{'first s':>9}{'torch ms':>10}{'jax ms':>9}"]  # fmt: skip
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['name']:<36}{'NO':>4}  {r['error'][:70]}")
            continue
        t = report.get("others", {}).get("torch", {}).get(r["name"])
        j = report.get("others", {}).get("jax", {}).get(r["name"])
        lines.append(
            f"{r['name']:<36}{'ok' if r['ok'] else 'NO':>4}{r['max_rel_err']:>10.1e}"
            f"{r['wall_s'] * 1e3:>10.3f}{r['enqueue_s'] * 1e3:>11.3f}{r['first_call_s']:>9.2f}"
            + (f"{t * 1e3:>10.3f}" if t else f"{'-':>10}")
            + (f"{j * 1e3:>9.3f}" if j else f"{'-':>9}")
        )
    ceil = report.get("ceilings")
    if ceil:
        lines.append(f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
                     f"TF32 GEMM {ceil['tf32_gemm_flops'] / 1e12:.0f} TFLOP/s")  # fmt: skip
    for r in report["results"]:
        for lt in r.get("lt_epilogues") or ():
            lines.append(f"  {r['name']}: {lt}")
    if report["skipped"]:
        lines.append("skipped (budget): " + ", ".join(report["skipped"]))
    lines.append(f"{report['passed']}/{len(report['results'])} correct, {report['seconds']:.0f} s")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shim", action="store_true", help="run through the host shim (tiny sizes)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes on the GPU too")
    p.add_argument("--budget", type=float, default=280.0, help="seconds for the cases")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--json", default="gpu_check.json")
    p.add_argument("--no-kernels", dest="kernels", action="store_false",
                   help="skip the per-kernel CUDA-event timings")  # fmt: skip
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.shim else 20
    if args.shim:
        _poison_shim()
    _record_lt()
    c = Check(args)
    run_cases(c)
    report = dict(device=str(c.device), shim=c.shim, sizes=c.sz, results=c.results,
                  skipped=c.skipped, fflow_root=os.path.dirname(fflow.__file__))  # fmt: skip
    if c.cp is not None:
        for key, fn in (("ceilings", ceilings), ("others", others)):
            try:
                report[key] = fn(c)
            except Exception as e:  # noqa: BLE001 - report and go on
                report[key + "_error"] = f"{type(e).__name__}: {e}"
    report["passed"] = sum(1 for r in c.results if r.get("ok"))
    report["seconds"] = time.perf_counter() - c.t0
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(table(report))
    return 0 if report["passed"] == len(c.results) else 1


if __name__ == "__main__":
    sys.exit(main())

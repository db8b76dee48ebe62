"""Run by tests/test_shard_mpi.py under `python -m fflow.launch -n N` and on simulated
devices; prints the numbers both runtimes must agree on as JSON (rank 0 only).

One launch runs many checks: every boxing pair on a 1-D placement (and on a 2x2
mesh at 4 ranks) from per-rank data (partial values differ per device, so every
reduction really adds), 16-bit and integer dtypes, a data-parallel and a
tensor-parallel training step (jitted), `make_global_array` and its mismatch error,
and the native MPI reduction mode (keys "native_*").
"""

import hashlib
import json
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import threads
from fflow.sharding import B, P, S, local_box, partial_max, partial_min, runtime

try:
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover
    bfloat16 = None


# the pairs boxed as one collective on mesh axis 1 of a dim mesh axis 0 already splits
NESTED = [
    ((S(0), P), (S(0), S(0))),
    ((S(0), S(0)), (S(0), B)),
    ((S(0), B), (S(0), S(0))),
    ((S(0), S(1)), (S(0), S(0))),
]


def per_device(x, nd, pl):
    """Device i's shard of the logical `x` under `nd`; partial values differ per device."""

    def shard(i):
        box = local_box(x.shape, nd, pl.hierarchy, pl.coords(i))
        piece = np.array(x[tuple(slice(a, b) for a, b in box)])
        coords = pl.coords(i)
        # distinct partial values per position on the partial mesh axes (devices on a
        # broadcast axis must hold the same value)
        k = 0
        for s, c, h in zip(nd, coords, pl.hierarchy):
            if s.is_partial():
                k = k * h + c
        if any(s.is_partial() for s in nd) and piece.dtype.kind == "f":
            scale = np.asarray((k + 1) / (pl.size + 1), piece.dtype)
            piece = (piece * scale + np.asarray(k * 0.25, piece.dtype)).astype(piece.dtype)
        elif any(s.is_partial() for s in nd):
            piece = piece + k
        return piece

    return shard


def boxed(x, pl, src, dst):
    g = fflow.make_global_array(per_device(x, src, pl), pl, src)
    return g.to_global(sbp=dst)


def as_list(v):
    a = np.asarray(v)
    return (a.astype(np.float32) if a.dtype.name in ("bfloat16", "float16") else a).tolist()


def main(n, fail_rank=None):
    rt = runtime()
    mpi = hasattr(rt, "world")
    if fail_rank is not None and rt.rank == fail_rank:
        raise RuntimeError(f"rank {fail_rank} failed on purpose")
    pl = fflow.placement("cpu", list(range(n)))
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.normal(size=s).astype(np.float32) for s in [(10, 16), (16, 24), (24, 16)])
    out = {}
    from fflow import mpi_ops  # defines mpi_allgather_bytes (mpi4py loads lazily)

    ag_limit = fflow.config.read("mpi_allgather_bytes")  # the default, restored after changes

    def mlp(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2

    out["megatron"] = fflow.shard(mlp, pl, in_sbp=(B, S(1), S(0)))(x, w1, w2)

    def loss(w1, w2, x):
        return jnp.mean(mlp(x, w1, w2) ** 2)

    g = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, B, S(0))), argnums=(0, 1))(w1, w2, x)
    out["dp_grad_w1"], out["dp_grad_w2"] = g
    gx = fflow.to_global(x, pl, S(0))
    out["eager"] = jnp.sum(jnp.exp(gx) * 2.0, axis=0).to_global(sbp=B)

    # every 1-D boxing pair, uneven splits included (10 x 6 over 4 devices)
    sbps = [S(0), S(1), B, P, partial_max, partial_min]
    x6 = rng.normal(size=(10, 6)).astype(np.float32)
    for src in sbps:
        for dst in sbps:
            out[f"box_{src}_{dst}"] = boxed(x6, pl, (src,), (dst,))
    for dt in [bfloat16, np.float16, np.int32]:
        if dt is None:
            continue
        xd = (x6 * 4).astype(dt)
        for src, dst in [(P, B), (P, S(0)), (S(0), B), (S(0), S(1)), (partial_max, S(1))]:
            out[f"dtype_{np.dtype(dt).name}_{src}_{dst}"] = boxed(xd, pl, (src,), (dst,))

    # cache-hit calls borrow NumPy inputs; a later write to them must not show through
    ident = fflow.shard(lambda a, b: (a, b), pl, in_sbp=(B, S(0)), out_sbp=(B, S(0)))
    xa, xs = x.copy(), x.copy()
    for _ in range(2):
        kept = ident(xa, xs)
    xa[:] = 0.0
    xs[:] = 0.0
    out["borrowed_B"], out["borrowed_S0"] = kept
    for k in kept:
        np.testing.assert_array_equal(np.asarray(k), x)

    # per-rank data: make_global_array round trip and its mismatch error
    pieces = per_device(x, (S(0),), pl)
    mg = fflow.make_global_array(pieces, pl, S(0))
    out["make_global"] = mg
    out["make_global_sum"] = fflow.shard(lambda a: jnp.sum(a, axis=0), pl)(mg)
    try:
        bad = n - 1
        fflow.make_global_array(
            lambda i: np.zeros((3, 2 + (i == bad)), np.float32), pl, S(0)
        ) if mpi else fflow.make_global_array(
            [np.zeros((3, 2 + (i == bad)), np.float32) for i in range(n)], pl, S(0)
        )
        mismatch = "no error"
    except Exception as e:  # noqa: BLE001
        mismatch = str(e).split(";")[0].replace("device", "rank")
    out_text = {"mismatch": mismatch}

    # a data-parallel training step, jitted, three steps
    def sgd_step(w1, w2, x):
        l, (g1, g2) = fflow.value_and_grad(loss, argnums=(0, 1))(w1, w2, x)
        return l, w1 - 0.1 * g1, w2 - 0.1 * g2

    dp = fflow.jit(fflow.shard(sgd_step, pl, in_sbp=(B, B, S(0)), out_sbp=(B, B, B)))
    xb = fflow.make_global_array(per_device(x, (S(0),), pl), pl, S(0))
    a, b = w1, w2
    for k in range(3):
        l, a, b = dp(a, b, xb)
        out[f"dp_step{k}_loss"] = l
    out["dp_w1"], out["dp_w2"] = a, b

    # tensor parallel (1-D) / data x tensor parallel (2x2 mesh) training step
    if n == 4:
        mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
        tp_sbps = ((B, S(1)), (B, S(0)), (S(0), B))
        tp = fflow.shard(sgd_step, mesh, in_sbp=tp_sbps, out_sbp=((B, B),) + tp_sbps[:2])
        f2 = fflow.shard(mlp, mesh, in_sbp=((S(0), B), (B, S(1)), (B, S(0))))
        out["mesh"] = f2(x, w1, w2)
        out["mesh_box"] = fflow.to_global(x, mesh, (S(0), S(1))).to_global(sbp=(S(1), S(0)))
        sbps2 = [
            (S(0), S(1)),
            (S(1), S(0)),
            (S(0), S(0)),
            (B, S(1)),
            (S(0), B),
            (P, B),
            (B, P),
            (P, S(1)),
            (P, P),
            (B, B),
            (S(1), partial_max),
        ]
        for src in sbps2:
            for dst in sbps2:
                out[f"mesh_{src}_{dst}"] = boxed(x6, mesh, src, dst)
        # nested splits (dim 0 even over the mesh): one reduce-scatter / all-gather /
        # slice on mesh axis 1 inside axis 0's pieces; total bytes sent per pair
        x8 = np.random.default_rng(8).normal(size=(8, 6)).astype(np.float32)
        out_text["nested_x"] = x8.tolist()
        for src, dst in NESTED:
            before = rt.bytes_moved
            out[f"nested_{src}_{dst}"] = boxed(x8, mesh, src, dst)
            sent = rt.bytes_moved - before
            out_text[f"nested_bytes_{src}_{dst}"] = rt.comm.allreduce(sent) if mpi else sent
    else:
        tp = fflow.shard(sgd_step, pl, in_sbp=(S(1), S(0), B), out_sbp=(B, S(1), S(0)))
    a, b = w1, w2
    for k in range(2):
        l, a, b = tp(a, b, x)
        out[f"tp_step{k}_loss"] = l
    out["tp_w1"], out["tp_w2"] = a, b

    # all_to_all / all_gather along inner axes of a 3-D value, uneven pieces
    x3 = np.arange(5 * 7 * 6, dtype=np.float32).reshape(5, 7, 6)
    for src, dst in [(0, 2), (2, 1), (1, 0)]:
        out[f"a2a3d_{src}_{dst}"] = boxed(x3, pl, (S(src),), (S(dst),))
        out[f"ag3d_{src}"] = boxed(x3, pl, (S(src),), (B,))

    # gradient buckets: none, one per gradient, and all in one (the default) change no number
    for name, mb in [("off", 0.0), ("tiny", 0.0001), ("default", 25.0), ("nooverlap", 25.0)]:
        fflow.config.update("grad_bucket_mb", mb)
        fflow.config.update("grad_overlap", name != "nooverlap")  # waited when started
        gb = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, B, S(0))), argnums=(0, 1))(w1, w2, x)
        out[f"bucket_{name}_w1"], out[f"bucket_{name}_w2"] = gb
    fflow.config.update("grad_bucket_mb", 25.0)
    fflow.config.update("grad_overlap", True)
    # a bucket over the one-all-gather size (set to 64 KB x ranks here): the chunked path
    mpi and fflow.config.update("mpi_allgather_bytes", 1 << 16)
    rb = np.random.default_rng(7)
    wbig = rb.normal(size=(64, 300)).astype(np.float32)
    xbig = rb.normal(size=(2 * n, 64)).astype(np.float32)
    vbig = rb.normal(size=(300,)).astype(np.float32)

    def big_loss(w, x, v):
        return jnp.sum(jnp.tanh(x @ w) * v)

    big = fflow.shard(big_loss, pl, in_sbp=(B, S(0), B))
    for name, mb in [("off", 0.0), ("default", 25.0)]:
        fflow.config.update("grad_bucket_mb", mb)
        out[f"bucket_big_{name}"], _, out[f"bucket_big_v_{name}"] = fflow.grad(
            big, argnums=(0, 1, 2)
        )(wbig, xbig, vbig)
    fflow.config.update("grad_bucket_mb", 25.0)
    mpi and fflow.config.update("mpi_allgather_bytes", ag_limit)

    # result buffers are reused only once nothing refers to them: kept results stay
    # intact while later calls' dropped results share one buffer
    red = fflow.shard(lambda a: a, pl, in_sbp=P, out_sbp=B)
    ga = fflow.make_global_array(per_device(x, (P,), pl), pl, P)
    kept = [red(ga) for _ in range(3)]
    twice = fflow.make_global_array(per_device(x * 2, (P,), pl), pl, P)
    for _ in range(3):
        last = red(twice)
    out["reuse_0"], out["reuse_1"], out["reuse_2"], out["reuse_last"] = *kept, last

    # cache hits of a one-collective program run its planned all-reduce (runtime_mpi's
    # runner, mpi_ops.planned): the one-all-gather path, the two-step path and MPI's own
    # reduction, three calls each on new data with every result kept, the mode switched
    # between programs (each mode keeps its own plan)
    rp = np.random.default_rng(13)
    modes = [("rows", ag_limit, True), ("twostep", 1 << 8, True), ("mpi", ag_limit, False)]
    for label, small, det in modes:
        mpi and fflow.config.update("mpi_allgather_bytes", small)
        mpi and fflow.config.update("mpi_deterministic", det)
        for dt, src in [(np.float32, P), (np.float32, partial_max), (np.int32, P), (np.float64, P)]:
            for shape in [(9, 7), (8, 8)]:  # uneven and even chunks
                f = fflow.shard(lambda a: a, pl, in_sbp=src, out_sbp=B)
                xs = [(rp.normal(size=shape) * 50).astype(dt) for _ in range(3)]
                res = [f(fflow.make_global_array(per_device(v, (src,), pl), pl, src)) for v in xs]
                for k, r in enumerate(res):
                    tag = "native_" if not det else ""
                    out[f"{tag}planned_{label}_{np.dtype(dt).name}_{src}_{shape}_{k}"] = r
    mpi and fflow.config.update("mpi_allgather_bytes", ag_limit)
    mpi and fflow.config.update("mpi_deterministic", True)

    # one program across config changes: each mode runs its own plan (det, native, the
    # two-step limit, det again), every call after the program's first one planned (the
    # first plan is native's: a stale plan would give its bits to the later det calls)
    f = fflow.shard(lambda a: a, pl, in_sbp=P, out_sbp=B)
    gm = fflow.make_global_array(
        per_device(rp.normal(size=(8, 8)).astype(np.float32), (P,), pl), pl, P
    )
    f(gm)
    for k, (small, det) in enumerate(
        [(ag_limit, False), (ag_limit, True), (1 << 8, True), (ag_limit, True)]
    ):
        mpi and fflow.config.update("mpi_allgather_bytes", small)
        mpi and fflow.config.update("mpi_deterministic", det)
        out[("" if det else "native_") + f"switch_{k}"] = f(gm)
    mpi and fflow.config.update("mpi_allgather_bytes", ag_limit)
    mpi and fflow.config.update("mpi_deterministic", True)

    # a sharded call's last-hit memo (transforms/shard.py `_last`, checked by identity):
    # arrays with the very sharding object of the last hit but another shape or dtype
    # run their own program, and the first array again its own
    rm = np.random.default_rng(23)
    f = fflow.shard(lambda a: a, pl, in_sbp=P, out_sbp=B)
    xs = [rm.normal(size=s).astype(d) for s, d in [((6, 4), "f4"), ((8, 4), "f4"), ((6, 4), "f8")]]
    gs = [fflow.make_global_array(per_device(v, (P,), pl), pl, P) for v in xs]
    for g in gs[1:]:
        g._sharding = gs[0]._sharding  # equal shardings, one object
    f2 = fflow.shard(lambda a, b: b, pl, in_sbp=(P, P), out_sbp=B)  # (the second changes)
    for k, g in enumerate([gs[0]] * 3 + gs[1:] + [gs[0]]):
        for tag, r in [("", f(g)), ("2", f2(gs[0], g))]:
            r = np.asarray(r)
            out[f"memo{tag}_{k}"] = r
            out_text[f"memo{tag}_{k}_type"] = f"{r.dtype} {r.shape}"

    # the default one-all-gather limit (mpi_allgather_bytes, value bytes x ranks) at
    # its edge: the largest float32 value on that path and the next even size (the
    # two-step path), sum and max, ten calls (from the second on planned: both paths
    # timed in turn, then the one every rank agreed on, mpi_ops._tuned); the results'
    # bytes (MPI == simulated, every call) and their distance to NumPy's reduction
    edge = ag_limit // (4 * n)
    rg = np.random.default_rng(17)
    for src in (P, partial_max):
        f = fflow.shard(lambda a: a, pl, in_sbp=src, out_sbp=B)
        for size in (edge, edge + n):
            parts = per_device(rg.normal(size=size).astype(np.float32), (src,), pl)
            rows = np.stack([parts(i) for i in range(n)])
            ref = rows.max(0) if src == partial_max else rows.sum(0)
            g = fflow.make_global_array(parts, pl, src)
            got = [np.asarray(f(g)) for _ in range(10)]
            digests = sorted({hashlib.sha256(r.tobytes()).hexdigest() for r in got})
            out_text[f"edge_{src}_{size - edge}"] = " ".join(digests)
            out[f"edge_err_{src}_{size - edge}"] = max(float(np.abs(r - ref).max()) for r in got)

    # all-reduces over the one-all-gather size: all-to-all, ordered reduction, then an
    # in-place all-gather (even chunks) or one into a second buffer (uneven); sums of
    # float32 at 2 ranks and of integers go to MPI's reduction (the same bits)
    rl = np.random.default_rng(11)
    mpi and fflow.config.update("mpi_allgather_bytes", 1 << 16)  # (160, 64) f32: two-step
    for shape in [(160, 64), (161, 63)]:
        xl = rl.normal(size=shape).astype(np.float32)
        for src in (P, partial_max, partial_min):
            out[f"large_{shape[1]}_{src}"] = boxed(xl, pl, (src,), (B,))
        out[f"large_{shape[1]}_int"] = boxed((xl * 100).astype(np.int32), pl, (P,), (B,))
        out[f"large_{shape[1]}_f64"] = boxed(xl.astype(np.float64), pl, (P,), (B,))
    mpi and fflow.config.update("mpi_allgather_bytes", ag_limit)
    # values from mpi_large_bytes on: the two-step path in pieces of PIECE_BYTES, in both
    # modes (float sums of 2 ranks too); sizes that are not multiples of the piece or p
    if mpi:
        fflow.config.update("mpi_large_bytes", 1 << 12)
        mpi_ops.PIECE_BYTES, piece = 1 << 12, mpi_ops.PIECE_BYTES  # 1024 float32s
        from fflow import mpi_shm  # (its window's pieces: 4 KB, the smallest window)

        mpi_shm.PIECE_BYTES, shm_piece = 1 << 12, mpi_shm.PIECE_BYTES
    for det in (True, False):
        mpi and fflow.config.update("mpi_deterministic", det)
        for shape in [(160, 64), (161, 63), (7, 1023)]:
            xl = rl.normal(size=shape).astype(np.float32)
            for src in (P, partial_max):
                out[f"pieces_{det}_{shape}_{src}"] = boxed(xl, pl, (src,), (B,))
            out[f"pieces_{det}_{shape}_int"] = boxed((xl * 100).astype(np.int32), pl, (P,), (B,))
            out[f"pieces_{det}_{shape}_bf16"] = boxed(xl.astype(bfloat16), pl, (P,), (B,))
    if mpi:
        fflow.config.update("mpi_deterministic", True)
        fflow.config.update("mpi_large_bytes", 2 << 20)
        mpi_ops.PIECE_BYTES, mpi_shm.PIECE_BYTES = piece, shm_piece

    # the native MPI reductions (simulated: the same computation in group order)
    if mpi:
        fflow.config.update("mpi_deterministic", False)
    for src, dst in [(P, B), (P, S(0)), (partial_max, B), (P, S(1))]:
        out[f"native_box_{src}_{dst}"] = boxed(x6, pl, (src,), (dst,))
    out["native_box_bf16"] = boxed((x6 * 4).astype(bfloat16), pl, (P,), (B,))
    l, a, b = dp(w1, w2, xb)
    out["native_dp_loss"], out["native_dp_w1"] = l, a
    # native buckets: one member (out of place) and several (reduced in place)
    for name, mb in [("tiny", 0.0001), ("default", 25.0)]:
        fflow.config.update("grad_bucket_mb", mb)
        gb = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, B, S(0))), argnums=(0, 1))(w1, w2, x)
        out[f"native_bucket_{name}_w1"], out[f"native_bucket_{name}_w2"] = gb
    fflow.config.update("grad_bucket_mb", 25.0)
    if mpi:
        fflow.config.update("mpi_deterministic", True)

    result = {k: as_list(v) for k, v in out.items()}
    result.update(out_text)
    sent = rt.bytes_moved
    if mpi:
        sent = rt.comm.allreduce(sent)
    result["bytes"] = int(sent)
    result["cores"] = threads.available_cores()  # each rank's share of the node's cores
    if rt.rank == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)

"""shard planner: transformer training steps (pre-LN attention + GELU MLP, Adam) with the
weights annotated Megatron-style and everything else left to the planner, against the
hand Megatron plan (every activation forced with with_sbp) and, where installed, JAX's
partitioner on the same program (collectives read from the compiled HLO).

Columns: bytes of the free plan, of the kept plan (`shard(..., keep_in_sbp=)`: the
annotations binding) and of the hand plan (communication summed over devices),
modelled step time per device (profile: H200 NVLink unless --profile cpu),
all-reduces of a (b, t, d) activation (forward+backward), matmuls run replicated,
whether the kept plan meets the Megatron targets (or what it misses), planning
seconds of f.plan (wall, and
the process's CPU seconds, which a loaded machine disturbs less; the arguments are
fflow arrays before the clock starts, and conversion plans are cached per process,
so a row after rows of the same shapes plans faster than a fresh process), and JAX's
collectives (jit with the same in_shardings, `--only fflow` to skip): HLO ops per kind,
with the values they carry where XLA combined several into one op (fflow counts
values), and their bytes in the same convention (benchmarks/jax_hlo.py).

Rows: --layers=1,24 --sizes=8.512.1024 --meshes=4,2x4 --tables=megatron,sequence,memory
pick a part of the grid (--quick / --tiny for the small grids).
"""

import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import numpy as np  # noqa: E402
from common import load_jax, parse_args  # noqa: E402
from fflow.transforms.shard_cost import work_share  # noqa: E402
from fflow.transforms.shard_memory import peak_memory  # noqa: E402
from jax_hlo import counts_text, hlo_collectives  # noqa: E402

import fflow  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import planner_models as pm  # noqa: E402

FULL = dict(
    layers=(1, 4, 12, 24), sizes=((2, 16, 64), (4, 128, 256), (8, 512, 512), (8, 512, 1024))
)
FULL["meshes"] = ((4,), (8,), (2, 2), (2, 4))
QUICK = dict(layers=(1, 4), sizes=((2, 16, 64), (4, 128, 256)), meshes=((4,), (2, 2)))
TINY = dict(layers=(1,), sizes=((2, 16, 64),), meshes=((4,),))


def placement(mesh):
    n = int(np.prod(mesh))
    ranks = list(range(n)) if len(mesh) == 1 else np.arange(n).reshape(mesh).tolist()
    return fflow.placement("cpu", ranks)


def measure(sp, act_shape):
    """(all-reduces of an act_shape activation, other collectives of one, replicated
    matmuls); all-reduces as (forward, backward): the forward pass ends at the
    equation that makes the loss (the first output)."""
    h = sp.placement.hierarchy
    loss = sp.exec_program.outvars[0]
    end = next((k for k, e in enumerate(sp.exec_program.eqns) if loss in e.outputs), -1)
    fwd = bwd = other = 0
    for k, v, _, _, bp in sp.boxings():
        if not bp.bytes or v.aval.shape != act_shape:
            continue
        colls = bp.collectives()
        n = colls.count("all_reduce")
        other += len(colls) - n
        if k != "out" and k <= end:
            fwd += n
        else:
            bwd += n
    replicated = sum(
        1
        for e, sig in zip(sp.exec_program.eqns, sp.plan.eqn_sigs)
        if e.primitive.name == "dot_general" and work_share(e, sig, h) == 1.0
    )
    return (fwd, bwd), other, replicated


def megatron_verdict(n_layers, kept, hand, ar, other, rep):
    """Whether the kept plan meets issue 11's Megatron targets, and what misses."""
    miss = []
    if kept.bytes > 1.05 * hand.bytes:
        miss.append(f"bytes {kept.bytes / hand.bytes:.2f}x hand")
    if ar[0] != 2 * n_layers:
        miss.append(f"{ar[0]} forward all-reduces, want {2 * n_layers}")
    if not 2 * n_layers - 1 <= ar[1] <= 2 * n_layers:  # (the batch needs no gradient)
        miss.append(f"{ar[1]} backward all-reduces, want {2 * n_layers - 1}-{2 * n_layers}")
    if other:
        miss.append(f"{other} other activation collectives")
    if rep:
        miss.append(f"{rep} replicated matmuls")
    return "yes" if not miss else "NO: " + ", ".join(miss)


# ----------------------------------------------------------------------------
# JAX's partitioner on the same program


def jax_collectives(jax, mesh, n_layers, b, t, d, heads):
    """(counts by collective, bytes by our cost convention) of JAX's compiled step."""
    import types

    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as Ps

    lib = types.SimpleNamespace(
        np=jax.numpy,
        rsqrt=jax.lax.rsqrt,
        softmax=jax.nn.softmax,
        gelu=jax.nn.gelu,
        value_and_grad=jax.value_and_grad,
    )
    n = int(np.prod(mesh))
    devs = np.array(jax.devices()[:n]).reshape(mesh)
    axes = ("model",) if len(mesh) == 1 else ("data", "model")
    jm = Mesh(devs, axes)
    spec = {"wq": Ps(None, "model"), "wk": Ps(None, "model"), "wv": Ps(None, "model")}
    spec.update({"w1": Ps(None, "model"), "wo": Ps("model", None), "w2": Ps("model", None)})
    params = pm.init(n_layers, d)
    x, y = pm.data(b, t, d)
    opt = pm.adam_init(params)

    def sh(p):
        return NamedSharding(jm, p)

    w_sh = [{k: sh(spec.get(k, Ps())) for k in p} for p in params]
    data_sh = sh(Ps("data") if len(mesh) == 2 else Ps())
    in_sh = (w_sh, [(w, w) for w in w_sh], data_sh, data_sh)
    out_sh = (sh(Ps()), w_sh, [(w, w) for w in w_sh])

    def step(params, opt, x, y):
        return pm.train_step(params, opt, x, y, heads, None, lib=lib)

    fn = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh)
    return hlo_collectives(fn.lower(params, opt, x, y).compile().as_text(), n)


def _select(grid, argv):
    """Rows picked by --layers=1,24 --sizes=8.512.1024,2.16.64 --meshes=4,2x4 (each
    optional; the grid's values otherwise). Returns (grid, the other arguments)."""
    grid, rest = dict(grid), []
    for a in argv:
        name, _, value = a.partition("=")
        if name == "--layers":
            grid["layers"] = tuple(int(x) for x in value.split(","))
        elif name == "--sizes":
            grid["sizes"] = tuple(tuple(int(y) for y in x.split(".")) for x in value.split(","))
        elif name == "--meshes":
            grid["meshes"] = tuple(tuple(int(y) for y in x.split("x")) for x in value.split(","))
        elif name == "--tables":
            grid["tables"] = value.split(",")
        else:
            rest.append(a)
    return grid, rest


def as_arrays(tree):
    """The arguments as fflow arrays, converted before the planning clock starts (a
    NumPy argument is copied on entry: 7 s of the 24-layer d=1024 row); a NumPy array
    that appears twice (Adam's zero m and v) is converted once."""
    seen = {}

    def conv(x):
        if id(x) not in seen:
            seen[id(x)] = fflow.numpy.asarray(x)
        return seen[id(x)]

    return fflow.tree_util.tree_map(conv, tree)


def main():
    # --quick (1 and 4 layers, two sizes), --profile=cpu and the row selection of
    # _select on top of the common flags
    quick = "--quick" in sys.argv
    prof = fflow.sharding.CPU if "--profile=cpu" in sys.argv else fflow.sharding.H200
    argv = [a for a in sys.argv[1:] if a not in ("--quick", "--profile=cpu")]
    grid, argv = _select(TINY if "--tiny" in argv else QUICK if quick else FULL, argv)
    sys.argv = sys.argv[:1] + argv
    args = parse_args(__doc__)
    tables = grid.get("tables", ("megatron", "sequence", "memory"))
    if "megatron" in tables:
        megatron_table(grid, prof, args)
    if "sequence" in tables:
        sequence_table(grid, prof)
    if "memory" in tables:
        memory_table(grid, prof)


def megatron_table(grid, prof, args):
    """Per row three plans of the same step: free (the weights' annotations are where
    they start; the planner may move them), kept (`keep_in_sbp`: the weights and their
    Adam state are read as annotated, splits propagate from them) and hand (every
    forward activation forced by with_sbp, the rest searched). All-reduces of the
    (b, t, d) activation as forward+backward; Megatron's: 2L forward, 2L backward
    (2L-1 where the first block's input gradient is not needed)."""
    jax = load_jax() if (args.only is None or "jax" in args.only) else None
    print(f"## shard planner: Megatron-annotated transformer training steps ({prof.name})\n")
    print(
        "| workload | mesh | eqns | free bytes | kept bytes | hand bytes | free / kept ratio "
        "| free time | kept time | hand time | act. all-reduces free / kept / hand "
        "| replicated matmuls free / kept | kept meets Megatron targets "
        "| planning s free, kept (CPU s) | JAX collectives | JAX bytes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mesh in grid["meshes"]:
        pl = placement(mesh)
        heads = max(4, mesh[-1])
        for n_layers in grid["layers"]:
            for b, t, d in grid["sizes"]:
                if d % (heads * mesh[-1]) or (len(mesh) == 2 and b % mesh[0]):
                    continue
                plans, secs = {}, []
                for name, kw in (("free", {}), ("kept", {"keep": True}), ("hand", {"hints": True})):
                    f, fargs = pm.megatron_sharded(pl, n_layers, b, t, d, heads, profile=prof, **kw)
                    fargs = as_arrays(fargs)
                    t0, c0 = time.perf_counter(), time.process_time()
                    plans[name] = f.plan(*fargs)
                    secs.append((time.perf_counter() - t0, time.process_time() - c0))
                sp, sk, sh = plans["free"], plans["kept"], plans["hand"]
                got = {n: measure(p, (b, t, d)) for n, p in plans.items()}
                ar = " / ".join(f"{g[0][0]}+{g[0][1]}" for g in got.values())
                verdict = megatron_verdict(n_layers, sk, sh, *got["kept"])
                jc, jb = "n/a", "n/a"
                if jax is not None:
                    try:
                        counts, jb = jax_collectives(jax, mesh, n_layers, b, t, d, heads)
                        jc = counts_text(counts) or "-"
                    except Exception as e:  # noqa: BLE001  (a JAX version without this API)
                        jc = f"error: {type(e).__name__}"
                name = f"{n_layers} layers, b,t,d={b},{t},{d}"
                hb = max(sh.bytes, 1)
                print(
                    f"| {name} | {'x'.join(map(str, mesh))} | {len(sp.exec_program.eqns)} "
                    f"| {sp.bytes / 1e6:.2f} MB | {sk.bytes / 1e6:.2f} MB "
                    f"| {sh.bytes / 1e6:.2f} MB "
                    f"| {sp.bytes / hb:.2f} / {sk.bytes / hb:.2f} "
                    f"| {sp.plan.time * 1e3:.3f} ms | {sk.plan.time * 1e3:.3f} ms "
                    f"| {sh.plan.time * 1e3:.3f} ms | {ar} "
                    f"| {got['free'][2]} / {got['kept'][2]} | {verdict} "
                    f"| {secs[0][0]:.2f}, {secs[1][0]:.2f} ({secs[0][1]:.2f}, {secs[1][1]:.2f}) "
                    f"| {jc} | {jb if isinstance(jb, str) else f'{jb / 1e6:.2f} MB'} |",
                    flush=True,
                )


def sequence_table(grid, prof):
    """Sequence-dominated shapes (b=1, long t) on the 1-D meshes: the planner's plan from
    the weight annotations next to the hand Megatron plan and the hand plan with
    sequence parallelism (planner_models.sequence: block outputs reduce-scattered along
    t, layernorms and residuals split, all-gathered before the next column matmul)."""
    print(f"\n## shard planner: sequence-dominated shapes ({prof.name})\n")
    print(
        "| workload | devices | plan bytes | plan time | Megatron bytes | Megatron time "
        "| seq.-parallel bytes | seq.-parallel time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    shapes = ((1, 2048, 256),) if len(grid["sizes"]) < 3 else ((1, 2048, 256), (1, 8192, 512))
    for mesh in [m for m in grid["meshes"] if len(m) == 1]:
        pl = placement(mesh)
        heads = max(4, mesh[0])
        for n_layers in grid["layers"][:2]:
            for b, t, d in shapes:
                row = []
                for hints in (False, True, "sequence"):
                    f, fargs = pm.megatron_sharded(
                        pl, n_layers, b, t, d, heads, hints=hints, profile=prof
                    )
                    sp = f.plan(*fargs)
                    row.append(f"{sp.bytes / 1e6:.2f} MB | {sp.plan.time * 1e3:.3f} ms")
                print(
                    f"| {n_layers} layers, b,t,d={b},{t},{d} | {mesh[0]} | "
                    + " | ".join(row)
                    + " |",
                    flush=True,
                )


def memory_table(grid, prof):
    """Batch annotation only (split over every device: S(0) on a 1-D mesh, (S(0), S(0))
    on a 2-D one), then budgets below that plan's peak: 10% below the data-parallel
    peak (the planner stores the optimizer state split: ZeRO-1, its gradients
    reduce-scatter into it: ZeRO-2), then 5% below that plan's peak (parameters split
    too; FSDP when it must: each parameter all-gathered before its forward use and
    again before its backward use, the gathered copy freed after).

    Hand references, over all p devices of the mesh (DeepSpeed ZeRO-2 / ZeRO-3 and
    PyTorch FSDP FULL_SHARD over the world; in fflow: `in_sbp` of the state
    (S(0),) * mesh.ndim), bytes summed over devices, plus the loss's all-reduce:
    ZeRO-2 reduce-scatters every gradient and all-gathers every updated parameter
    once, 2 (p-1) bytes per parameter byte (as data parallelism's all-reduce); FSDP
    (ZeRO-3) all-gathers every parameter for the forward and again for the backward
    and reduce-scatters every gradient, 3 (p-1) per parameter byte. On a 2-D mesh
    this is the reference rather than HSDP (PyTorch HYBRID_SHARD: parameters and
    state split over mesh axis 1, replicated over axis 0): on 2x2 HSDP's parameters
    and Adam state take N/2 + 2N/2 bytes per device (N: parameter bytes), as many as
    ZeRO-2's N + 2N/4, so it is no answer to a budget below ZeRO-2's peak; on 2x4
    (N/4 + 2N/4) it may fit, and moves 20N against full-mesh FSDP's 21N, so a row at
    ratio r is at most 1.05 r of HSDP.

    Planning s: wall (CPU) seconds of `f.plan` under the budget, the whole storage
    ladder included (each rung is one plan)."""
    from fflow.sharding import S

    print(f"\n## shard planner: batch annotation only, under a memory budget ({prof.name})\n")
    print(
        "| workload | mesh | DP peak | DP bytes | budget | plan peak | plan bytes "
        "| hand bytes (ZeRO-2, then FSDP) | ratio | storage | planning s (CPU s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rungs = ("as given", "optimizer state split", "parameters split too")
    for mesh in grid["meshes"]:
        pl = placement(mesh)
        p = int(np.prod(mesh))
        data = (S(0),) * len(mesh)
        for n_layers in grid["layers"]:
            for b, t, d in grid["sizes"]:
                b = p * max(1, b // p)  # a batch every device gets a share of
                params = pm.init(n_layers, d)
                x, y = pm.data(b, t, d)
                args = as_arrays((params, pm.adam_init(params), x, y))
                fn = pm.step_fn(max(4, p))
                in_sbp = (None, None, data, data)
                dp = fflow.shard(fn, pl, in_sbp=in_sbp, profile=prof).plan(*args)
                peak = peak_memory(dp.plan.problem, dp.plan.sig_index)[0]
                param_bytes = sum(a.nbytes for layer in params for a in layer.values())
                loss_ar = 2 * (p - 1) * 4
                budget = int(0.9 * peak)
                zero2, fsdp = 2 * (p - 1) * param_bytes, 3 * (p - 1) * param_bytes
                for hand in (zero2 + loss_ar, fsdp + loss_ar):
                    f = fflow.shard(fn, pl, in_sbp=in_sbp, profile=prof, memory_limit=budget)
                    t0, c0 = time.perf_counter(), time.process_time()
                    try:
                        sp = f.plan(*args)
                        got = (
                            f"{sp.peak_memory / 1e6:.2f} MB | {sp.bytes / 1e6:.2f} MB "
                            f"| {hand / 1e6:.2f} MB | {sp.bytes / hand:.2f} "
                            f"| {rungs[sp.storage_rung]}"
                            + (", gathered per use (FSDP)" if sp.gathered_per_use else "")
                        )
                    except ValueError:
                        sp, got = None, f"no plan fits | - | {hand / 1e6:.2f} MB | - | -"
                    spent = time.perf_counter() - t0, time.process_time() - c0
                    print(
                        f"| {n_layers} layers, b,t,d={b},{t},{d} | {'x'.join(map(str, mesh))} "
                        f"| {peak / 1e6:.2f} MB | {dp.bytes / 1e6:.2f} MB | {budget / 1e6:.2f} MB "
                        f"| {got} | {spent[0]:.2f} ({spent[1]:.2f}) |",
                        flush=True,
                    )
                    if sp is None:
                        break
                    budget = int(0.95 * sp.peak_memory)


if __name__ == "__main__":
    main()

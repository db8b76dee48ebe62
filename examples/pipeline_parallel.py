"""Pipeline parallelism: an MLP cut into 4 stages on 4 devices, trained with 1F1B.

    python examples/pipeline_parallel.py                       # 4 simulated devices
    python -m fflow.launch -n 4 examples/pipeline_parallel.py  # 4 MPI ranks
    python examples/pipeline_parallel.py --tiny                # small sizes (tests)

Each stage is a plain function `stage(params, x) -> x_next` on its own placement;
the last one returns the micro-batch's loss. `fflow.pipeline` cuts every batch into
micro-batches and runs them through the stages in the 1F1B order: after a short
warm-up each device alternates one forward and one backward, so stage 0 keeps at
most 4 micro-batches' activations (GPipe keeps all of them). The script prints the
schedule (device x tick), its bubble fraction next to the theory (p-1)/(m+p-1),
the bubble measured from the last step's trace (fflow.pipeline_trace), the peak
activation bytes per stage, and checks the first step's loss and gradients against
the same model without pipelining.
"""

import argparse

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.pipeline_trace import StepTrace
from fflow.sharding import runtime

LAYERS = [2, 1, 1, 1]  # layers per stage (uneven on purpose)


def dense_layers(layers, h):
    for layer in layers:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    return h


def middle_stage(params, batch):
    x, y = batch
    return dense_layers(params, x), y  # the targets travel with the activations


def last_stage(params, batch):
    x, y = batch
    h = dense_layers(params["hidden"], x)
    return jnp.mean((h @ params["head"] - y) ** 2)


def init(width, d_in, seed=0):
    rng = np.random.default_rng(seed)

    def layer(a, b):
        return {
            "w": (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
            "b": np.zeros(b, np.float32),
        }

    params = []
    for s, n in enumerate(LAYERS):
        layers = [layer(d_in if s == 0 and i == 0 else width, width) for i in range(n)]
        params.append(layers)
    last = params[-1]
    head = (rng.normal(size=(width, 1)) / np.sqrt(width)).astype(np.float32)
    params[-1] = {"hidden": last, "head": head}
    return params


def plain_loss(params, batch):
    for p in params[:-1]:
        batch = middle_stage(p, batch)
    return last_stage(params[-1], batch)


def make_data(n, d_in, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in)).astype(np.float32)
    y = np.sin(x @ rng.normal(size=(d_in, 1))).astype(np.float32)
    return x, y


def main(tiny=False):
    rank0 = runtime().rank == 0
    width, d_in, batch_size, m, steps = (8, 4, 16, 4, 6) if tiny else (64, 16, 256, 8, 60)
    placements = [fflow.placement("cpu", [i]) for i in range(4)]
    stages = [middle_stage] * 3 + [last_stage]
    step_fn = fflow.pipeline(stages, placements, num_microbatches=m, schedule="1f1b")
    sched = step_fn.schedule
    if rank0:
        print(f"pipeline of 4 stages on {runtime().describe()}, {m} micro-batches, 1F1B")
        print(sched.picture())
        print(
            f"bubble fraction {sched.bubble_fraction():.3f} "
            f"(theory (p-1)/(m+p-1) = {sched.theory():.3f})"
        )

    params = init(width, d_in)
    x, y = make_data(batch_size * 4, d_in)
    lr = 0.1
    first = None
    for step in range(steps):
        lo = (step % 4) * batch_size
        batch = (x[lo : lo + batch_size], y[lo : lo + batch_size])
        loss, grads = fflow.value_and_grad(step_fn)(params, batch)
        if step == 0:  # the pipelined step equals the plain model's
            want_loss, want = fflow.value_and_grad(plain_loss)(params, batch)
            err = max(
                float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
                for g, w in zip(
                    fflow.tree_util.tree_leaves(grads), fflow.tree_util.tree_leaves(want)
                )
            )
            assert abs(float(loss) - float(want_loss)) < 1e-5 and err < 1e-4, err
            first = float(loss)
            if rank0:
                print(
                    f"step 0: loss {first:.4f}, equals the un-pipelined model "
                    f"(max grad diff {err:.1e})"
                )
                print(f"peak activation bytes per stage: {step_fn.stats['peak_activation_bytes']}")
                print(step_fn.describe_transfers())
        params = fflow.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
        if rank0 and (step + 1) % max(1, steps // 4) == 0:
            print(f"step {step + 1}: loss {float(loss):.4f}")
    trace = StepTrace.gather(step_fn)  # every rank's trace of the last step as it ran
    if rank0:
        print(f"loss {first:.4f} -> {float(loss):.4f}")
        cpu = trace.cpu_timeline()
        print(
            f"last step measured: executed ticks bubble {trace.ticks().mean_idle:.3f}, "
            f"CPU-clock bubble of the busiest device {cpu.bottleneck:.3f} "
            f"(stage imbalance {cpu.imbalance():.2f}: LAYERS are uneven)"
        )
        if trace.mpi:
            print("wall clock per rank (F/B computing, . idle):")
            print(trace.picture(48))
    assert float(loss) < first
    return float(loss)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true")
    main(tiny=parser.parse_args().tiny)

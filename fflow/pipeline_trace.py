"""Measuring a pipeline step from what it did: the traces of `fflow.pipeline` calls.

Every process records each operation it runs (`stats["trace"]`, fflow/pipeline_step.py):
when it began waiting for its inputs, when they were there, when it ended (wall
timestamps of `time.perf_counter`, one clock for all processes of a machine) and the
CPU seconds its thread spent on it. `StepTrace.gather(f)` collects them (under MPI
from every rank) and measures the bubble three ways:

* `ticks()`: the executed operations placed on ticks, each lane (a device; under MPI
  a rank) keeping the order it ran them in, each operation as early as the values it
  consumed allow (one tick per operation, a value made at tick t usable at t+1): the
  bubble of the schedule as executed, in units of one stage-chunk operation;
* `cpu_timeline()`: the same dependencies with each operation taking the CPU seconds
  it was measured to take (or its stage's least cost, `op_costs`): the step's
  timeline if every lane had a core of its own and messages were free. Simulated
  devices run one after the other in one process, so this is what they can tell
  about time; under MPI it is what the ranks' own costs allow, without the
  machine's core sharing;
* `wall()` (MPI): per rank, from the timestamps: the window runs from the first
  operation's start to the last one's end over all ranks; busy = the time inside
  the rank's own operations, idle = window - busy (waiting for inputs, and the
  rank's time between operations). With fewer free cores than ranks, busy time
  stretches (ranks take turns on a core) and this measures the machine too.

Each returns per-lane idle fractions; `bottleneck` is the lane with the most busy
time: with unequal stages the others also wait for it, so its idle fraction is the
fill-and-drain bubble the textbook figure (p-1)/(m+p-1) describes.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.pipeline_trace import StepTrace
    >>> pls = [fflow.placement("cpu", [0]), fflow.placement("cpu", [1])]
    >>> stages = [lambda w, x: jnp.tanh(x @ w), lambda w, x: jnp.mean(x @ w)]
    >>> f = fflow.pipeline(stages, pls, num_microbatches=4)
    >>> _ = fflow.grad(f)([jnp.ones((3, 3)), jnp.ones((3, 1))], jnp.ones((8, 3)))
    >>> ticks = StepTrace.gather(f).ticks()  # p=2, m=4: (p-1)/(m+p-1) = 0.2
    >>> ticks.span, [round(i, 3) for i in ticks.idle]
    (10.0, [0.2, 0.2])
"""

from fflow.pipeline_schedule import Lane, Timeline, place
from fflow.sharding import runtime


class StepTrace:
    """The traces of one pipeline call on every process (see the module docstring)."""

    def __init__(self, lanes, num_stages, mpi):
        self.lanes = lanes
        self.num_stages = num_stages
        self.mpi = mpi

    @classmethod
    def gather(cls, pipeline_fn):
        """The last call of `pipeline_fn` (what `fflow.pipeline` returned). Under MPI
        every rank must call this (an allgather of the traces)."""
        pipe = pipeline_fn.pipe
        rows = [(o.kind, o.stage, o.mb, o.wait, o.start, o.end, o.cpu) for o in pipe.stats["trace"]]
        rt = runtime()
        n = len(pipe.stages)
        if hasattr(rt, "comm"):
            every = rt.comm.allgather(rows)
            lanes = [Lane(f"rank{r}", ops) for r, ops in enumerate(every) if ops]
            return cls(lanes, n, True)
        p = len(pipe.placements)
        lanes = [Lane(f"dev{d}", [o for o in rows if o[1] % p == d]) for d in range(p)]
        return cls(lanes, n, False)

    def ticks(self):
        return place(self.lanes, lambda lane, op: 1.0, self.num_stages)

    def cpu_timeline(self, costs=None):
        """Each operation takes the CPU seconds it took, or with `costs` (from
        `op_costs`) the cost of its lane, kind and stage."""
        if costs is None:
            return place(self.lanes, lambda lane, op: op[6], self.num_stages)
        return place(self.lanes, lambda lane, op: costs[(lane.name,) + op[:2]], self.num_stages)

    def wall(self):
        """Per rank from its timestamps (MPI ranks run at once; simulated devices do
        not, so there this is None)."""
        if not self.mpi:
            return None
        start = min(op[4] for lane in self.lanes for op in lane.ops)
        end = max(op[5] for lane in self.lanes for op in lane.ops)
        busy = [sum(op[5] - op[4] for op in lane.ops) for lane in self.lanes]
        return Timeline([lane.name for lane in self.lanes], busy, end - start)

    def waiting(self):
        """Per lane: seconds spent waiting for inputs (wall clock)."""
        return [sum(op[4] - op[3] for op in lane.ops) for lane in self.lanes]

    def picture(self, columns=64):
        """Text: per rank a row of `columns` time bins over the wall window, each bin
        marked F or B when an operation ran in most of it (f or b: in part of it), '.'
        when idle (MPI)."""
        if not self.mpi:
            return ""
        start = min(op[4] for lane in self.lanes for op in lane.ops)
        end = max(op[5] for lane in self.lanes for op in lane.ops)
        width = (end - start) / columns
        lines = []
        for lane in self.lanes:
            row = []
            for c in range(columns):
                lo, hi = start + c * width, start + (c + 1) * width
                cover = {"F": 0.0, "B": 0.0}
                for op in lane.ops:
                    cover[op[0]] += max(0.0, min(hi, op[5]) - max(lo, op[4]))
                kind = max(cover, key=cover.get)
                if cover[kind] == 0:
                    row.append(".")
                else:  # lower case: an operation ran in less than half the bin
                    row.append(kind if cover[kind] >= width / 2 else kind.lower())
            lines.append(f"{lane.name:>6} " + "".join(row))
        return "\n".join(lines)


def op_costs(traces, reduce=min):
    """{(lane, kind, stage): `reduce` of those operations' CPU seconds} over the
    `StepTrace`s. The operations of one lane, kind and stage do the same work on every
    micro-batch; the least is its cost on an undisturbed core (on a busy machine a
    run's CPU time grows with the cache misses that other processes cause)."""
    runs = {}
    for trace in traces:
        for lane in trace.lanes:
            for op in lane.ops:
                runs.setdefault((lane.name,) + op[:2], []).append(op[6])
    return {key: reduce(v) for key, v in runs.items()}

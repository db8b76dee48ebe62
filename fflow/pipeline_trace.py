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
  it was measured to take: the step's timeline if every lane had a core of its own
  and messages were free. Simulated devices run one after the other in one process,
  so this is what they can tell about time; under MPI it is what the ranks' own
  costs allow, without the machine's core sharing;
* `wall()` (MPI): per rank, from the timestamps: the window runs from the first
  operation's start to the last one's end over all ranks; busy = the time inside
  the rank's own operations, idle = window - busy (waiting for inputs, and the
  rank's time between operations). With fewer free cores than ranks, busy time
  stretches (ranks take turns on a core) and this measures the machine too.

Each returns per-lane idle fractions; `bottleneck` is the lane with the most busy
time: with unequal stages the others also wait for it, so its idle fraction is the
fill-and-drain bubble the textbook figure (p-1)/(m+p-1) describes.
"""

from fflow.sharding import runtime


class Lane:
    """One device (simulated) or rank (MPI): its operations in the order they ran, as
    tuples (kind, stage, mb, wait, start, end, cpu)."""

    def __init__(self, name, ops):
        self.name = name
        self.ops = ops


class Timeline:
    """Per lane: busy time, idle fraction; `span` = the step's length."""

    def __init__(self, names, busy, span):
        self.names = list(names)
        self.busy = list(busy)
        self.span = span
        self.idle = [1.0 - b / span if span > 0 else 0.0 for b in busy]

    @property
    def mean_idle(self):
        return sum(self.idle) / len(self.idle)

    @property
    def bottleneck(self):
        """The idle fraction of the lane with the most busy time."""
        return self.idle[max(range(len(self.busy)), key=self.busy.__getitem__)]

    def imbalance(self):
        """The busiest lane's busy time over the mean."""
        return max(self.busy) / (sum(self.busy) / len(self.busy))

    def __repr__(self):
        lanes = ", ".join(f"{n}: {i:.3f}" for n, i in zip(self.names, self.idle))
        return f"Timeline(span={self.span:.6g}, idle {lanes})"


def _deps(kind, stage, mb, last):
    if kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    deps = [("F", stage, mb)]
    if stage < last:
        deps.append(("B", stage + 1, mb))
    return deps


def place(lanes, cost, num_stages):
    """Each lane's operations, in its order, as early as their inputs allow; an
    operation that runs on several lanes (a sharded stage) is done when all finished.
    `cost(lane, op)` is its duration. Returns a Timeline."""
    runs = {}
    for lane in lanes:
        for op in lane.ops:
            runs[op[:3]] = runs.get(op[:3], 0) + 1
    done, left = {}, dict(runs)
    pos = [0] * len(lanes)
    free = [0.0] * len(lanes)
    busy = [0.0] * len(lanes)
    remaining = sum(len(lane.ops) for lane in lanes)
    while remaining:
        progressed = False
        for i, lane in enumerate(lanes):
            if pos[i] == len(lane.ops):
                continue
            op = lane.ops[pos[i]]
            deps = _deps(*op[:3], num_stages - 1)
            if any(left.get(d, 1) for d in deps if d in runs):
                continue
            start = max([free[i]] + [done[d] for d in deps if d in done])
            dur = cost(lane, op)
            free[i] = start + dur
            busy[i] += dur
            done[op[:3]] = max(done.get(op[:3], 0.0), free[i])
            left[op[:3]] -= 1
            pos[i] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ValueError("the trace's operations wait on each other (not a schedule)")
    return Timeline([lane.name for lane in lanes], busy, max(free))


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

    def cpu_timeline(self):
        return place(self.lanes, lambda lane, op: op[6], self.num_stages)

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
        marked F or B when an operation ran in most of it, '.' when idle (MPI)."""
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
                row.append(kind if cover[kind] > width / 2 else ".")
            lines.append(f"{lane.name:>6} " + "".join(row))
        return "\n".join(lines)

"""Micro-batch schedules of a pipeline: GPipe, 1F1B and interleaved 1F1B.

A schedule is first an *order*: for every pipeline device, the sequence of its
operations `F(stage, mb)` / `B(stage, mb)`. `Schedule` then places each operation
on a tick (one tick = one stage-chunk's forward or backward; a value sent at the
end of tick t is there at tick t+1) as early as its inputs allow, keeping each
device's order. That gives the picture (per device, per tick: F/B of which
micro-batch, its sends and receives, or idle), the bubble fraction (idle ticks /
all ticks) and how many micro-batches' activations each stage holds at its peak.

With p devices, m micro-batches and v virtual stages per device, the bubble is
(p-1)/(m+p-1) for GPipe and 1F1B and (p-1)/(v*m+p-1) for interleaved 1F1B
(m a multiple of p; a smaller last group of micro-batches leaves more idle ticks);
1F1B holds at most p micro-batches on stage 0 where GPipe holds m.

Example:
    >>> from fflow.pipeline_schedule import Schedule
    >>> s = Schedule("1f1b", num_devices=2, num_microbatches=3)
    >>> print(s.picture())
    tick    0   1   2   3   4   5   6   7
    dev0   F0  F1   .  B0  F2  B1   .  B2
    dev1    .  F0  B0  F1  B1  F2  B2   .
    >>> round(s.bubble_fraction(), 3)
    0.25
"""

from fflow.errors import user_error

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class Lane:
    """One device or rank: its operations in the order they run, as tuples starting
    (kind, stage, mb) (a trace's also carry wait, start, end, cpu)."""

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


def deps_of(kind, stage, mb, last):
    """The operations whose values (kind, stage, mb) consumes (`last`: the last stage)."""
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
            deps = deps_of(*op[:3], num_stages - 1)
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


class Op:
    """One operation of the schedule: kind "F" or "B" of `stage` on micro-batch `mb`."""

    __slots__ = ("kind", "stage", "mb", "device", "tick", "sends", "recvs", "num_devices")

    def __init__(self, kind, stage, mb, device):
        self.kind = kind
        self.stage = stage
        self.mb = mb
        self.device = device
        self.tick = None
        self.sends = []  # devices this op's result goes to
        self.recvs = []  # devices this op's input came from

    def label(self, virtual):
        chunk = f"{'abcdefgh'[self.stage // self.num_devices]}" if virtual > 1 else ""
        return f"{self.kind}{self.mb}{chunk}"

    def __repr__(self):
        return f"{self.kind}(stage={self.stage}, mb={self.mb}, tick={self.tick})"


def _orders(kind, p, m, v, extra=0):
    """Per device: the list of (kind, stage, mb) in execution order."""
    orders = []
    for d in range(p):
        if kind == "gpipe":
            seq = [("F", d, k) for k in range(m)] + [("B", d, k) for k in range(m)]
        elif kind == "1f1b":
            warm = min(p - d - 1, m)
            seq = [("F", d, k) for k in range(warm)]
            for i in range(m - warm):
                seq += [("F", d, warm + i), ("B", d, i)]
            seq += [("B", d, k) for k in range(m - warm, m)]
        else:
            seq = _interleaved(d, p, m, v, extra)
        orders.append(seq)
    return orders


def _interleaved(d, p, m, v, extra):
    # Megatron-LM's interleaved 1F1B: micro-batches in groups of p (the last group may
    # be smaller), each group through chunk 0, then chunk 1, ...; backward chunks reversed.
    groups = [list(range(g, min(g + p, m))) for g in range(0, m, p)]
    fwd = [("F", c * p + d, k) for grp in groups for c in range(v) for k in grp]
    bwd = [("B", c * p + d, k) for grp in groups for c in reversed(range(v)) for k in grp]
    total = m * v
    warm = min((p - d - 1) * 2 + (v - 1) * p + extra, total)
    seq = fwd[:warm]
    for i in range(total - warm):
        seq += [fwd[warm + i], bwd[i]]
    seq += bwd[total - warm :]
    return seq


class Schedule:
    """A micro-batch schedule placed on ticks (see the module docstring).

    Args:
        kind: "gpipe", "1f1b" or "interleaved".
        num_devices: pipeline devices p (placements).
        num_microbatches: m.
        virtual: stages per device v (interleaved only; the stages are p*v, stage s on
            device s mod p).
        forward_only: only the forward operations (evaluation, no gradients).
    """

    def __init__(self, kind, num_devices, num_microbatches, virtual=1, forward_only=False):
        kind = str(kind).lower()
        if kind not in SCHEDULES:
            raise user_error(
                ValueError, f"unknown pipeline schedule {kind!r}; use one of {SCHEDULES}"
            )
        p, m, v = int(num_devices), int(num_microbatches), int(virtual)
        if m < 1 or p < 1 or v < 1:
            raise user_error(ValueError, "a pipeline needs at least 1 device and 1 micro-batch")
        if kind != "interleaved" and v != 1:
            raise user_error(
                ValueError,
                f"{v} stages per device need schedule='interleaved' ({kind!r} runs one stage "
                "per placement). Fix: give one placement per stage, or use 'interleaved'.",
            )
        self.kind, self.p, self.m, self.v = kind, p, m, v
        self.num_stages = p * v
        self.forward_only = forward_only
        # interleaved with a last group smaller than p can need a longer warm-up:
        # lengthen it until the order runs (all forwards first always does)
        for extra in range(m * v + 1):
            if forward_only:  # chunk by chunk, micro-batches in order
                orders = [
                    [("F", c * p + d, k) for c in range(v) for k in range(m)] for d in range(p)
                ]
            else:
                orders = _orders(kind, p, m, v, extra)
            self.device_ops = [
                [Op(k, s, mb, d) for k, s, mb in seq] for d, seq in enumerate(orders)
            ]
            for ops in self.device_ops:
                for op in ops:
                    op.num_devices = p
            if self._place():
                break

    # -- placing operations on ticks ------------------------------------------------
    def _deps(self, op):
        return deps_of(op.kind, op.stage, op.mb, self.num_stages - 1)

    def _place(self):
        done = {}  # (kind, stage, mb) -> finishing tick
        pos = [0] * self.p
        free = [0] * self.p
        remaining = sum(len(o) for o in self.device_ops)
        while remaining:
            progressed = False
            for d in range(self.p):
                ops = self.device_ops[d]
                if pos[d] == len(ops):
                    continue
                op = ops[pos[d]]
                deps = self._deps(op)
                if any(k not in done for k in deps):
                    continue
                op.tick = max([free[d]] + [done[k] + 1 for k in deps])
                done[(op.kind, op.stage, op.mb)] = op.tick
                free[d] = op.tick + 1
                pos[d] += 1
                remaining -= 1
                progressed = True
            if not progressed:
                return False  # this order waits on itself
        self.num_ticks = max(free)
        by_key = {(o.kind, o.stage, o.mb): o for ops in self.device_ops for o in ops}
        for op in by_key.values():
            for k in self._deps(op):
                src = by_key[k]
                if src.device != op.device:
                    src.sends.append(op.device)
                    op.recvs.append(src.device)
        return True

    # -- what the runtime walks -----------------------------------------------------
    def ops_in_order(self):
        """All operations by (tick, device): the order every rank walks."""
        ops = [o for dev in self.device_ops for o in dev]
        return sorted(ops, key=lambda o: (o.tick, o.device))

    def device_of(self, stage):
        return stage % self.p

    # -- measurements ---------------------------------------------------------------
    def busy_ticks(self):
        return sum(len(ops) for ops in self.device_ops)

    def bubble_fraction(self):
        """Idle ticks / all ticks (p devices x the schedule's length)."""
        total = self.p * self.num_ticks
        return (total - self.busy_ticks()) / total

    def theory(self):
        """The textbook bubble: (p-1)/(m+p-1), or (p-1)/(v*m+p-1) interleaved."""
        return (self.p - 1) / (self.v * self.m + self.p - 1)

    def replay(self, durations):
        """(makespan, bubble) of this order when op (kind, stage, mb) takes
        `durations[(kind, stage, mb)]` seconds (e.g. measured), sends taking no time."""
        makespan, idle = self.replay_devices(durations)
        return makespan, sum(idle) / self.p

    def replay_devices(self, durations):
        """(makespan, idle fraction of each device) of the timed replay. With stages of
        unequal cost, the slowest device's idle fraction is the pipeline bubble (fill
        and drain); the others idle more by the stage imbalance."""
        lanes = [
            Lane(f"dev{d}", [(o.kind, o.stage, o.mb) for o in sorted(ops, key=lambda o: o.tick)])
            for d, ops in enumerate(self.device_ops)
        ]
        t = place(lanes, lambda lane, op: durations[op[:3]], self.num_stages)
        return t.span, t.idle

    def peak_in_flight(self):
        """Per stage: the most micro-batches whose forward ran and backward did not yet."""
        peaks = []
        for s in range(self.num_stages):
            events = []
            for op in self.device_ops[self.device_of(s)]:
                if op.stage == s:
                    events.append((op.tick, 1 if op.kind == "F" else -1))
            alive = peak = 0
            for _, delta in sorted(events):
                alive += delta
                peak = max(peak, alive)
            peaks.append(peak)
        return peaks

    # -- printing -------------------------------------------------------------------
    def picture(self, details=False):
        """Text picture: a row per device, a column per tick ('.' = idle).

        With `details`, a list follows with each tick's sends and receives.
        """
        grid = [["."] * self.num_ticks for _ in range(self.p)]
        for d, ops in enumerate(self.device_ops):
            for op in ops:
                grid[d][op.tick] = op.label(self.v)
        width = max(4, max(len(c) for row in grid for c in row) + 1)
        lines = ["tick " + "".join(f"{t:>{width}}" for t in range(self.num_ticks))]
        for d, row in enumerate(grid):
            lines.append(f"dev{d:<2}" + "".join(f"{c:>{width}}" for c in row))
        lines = [line.rstrip() for line in lines]
        if details:
            for op in self.ops_in_order():
                parts = []
                if op.recvs:
                    parts.append("recv from " + ",".join(f"dev{r}" for r in op.recvs))
                if op.sends:
                    parts.append("send to " + ",".join(f"dev{r}" for r in op.sends))
                if parts:
                    lines.append(
                        f"  t{op.tick} dev{op.device} {op.label(self.v)}: " + "; ".join(parts)
                    )
        return "\n".join(lines)

    def summary(self):
        return (
            f"{self.kind} p={self.p} m={self.m} v={self.v}: {self.num_ticks} ticks, bubble "
            f"{self.bubble_fraction():.3f} (theory {self.theory():.3f}), peak micro-batches "
            f"in flight per stage {self.peak_in_flight()}"
        )

    def __str__(self):
        return self.summary() + "\n" + self.picture(details=True)

    __repr__ = summary

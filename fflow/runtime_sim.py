"""The simulated runtime: every device of a placement lives in this one process.

A global array keeps one NumPy shard per device. A sharded program runs as one
generator per device; each runs until its next collective, then the collective's
phases move messages between the devices of each group (counting their bytes),
and every device continues. The device count comes from `fflow.config`
(`num_cpu_devices`) or the FFLOW_NUM_CPU_DEVICES environment variable (default 8).
"""

import numpy as np

from fflow.errors import FflowError
from fflow.primitives.collectives import collective_phases
from fflow.sharding import B, assemble, make_global, num_cpu_devices, scatter_global
from fflow.transforms.shard_exec import device_steps, plain_runner, run_identity


class SimRuntime:
    """Simulated devices in one process (the default runtime)."""

    def __init__(self, num_devices=None):
        self.num_devices = num_devices
        self.bytes_moved = 0  # bytes carried by collective messages since creation
        self.collective_count = 0

    def device_count(self):
        return self.num_devices or num_cpu_devices()

    def describe(self):
        return f"{self.device_count()} simulated CPU devices"

    @property
    def rank(self):
        return 0

    def scatter(self, value, nd_sbp, pl):
        return dict(enumerate(scatter_global(value, nd_sbp, pl)))

    def assemble(self, gv):
        sbp, pl = gv.sharding.sbp, gv.sharding.placement
        if sum(1 for s in sbp if s.is_partial()) > 1:
            # partial on several mesh axes: reduce as the boxing to broadcast does (the
            # MPI runtime reads this way), so both runtimes round alike
            counted = self.bytes_moved  # reads are not program traffic
            x = make_global(gv.shape, gv.dtype, pl, sbp, gv.shards)
            value = run_identity(x, pl, (B,) * pl.ndim)._value.shards[0]
            self.bytes_moved = counted
            return value
        return assemble(gv.shards, gv.shape, sbp, pl)

    def local_shards(self, pl, value):
        """{flat index: shard} of the devices this process holds (all of them)."""
        return {i: value(i) for i in range(pl.size)}

    def gather_shard_infos(self, pl, shards):
        """(shape, dtype name) of every device's shard, in placement order."""
        return [
            (tuple(np.shape(shards[i])), np.dtype(shards[i].dtype).name) for i in range(pl.size)
        ]

    def local_of(self, gv):
        return gv.shards[0]

    def execute(self, sp, in_shards):
        n = sp.placement.size
        runners = getattr(sp, "_sim_runners", None)
        if runners is None:  # False: some device program has collectives
            runners = [plain_runner(sp.local_program(i)) for i in range(n)]
            runners = sp._sim_runners = False if any(r is None for r in runners) else runners
        if runners:  # no collectives: each device's program straight through
            if n == 1:
                return [{0: r} for r in runners[0]([s[0] for s in in_shards])]
            results = [run([s[i] for s in in_shards]) for i, run in enumerate(runners)]
            return [{i: r[k] for i, r in enumerate(results)} for k in range(len(results[0]))]
        progs = [sp.local_program(i) for i in range(n)]
        args = [[s[i] for s in in_shards] for i in range(n)]
        results = self.run_programs(progs, args)
        n_out = len(sp.program.outvars)
        return [{i: results[i][k] for i in range(n)} for k in range(n_out)]

    def run_programs(self, programs, args):
        """Run one program per device (args[i] for device i) in lockstep at collectives."""
        n = len(programs)
        gens = [device_steps(p, a) for p, a in zip(programs, args)]
        results = [None] * n
        reqs = {}
        for i, g in enumerate(gens):
            self._advance(g, i, None, reqs, results, first=True)
        while reqs:
            if len(reqs) != n:
                raise FflowError("devices diverged: only some reached a collective")
            outs = self.collective(reqs)
            reqs_next = {}
            for i, g in enumerate(gens):
                self._advance(g, i, outs[i], reqs_next, results)
            reqs = reqs_next
        return results

    @staticmethod
    def _advance(gen, i, value, reqs, results, first=False):
        try:
            req = next(gen) if first else gen.send(value)
            while req[0] in ("wait", "progress"):
                # a bucket's all-reduce ran when it started: its handle is the result
                req = gen.send(req[1] if req[0] == "wait" else None)
            reqs[i] = req[1:4] if req[0] == "start" else req
        except StopIteration as stop:
            results[i] = stop.value

    def collective(self, reqs):
        """Run one collective for every device: reqs[flat] = (prim, x, params)."""
        prims = {r[0].name for r in reqs.values()}
        if len(prims) != 1:
            raise FflowError(f"devices diverged at a collective: {sorted(prims)}")
        self.collective_count += 1
        outs = {}
        done = set()
        for flat, (prim, _, params) in sorted(reqs.items()):
            group = params["group"]
            if flat in done:
                continue
            members = [(g, reqs[g]) for g in group]
            states = [None] * len(members)
            for phase in collective_phases[prim]:
                msgs = [phase.make(x, st, **p) for (_, (_, x, p)), st in zip(members, states)]
                new_states = []
                for j, ((_, (_, x, p)), st) in enumerate(zip(members, states)):
                    received = {}
                    for src in phase.sources(p):
                        payload = msgs[src].get(j, [])
                        self.bytes_moved += sum(a.nbytes for a in payload)
                        received[src] = payload
                    new_states.append(phase.combine(x, st, received, **p))
                states = new_states
            for (g, _), st in zip(members, states):
                outs[g] = st
                done.add(g)
        return outs

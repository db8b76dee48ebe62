"""Device profiles: the constants of the SBP planner's cost model.

A `DeviceProfile` says how fast one device computes (FLOP/s, memory bytes/s), how
much memory it has, and, per mesh axis, the latency and bandwidth of its
collectives. `CPU` is this kind of machine running simulated devices (every
collective is a copy through Python), `H200` an 8-GPU NVLink node.
`fflow.sharding.profile_devices(placement)` measures one.

Example:
    >>> import fflow
    >>> fflow.sharding.H200.latency_of(0) < fflow.sharding.CPU.latency_of(0)
    True
"""

import json
import os
import time

from fflow.errors import user_error


class DeviceProfile:
    """Per-device throughput and memory, and per-mesh-axis link latency and bandwidth.

    Args:
        name: a label for printing.
        flops: arithmetic throughput of one device, FLOP/s.
        mem_bandwidth: memory bandwidth of one device, bytes/s.
        latency: seconds per collective step; one number, or one per mesh axis
            (the last repeats for further axes).
        bandwidth: bytes/s one device sends per collective step (same forms).
        memory: bytes of memory per device (None: unlimited).
        copy_bandwidth: bytes/s (read + written) of the host copies a collective makes
            around its transfer: packing pieces of a non-leading split, joining gathered
            blocks, reducing received partial sums (MPI ranks on the host;
            `shard_cost.host_copy_bytes`). None: not priced (NCCL, simulated devices,
            whose copies are in their measured bandwidth).
        overlap: the share (0..1) of a gradient bucket's all-reduce that can run while
            the device computes (`shard_cost.hidden_time`): 1 for links that progress
            by themselves (NCCL, RDMA), 0 for MPI ranks on host cores, whose
            shared-memory transport moves data only inside MPI calls, with the ranks'
            own CPUs.

    Example:
        >>> p = DeviceProfile("slow link", 1e12, 1e11, latency=(5e-6, 5e-5), bandwidth=(1e11, 1e10))
        >>> p.latency_of(1), p.bandwidth_of(3)
        (5e-05, 10000000000.0)
    """

    def __init__(
        self,
        name,
        flops,
        mem_bandwidth,
        latency,
        bandwidth,
        memory=None,
        copy_bandwidth=None,
        overlap=1.0,
    ):
        self.name = name
        self.flops = float(flops)
        self.mem_bandwidth = float(mem_bandwidth)
        self.latency = tuple(latency) if isinstance(latency, (tuple, list)) else (latency,)
        self.bandwidth = tuple(bandwidth) if isinstance(bandwidth, (tuple, list)) else (bandwidth,)
        self.memory = memory
        self.copy_bandwidth = float(copy_bandwidth) if copy_bandwidth else None
        self.overlap = float(overlap)

    def latency_of(self, axis):
        return float(self.latency[min(axis, len(self.latency) - 1)])

    def bandwidth_of(self, axis):
        return float(self.bandwidth[min(axis, len(self.bandwidth) - 1)])

    def to_json(self):
        """The profile as a JSON-ready dict (`from_json` reads it back)."""
        return {
            "name": self.name,
            "flops": self.flops,
            "mem_bandwidth": self.mem_bandwidth,
            "latency": list(self.latency),
            "bandwidth": list(self.bandwidth),
            "memory": self.memory,
            "copy_bandwidth": self.copy_bandwidth,
            "overlap": self.overlap,
        }

    @classmethod
    def from_json(cls, d):
        """A profile from `to_json`'s dict (or a JSON file's contents)."""
        return cls(**d)

    def save(self, path):
        """Write the profile as JSON (what `FFLOW_DEVICE_PROFILE=path` makes the default)."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.from_json(json.load(f))

    def __repr__(self):
        extra = ""
        if self.copy_bandwidth:
            extra = f", copy_bandwidth={self.copy_bandwidth:.3g}, overlap={self.overlap:g}"
        return (
            f"DeviceProfile({self.name!r}, flops={self.flops:.3g}, "
            f"mem_bandwidth={self.mem_bandwidth:.3g}, latency={self.latency}, "
            f"bandwidth={self.bandwidth}{extra})"
        )


# the 2-core development machine: flops and mem_bandwidth as fflow runs them (a jit'd
# 512x1024x1024 matmul 28-37 GFLOP/s, a jit'd SGD update of 1M f32 3.8 GB/s); the links
# as profile_devices measured them on 2 simulated devices (latency 74-79 us,
# 5.0-5.1e8 B/s, 2026-12-03, load ~2; a data-parallel MLP step under fflow.launch -n 2
# moved its 7.5 MB per rank at ~6.5e8 B/s). Was bandwidth=2e9, latency=5e-5.
CPU = DeviceProfile("cpu", flops=3e10, mem_bandwidth=5e9, latency=7.5e-5, bandwidth=5e8)
# H200 SXM: ~400 TFLOP/s TF32 dense, 4.8 TB/s HBM3e, NVLink 4 at ~450 GB/s per direction
H200 = DeviceProfile(
    "h200-nvlink", flops=4e14, mem_bandwidth=4.8e12, latency=1e-5, bandwidth=4.5e11, memory=141e9
)


# MPI ranks of one node on its host cores (fflow.launch, mpi4py + MPICH's shared-memory
# transport), as `fflow.sharding.profile_devices()` measured them under `fflow.launch -n
# 2` with 1 BLAS thread per rank, 2026-12-03 (machine load 7-8, six launches): GEMM
# 1.1-1.25e11 FLOP/s; a 4 MB copy 0.9-1.2e11 B/s; a 256-byte all-reduce right after a
# GEMM, best of 15, 0.7-1.6e-4 s (a blocking collective waits for its slowest member:
# warm and synchronized it takes 2e-5 s); a 4 MB all-gather after a GEMM 4.1-6.0e9 B/s;
# a 16 MB all-reduce started before a GEMM finished behind it 0-0.09 of its time, and 0
# in a DP step (hidden -0.14..+0.07 ms of 1.2 ms, notes/issue10-overlap.md): MPI moves
# shared-memory data only inside MPI calls, with the ranks' own CPUs. Latency 2e-4 is
# the top of that range: at 7e-5 the planner splits bench_mpi's DP step's layer-1 update
# again (measured slower), and at 1.5e-4 on 4 devices its search returned a plan costlier
# than plain DP by its own model. The model then prices that split (all_to_all 1 MB,
# all_gather 1.6 MB, all_gather 3.2 MB with its join) at 1.26 ms, 1.32 ms measured in
# the step (W1's all-reduce 0.88 ms; the 4.2 MB bucket's wait measured 0.9-1.2 ms).
CPU_MPI = DeviceProfile(
    "cpu-mpi", flops=1.2e11, mem_bandwidth=1.2e11, latency=2e-4, bandwidth=5e9,
    copy_bandwidth=1.2e11, overlap=0.0,
)  # fmt: skip

NAMED = {"cpu": CPU, "cpu-mpi": CPU_MPI, "h200": H200}


def default_profile(pl=None):
    """The profile the planner uses when none is given.

    H200 for GPU placements. For CPU placements: `FFLOW_DEVICE_PROFILE` if set (a name
    in `NAMED`, or a JSON file that `profile_devices(path=)` wrote); else `CPU_MPI`, on
    simulated devices and on MPI ranks (`python -m fflow.launch`, FFLOW_RUNTIME=mpi)
    alike, so a program gets the same plan on both (and the same bits, in deterministic
    mode: simulate, then deploy); `CPU` only for MPI ranks spread over nodes (more
    devices than FFLOW_RANKS_PER_NODE).

    Example:
        >>> default_profile().name
        'cpu-mpi'
    """
    if pl is not None and getattr(pl, "type", "cpu") in ("cuda", "gpu"):
        return H200
    chosen = os.environ.get("FFLOW_DEVICE_PROFILE")
    if chosen:
        return NAMED.get(chosen.lower()) or _loaded(chosen)
    if os.environ.get("FFLOW_RUNTIME", "").lower() == "mpi":
        per_node = int(os.environ.get("FFLOW_RANKS_PER_NODE", "0") or 0)
        if pl is not None and pl.size > per_node:
            return CPU
    return CPU_MPI


_files = {}


def _loaded(path):
    if path not in _files:
        try:
            _files[path] = DeviceProfile.load(path)
        except (OSError, ValueError, TypeError) as e:
            raise user_error(
                ValueError,
                f"FFLOW_DEVICE_PROFILE={path!r}: not a profile name ({', '.join(NAMED)}) "
                f"nor a readable profile file ({e}). Fix: write one with "
                "fflow.sharding.profile_devices(path=...) or unset it.",
            ) from None
    return _files[path]


def best_time(fn, reps=5):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

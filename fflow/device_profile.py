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

import time


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

    Example:
        >>> p = DeviceProfile("slow link", 1e12, 1e11, latency=(5e-6, 5e-5), bandwidth=(1e11, 1e10))
        >>> p.latency_of(1), p.bandwidth_of(3)
        (5e-05, 10000000000.0)
    """

    def __init__(self, name, flops, mem_bandwidth, latency, bandwidth, memory=None):
        self.name = name
        self.flops = float(flops)
        self.mem_bandwidth = float(mem_bandwidth)
        self.latency = tuple(latency) if isinstance(latency, (tuple, list)) else (latency,)
        self.bandwidth = tuple(bandwidth) if isinstance(bandwidth, (tuple, list)) else (bandwidth,)
        self.memory = memory

    def latency_of(self, axis):
        return float(self.latency[min(axis, len(self.latency) - 1)])

    def bandwidth_of(self, axis):
        return float(self.bandwidth[min(axis, len(self.bandwidth) - 1)])

    def __repr__(self):
        return (
            f"DeviceProfile({self.name!r}, flops={self.flops:.3g}, "
            f"mem_bandwidth={self.mem_bandwidth:.3g}, latency={self.latency}, "
            f"bandwidth={self.bandwidth})"
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


def default_profile(pl=None):
    """The profile the planner uses when none is given: H200 for GPU placements, else CPU."""
    if pl is not None and getattr(pl, "type", "cpu") in ("cuda", "gpu"):
        return H200
    return CPU


def best_time(fn, reps=5):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

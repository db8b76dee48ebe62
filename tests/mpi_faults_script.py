"""Run by tests/test_mpi_faults.py under `python -m fflow.launch -n N`: one rank
misbehaves in the way argv[1] names; the job must end quickly, naming that rank."""

import os
import signal
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import S, runtime


def main(mode, bad):
    rt = runtime()
    n = rt.device_count()
    me = rt.rank
    pl = fflow.placement("cpu", list(range(n)))
    f = fflow.shard(lambda x: jnp.sum(x * 2.0), pl, in_sbp=S(0))
    g = fflow.shard(lambda x: jnp.max(jnp.sin(x)), pl, in_sbp=S(0))
    x = np.arange(8 * n, dtype=np.float32)
    for step in range(4):
        fn, arg = f, x
        if me == bad:
            if mode == "program":  # another function from the first step on
                fn = g
            if mode == "shape":  # another batch shape from the first step on
                arg = np.arange(8 * n + n, dtype=np.float32)
            if mode == "debug_program" and step == 2:  # diverges mid-run (debug mode)
                fn = g
            if step == 2:
                if mode == "raise":
                    raise RuntimeError(f"rank {me} failed on purpose")
                if mode == "exit":
                    os._exit(3)
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "early":
                    break
                if mode == "sysexit":
                    sys.exit(5)
        if mode == "hang" and me == bad and step == 1:
            import time

            time.sleep(1000)  # computes "forever": the others time out
        float(fn(arg))
    print(f"rank {me} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

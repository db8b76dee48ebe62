"""Run by tests/test_save_mpi.py: `save DIR` under `python -m fflow.launch -n 4` writes
global arrays shard by shard from each rank and reads them back resharded; `load DIR`
(simulated devices, or MPI) restores them onto other placements. Prints RESULT ok."""

import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.serialization import barrier
from fflow.sharding import B, S, runtime

VALUE = np.arange(32, dtype=np.float32).reshape(8, 4)


def check(tree):
    for name in ("line", "mesh"):
        got = np.asarray(tree[name])  # assembles across ranks under MPI
        assert np.array_equal(got, VALUE), (name, got)


def main(mode, directory):
    line = fflow.placement("cpu", [0, 1, 2, 3])
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    if mode == "save":
        tree = {
            "line": fflow.to_global(jnp.asarray(VALUE), line, S(0)),
            "mesh": fflow.to_global(jnp.asarray(VALUE), mesh, (S(1), B)),
        }
        fflow.save(directory, tree)
        like = {
            "line": fflow.to_global(jnp.zeros((8, 4)), mesh, (S(0), S(1))),
            "mesh": fflow.to_global(jnp.zeros((8, 4)), line, S(1)),
        }
    else:
        two = fflow.placement("cpu", [0, 1])
        like = {
            "line": fflow.to_global(jnp.zeros((8, 4)), two, S(1)),
            "mesh": fflow.to_global(jnp.zeros((8, 4)), two, B),
        }
    out = fflow.load(directory, like=like)
    for k in like:
        assert out[k].sbp == like[k].sbp and out[k].placement == like[k].placement
    check(out)
    barrier()  # no rank leaves while another still waits on the last collective
    if runtime().rank == 0:
        print("RESULT ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

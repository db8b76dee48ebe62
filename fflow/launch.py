"""Run a script on N MPI ranks: `python -m fflow.launch -n 4 script.py [args...]`.

A thin wrapper over `mpiexec -n 4 python -m mpi4py script.py`: mpi4py's runner
aborts every rank when one raises, so a failing rank ends the run with its own
traceback instead of leaving the others waiting in a collective. The ranks use
fflow's MPI runtime (FFLOW_RUNTIME=mpi), so the same script that runs on
simulated devices runs here unchanged.

Each rank holds only its own shards. Reading a global array's whole value
(`np.asarray`, `float`, `print`) gathers it from every rank, so do it on all ranks
(compute the value everywhere, then print on rank 0):

    loss = float(step(...))          # every rank
    if fflow.sharding.runtime().rank == 0:
        print(loss)
"""

import argparse
import os
import shutil
import subprocess
import sys


def find_mpiexec():
    """mpiexec of the MPICH installed from PyPI (next to this Python), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    try:
        from importlib.metadata import files

        for f in files("mpich") or ():
            if f.name == "mpiexec":
                path = str(f.locate())
                if os.path.exists(path):
                    return path
    except Exception:  # noqa: BLE001  (mpich may not be a pip package here)
        pass
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit(
            "fflow.launch: mpiexec not found. Fix: pip install 'fflow[mpi]' (mpi4py, mpich)."
        )
    return found


def command(n, script, args, module=False):
    target = ["-m", script] if module else [script]
    return [find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", *target, *args]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fflow.launch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    parser.add_argument("-m", dest="module", action="store_true", help="run a module")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    env = dict(os.environ, FFLOW_RUNTIME="mpi")
    proc = subprocess.run(command(ns.nproc, ns.script, ns.args, ns.module), env=env)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

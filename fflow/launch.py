"""Run a script on N MPI ranks: `python -m fflow.launch -n 4 script.py [args...]`.

    python -m fflow.launch -n N [--hostfile F] [--ppn K] [-m] script.py args...

Starts the ranks with MPICH's `mpiexec` (Hydra; `--hostfile`/`--ppn` pass through as
`-f`/`-ppn`). Inside an existing job (SLURM's `srun`, or any PMI launcher that sets
PMI_RANK/PMI_SIZE) it does not start ranks: this process is one rank, its rank
and size come from the environment. The ranks use fflow's MPI runtime
(FFLOW_RUNTIME=mpi), so a script that runs on simulated devices runs here unchanged.

Failures end the whole job with a non-zero exit and one message naming the rank:
each rank runs under a small supervisor process that reports how its rank ended.
An exception prints that rank's traceback once; `sys.exit(k)`, `os._exit(k)` and
signals (SIGKILL, a segfault) are reported by the supervisor; a rank that finishes
early is noticed by the ranks still waiting for it (fflow/mpi_faults.py), and any
remaining hang ends after `collective_timeout` seconds (FFLOW_COLLECTIVE_TIMEOUT).

Each rank holds only its own shards. Reading a global array's whole value
(`np.asarray`, `float`, `print`) is a collective, so do it on all ranks (compute
the value everywhere, then print on rank 0):

    loss = float(step(...))          # every rank
    if fflow.process_index() == 0:
        print(loss)
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from fflow import mpi_faults, rank_supervisor
from fflow.rank_supervisor import QUIET, REPORTED


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


def env_rank():
    """(rank, size) from a PMI or SLURM environment, or None outside a launched job."""
    env = os.environ
    for r, s in (
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if r in env and s in env:
            if r == "SLURM_PROCID" and "SLURM_STEP_ID" not in env:
                continue  # inside an allocation (salloc/sbatch) but not an srun task
            return int(env[r]), int(env[s])
    return None


def command(n, script, args, module=False, hostfile=None, ppn=None):
    cmd = [find_mpiexec(), "-n", str(n)]
    if hostfile:
        cmd += ["-f", hostfile]
    if ppn:
        cmd += ["-ppn", str(ppn)]
    target = ["-m", script] if module else [script]
    # the supervisor runs by path: it imports nothing of fflow (starts fast)
    supervisor = [sys.executable, rank_supervisor.__file__, sys.executable, "-m", "fflow.launch"]
    return cmd + supervisor + ["--rank-child", *target, *args]


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m fflow.launch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    parser.add_argument("--hostfile", "-f", help="MPICH hostfile (one host per line)")
    parser.add_argument("--ppn", type=int, help="ranks per node")
    parser.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-m", dest="module", action="store_true", help="run a module")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv=None):
    ns = _parser().parse_args(argv)
    if ns.rank_child:
        return rank_child(ns.script, ns.args, ns.module)
    if env_rank() is not None:  # already a rank of a job (srun, or another launcher)
        child = [sys.executable, "-m", "fflow.launch", "--rank-child"]
        child += (["-m"] if ns.module else []) + [ns.script, *ns.args]
        return rank_supervisor.supervise(child)
    status_dir = tempfile.mkdtemp(prefix="fflow_launch_")
    kind = "nccl" if os.environ.get("FFLOW_RUNTIME", "").lower() == "nccl" else "mpi"
    env = dict(os.environ, FFLOW_RUNTIME=kind, FFLOW_LAUNCH_DIR=status_dir)
    cmd = command(ns.nproc, ns.script, ns.args, ns.module, ns.hostfile, ns.ppn)
    try:
        rc = subprocess.run(cmd, env=env).returncode
        failed = {}
        for name in sorted(os.listdir(status_dir)):
            with open(os.path.join(status_dir, name)) as f:
                failed[name[len("rank") :]] = f.read()
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    if failed:
        if rc == 0:  # a rank failed, but the exit code got lost on the way
            rc = 1
        ranks = ", ".join(f"rank {r} (exit status {c})" for r, c in failed.items())
        sys.stderr.write(f"fflow.launch: the job failed: {ranks}; the other ranks were ended.\n")
    return rc


# ----------------------------------------------------------------------------
# One rank: a supervisor process and the rank itself


def rank_child(script, args, module):
    """The rank itself: run the script; report an error once; say goodbye at the end."""
    import runpy
    import traceback

    from mpi4py import MPI  # this process is an MPI rank

    rank = MPI.COMM_WORLD.Get_rank()
    found = env_rank()
    if found is not None and found != (rank, MPI.COMM_WORLD.Get_size()):
        sys.stderr.write(
            f"fflow.launch: the environment says rank {found[0]} of {found[1]}, but MPI sees "
            f"rank {rank} of {MPI.COMM_WORLD.Get_size()}: MPI was not started by this job's "
            "process manager. Fix: under SLURM use `srun --mpi=pmi2` (or pmix), or start "
            "the job with `python -m fflow.launch -n N` outside srun.\n"
        )
        os._exit(REPORTED)
    # ranks of one node share its cores: fflow/threads.py sizes each rank's GEMM pool to
    # its share (2 ranks x 2 threads on 2 cores ran every GEMM oversubscribed)
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    os.environ["FFLOW_RANKS_PER_NODE"] = str(node.Get_size())
    node.Free()
    sys.argv = [script, *args]
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        if module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code not in (0, None):
            _flush()
            if not isinstance(code, int):
                sys.stderr.write(f"{code}\n")
                code = 1
            sys.stderr.write(
                f"fflow.launch: rank {rank} called sys.exit({e.code}); ending every rank.\n"
            )
            _flush()
            os._exit(REPORTED)
    except BaseException as e:  # noqa: BLE001  (any failure of the user's script)
        _flush()
        reporter = getattr(e, "reporter", None)
        if reporter is not None and reporter != rank:
            time.sleep(2.0)  # the reporting rank prints it; this one only ends
            os._exit(QUIET)
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None and _launcher_frame(tb):
            tb = tb.tb_next  # start at the user's script, not at this runner
        text = "".join(traceback.format_exception(type(e), e, tb))
        sys.stderr.write(f"fflow.launch: rank {rank} failed:\n{text}")
        _flush()
        os._exit(REPORTED)
    _flush()
    mpi_faults.leave_world(_summary())
    _flush()
    return 0


def _launcher_frame(tb):
    name = tb.tb_frame.f_code.co_filename
    return name == __file__ or name.startswith("<frozen runpy")


def _summary():
    sharding = sys.modules.get("fflow.sharding")  # loaded only if the script used fflow
    rt = sharding._runtime if sharding is not None else None
    n = getattr(rt, "collective_count", 0) if rt is not None else 0
    return f"after {n} collectives"


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  (a closed stream must not hide the error)
            pass


if __name__ == "__main__":
    sys.exit(main())

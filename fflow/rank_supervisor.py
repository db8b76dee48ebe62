"""The supervisor of one MPI rank (started by `fflow.launch` through mpiexec).

    python fflow/rank_supervisor.py CHILD_COMMAND...

It runs the rank as a child process (which inherits the PMI environment and file
descriptors) and reports how it ended: a signal (SIGKILL, a segfault) or an exit
code of a rank that never printed its own error (`os._exit`). It exits non-zero,
so mpiexec ends every rank. The child dies with its supervisor (PR_SET_PDEATHSIG),
so killing the job leaves no orphan. Run by path, it imports nothing of fflow and
starts in milliseconds.
"""

import os
import signal
import subprocess
import sys

REPORTED = 70  # a rank's exit code after it printed its own error
QUIET = 71  # a rank that ends because another rank reports the failure


def rank_name():
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return os.environ[var]
    return "?"


def _pdeathsig():
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def supervise(cmd):
    """Run `cmd` as this rank; returns the exit code the supervisor should end with."""
    if os.environ.get("FFLOW_RUNTIME", "").lower() != "nccl":
        os.environ["FFLOW_RUNTIME"] = "mpi"
    rank = rank_name()
    child = subprocess.Popen(cmd, close_fds=False, preexec_fn=_pdeathsig)  # keeps PMI_FD
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = child.wait()
    if rc == 0:
        return 0
    if not stopping and rc != QUIET:
        _record_failure(rank, rc)
        if rc < 0:
            sys.stderr.write(
                f"fflow.launch: rank {rank} was killed by {signal.Signals(-rc).name} before "
                "finishing its script; ending every rank.\n"
            )
        elif rc != REPORTED:
            sys.stderr.write(
                f"fflow.launch: rank {rank} exited with code {rc} before finishing its script "
                "(os._exit, or a crash outside Python); ending every rank.\n"
            )
        sys.stderr.flush()
    if rc < 0:
        return 128 - rc
    return 1 if rc in (REPORTED, QUIET) else rc


def _record_failure(rank, rc):
    d = os.environ.get("FFLOW_LAUNCH_DIR")
    if d and os.path.isdir(d):
        with open(os.path.join(d, f"rank{rank}"), "w") as f:
            f.write(str(rc))


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))

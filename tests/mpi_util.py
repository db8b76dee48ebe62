"""What the MPI tests share: whether mpi4py and an mpiexec are here to launch ranks, and
running a test script on ranks for the RESULT line it prints."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def mpi_available():
    """True when mpi4py imports and fflow.launch finds an mpiexec (pip install mpich)."""
    try:
        import mpi4py  # noqa: F401  (the optional MPI extra)

        from fflow.launch import find_mpiexec

        find_mpiexec()
    except (ImportError, SystemExit):
        return False
    return True


def launch_result(script, n, timeout=240):
    """Run tests/<script> on `n` ranks (`python -m fflow.launch -n n`, MPI runtime) and
    return the JSON after its "RESULT " line; a failing launch fails the test with the
    ranks' output."""
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable, "-m", "fflow.launch", "-n", str(n), os.path.join(HERE, script)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=os.path.dirname(HERE), env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])

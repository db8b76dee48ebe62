"""What the MPI tests share: whether mpi4py and an mpiexec are here to launch ranks."""


def mpi_available():
    """True when mpi4py imports and fflow.launch finds an mpiexec (pip install mpich)."""
    try:
        import mpi4py  # noqa: F401  (the optional MPI extra)

        from fflow.launch import find_mpiexec

        find_mpiexec()
    except (ImportError, SystemExit):
        return False
    return True

"""`fflow.explain(f)(*args)`: what jit does with `f` for these arguments.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> report = fflow.explain(lambda x: jnp.tanh(x * 2 + 1))(jnp.ones(1000))
    >>> report.eqns_after <= report.eqns_before
    True
    >>> len(report.groups)
    1
"""

import sys
import time
import types

from fflow.transforms.jit import Jitted
from fflow.transforms.lowered import Report


def explain(fun, **jit_kwargs):
    """`explain(f)(*args)` traces and lowers `f` as jit would and reports on it.

    Returns a `Report` (print it): trace time, pass times, equation counts before
    and after the passes, fused groups and estimated bytes moved.
    """
    jitted = fun if isinstance(fun, Jitted) else Jitted(fun, **jit_kwargs)

    def run(*args, **kwargs):
        fresh = Jitted(jitted.fun, jitted.static_argnums, jitted.static_argnames)
        t0 = time.perf_counter()
        lowered = fresh.lower(*args, **kwargs)
        total = time.perf_counter() - t0
        return Report(lowered.entry, compile_time=total - lowered.entry.trace_time)

    return run


__all__ = ["explain", "Report"]


class _CallableModule(types.ModuleType):
    # `import fflow.explain` rebinds `fflow.explain` to this
    # module; calling it must still mean `fflow.explain(f)`
    def __call__(self, fun, **jit_kwargs):
        return explain(fun, **jit_kwargs)


sys.modules[__name__].__class__ = _CallableModule

"""`fflow.explain(f)(*args)`: what jit does with `f` for these arguments.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> report = fflow.explain(lambda x: jnp.tanh(x * 2 + 1))(jnp.ones(1000))
    >>> report.eqns_after <= report.eqns_before
    True
    >>> len(report.groups)
    1

A sharded function's report ends with each sharded call's plan: its totals and what
the annotations forced (kept inputs by name):

    >>> pl = fflow.placement("cpu", [0, 1])
    >>> S, B = fflow.sbp.split, fflow.sbp.broadcast
    >>> f = fflow.shard(lambda x, w: x @ w, pl, in_sbp=(B, S(1)), keep_in_sbp=True)
    >>> report = fflow.explain(f)(jnp.ones((4, 3)), jnp.ones((3, 2)))
    >>> print(report.plans[0].splitlines()[3])
      in_sbp: input 1 f32[3,2] = S(1), kept (keep_in_sbp: w): read in place by eqn 0
"""

import sys
import time
import types

from fflow.transforms.jit import Jitted
from fflow.transforms.lowered import Report
from fflow.transforms.shard_print import summary


def explain(fun, **jit_kwargs):
    """`explain(f)(*args)` traces and lowers `f` as jit would and reports on it.

    Returns a `Report` (print it): trace time, pass times, equation counts before
    and after the passes, fused groups and estimated bytes moved; and, per sharded call
    (`fflow.shard`) in the program, its plan's totals and what its annotations forced
    (`report.plans`; `shard(...).plan(*args).explain()` adds every equation's choice).
    Under `grad(shard(f))` those are the primal and the backward sharded programs that
    grad derived, each saying which it is.
    """
    jitted = fun if isinstance(fun, Jitted) else Jitted(fun, **jit_kwargs)

    def run(*args, **kwargs):
        fresh = Jitted(jitted.fun, jitted.static_argnums, jitted.static_argnames)
        t0 = time.perf_counter()
        lowered = fresh.lower(*args, **kwargs)
        total = time.perf_counter() - t0
        return PlanReport(lowered.entry, compile_time=total - lowered.entry.trace_time)

    return run


class PlanReport(Report):
    """A `Report` that also explains the plans of the sharded calls in the program."""

    def __init__(self, entry, compile_time=None):
        super().__init__(entry, compile_time)
        calls = [e for e in self.program.eqns if "sharded_call" in e.primitive.traits]
        # (a program over several placements is planned per segment: no one plan)
        calls = [e for e in calls if not getattr(e.params["sharded"], "is_mixed", False)]
        self.plans = ["\n".join(summary(e.params["sharded"])) for e in calls]

    def __str__(self):
        text = super().__str__()
        for k, plan in enumerate(self.plans):
            text += f"\nsharded call {k}: " + plan
        return text

    __repr__ = __str__


__all__ = ["explain", "Report", "PlanReport"]


class _CallableModule(types.ModuleType):
    # `import fflow.explain` rebinds `fflow.explain` to this
    # module; calling it must still mean `fflow.explain(f)`
    def __call__(self, fun, **jit_kwargs):
        return explain(fun, **jit_kwargs)


sys.modules[__name__].__class__ = _CallableModule

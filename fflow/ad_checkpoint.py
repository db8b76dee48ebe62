"""`jax.ad_checkpoint`: `checkpoint` (remat), its policies and `checkpoint_name`.

`checkpoint_name(x, name)` returns `x`; the name policies (`save_only_these_names`,
`save_any_names_but_these`, `save_and_offload_only_these_names`) therefore save no
named value and recompute them, which gives the same numbers with less saved memory.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.ad_checkpoint import checkpoint, checkpoint_name, checkpoint_policies
    >>> f = checkpoint(lambda x: jnp.sin(checkpoint_name(x * 2, "h")),
    ...                policy=checkpoint_policies.save_only_these_names("h"))
    >>> round(float(fflow.grad(f)(0.5)), 4)
    1.0806
"""

from fflow.transforms.remat import checkpoint
from fflow.transforms.remat import checkpoint_policies as _policies

remat = checkpoint


def checkpoint_name(x, name):
    """Name `x` for name-based checkpoint policies (returns `x` unchanged)."""
    return x


def _names_policy(*names, **kw):
    return _policies.nothing_saveable


class checkpoint_policies(_policies):  # noqa: N801  (JAX's name)
    """JAX's checkpoint policies; the name-based ones save nothing here (see module doc)."""

    save_only_these_names = staticmethod(_names_policy)
    save_any_names_but_these = staticmethod(_names_policy)
    save_and_offload_only_these_names = staticmethod(_names_policy)

    @staticmethod
    def save_from_both_policies(policy_1, policy_2):
        def policy(prim, *avals, **params):
            return policy_1(prim, *avals, **params) or policy_2(prim, *avals, **params)

        return policy

    @staticmethod
    def offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host"):
        return _policies.dots_with_no_batch_dims_saveable


__all__ = ["checkpoint", "checkpoint_name", "checkpoint_policies", "remat"]

"""Top-level `jax.*` names fflow provides for JAX programs: device queries, no-op
contexts (`default_matmul_precision`, `ensure_compile_time_eval`, `named_scope`),
`named_call`, `jacobian`, `print_environment_info`.

fflow computes on one host (the CPU, or GPUs through CuPy); `shard` simulates
`config.cpu_devices` devices for SPMD programs, which is what `device_count()`
reports, so JAX programs that build a `Mesh` over `jax.devices()` get a mesh fflow
can run.

Example:
    >>> import fflow
    >>> fflow.device_count() == len(fflow.local_devices())
    True
    >>> with fflow.default_matmul_precision("float32"):
    ...     pass
"""

import contextlib
import platform
import sys

import numpy as np

from fflow.errors import user_error
from fflow.jax_sharding import cpu_devices
from fflow.transforms.ad_api import jacrev
from fflow.transforms.vmap import vmap
from fflow.tree_util import tree_leaves

jacobian = jacrev


def pmap(fun=None, axis_name=None, *, in_axes=0, out_axes=0, static_broadcasted_argnums=(),
         devices=None, backend=None, axis_size=None, donate_argnums=()):  # fmt: skip
    """JAX's `pmap`: `fun` mapped over the leading axis with a named axis for
    collectives, one simulated device per entry (at most `device_count()`); computed as
    a named `vmap`, so the numbers are those of the SPMD program."""
    if fun is None:
        return lambda f: pmap(f, axis_name, in_axes=in_axes, out_axes=out_axes)
    mapped = vmap(fun, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name,
                  axis_size=axis_size)  # fmt: skip
    limit = len(devices) if devices is not None else device_count()

    def run(*args):
        sizes = {np.shape(x)[0] for x in tree_leaves(args) if np.ndim(x) > 0}
        if sizes and max(sizes) > limit:
            raise user_error(
                ValueError,
                f"pmap over an axis of size {max(sizes)} needs that many devices; this run "
                f"has {limit}. Fix: raise fflow.config cpu_devices, or use vmap.",
            )
        return mapped(*args)

    return run


def local_devices(process_index=None, backend=None):
    """The simulated devices `shard` uses (config `cpu_devices`), as JAX lists its own."""
    return cpu_devices()


def device_count(backend=None):
    return len(local_devices())


def local_device_count(backend=None):
    return len(local_devices())


def default_backend():
    return "cpu"


@contextlib.contextmanager
def default_matmul_precision(precision):
    """JAX's matmul-precision context: fflow computes float32 products in full
    precision on the CPU, so this changes nothing (it exists so programs run)."""
    yield


@contextlib.contextmanager
def ensure_compile_time_eval():
    """JAX's context for eager evaluation inside jit: fflow evaluates constants
    eagerly already, so this changes nothing."""
    yield


@contextlib.contextmanager
def named_scope(name):
    """A name for the operations inside (profiling labels in JAX): no effect here."""
    if not isinstance(name, str):
        raise TypeError("named_scope name argument must be a string.")
    yield


def named_call(fun, *, name=None):
    """`fun` itself: JAX's named_call only labels the staged call."""
    return fun


def print_environment_info(return_string=False):
    """fflow's and its environment's versions, in the shape of JAX's report."""
    fflow = sys.modules["fflow"]
    text = (
        f"fflow:    {fflow.__fflow_version__} (JAX API {fflow.__version__})\n"
        f"numpy:    {np.__version__}\n"
        f"python:   {sys.version}\n"
        f"platform: {platform.platform()}\n"
    )
    if return_string:
        return text
    print(text, end="")


__all__ = [
    "default_backend",
    "default_matmul_precision",
    "device_count",
    "ensure_compile_time_eval",
    "jacobian",
    "local_device_count",
    "local_devices",
    "named_call",
    "named_scope",
    "pmap",
    "print_environment_info",
]

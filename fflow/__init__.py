"""fflow: JAX-style functional transformations with OneFlow's SBP sharding.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> f = fflow.jit(fflow.grad(lambda w: jnp.sum(jnp.tanh(w) ** 2)))
    >>> f(jnp.zeros(3)).tolist()
    [0.0, 0.0, 0.0]
"""

import importlib as _importlib
import sys as _sys

from fflow import array as _array  # installs the root trace
from fflow import array_methods, core, dtypes, errors
from fflow import device_buffer as _device_buffer  # noqa: F401  (Array.device)
from fflow.array import Array
from fflow.core import ShapedArray, Tracer

array_methods.install(Array)
array_methods.install(Tracer)

from fflow import lax_ops, numpy, tree_util  # noqa: E402
from fflow import primitives as _primitives  # noqa: E402,F401  (registers every primitive)
from fflow import sharding as _sharding  # noqa: E402,F401  (Array.to_global and friends)
from fflow.config import config as _config  # noqa: E402
from fflow.transforms.ad_api import (  # noqa: E402
    grad,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    linearize,
    value_and_grad,
    vjp,
)
from fflow.transforms.jit import jit, make_jaxpr  # noqa: E402

# The JAX API version fflow implements (libraries gate on `jax.__version__`); fflow's own
# release is `__fflow_version__`.
__version__ = __jax_version__ = "0.10.2"
__version_info__ = (0, 10, 2)
__fflow_version__ = "0.1.0"

# Names provided by modules that load on first use (keeps `import fflow` fast and
# keeps optional parts optional).
_LAZY = {
    "lax": ("fflow.lax", None),
    "vmap": ("fflow.transforms.vmap", "vmap"),
    "custom_jvp": ("fflow.transforms.custom", "custom_jvp"),
    "custom_vjp": ("fflow.transforms.custom", "custom_vjp"),
    "checkpoint": ("fflow.transforms.remat", "checkpoint"),
    "remat": ("fflow.transforms.remat", "checkpoint"),
    "checkpoint_policies": ("fflow.ad_checkpoint", "checkpoint_policies"),
    "test_util": ("fflow.test_util", None),
    "nn": ("fflow.nn", None),
    "random": ("fflow.random", None),
    "scipy": ("fflow.scipy", None),
    "config": ("fflow.config", "config"),
    "debug": ("fflow.debug", None),
    "explain": ("fflow.explain", "explain"),
    "shard": ("fflow.transforms.shard", "shard"),
    "with_sbp": ("fflow.transforms.shard", "with_sbp"),
    "placement": ("fflow.sharding", "placement"),
    "to_global": ("fflow.sharding", "to_global"),
    "sbp": ("fflow.sbp", None),
    "make_global_array": ("fflow.sharding", "make_global_array"),
    "process_index": ("fflow.sharding", "process_index"),
    "process_count": ("fflow.sharding", "process_count"),
    "pipeline": ("fflow.pipelining", "pipeline"),
    "accumulate_gradients": ("fflow.grad_accum", "accumulate_gradients"),
    "amp": ("fflow.transforms.amp", "amp"),
    "devices": ("fflow.device_buffer", "devices"),
    "device_put": ("fflow.device", "device_put"),
    "eval_shape": ("fflow.transforms.ad_api", "eval_shape"),
    "ShapeDtypeStruct": ("fflow.transforms.ad_api", "ShapeDtypeStruct"),
    "tree": ("fflow.tree", None),
    "ops": ("fflow.ops", None),
    "save": ("fflow.serialization", "save"),
    "load": ("fflow.serialization", "load"),
    "CheckpointManager": ("fflow.serialization", "CheckpointManager"),
    "optim": ("fflow.optim", None),
    # JAX names for JAX programs (fflow.compat makes `import jax` resolve here)
    "typing": ("fflow.typing", None),
    "flatten_util": ("fflow.flatten_util", None),
    "experimental": ("fflow.experimental", None),
    "extend": ("fflow.extend", None),
    "interpreters": ("fflow.interpreters", None),
    "ad_checkpoint": ("fflow.ad_checkpoint", None),
    "stages": ("fflow.stages", None),
    "compat": ("fflow.compat", None),
    "Device": ("fflow.device_buffer", "Device"),
    "jacobian": ("fflow.jax_api", "jacobian"),
    "pure_callback": ("fflow.callbacks", "pure_callback"),
    "image": ("fflow.image", None),
    "device_count": ("fflow.jax_api", "device_count"),
    "local_device_count": ("fflow.jax_api", "local_device_count"),
    "local_devices": ("fflow.jax_api", "local_devices"),
    "default_backend": ("fflow.jax_api", "default_backend"),
    "default_matmul_precision": ("fflow.jax_api", "default_matmul_precision"),
    "ensure_compile_time_eval": ("fflow.jax_api", "ensure_compile_time_eval"),
    "named_scope": ("fflow.jax_api", "named_scope"),
    "named_call": ("fflow.jax_api", "named_call"),
    "print_environment_info": ("fflow.jax_api", "print_environment_info"),
    "pmap": ("fflow.jax_api", "pmap"),
    "shard_map": ("fflow.jax_sharding", "shard_map"),
    "make_mesh": ("fflow.jax_sharding", "make_mesh"),
    "with_sharding_constraint": ("fflow.jax_sharding", "with_sharding_constraint"),
}


# JAX's ClosedJaxpr / Jaxpr / JaxprEqn / Literal field names on fflow's IR, for custom
# interpreters (fflow/jax_core.py): a Program is a ClosedJaxpr and its Jaxpr at once
core.Program.jaxpr = property(lambda self: self)
core.Program.literals = property(lambda self: self.consts)
core.Program.effects = property(lambda self: frozenset())
core.Eqn.invars = property(lambda self: self.inputs)
core.Eqn.outvars = property(lambda self: self.outputs)
core.Eqn.effects = property(lambda self: frozenset({"effect"} & self.primitive.traits))
core.Literal.val = property(lambda self: self.value)


def _array_sharding(self):
    # JAX's `x.sharding` (NamedSharding of a global array, else one device), loaded on use
    return _importlib.import_module("fflow.jax_sharding").sharding_of(self)


Array.sharding = property(_array_sharding)
Array.devices = lambda self: self.sharding.device_set  # JAX's `x.devices()`


def __getattr__(name):
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module 'fflow' has no attribute {name!r}")
    module = _importlib.import_module(entry[0])
    value = module if entry[1] is None else getattr(module, entry[1])
    globals()[name] = value
    return value


# Global arrays (fflow/sharding.py) reach the modules above it through hooks, each
# loading its module on first use (import time): the runtime, eager boxing, moves to
# other devices, eager operations and sharded programs over several placements.


def _make_runtime(kind):
    """FFLOW_RUNTIME=mpi: MPI ranks (fflow.launch); nccl: MPI ranks with one GPU each,
    collectives over NCCL; else simulated devices in this process."""
    if kind == "nccl":
        return _importlib.import_module("fflow.lowering.cuda_nccl").NCCLRuntime()
    if kind == "mpi":
        return _importlib.import_module("fflow.runtime_mpi").MPIRuntime()
    return _importlib.import_module("fflow.runtime_sim").SimRuntime()


_sharding.runtime_factories.append(_make_runtime)


def _box_global(x, pl, sbp):
    """Eager boxing of a global array (`x.to_global(sbp=...)`): transforms/shard_exec.py."""
    return _importlib.import_module("fflow.transforms.shard_exec").run_identity(x, pl, sbp)


_sharding.boxers.append(_box_global)


def _global_dispatch(prim, args, params):
    """Eager operations on global arrays: planned and run by transforms/shard.py."""
    for a in args:
        if type(a) is _array.Array and a._sharding is not None:
            shard = _importlib.import_module("fflow.transforms.shard")
            return shard._global_dispatch(prim, args, params)
    return NotImplemented


_array.special_dispatch.append(_global_dispatch)


def _move_placement(x, placement, sbp):
    """to_global onto other devices: point-to-point boxing (transforms/shard_transfer.py),
    loaded on the first move (import time)."""
    return _importlib.import_module("fflow.transforms.shard_transfer").transfer(x, placement, sbp)


_sharding.placement_movers.append(_move_placement)


def _cut_program(*args):
    """A sharded program over several placements: transforms/shard_mixed.py, loaded
    when `shard` first traces a move (import time)."""
    return _importlib.import_module("fflow.transforms.shard_mixed").MixedProgram(*args)


_sharding.program_cutters.append(_cut_program)


def _debug_checks(_value):
    """Eager NaN/inf checks live in fflow.debug, loaded when first turned on."""
    if _config.debug_nans or _config.debug_infs or "fflow.debug" in _sys.modules:
        _importlib.import_module("fflow.debug")._eager_checks_hook(_value)


_config.on_update("debug_nans", _debug_checks)
_config.on_update("debug_infs", _debug_checks)
_debug_checks(None)


def block_until_ready(x):
    """Arrays are computed eagerly on the CPU: returns `x`."""
    return x


def device_get(x):
    """NumPy copies of every array leaf of `x`."""
    import numpy as np

    return tree_util.tree_map(lambda a: np.asarray(a) if isinstance(a, _array.Array) else a, x)


def stop_gradient(x):
    return lax_ops.stop_gradient(x)


class _ArrayType(type):
    def __instancecheck__(cls, x):
        return isinstance(x, (_array.Array, Tracer))

    def __subclasscheck__(cls, c):
        return issubclass(c, (_array.Array, Tracer))


class Array(metaclass=_ArrayType):  # noqa: F811  (the public name; fflow.array.Array is concrete)
    """JAX's `jax.Array`: the type of fflow's arrays and of traced values, for
    `isinstance` checks and annotations (as in JAX, a tracer is an Array).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> isinstance(jnp.ones(2), fflow.Array)
        True
        >>> seen = []
        >>> _ = fflow.jit(lambda x: seen.append(isinstance(x, fflow.Array)) or x)(1.0)
        >>> seen
        [True]
    """


# The public names (dir(fflow) lists the lazy ones too, which load on first access)
__all__ = sorted(
    {
        "Array",
        "block_until_ready",
        "device_get",
        "dtypes",
        "errors",
        "grad",
        "hessian",
        "jacfwd",
        "jacrev",
        "jit",
        "jvp",
        "linearize",
        "make_jaxpr",
        "numpy",
        "sbp",
        "sharding",
        "stop_gradient",
        "tree_util",
        "value_and_grad",
        "vjp",
    }
    | set(_LAZY)
)


def __dir__():
    return list(__all__)

"""JAX's sharding API on fflow's placements and SBP (`jax.sharding` under fflow.compat).

* `Mesh(devices, axis_names)` is a `fflow.placement` whose hierarchy is the device
  array's shape, with a name per mesh axis.
* `PartitionSpec(*entries)` (`P`) names, per array dimension, the mesh axes it is split
  over; on a mesh it is an N-D SBP: mesh axis `a` gets `S(k)` when dimension `k` names
  `a`, else `B` (`to_sbp`).
* `NamedSharding(mesh, spec)` is the pair; `device_put(x, sharding)` makes a global
  array, `jit(f, in_shardings=..., out_shardings=...)` runs `fflow.shard` with those
  SBPs (the same plan as the equivalent `shard` call), `with_sharding_constraint` is
  `with_sbp`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.jax_sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(fflow.local_devices()[:4], ("x",))
    >>> x = fflow.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
    >>> x.sbp, x.sharding.spec
    ((S(0),), PartitionSpec('x',))
"""

import weakref

import numpy as np

from fflow.device import Device, device_of, device_put
from fflow.errors import user_error
from fflow.numpy import moveaxis
from fflow.sharding import broadcast, device_count, placement, split, to_global
from fflow.transforms.jit import jit
from fflow.transforms.shard import shard, with_sbp
from fflow.transforms.vmap import vmap
from fflow.tree_util import (
    flatten_up_to,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_structure,
    tree_unflatten,
)


def cpu_devices():
    """The simulated devices (config `cpu_devices`, or the MPI ranks under fflow.launch)."""
    return [Device("cpu", i) for i in range(device_count())]


class PartitionSpec(tuple):
    """Per array dimension: None, a mesh axis name, or a tuple of names (JAX's `P`)."""

    UNCONSTRAINED = "unconstrained"

    def __new__(cls, *partitions):
        return super().__new__(cls, partitions)

    def __repr__(self):
        return (
            "PartitionSpec("
            + ", ".join(repr(p) for p in self)
            + ("," if len(self) == 1 else "")
            + ")"
        )

    def __reduce__(self):
        return (PartitionSpec, tuple(self))

    def _fflow_jit(self, fun, in_shardings, out_shardings, **kw):  # under `with mesh:`
        return sharded_jit(fun, in_shardings, out_shardings, **kw)


P = PartitionSpec


class Mesh:
    """A named device mesh: `Mesh(devices, axis_names)` (devices: an N-D array or list)."""

    def __init__(self, devices, axis_names, axis_types=None):
        arr = np.asarray(devices, dtype=object)
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        if arr.ndim != len(axis_names):
            raise user_error(
                ValueError,
                f"Mesh: {len(axis_names)} axis names {axis_names} for a device array of "
                f"{arr.ndim} dimensions {arr.shape}. Fix: one name per mesh dimension.",
            )
        self.devices = arr
        self.axis_names = axis_names
        ranks = np.vectorize(lambda d: d.id if hasattr(d, "id") else int(d), otypes=[int])(arr)
        self.placement = placement("cpu", ranks.tolist() if arr.ndim else [int(ranks)])

    @property
    def shape(self):
        return dict(zip(self.axis_names, self.devices.shape))

    @property
    def size(self):
        return int(self.devices.size)

    @property
    def device_ids(self):
        return np.asarray(self.placement.ranks).reshape(self.devices.shape)

    def __enter__(self):
        _mesh_stack.append(self)
        return self

    def __exit__(self, *exc):
        _mesh_stack.pop()

    def __eq__(self, other):
        return (
            isinstance(other, Mesh)
            and self.axis_names == other.axis_names
            and self.placement == other.placement
        )

    def __hash__(self):
        return hash((self.axis_names, self.placement))

    def __repr__(self):
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items())
        return f"Mesh({axes})"


_mesh_stack = []


def make_mesh(axis_shapes, axis_names, *, devices=None, axis_types=None):
    """A mesh of the first prod(axis_shapes) devices (JAX's `jax.make_mesh`)."""
    n = int(np.prod(axis_shapes))
    devices = list(devices if devices is not None else cpu_devices())
    if len(devices) < n:
        raise user_error(
            ValueError,
            f"make_mesh: a {tuple(axis_shapes)} mesh needs {n} devices, {len(devices)} exist. "
            f"Fix: raise fflow.config cpu_devices (FFLOW_CPU_DEVICES).",
        )
    arr = np.empty(n, dtype=object)
    arr[:] = devices[:n]
    return Mesh(arr.reshape(tuple(axis_shapes)), axis_names)


def to_sbp(mesh, spec, ndim=None):
    """The N-D SBP (one entry per mesh axis) a PartitionSpec means on `mesh`."""
    spec = PartitionSpec() if spec is None else spec
    where = {}
    for dim, entry in enumerate(spec):
        if entry is None or entry == PartitionSpec.UNCONSTRAINED:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        order = [mesh.axis_names.index(n) if n in mesh.axis_names else -1 for n in names]
        if -1 in order:
            bad = [n for n, o in zip(names, order) if o < 0]
            raise user_error(
                ValueError,
                f"PartitionSpec {spec} names mesh axis {bad[0]!r}, but the mesh axes are "
                f"{mesh.axis_names}.",
            )
        if order != sorted(order):
            raise user_error(
                NotImplementedError,
                f"PartitionSpec {spec}: dimension {dim} is split over mesh axes {names} in an "
                f"order other than the mesh's {mesh.axis_names}; fflow's SBP splits in mesh "
                f"order. Fix: list them as {tuple(mesh.axis_names[o] for o in sorted(order))}.",
            )
        for n in names:
            if n in where:
                raise user_error(ValueError, f"PartitionSpec {spec} uses mesh axis {n!r} twice")
            where[n] = dim
    if ndim is not None and len(spec) > ndim:
        raise user_error(
            ValueError, f"PartitionSpec {spec} has {len(spec)} entries for an array of rank {ndim}"
        )
    return tuple(split(where[n]) if n in where else broadcast for n in mesh.axis_names)


class Sharding:
    """Base of the shardings (JAX's `jax.sharding.Sharding`)."""

    def _fflow_put(self, x):  # `fflow.device_put(x, sharding)` lands here
        return put(x, self)

    def _fflow_jit(self, fun, in_shardings, out_shardings, **kw):  # jit(in_shardings=...)
        return sharded_jit(fun, in_shardings, out_shardings, **kw)


class NamedSharding(Sharding):
    """A mesh and a PartitionSpec (JAX's `NamedSharding`); `.sbp` is fflow's N-D SBP."""

    def __init__(self, mesh, spec=None, *, memory_kind=None):
        if not isinstance(mesh, Mesh):
            raise user_error(TypeError, f"NamedSharding needs a Mesh, got {mesh!r}")
        self.mesh = mesh
        self.spec = PartitionSpec() if spec is None else PartitionSpec(*spec)
        self.sbp = to_sbp(mesh, self.spec)
        self.memory_kind = memory_kind

    @property
    def placement(self):
        return self.mesh.placement

    @property
    def device_set(self):
        return set(self.mesh.devices.flat)

    @property
    def addressable_devices(self):
        return self.device_set

    @property
    def is_fully_replicated(self):
        return all(s == broadcast for s in self.sbp)

    @property
    def num_devices(self):
        return self.mesh.size

    def shard_shape(self, global_shape):
        shape = list(global_shape)
        for n, s in zip(self.mesh.axis_names, self.sbp):
            if s != broadcast:
                shape[s.axis] = -(-shape[s.axis] // self.mesh.shape[n])
        return tuple(shape)

    def __eq__(self, other):
        return isinstance(other, NamedSharding) and (self.mesh, self.sbp) == (other.mesh, other.sbp)

    def __hash__(self):
        return hash((self.mesh, self.sbp))

    def __repr__(self):
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"


class SingleDeviceSharding(Sharding):
    """One device: the array is a local (not global) array."""

    def __init__(self, device, *, memory_kind=None):
        self.device = device
        self.memory_kind = memory_kind
        self.is_fully_replicated = True

    @property
    def device_set(self):
        return {self.device}

    def __repr__(self):
        return f"SingleDeviceSharding(device={self.device!r})"


def put(x, sharding):
    """`device_put(x, sharding)`: a global array laid out by a NamedSharding."""

    if isinstance(sharding, SingleDeviceSharding):
        return device_put(x, sharding.device)

    def one(leaf):
        out = to_global(leaf, sharding.placement, sharding.sbp)
        # `out.sharding` gives back the user's mesh and spec (arrays are unhashable: by id)
        key = id(out)
        _named[key] = (weakref.ref(out, lambda _, k=key: _named.pop(k, None)), sharding)
        return out

    return tree_map(one, x)


_named = {}  # id(global array) -> (weak ref to it, the NamedSharding it was put with)


def sharding_of(x):
    """`x.sharding`: a NamedSharding for a global array, else a SingleDeviceSharding."""

    if x.placement is None:
        return SingleDeviceSharding(device_of(x))
    pl, sbp = x.placement, x.sbp
    ref, named = _named.get(id(x), (None, None))
    if ref is not None and ref() is x and named.placement == pl and named.sbp == tuple(sbp):
        return named
    names = tuple(f"d{i}" for i in range(pl.ndim))
    devs = np.empty(len(pl.ranks), dtype=object)
    devs[:] = [d for r in pl.ranks for d in cpu_devices()[r : r + 1]]
    mesh = Mesh(devs.reshape(pl.hierarchy), names)
    spec = [None] * len(x.shape)
    for name, s in zip(names, sbp):
        if s.is_split():
            prev = spec[s.axis]
            spec[s.axis] = (
                name if prev is None else (*(prev if isinstance(prev, tuple) else (prev,)), name)
            )
        elif s.is_partial():
            return _PartialSharding(mesh, sbp)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(mesh, PartitionSpec(*spec))


class _PartialSharding(Sharding):
    """A global array with a partial SBP: no PartitionSpec can say that."""

    def __init__(self, mesh, sbp):
        self.mesh, self.sbp = mesh, sbp
        self.is_fully_replicated = False

    @property
    def device_set(self):
        return set(self.mesh.devices.flat)

    def __repr__(self):
        return f"PartialSharding(mesh={self.mesh!r}, sbp={self.sbp})"


def _spec_sbp(sharding):
    if sharding is None:
        return None
    if isinstance(sharding, NamedSharding):
        return sharding.sbp
    if isinstance(sharding, PartitionSpec):
        mesh = _current_mesh("a PartitionSpec in in_shardings/out_shardings")
        return to_sbp(mesh, sharding)
    raise user_error(TypeError, f"expected a NamedSharding or PartitionSpec, got {sharding!r}")


def _current_mesh(what):
    if not _mesh_stack:
        raise user_error(
            ValueError, f"{what} needs a mesh: use NamedSharding(mesh, spec) or `with mesh:`"
        )
    return _mesh_stack[-1]


def _mesh_of(tree):

    for s in tree_leaves(tree, is_leaf=lambda v: isinstance(v, (NamedSharding, PartitionSpec))):
        if isinstance(s, NamedSharding):
            return s.mesh
    return _current_mesh("jit(in_shardings=PartitionSpec...)")


def _sbp_tree(tree):

    def conv(s):
        return None if s is None else _Box(_spec_sbp(s))

    return tree_map(conv, tree, is_leaf=lambda v: isinstance(v, (NamedSharding, PartitionSpec)))


class _Box(tuple):
    """An N-D SBP kept whole (a leaf) inside a pytree of shardings."""


def sharded_jit(fun, in_shardings=None, out_shardings=None, **jit_kwargs):
    """`jit(fun, in_shardings=, out_shardings=)`: `fflow.shard` with those SBPs, jitted.

    `.sharded` is the `fflow.shard` object (`.sharded.plan(*args)` prints its plan).
    """

    mesh = _mesh_of((in_shardings, out_shardings))
    in_sbp = _unbox(_sbp_tree(in_shardings)) if in_shardings is not None else None
    out_sbp = _unbox(_sbp_tree(out_shardings)) if out_shardings is not None else None
    if isinstance(in_sbp, list):
        in_sbp = tuple(in_sbp)
    sharded = shard(fun, mesh.placement, in_sbp=in_sbp, out_sbp=out_sbp)
    wrapped = jit(sharded, **jit_kwargs)
    wrapped.sharded = sharded
    return wrapped


def _unbox(tree):
    if isinstance(tree, _Box):
        return tuple(tree)
    if isinstance(tree, (list, tuple)) and not isinstance(tree, _Box):
        return (
            type(tree)(_unbox(t) for t in tree)
            if isinstance(tree, tuple)
            else [_unbox(t) for t in tree]
        )
    if isinstance(tree, dict):
        return {k: _unbox(v) for k, v in tree.items()}
    return tree


def with_sharding_constraint(x, shardings):
    """Constrain `x`'s layout (JAX's `with_sharding_constraint`): `with_sbp` per leaf."""

    if isinstance(shardings, (NamedSharding, PartitionSpec)):
        sbp = _spec_sbp(shardings)
        return tree_map(lambda leaf: with_sbp(leaf, sbp), x)
    return tree_map(
        lambda leaf, s: with_sbp(leaf, _spec_sbp(s)),
        x,
        shardings,
    )


# -- shard_map and pmap: the per-device view, as nested named vmaps -------------------


def shard_map(f, mesh=None, in_specs=None, out_specs=None, check_rep=True, check_vma=None,
              auto=frozenset(), axis_names=None):  # fmt: skip
    """JAX's `shard_map`: `f` runs on each device's block of the inputs (split as
    `in_specs` say), with collectives (`lax.psum(x, "x")`...) over the mesh axes;
    the blocks of the outputs are put together as `out_specs` say.

    Each mesh axis is a named `vmap` over the blocks, so the numbers are those of
    the SPMD program; an output whose spec leaves a mesh axis out must be the same
    on every device of that axis (as JAX's check_rep asks), and the first is kept.
    """
    if f is None or mesh is None:
        return lambda g: shard_map(g, mesh, in_specs, out_specs, check_rep)
    names = list(mesh.axis_names)
    sizes = [mesh.shape[n] for n in names]

    def wrapped(*args):
        leaves, tree = tree_flatten(args)
        specs = _spec_leaves(in_specs, args, "in_specs")
        out_store = []

        def flat(*xs):
            out = f(*tree_unflatten(tree, list(xs)))
            out_leaves, out_tree = tree_flatten(out)
            out_store.append((out_tree, out))
            return out_leaves

        fn = flat
        for name, size in reversed(list(zip(names, sizes))):
            fn = _map_axis(fn, name, size, specs, lambda: out_store, out_specs)
        out_leaves = fn(*leaves)
        out_tree = out_store[-1][0]
        return tree_unflatten(out_tree, list(out_leaves))

    return wrapped


def _spec_leaves(specs, args, what):
    is_spec = lambda s: isinstance(s, PartitionSpec) or s is None  # noqa: E731
    if isinstance(specs, PartitionSpec):
        return [specs] * len(tree_leaves(args))
    prefix = tree_structure(specs, is_leaf=is_spec)
    subtrees = flatten_up_to(prefix, args)
    spec_list = tree_leaves(specs, is_leaf=is_spec)
    out = []
    for spec, sub in zip(spec_list, subtrees):
        out.extend([spec] * len(tree_leaves(sub)))
    return out


def _dim_of(spec, name):
    for dim, entry in enumerate(spec or ()):
        if entry == name or (isinstance(entry, tuple) and name in entry):
            return dim
    return None


def _map_axis(fn, name, size, in_specs, get_store, out_specs):
    def mapped(*xs):
        in_axes, blocks = [], []
        for x, spec in zip(xs, in_specs):
            d = _dim_of(spec, name)
            if d is None:
                in_axes.append(None)
                blocks.append(x)
                continue
            shape = tuple(x.shape)
            if shape[d] % size:
                raise user_error(
                    ValueError,
                    f"shard_map: dimension {d} of size {shape[d]} does not split over mesh "
                    f"axis {name!r} of size {size}.",
                )
            blocks.append(x.reshape(shape[:d] + (size, shape[d] // size) + shape[d + 1 :]))
            in_axes.append(d)
        outs = vmap(lambda *b: list(fn(*b)), in_axes=tuple(in_axes), out_axes=0,
                    axis_name=name, axis_size=size)(*blocks)  # fmt: skip
        out_tree, out_value = get_store()[-1]
        specs = _spec_leaves(out_specs, out_value, "out_specs")
        result = []
        for o, spec in zip(outs, specs):
            d = _dim_of(spec, name)
            if d is None:
                result.append(o[0])  # replicated over this axis: every lane holds it
            else:
                moved = moveaxis(o, 0, d)
                shape = tuple(moved.shape)
                result.append(
                    moved.reshape(shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2 :])
                )
        return result

    return mapped


__all__ = [
    "Mesh",
    "shard_map",
    "NamedSharding",
    "PartitionSpec",
    "P",
    "SingleDeviceSharding",
    "Sharding",
    "make_mesh",
    "sharded_jit",
    "to_sbp",
    "with_sharding_constraint",
]

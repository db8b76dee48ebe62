"""Checkpoints: `fflow.save(path, tree)` / `fflow.load(path, like=None)` (OneFlow's names)
and `CheckpointManager` for training loops.

On-disk format (a directory), chosen on purpose: one NumPy `.npy` file per array (per
shard for global arrays) plus `index.json`. `.npy` is NumPy's own documented format,
needs no extra dependency, can be memory-mapped, and lets every rank write its own
shards as separate files with no shared file header to coordinate (safetensors keeps
all tensors of a file behind one header, which would force a gather). `index.json`
holds the format version, the tree structure (dicts, lists, tuples, None and
namedtuples; other node types are restored through `like=`), and per leaf its kind,
shape, logical dtype (bfloat16 and other ml_dtypes types are stored as their raw bits,
uint8/uint16, and viewed back), and for a global array its placement hierarchy, SBP
and the box (start, stop) of each distinct shard file. Python scalars and strings are
stored inline.

Saving is atomic: files go to a temporary directory next to `path`, each is fsynced,
then the directory is renamed into place (the old checkpoint, if any, is moved aside
first and removed last). A process killed mid-save leaves the previous checkpoint.

Global arrays are saved shard by shard, each process writing the shards it holds (a
shard replicated by broadcast axes is written once), and restored onto any placement
and SBP given by `like`: each device reads only the parts of the files that overlap
its own box.

Example:
    >>> import os, tempfile, fflow, fflow.numpy as jnp
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> fflow.save(path, {"w": jnp.ones((2, 3)), "step": 7})
    >>> restored = fflow.load(path)
    >>> restored["w"].shape, restored["step"]
    ((2, 3), 7)
"""

import importlib
import json
import os
import re
import shutil

import numpy as np

from fflow.array import Array
from fflow.errors import FflowError, user_error
from fflow.sharding import (
    Broadcast,
    Partial,
    is_global,
    local_box,
    local_indices,
    make_global,
    runtime,
    to_global,
)
from fflow.tree_util import tree_flatten, tree_structure, tree_unflatten

FORMAT = "fflow-checkpoint"
VERSION = 1
INDEX = "index.json"


# ----------------------------------------------------------------------------
# dtypes and SBP to and from JSON


def _storage(dtype):
    """The NumPy dtype the bits of `dtype` are stored as (itself for NumPy's own)."""
    dtype = np.dtype(dtype)
    if dtype.isbuiltin == 1 and dtype.kind in "biufc":
        return dtype
    return np.dtype(f"u{dtype.itemsize}")  # bfloat16, float8_*, int4...: raw bits


def _dtype_from_name(name):
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # optional (the bf16 extra): only for its dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _sbp_to_str(s):
    return repr(s)


# ----------------------------------------------------------------------------
# Tree structure to and from JSON


def _encode(tree, leaves):
    if tree is None:
        return {"kind": "none"}
    t = type(tree)
    if t is dict:
        if not all(isinstance(k, str) for k in tree):
            return _node(tree, leaves)
        keys = sorted(tree)
        return {"kind": "dict", "keys": keys, "children": [_encode(tree[k], leaves) for k in keys]}
    if t in (list, tuple):
        return {"kind": t.__name__, "children": [_encode(c, leaves) for c in tree]}
    if isinstance(tree, tuple) and hasattr(t, "_fields"):
        return {
            "kind": "namedtuple",
            "type": f"{t.__module__}:{t.__qualname__}",
            "children": [_encode(c, leaves) for c in tree],
        }
    if tree_structure(tree).kind == "leaf":
        leaves.append(tree)
        return {"kind": "leaf"}
    return _node(tree, leaves)


def _node(tree, leaves):
    sub = tree_flatten(tree)[0]
    leaves.extend(sub)
    t = type(tree)
    return {"kind": "node", "type": f"{t.__module__}:{t.__qualname__}", "leaves": len(sub)}


def _decode(spec, it):
    kind = spec["kind"]
    if kind == "none":
        return None
    if kind == "leaf":
        return next(it)
    if kind == "dict":
        return {k: _decode(c, it) for k, c in zip(spec["keys"], spec["children"])}
    if kind in ("list", "tuple"):
        items = [_decode(c, it) for c in spec["children"]]
        return items if kind == "list" else tuple(items)
    if kind == "namedtuple":
        module, qual = spec["type"].split(":")
        cls = importlib.import_module(module)
        for part in qual.split("."):
            cls = getattr(cls, part)
        return cls(*[_decode(c, it) for c in spec["children"]])
    raise user_error(
        ValueError,
        f"this checkpoint holds a {spec['type']} (a pytree node type JSON cannot rebuild). "
        "Fix: pass like=<a tree of the same structure> to fflow.load.",
    )


# ----------------------------------------------------------------------------
# Saving


def _is_array(x):
    return isinstance(x, (Array, np.ndarray, np.generic)) or (
        hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype")
    )


def barrier():
    """Wait until every process got here (MPI: a non-blocking barrier waited on through
    the runtime's fault-aware loop, so a rank that died ends the wait with its error)."""
    rt = runtime()
    if not hasattr(rt, "comm"):
        return
    req = rt.comm.Ibarrier()
    if hasattr(rt, "wait"):
        rt.wait([req], list(range(rt.device_count())), "a fflow.save/load barrier")
    else:
        req.Wait()


def _is_writer():
    return runtime().rank == 0


def _write_npy(path, array):
    with open(path, "wb") as f:
        # (ascontiguousarray would turn a 0-d array into 1-d)
        array = array if array.flags.c_contiguous else np.array(array, order="C")
        np.lib.format.write_array(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _global_entry(i, x, tmp, write):
    if any(isinstance(s, Partial) for s in x.sbp):
        # partial values are not the array: reduce them (a collective) before saving
        x = to_global(x, sbp=tuple(Broadcast() if isinstance(s, Partial) else s for s in x.sbp))
    pl, sbp = x.placement, x.sbp
    boxes, writers = {}, []
    for d in range(pl.size):
        box = local_box(x.shape, sbp, pl.hierarchy, pl.coords(d))
        if box not in boxes:
            boxes[box] = d
            writers.append((d, box))
    dtype = np.dtype(x.dtype)
    shards = x._value.shards
    entries = []
    for d, box in writers:
        name = f"leaf_{i:05d}.shard_{d:05d}.npy"
        if write and d in shards:
            _write_npy(os.path.join(tmp, name), np.asarray(shards[d]).view(_storage(dtype)))
        entries.append({"file": name, "box": [list(b) for b in box]})
    return {
        "kind": "global",
        "shape": list(x.shape),
        "dtype": dtype.name,
        "hierarchy": list(pl.hierarchy),
        "ranks": list(pl.ranks),
        "sbp": [_sbp_to_str(s) for s in sbp],
        "shards": entries,
    }


def _leaf_entry(i, x, tmp):
    if not isinstance(x, np.generic) and (isinstance(x, (bool, int, float, str)) or x is None):
        return {"kind": "python", "value": x, "type": type(x).__name__}
    if is_global(x):
        return _global_entry(i, x, tmp, write=True)
    if not _is_array(x):
        raise user_error(
            TypeError,
            f"fflow.save: leaf {i} is a {type(x).__name__}, which is neither an array nor a "
            "Python scalar/string. Fix: convert it, or keep it out of the saved tree.",
        )
    kind = "numpy" if isinstance(x, (np.ndarray, np.generic)) else "array"
    value = np.asarray(x)
    name = f"leaf_{i:05d}.npy"
    if _is_writer():
        _write_npy(os.path.join(tmp, name), value.view(_storage(value.dtype)))
    entry = {"kind": kind, "shape": list(value.shape), "dtype": value.dtype.name}
    entry["shards"] = [{"file": name, "box": [[0, n] for n in value.shape]}]
    if kind == "array" and getattr(x, "weak_type", False):
        entry["weak_type"] = True
    return entry


def save(path, tree):
    """Save a pytree of arrays (local or global) and Python scalars to directory `path`.

    Every process of a multi-process run must call it (each writes its own shards).

    Args:
        path: the checkpoint directory (created; an existing one is replaced atomically).
        tree: a pytree (dicts, lists, tuples, namedtuples, modules, optimizer states...).

    Example:
        >>> import os, tempfile, fflow, fflow.numpy as jnp
        >>> d = tempfile.mkdtemp()
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> w = fflow.to_global(jnp.arange(8.0).reshape(4, 2), pl, fflow.sbp.split(0))
        >>> fflow.save(os.path.join(d, "c"), {"w": w})
        >>> sorted(os.listdir(os.path.join(d, "c")))
        ['index.json', 'leaf_00000.shard_00000.npy', 'leaf_00000.shard_00001.npy']
    """
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    tmp = os.path.join(parent, f".{name}.tmp-fflow")
    if _is_writer():
        os.makedirs(parent, exist_ok=True)
        if os.path.exists(tmp):  # left by a save that was killed
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    barrier()
    leaves = []
    structure = _encode(tree, leaves)
    entries = [_leaf_entry(i, x, tmp) for i, x in enumerate(leaves)]
    barrier()
    if _is_writer():
        index = {"format": FORMAT, "version": VERSION, "tree": structure, "leaves": entries}
        with open(os.path.join(tmp, INDEX), "w") as f:
            json.dump(index, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = os.path.join(parent, f".{name}.old-fflow")
        if os.path.exists(path):
            if os.path.exists(old):
                shutil.rmtree(old)
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(parent)
        if os.path.exists(old):
            shutil.rmtree(old)
    barrier()


# ----------------------------------------------------------------------------
# Loading


def _read_box(dirname, entry, box, dtype):
    """The part `box` (list of (start, stop)) of a saved array, from its shard files."""
    out = np.empty(tuple(b - a for a, b in box), dtype)
    storage = _storage(dtype)
    filled = 0
    for shard in entry["shards"]:
        sbox = shard["box"]
        lo = [max(a, c) for (a, _), (c, _) in zip(box, sbox)]
        hi = [min(b, d) for (_, b), (_, d) in zip(box, sbox)]
        if any(h <= l for l, h in zip(lo, hi)) and out.size:
            continue
        data = np.load(os.path.join(dirname, shard["file"]), mmap_mode="r", allow_pickle=False)
        src = tuple(slice(l - c, h - c) for l, h, (c, _) in zip(lo, hi, sbox))
        dst = tuple(slice(l - a, h - a) for l, h, (a, _) in zip(lo, hi, box))
        out[dst] = np.asarray(data[src]).view(storage).view(dtype)
        filled += int(np.prod([h - l for l, h in zip(lo, hi)]))
        if not out.size:
            break
    if filled < out.size:
        raise FflowError(f"checkpoint {dirname} misses part of an array (a shard file is lost)")
    return out


def _restore_leaf(dirname, entry, like):
    kind = entry["kind"]
    if kind == "python":
        return entry["value"]
    shape = tuple(entry["shape"])
    dtype = _dtype_from_name(entry["dtype"])
    if like is not None and hasattr(like, "shape") and tuple(like.shape) != shape:
        raise user_error(
            ValueError,
            f"fflow.load: a saved array has shape {shape} but like= has {tuple(like.shape)}. "
            "Fix: pass a like= tree that matches the checkpoint.",
        )
    if like is not None and hasattr(like, "dtype") and np.dtype(like.dtype) != dtype:
        raise user_error(
            ValueError,
            f"fflow.load: a saved array is {dtype.name} but like= has {np.dtype(like.dtype).name}.",
        )
    if like is not None and is_global(like):
        return _restore_global(dirname, entry, shape, dtype, like.placement, like.sbp)
    full = [[0, n] for n in shape]
    if like is None and kind == "global":
        return Array(_read_box(dirname, entry, full, dtype))
    value = _read_box(dirname, entry, full, dtype)
    if isinstance(like, (np.ndarray, np.generic)) or (like is None and kind == "numpy"):
        return value
    return Array(value, bool(entry.get("weak_type", False)))


def _restore_global(dirname, entry, shape, dtype, pl, sbp):
    read_sbp = tuple(Broadcast() if isinstance(s, Partial) else s for s in sbp)
    shards = {}
    for d in local_indices(pl):
        box = local_box(shape, read_sbp, pl.hierarchy, pl.coords(d))
        shards[d] = _read_box(dirname, entry, [list(b) for b in box], dtype)
    out = make_global(shape, dtype, pl, read_sbp, shards)
    return out if read_sbp == tuple(sbp) else to_global(out, sbp=sbp)


def _find(path):
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(os.path.join(path, INDEX)):
        return path
    parent, name = os.path.split(path)
    old = os.path.join(parent, f".{name}.old-fflow")
    if os.path.exists(os.path.join(old, INDEX)):  # a save was killed between its renames
        return old
    raise user_error(FileNotFoundError, f"fflow.load: no checkpoint at {path}")


def load(path, like=None):
    """Load a checkpoint written by `fflow.save`.

    Args:
        path: the checkpoint directory.
        like: optional pytree of the same structure (e.g. the freshly initialised
            model and optimizer state): gives node types JSON cannot rebuild, and each
            global-array leaf of `like` sets the placement and SBP the saved array is
            restored onto (any placement and SBP, not only the saved one).

    Returns:
        The saved tree: arrays as fflow arrays (NumPy arrays where NumPy arrays were
        saved), global arrays where `like` has them.

    Example:
        >>> import os, tempfile, fflow, fflow.numpy as jnp
        >>> d = os.path.join(tempfile.mkdtemp(), "c")
        >>> fflow.save(d, [jnp.arange(4.0)])
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> like = [fflow.to_global(jnp.zeros(4), pl, fflow.sbp.split(0))]
        >>> fflow.load(d, like=like)[0].sbp
        (S(0),)
    """
    dirname = _find(path)
    with open(os.path.join(dirname, INDEX)) as f:
        index = json.load(f)
    if index.get("format") != FORMAT or index.get("version", 0) > VERSION:
        raise FflowError(
            f"{dirname} is not a {FORMAT} (version <= {VERSION}) checkpoint: "
            f"format={index.get('format')!r}, version={index.get('version')!r}"
        )
    entries = index["leaves"]
    if like is None:
        leaves = [_restore_leaf(dirname, e, None) for e in entries]
        return _decode(index["tree"], iter(leaves))
    like_leaves, treedef = tree_flatten(like)
    if len(like_leaves) != len(entries):
        raise user_error(
            ValueError,
            f"fflow.load: the checkpoint has {len(entries)} leaves but like= has "
            f"{len(like_leaves)}. Fix: pass a like= tree of the saved structure.",
        )
    leaves = [_restore_leaf(dirname, e, x) for e, x in zip(entries, like_leaves)]
    return tree_unflatten(treedef, leaves)


# ----------------------------------------------------------------------------
# Training loops


class CheckpointManager:
    """Numbered checkpoints in one directory: save every `save_interval` steps, keep the
    newest `max_to_keep`, and restore the latest to resume.

    Example:
        >>> import tempfile, fflow.numpy as jnp
        >>> from fflow.serialization import CheckpointManager
        >>> mgr = CheckpointManager(tempfile.mkdtemp(), max_to_keep=2, save_interval=10)
        >>> for step in range(1, 41):
        ...     _ = mgr.save(step, {"w": jnp.full(2, float(step))})
        >>> mgr.all_steps(), mgr.latest_step()
        ([30, 40], 40)
        >>> mgr.restore()["w"].tolist()
        [40.0, 40.0]
    """

    def __init__(self, directory, max_to_keep=3, save_interval=1):
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_to_keep = max_to_keep
        self.save_interval = max(int(save_interval), 1)
        os.makedirs(self.directory, exist_ok=True)

    def path(self, step):
        return os.path.join(self.directory, f"step_{int(step):08d}")

    def all_steps(self):
        steps = []
        for name in os.listdir(self.directory):
            m = re.fullmatch(r"step_(\d+)", name)
            if m and os.path.exists(os.path.join(self.directory, name, INDEX)):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest_step(self):
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step):
        return int(step) % self.save_interval == 0

    def save(self, step, tree, force=False):
        """Save `tree` as step `step` if it is a save step (or `force`); True if saved."""
        if not (force or self.should_save(step)):
            return False
        save(self.path(step), tree)
        if self.max_to_keep is not None and _is_writer():
            for old in self.all_steps()[: -self.max_to_keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        barrier()
        return True

    def restore(self, step=None, like=None):
        """The tree saved at `step` (default: the latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise user_error(FileNotFoundError, f"no checkpoints in {self.directory}")
        return load(self.path(step), like)


__all__ = ["save", "load", "CheckpointManager"]

"""A data iterator for training loops: shuffles with `fflow.random` keys, batches,
drops / pads / keeps the remainder, gives each process only its shard of the global
batch, and prefetches on a background thread.

The order is a pure function of (key, epoch), so resuming at step k (`steps(n,
start=k)`) yields exactly the batches an uninterrupted run would have seen.

Example:
    >>> import numpy as np, fflow
    >>> from fflow.data import DataLoader
    >>> x = np.arange(10, dtype=np.float32)
    >>> loader = DataLoader({"x": x}, batch_size=4, key=fflow.random.PRNGKey(0))
    >>> len(loader), [b["x"].shape for b in loader]
    (2, [(4,), (4,)])
    >>> pl = fflow.placement("cpu", [0, 1])
    >>> sharded = DataLoader({"x": x}, batch_size=4, shuffle=False, placement=pl)
    >>> batch = next(iter(sharded))["x"]
    >>> batch.sbp, [s.tolist() for s in batch.to_local_shards()]
    ((S(0),), [[0.0, 1.0], [2.0, 3.0]])
"""

import queue
import threading

import numpy as np

from fflow import random
from fflow.array import Array
from fflow.errors import user_error
from fflow.sharding import (
    Broadcast,
    SbpParallel,
    Split,
    as_nd_sbp,
    check_sbp_fits,
    local_box,
    local_indices,
    make_global,
)
from fflow.tree_util import prefix_broadcast, tree_flatten, tree_unflatten

_DONE = object()


class DataLoader:
    """Batches of a pytree of arrays that share their leading (example) dimension.

    Args:
        data: a pytree of NumPy-convertible arrays, all with the same first dimension.
        batch_size: examples per (global) batch.
        key: a `fflow.random` key; shuffles every epoch (epoch e uses fold_in(key, e)).
        shuffle: set False to keep the order (shuffle needs a key).
        remainder: what to do with a last partial batch: "drop" (default), "keep" (a
            smaller batch) or "pad" (fill with the first examples of the epoch and
            yield `(batch, mask)` with mask[i] False on the padding, for every batch).
        placement: yield global arrays on this placement; each process only builds
            the shards of its own devices.
        sbp: SBP of the batch leaves (one for all or a pytree prefix); by default
            split over the first mesh axis, broadcast over the others.
        prefetch: batches prepared ahead on a background thread (0: none).
    """

    def __init__(self, data, batch_size, *, key=None, shuffle=True, remainder="drop",
                 placement=None, sbp=None, prefetch=2):  # fmt: skip
        self.leaves, self.treedef = tree_flatten(data)
        self.leaves = [np.asarray(x) for x in self.leaves]
        if not self.leaves:
            raise user_error(ValueError, "DataLoader needs at least one array")
        sizes = {x.shape[0] if x.ndim else None for x in self.leaves}
        if len(sizes) != 1 or None in sizes:
            raise user_error(
                ValueError,
                f"DataLoader: every array needs the same leading dimension, got "
                f"{[x.shape for x in self.leaves]}",
            )
        if remainder not in ("drop", "keep", "pad"):
            raise user_error(ValueError, f"remainder must be drop, keep or pad, not {remainder!r}")
        if shuffle and key is None:
            shuffle = False
        self.n = sizes.pop()
        self.batch_size = int(batch_size)
        if self.batch_size < 1 or (remainder == "drop" and self.batch_size > self.n):
            raise user_error(
                ValueError,
                f"batch_size={batch_size} does not fit {self.n} examples with "
                f"remainder={remainder!r}",
            )
        self.key, self.shuffle, self.remainder = key, shuffle, remainder
        self.placement, self.prefetch = placement, int(prefetch)
        self.sbps = None
        if placement is not None:
            default = (Split(0),) + (Broadcast(),) * (placement.ndim - 1)
            self.sbps = [
                as_nd_sbp(default if s is None else s, placement.ndim, "DataLoader sbp")
                for s in _spec_leaves(sbp, data, placement.ndim)
            ]
            for x, s in zip(self.leaves, self.sbps):
                shape = (self.batch_size,) + x.shape[1:]
                check_sbp_fits(shape, s, placement.hierarchy, "DataLoader sbp")
        self._epoch = 0

    def __len__(self):
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest and self.remainder != "drop" else 0)

    def order(self, epoch):
        """The example order of `epoch` (a NumPy int array)."""
        if not self.shuffle:
            return np.arange(self.n)
        k = random.fold_in(self.key, epoch)
        return np.asarray(random.permutation(k, self.n))

    def _batch(self, order, i):
        idx = order[i * self.batch_size : (i + 1) * self.batch_size]
        mask = None
        if self.remainder == "pad":
            mask = np.ones(self.batch_size, bool)
            if len(idx) < self.batch_size:
                mask[len(idx) :] = False
                idx = np.concatenate([idx, order[: self.batch_size - len(idx)]])
        leaves = [self._place(x[idx], j) for j, x in enumerate(self.leaves)]
        batch = tree_unflatten(self.treedef, leaves)
        return batch if mask is None else (batch, self._place_mask(mask))

    def _place(self, value, j):
        if self.placement is None:
            return Array(value)
        pl, nd = self.placement, self.sbps[j]
        shards = {}
        for d in local_indices(pl):
            box = local_box(value.shape, nd, pl.hierarchy, pl.coords(d))
            shards[d] = np.array(value[tuple(slice(a, b) for a, b in box)])
        return make_global(value.shape, value.dtype, pl, nd, shards)

    def _place_mask(self, mask):
        if self.placement is None:
            return Array(mask)
        nd = (Split(0),) + (Broadcast(),) * (self.placement.ndim - 1)
        saved, self.sbps = self.sbps, [nd]
        try:
            return self._place(mask, 0)
        finally:
            self.sbps = saved

    def _produce(self, items):
        """Iterate `items` (epoch, index) pairs as batches, prefetching in a thread."""
        orders = {}

        def make(epoch, i):
            if epoch not in orders:
                orders.clear()
                orders[epoch] = self.order(epoch)
            return self._batch(orders[epoch], i)

        if self.prefetch <= 0:
            for epoch, i in items:
                yield make(epoch, i)
            return
        q = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def worker():
            try:
                for epoch, i in items:
                    if stop.is_set():
                        return
                    q.put(make(epoch, i))
                q.put(_DONE)
            except BaseException as e:  # handed to the consumer, raised on its thread
                q.put(_Failure(e))

        thread = threading.Thread(target=worker, daemon=True, name="fflow-data-prefetch")
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a worker waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(0.01)

    def epoch(self, epoch):
        """An iterator over the batches of `epoch`."""
        return self._produce([(epoch, i) for i in range(len(self))])

    def __iter__(self):
        it = self.epoch(self._epoch)
        self._epoch += 1
        return it

    def steps(self, num_steps, start=0):
        """Batches for global steps start..num_steps-1, crossing epochs (for step-based
        training loops; resuming with start=k continues the same sequence)."""
        per = len(self)
        return self._produce([(s // per, s % per) for s in range(start, num_steps)])


def _spec_leaves(spec, data, ndim):
    """One SBP (or None) per leaf of `data` from a single SBP or a pytree prefix."""

    def is_leaf(s):
        return (
            s is None
            or isinstance(s, SbpParallel)
            or isinstance(s, tuple)
            and len(s) == ndim
            and all(isinstance(x, SbpParallel) for x in s)
        )

    if is_leaf(spec):
        return [spec] * len(tree_flatten(data)[0])
    leaves, treedef = tree_flatten(spec, is_leaf=is_leaf)
    boxed = tree_unflatten(treedef, [_Spec(s) for s in leaves])
    return [b.sbp if isinstance(b, _Spec) else b for b in prefix_broadcast(boxed, data, "sbp")]


class _Spec:
    __slots__ = ("sbp",)

    def __init__(self, sbp):
        self.sbp = sbp


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

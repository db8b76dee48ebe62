"""Counter-based random bits: Threefry-2x32 (20 rounds), as JAX uses it.

Two primitives, both with zero derivative:

- `random_bits_p(key, *, shape)`: `key` is uint32[..., 2]; the result is
  uint32[..., *shape, 2]. For the flat (row-major) position `i` of `shape`,
  `out[..., i, :] = threefry2x32(key, (i >> 32, i & 0xFFFFFFFF))`: the block cipher
  encrypts the 64-bit counter `i` split into two 32-bit words. This is JAX's
  "partitionable" Threefry (`jax_threefry_partitionable=True`, the default since
  JAX 0.5): `random.split` uses both words as the new keys, and 32 random bits are
  `out[..., 0] ^ out[..., 1]`.
- `random_fold_in_p(key, data)`: `key` uint32[..., 2], `data` uint32[...]; the
  result is `threefry2x32(key, (0, data))`, uint32[..., 2].

Leading key dimensions are batch dimensions (so `vmap` over keys is one call).

threefry2x32(k, x) for keys k0, k1 and counter words x0, x1 (all uint32, wrapping
arithmetic, `rotl` a 32-bit left rotation)::

    k2 = k0 ^ k1 ^ 0x1BD11BDA;  ks = (k0, k1, k2)
    x0 += k0;  x1 += k1
    for block in 0..4:
        for r in ROT[block % 2]:       # ROT = ((13, 15, 26, 6), (17, 29, 16, 24))
            x0 += x1;  x1 = rotl(x1, r);  x1 ^= x0
        x0 += ks[(block + 1) % 3];  x1 += ks[(block + 2) % 3] + (block + 1)
    return (x0, x1)
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import defzero
from fflow.transforms.shard_rules import Sig, def_sbp
from fflow.transforms.vmap import batch_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.sbp import B, S

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 on uint32 NumPy arrays (broadcasting); returns (y0, y1)."""
    k0 = np.asarray(k0, np.uint32)
    k1 = np.asarray(k1, np.uint32)
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    with np.errstate(over="ignore"):
        x0 = np.asarray(x0, np.uint32) + ks[0]
        x1 = np.asarray(x1, np.uint32) + ks[1]
        for block in range(5):
            for r in _ROTATIONS[block % 2]:
                x0 = x0 + x1
                x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
                x1 = x1 ^ x0
            x0 = x0 + ks[(block + 1) % 3]
            x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _check_key(name, key):
    if key.dtype != np.uint32 or key.ndim < 1 or key.shape[-1] != 2:
        raise user_error(
            DtypeError,
            f"{name} needs a PRNG key: a uint32[2] array (leading batch dims allowed), got "
            f"{key.str_short()}. Fix: make keys with fflow.random.key(seed) / "
            "fflow.random.PRNGKey(seed) and fflow.random.split.",
        )


# ----------------------------------------------------------------------------
# random_bits

random_bits_p = Primitive("random_bits")
random_bits_p.amp_class = "follow"


@random_bits_p.def_impl
def _random_bits_impl(key, *, shape):
    key = np.asarray(key, np.uint32)
    batch = key.shape[:-1]
    n = int(np.prod(shape, dtype=np.int64))
    counter = np.arange(n, dtype=np.uint64)
    hi = (counter >> np.uint64(32)).astype(np.uint32)
    lo = counter.astype(np.uint32)
    k0 = key[..., 0].reshape(batch + (1,))
    k1 = key[..., 1].reshape(batch + (1,))
    y0, y1 = threefry2x32(k0, k1, hi, lo)
    y0 = np.broadcast_to(y0, batch + (n,))
    y1 = np.broadcast_to(y1, batch + (n,))
    return np.stack([y0, y1], axis=-1).reshape(batch + tuple(shape) + (2,))


@random_bits_p.def_abstract_eval
def _random_bits_abstract_eval(key, *, shape):
    _check_key("random_bits", key)
    if any(int(d) < 0 for d in shape):
        raise user_error(ShapeError, f"random_bits: negative dimension in shape {shape}")
    return ShapedArray(key.shape[:-1] + tuple(shape) + (2,), np.uint32)


defzero(random_bits_p)

# ----------------------------------------------------------------------------
# random_fold_in

random_fold_in_p = Primitive("random_fold_in")
random_fold_in_p.amp_class = "follow"


@random_fold_in_p.def_impl
def _random_fold_in_impl(key, data):
    key = np.asarray(key, np.uint32)
    data = np.asarray(data, np.uint32)
    y0, y1 = threefry2x32(key[..., 0], key[..., 1], np.zeros_like(data), data)
    return np.stack(np.broadcast_arrays(y0, y1), axis=-1)


@random_fold_in_p.def_abstract_eval
def _random_fold_in_abstract_eval(key, data):
    _check_key("fold_in", key)
    if data.dtype != np.uint32 or data.shape != key.shape[:-1]:
        raise user_error(
            DtypeError,
            f"random_fold_in needs uint32 data of shape {key.shape[:-1]}, got "
            f"{data.str_short()}. Fix: fflow.random.fold_in converts Python ints for you.",
        )
    return ShapedArray(key.shape, np.uint32)


defzero(random_fold_in_p)


def _bits_batch(args, dims, *, shape):

    (key,), (bdim,) = args, dims
    return random_bits_p.bind(vm.moveaxis(key, bdim, 0), shape=shape), 0


def _fold_in_batch(args, dims):

    (key, data), (kd, dd) = args, dims
    size = vm.batch_size(args, dims)
    key = vm.bdim_to_front(key, kd, size)
    data = vm.bdim_to_front(data, dd, size)
    return random_fold_in_p.bind(key, data), 0


def _register_batch_rules():
    """Batching: leading key dims are batch dims, so a batched key needs no loop."""

    batch_rules[random_bits_p] = _bits_batch
    batch_rules[random_fold_in_p] = _fold_in_batch


_register_batch_rules()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): one mesh axis; S = split, B = broadcast,
# P = partial sum. A `local` kernel gets the device's boxes (e.g. a shard's offset).


def _random_bits_local(ctx, key):
    # Counter-based bits: a shard encrypts only the counters (flat positions in the
    # logical array) of its own box, so sharded and unsharded numbers are identical.
    shape = tuple(ctx.params["shape"])
    nb = key.ndim - 1
    box = ctx.out_boxes[0][nb : nb + len(shape)]
    n = int(np.prod(shape, dtype=np.int64))
    if n >= 2**32 or all(lo == 0 and hi == d for (lo, hi), d in zip(box, shape)):
        out = random_bits_p.bind(key, **ctx.params)  # 64-bit counters: whole, then slice
        starts = [0] * nb + [lo for lo, _ in box] + [0]
        limits = list(key.shape[:nb]) + [hi for _, hi in box] + [2]
        if not any(starts) and tuple(limits) == tuple(out.shape):
            return out
        return lax.slice(out, starts, limits)
    u32 = np.dtype(np.uint32)
    local = tuple(hi - lo for lo, hi in box)
    out_shape = tuple(key.shape[:nb]) + local
    counter = lax.full(local, 0, u32)
    stride = 1
    for d in reversed(range(len(shape))):
        pos = lax.add(lax.broadcasted_iota(u32, local, d), lax.full(local, box[d][0], u32))
        counter = lax.add(counter, lax.mul(pos, lax.full(local, stride, u32)))
        stride *= shape[d]
    dims = tuple(range(nb, nb + len(shape)))
    x1 = lax.broadcast_in_dim(counter, out_shape, dims)
    x0 = lax.full(out_shape, 0, u32)
    words = [lax.squeeze(lax.slice_in_dim(key, i, i + 1, axis=nb), (nb,)) for i in (0, 1)]
    k0, k1 = (lax.broadcast_in_dim(w, out_shape, tuple(range(nb))) for w in words)
    y0, y1 = _threefry_lax(k0, k1, x0, x1, out_shape)
    both = [lax.broadcast_in_dim(y, out_shape + (1,), tuple(range(len(out_shape))))
            for y in (y0, y1)]  # fmt: skip
    return lax.concatenate(both, len(out_shape))


def _threefry_lax(k0, k1, x0, x1, shape):
    """threefry2x32 (see the module docstring) written with lax ops on uint32 arrays."""
    u32 = np.dtype(np.uint32)

    def const(v):
        return lax.full(shape, v, u32)

    def rotl(x, r):
        return lax.bitwise_or(
            lax.shift_left(x, const(r)), lax.shift_right_logical(x, const(32 - r))
        )

    ks = (k0, k1, lax.bitwise_xor(lax.bitwise_xor(k0, k1), const(int(_PARITY))))
    x0, x1 = lax.add(x0, ks[0]), lax.add(x1, ks[1])
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = lax.add(x0, x1)
            x1 = lax.bitwise_xor(rotl(x1, r), x0)
        x0 = lax.add(x0, ks[(block + 1) % 3])
        x1 = lax.add(lax.add(x1, ks[(block + 2) % 3]), const(block + 1))
    return x0, x1


def _random_bits_sbp(in_avals, out_avals, *, shape):
    (key,) = in_avals
    nb = key.ndim - 1
    sigs = [Sig((S(k),), (S(k),)) for k in range(nb)]
    sigs += [Sig((B,), (S(nb + k),), _random_bits_local) for k in range(len(shape))]
    return sigs


def _fold_in_sbp(in_avals, out_avals):
    key, data = in_avals
    return [Sig((S(k), S(k)), (S(k),)) for k in range(key.ndim - 1)]


def_sbp(random_bits_p, _random_bits_sbp)
def_sbp(random_fold_in_p, _fold_in_sbp)

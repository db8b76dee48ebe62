"""fflow.random: JAX's counter-based PRNG (Threefry-2x32, "partitionable" mode).

A key is a uint32[2] array (JAX's raw key, `PRNGKey`) or a typed key of shape ()
(`key(seed)`, a `KeyArray` over the same data). Keys are split, never mutated: the
same key always gives the same numbers, eagerly, under `jit` and on every backend.
The bits come from `random_bits_p` (see primitives/random_bits.py for the exact
algorithm), and every sampler follows JAX's construction, so `fflow.random`
reproduces `jax.random`'s numbers for the same key (normal to within 2 ulp of
XLA's erf_inv).

Example:
    >>> import fflow.random as random
    >>> key = random.PRNGKey(0)
    >>> key, sub = random.split(key)
    >>> random.uniform(sub, (2,)).shape
    (2,)
    >>> random.normal(random.PRNGKey(1), (3,)).dtype
    dtype('float32')
"""

import math

import numpy as np

import fflow.numpy as jnp
from fflow import dtypes, lax
from fflow import lax as _lax
from fflow.core import Tracer
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.primitives.random_bits import random_bits_p, random_fold_in_p
from fflow.primitives.special import lgamma_p
from fflow.transforms.vmap import vmap
from fflow.tree_util import register_pytree_node

_UINT = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32), 64: np.uint64}


def _jnp():

    return jnp


def _shape(shape):
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


class KeyDtype:
    """The dtype of typed keys (JAX's `key<fry>`): `jax.dtypes.prng_key` subclasses."""

    name = "key<fry>"
    itemsize = 8
    kind = "V"

    def __eq__(self, other):
        return isinstance(other, KeyDtype) or other == "key<fry>"

    def __hash__(self):
        return hash("key<fry>")

    def __repr__(self):
        return "key<fry>"


class KeyArray:
    """Typed PRNG keys (`fflow.random.key(seed)`, JAX's `jax.random.key`): an array of
    keys of shape `shape`, each one uint32[2] of key data (`key_data(k)`). A pytree
    over its data, so jit, vmap, scan and grad carry it; every sampler takes it."""

    dtype = KeyDtype()

    def __init__(self, data):
        self._data = data

    shape = property(lambda self: tuple(self._data.shape[:-1]))
    ndim = property(lambda self: len(self._data.shape) - 1)
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    weak_type = False

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of an unsized key array")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        return KeyArray(self._data[idx + (Ellipsis,) if Ellipsis not in idx else idx])

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return KeyArray(self._data.reshape(tuple(shape) + (2,)))

    def __repr__(self):
        return f"Array({self.shape}, dtype=key<fry>) overlaying:\n{np.asarray(self._data)}"


register_pytree_node(KeyArray, lambda k: ((k._data,), None), lambda _, c: KeyArray(c[0]))


def _key(key, name):
    jnp = _jnp()
    key = key._data if isinstance(key, KeyArray) else jnp.asarray(key)
    if key.dtype != np.uint32 or key.ndim < 1 or key.shape[-1] != 2:
        raise user_error(
            DtypeError,
            f"fflow.random.{name} needs a PRNG key (a uint32[2] array), got "
            f"{key.dtype}{list(key.shape)}. Fix: make one with fflow.random.PRNGKey(seed) "
            "and derive new ones with fflow.random.split(key).",
        )
    if key.ndim != 1:
        raise user_error(
            ShapeError,
            f"fflow.random.{name} takes a single key (uint32[2]), got a batch of keys of shape "
            f"{tuple(key.shape)}. Fix: use fflow.vmap over the keys.",
        )
    return key


def _float_dtype(dtype, name):
    dtype = dtypes.float_ if dtype is None else dtypes.canonicalize(dtype)
    if not dtypes.is_float(dtype):
        raise user_error(DtypeError, f"fflow.random.{name} needs a float dtype, got {dtype}")
    return dtype


# ----------------------------------------------------------------------------
# Keys


def PRNGKey(seed, *, impl=None):  # noqa: N802  (JAX's name)
    """A key from an integer seed: uint32[2] `[seed >> 32, seed & 0xFFFFFFFF]`.

    Example:
        >>> import fflow.random as random
        >>> random.PRNGKey(42).tolist()
        [0, 42]
    """
    jnp = _jnp()
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seed = int(seed)
        if not -(2**63) <= seed < 2**64:
            raise user_error(OverflowError, f"PRNG seed {seed} does not fit in 64 bits")
        # a Python int is a 32-bit seed, as in JAX (its high word is 0)
        hi, lo = 0, seed & 0xFFFFFFFF
        return jnp.asarray(np.array([hi, lo], np.uint32))
    seed = jnp.asarray(seed)
    if seed.shape != () or not dtypes.is_int(seed.dtype):
        raise user_error(
            TypeError, f"PRNG seed must be an integer scalar, got {seed.dtype}{list(seed.shape)}"
        )
    if seed.dtype.itemsize == 8:
        hi = lax.convert_element_type(
            lax.shift_right_logical(
                lax.convert_element_type(seed, np.uint64), np.asarray(32, np.uint64)
            ),
            np.uint32,
        )
    else:
        hi = jnp.zeros((), np.uint32)
    lo = lax.convert_element_type(seed, np.uint32)
    return jnp.stack([hi, lo])


def key(seed, *, impl=None):
    """A typed key of shape () from an integer seed (JAX's `jax.random.key`); its data
    is `PRNGKey(seed)`, so both give the same numbers.

    Example:
        >>> import fflow.random as random
        >>> k = random.key(0)
        >>> k.shape, random.split(k, 3).shape, random.key_data(k).tolist()
        ((), (3,), [0, 0])
    """
    return KeyArray(PRNGKey(seed, impl=impl))


def key_data(keys):
    """The uint32 data of keys: [..., 2] (a raw uint32 key is its own data)."""
    return keys._data if isinstance(keys, KeyArray) else _jnp().asarray(keys)


def wrap_key_data(key_bits_array, *, impl=None):
    """Typed keys over uint32 key data of shape [..., 2]."""
    return KeyArray(_jnp().asarray(key_bits_array))


def _like(key, raw):
    # typed keys in, typed keys out (raw uint32 keys stay raw)
    return KeyArray(raw) if isinstance(key, KeyArray) else raw


def split(key, num=2):
    """`num` new keys (or an array of keys of shape `num` when it is a tuple).

    Example:
        >>> import fflow.random as random
        >>> random.split(random.PRNGKey(0), 3).shape
        (3, 2)
    """
    return _like(key, random_bits_p.bind(_key(key, "split"), shape=_shape(num)))


def fold_in(key, data):
    """A new key from `key` and an integer (a step counter, a process index...)."""
    typed, key = key, _key(key, "fold_in")
    if isinstance(data, (int, np.integer)):
        data = np.asarray(int(data) & 0xFFFFFFFF, np.uint32)
    else:
        data = _jnp().asarray(data)
        if data.dtype != np.uint32:
            data = lax.convert_element_type(data, np.uint32)
    return _like(typed, random_fold_in_p.bind(key, data))


def clone(key):
    return key


# ----------------------------------------------------------------------------
# Bits


def _random_bits(key, bit_width, shape):
    words = random_bits_p.bind(key, shape=shape)
    w0 = lax.squeeze(lax.slice_in_dim(words, 0, 1, axis=len(shape)), (len(shape),))
    w1 = lax.squeeze(lax.slice_in_dim(words, 1, 2, axis=len(shape)), (len(shape),))
    if bit_width == 64:
        u64 = np.dtype(np.uint64)
        hi = lax.convert_element_type(w0, u64)
        lo = lax.convert_element_type(w1, u64)
        return lax.bitwise_or(lax.shift_left(hi, np.full(shape, 32, u64)), lo)
    bits = lax.bitwise_xor(w0, w1)
    if bit_width != 32:
        bits = lax.convert_element_type(bits, _UINT[bit_width])
    return bits


def bits(key, shape=(), dtype=None):
    """Uniform random bits of an unsigned dtype (uint32 by default)."""
    key = _key(key, "bits")
    dtype = np.dtype(np.uint32) if dtype is None else dtypes.canonicalize(dtype)
    if dtype.kind != "u":
        raise user_error(DtypeError, f"fflow.random.bits needs an unsigned dtype, got {dtype}")
    return _random_bits(key, dtype.itemsize * 8, _shape(shape))


# ----------------------------------------------------------------------------
# Continuous distributions


def _nbits_nmant(dtype):
    fi = dtypes.finfo(dtype)
    return fi.bits, fi.nmant


def _check_broadcast(name, shape, *param_shapes):
    for s in param_shapes:
        s = tuple(s)
        try:
            ok = np.broadcast_shapes(s, shape) == tuple(shape)
        except ValueError:
            ok = False
        if not ok:
            raise user_error(
                ShapeError,
                f"fflow.random.{name}: parameter shape {s} does not broadcast to shape "
                f"{tuple(shape)}. Fix: pass shape= with the parameters' shape as a suffix.",
            )


def _uniform(key, shape, dtype, minval, maxval):
    jnp = _jnp()
    minval = jnp.asarray(minval, dtype)
    maxval = jnp.asarray(maxval, dtype)
    _check_broadcast("uniform", shape, minval.shape, maxval.shape)
    nbits, nmant = _nbits_nmant(dtype)
    rng_bits = nbits if nmant >= 8 else 8
    raw = _random_bits(key, rng_bits, shape)
    # JAX fills the mantissa of 1.0 and subtracts 1: (bits >> (w - nmant)) * 2^-nmant,
    # computed here without a bitcast, gives exactly the same float.
    mant = lax.shift_right_logical(raw, np.full(shape, rng_bits - nmant, raw.dtype))
    floats = lax.mul(lax.convert_element_type(mant, dtype), lax.full(shape, 2.0**-nmant, dtype))
    scaled = jnp.add(jnp.multiply(floats, jnp.subtract(maxval, minval)), minval)
    return jnp.maximum(minval, scaled)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    """Uniform samples in [minval, maxval).

    Example:
        >>> import fflow.random as random
        >>> x = random.uniform(random.PRNGKey(0), (1000,), minval=-1.0, maxval=1.0)
        >>> bool((x >= -1).all() and (x < 1).all())
        True
    """
    key = _key(key, "uniform")
    return _uniform(key, _shape(shape), _float_dtype(dtype, "uniform"), minval, maxval)


def normal(key, shape=(), dtype=None):
    """Standard normal samples: `sqrt(2) * erf_inv(u)` with u uniform in (-1, 1)."""
    key = _key(key, "normal")
    dtype = _float_dtype(dtype, "normal")
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))
    u = _uniform(key, _shape(shape), dtype, lo, 1.0)
    return lax.mul(lax.full(_shape(shape), math.sqrt(2), dtype), lax.erf_inv(u))


def truncated_normal(key, lower, upper, shape=None, dtype=None):
    """Normal samples truncated to (lower, upper)."""
    jnp = _jnp()
    key = _key(key, "truncated_normal")
    dtype = _float_dtype(dtype, "truncated_normal")
    lower = jnp.asarray(lower, dtype)
    upper = jnp.asarray(upper, dtype)
    if shape is None:
        shape = np.broadcast_shapes(lower.shape, upper.shape)
    shape = _shape(shape)
    sqrt2 = np.array(np.sqrt(2), dtype)
    a = lax.erf(jnp.divide(lower, sqrt2))
    b = lax.erf(jnp.divide(upper, sqrt2))
    u = _uniform(key, shape, dtype, a, b)
    out = jnp.multiply(sqrt2, lax.erf_inv(u))
    lo = jnp.nextafter(lax.stop_gradient(lower), np.array(np.inf, dtype))
    hi = jnp.nextafter(lax.stop_gradient(upper), np.array(-np.inf, dtype))
    return jnp.clip(out, lo, hi)


def bernoulli(key, p=0.5, shape=None):
    """Boolean samples, True with probability `p`."""
    jnp = _jnp()
    key = _key(key, "bernoulli")
    p = jnp.asarray(p)
    if not dtypes.is_float(p.dtype):
        p = p.astype(dtypes.float_)
    shape = p.shape if shape is None else _shape(shape)
    _check_broadcast("bernoulli", shape, p.shape)
    return jnp.less(_uniform(key, shape, p.dtype, 0.0, 1.0), p)


def gumbel(key, shape=(), dtype=None, mode="low"):
    """Standard Gumbel samples."""
    jnp = _jnp()
    key = _key(key, "gumbel")
    dtype = _float_dtype(dtype, "gumbel")
    shape = _shape(shape)
    if mode == "high":
        u = _uniform(key, (2,) + shape, dtype, 0.0, 1.0)
        high, low = u[0], u[1]
        fi = dtypes.finfo(dtype)
        x = jnp.where(high >= 0.5, high, high + 2.0**-(fi.nmant) * low + np.asarray(fi.tiny, dtype))
        return -jnp.log(-jnp.log1p(-x))
    tiny = np.asarray(dtypes.finfo(dtype).tiny, dtype)
    return -jnp.log(-jnp.log(_uniform(key, shape, dtype, tiny, 1.0)))


def exponential(key, shape=(), dtype=None):
    """Exponential(1) samples."""
    jnp = _jnp()
    key = _key(key, "exponential")
    dtype = _float_dtype(dtype, "exponential")
    return -jnp.log1p(-_uniform(key, _shape(shape), dtype, 0.0, 1.0))


def laplace(key, shape=(), dtype=None):
    jnp = _jnp()
    key = _key(key, "laplace")
    dtype = _float_dtype(dtype, "laplace")
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))
    u = _uniform(key, _shape(shape), dtype, lo, 1.0)
    return jnp.sign(u) * jnp.log1p(-jnp.abs(u))


def logistic(key, shape=(), dtype=None):
    jnp = _jnp()
    key = _key(key, "logistic")
    dtype = _float_dtype(dtype, "logistic")
    tiny = np.asarray(dtypes.finfo(dtype).tiny, dtype)
    x = _uniform(key, _shape(shape), dtype, tiny, 1.0)
    return jnp.log(jnp.divide(x, 1 - x))


def rademacher(key, shape=(), dtype=None):
    """+1 or -1 with equal probability (int32 by default)."""
    key = _key(key, "rademacher")
    dtype = dtypes.int_ if dtype is None else dtypes.canonicalize(dtype)
    b = bernoulli(key, 0.5, shape=_shape(shape))
    return (2 * b.astype(dtype) - 1).astype(dtype)


def generalized_normal(key, p, shape=(), dtype=None):
    """Samples with density proportional to exp(-|x|^p): a random sign times Gamma(1/p)^(1/p).

    Example:
        >>> import fflow
        >>> fflow.random.generalized_normal(fflow.random.PRNGKey(0), 2.0, (3,)).shape
        (3,)
    """
    key = _key(key, "generalized_normal")
    dtype = _float_dtype(dtype, "generalized_normal")
    k_gamma, k_sign = split(key)
    g = gamma(k_gamma, 1 / p, _shape(shape), dtype)
    return rademacher(k_sign, _shape(shape), dtype) * g ** (1 / p)


def ball(key, d, p=2, shape=(), dtype=None):
    """Points uniform in the unit p-norm ball of dimension `d` (shape `(*shape, d)`).

    A generalized-normal vector divided by (its p-norm^p + an Exponential(1))^(1/p).

    Example:
        >>> import fflow
        >>> x = fflow.random.ball(fflow.random.PRNGKey(0), 3, shape=(5,))
        >>> x.shape, bool((fflow.numpy.linalg.norm(x, axis=-1) <= 1).all())
        ((5, 3), True)
    """
    jnp = _jnp()
    key = _key(key, "ball")
    dtype = _float_dtype(dtype, "ball")
    if not isinstance(d, (int, np.integer)):
        raise TypeError(f"random.ball: d must be a Python int (the dimension), got {d!r}")
    k_dir, k_rad = split(key)
    g = generalized_normal(k_dir, p, (*_shape(shape), int(d)), dtype)
    e = exponential(k_rad, _shape(shape), dtype)
    return g / ((jnp.abs(g) ** p).sum(-1) + e)[..., None] ** (1 / p)


def cauchy(key, shape=(), dtype=None):
    jnp = _jnp()
    key = _key(key, "cauchy")
    dtype = _float_dtype(dtype, "cauchy")
    u = _uniform(key, _shape(shape), dtype, dtypes.finfo(dtype).eps, 1.0)
    return jnp.tan(jnp.multiply(np.asarray(np.pi, dtype), jnp.subtract(u, np.asarray(0.5, dtype))))


def lognormal(key, sigma=1.0, shape=None, dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "lognormal")
    shape = np.shape(sigma) if shape is None else _shape(shape)
    return jnp.exp(normal(key, shape, dtype) * jnp.asarray(sigma, dtype))


def rayleigh(key, scale=1.0, shape=None, dtype=None):
    jnp = _jnp()
    key = _key(key, "rayleigh")
    dtype = _float_dtype(dtype, "rayleigh")
    shape = np.shape(scale) if shape is None else _shape(shape)
    u = _uniform(key, shape, dtype, 0.0, 1.0)
    scale = jnp.broadcast_to(jnp.asarray(scale, dtype), shape)
    return jnp.multiply(scale, jnp.sqrt(jnp.multiply(jnp.log(u), np.asarray(-2, dtype))))


def pareto(key, b, shape=None, dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "pareto")
    shape = np.shape(b) if shape is None else _shape(shape)
    return jnp.exp(exponential(key, shape, dtype) / jnp.asarray(b, dtype))


def weibull_min(key, scale, concentration, shape=(), dtype=None):
    jnp = _jnp()
    key = _key(key, "weibull_min")
    dtype = _float_dtype(dtype, "weibull_min")
    u = _uniform(key, _shape(shape), dtype, 0.0, 1.0)
    return jnp.power(-jnp.log1p(-u), 1.0 / jnp.asarray(concentration, dtype)) * scale


def maxwell(key, shape=(), dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "maxwell")
    return jnp.linalg.norm(normal(key, _shape(shape) + (3,), dtype), axis=-1)


def geometric(key, p, shape=None, dtype=None):
    """Number of Bernoulli(p) trials up to the first success (int32 by default)."""
    jnp = _jnp()
    key = _key(key, "geometric")
    p = jnp.asarray(p)
    if not dtypes.is_float(p.dtype):
        p = p.astype(dtypes.float_)
    shape = p.shape if shape is None else _shape(shape)
    u = _uniform(key, shape, p.dtype, 0.0, 1.0)
    u = jnp.where(u == 0, 1, u)
    log_one_minus_p = jnp.broadcast_to(jnp.log1p(-p), shape)
    g = jnp.floor(jnp.log(u) / log_one_minus_p) + 1
    return g.astype(dtypes.int_ if dtype is None else dtypes.canonicalize(dtype))


def multivariate_normal(key, mean, cov, shape=None, dtype=None, method="cholesky"):
    """Samples of N(mean, cov); the factor of cov from cholesky (default), svd or eigh."""
    jnp = _jnp()
    key = _key(key, "multivariate_normal")
    dtype = _float_dtype(dtype, "multivariate_normal")
    mean = jnp.asarray(mean, dtype)
    cov = jnp.asarray(cov, dtype)
    if mean.ndim < 1 or cov.ndim < 2 or cov.shape[-2:] != (mean.shape[-1],) * 2:
        raise user_error(
            ShapeError,
            f"multivariate_normal needs mean [..., n] and cov [..., n, n], got {mean.shape} "
            f"and {cov.shape}",
        )
    if shape is None:
        shape = np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
    shape = _shape(shape)
    if method == "svd":
        u, s, _ = jnp.linalg.svd(cov)
        factor = u * jnp.sqrt(s[..., None, :])
    elif method == "eigh":
        w, v = jnp.linalg.eigh(cov)
        factor = v * jnp.sqrt(w[..., None, :])
    else:
        factor = jnp.linalg.cholesky(cov)
    samples = normal(key, shape + mean.shape[-1:], dtype)
    return mean + jnp.einsum("...ij,...j->...i", factor, samples)


def orthogonal(key, n, shape=(), dtype=None):
    """Random n x n orthogonal matrices (Haar measure), via QR of a normal sample."""
    jnp = _jnp()
    dtype = _float_dtype(dtype, "orthogonal")
    z = normal(key, _shape(shape) + (n, n), dtype)
    q, r = jnp.linalg.qr(z)
    d = jnp.diagonal(r, 0, -2, -1)
    return q * jnp.expand_dims(jnp.sign(d), -2)


# ----------------------------------------------------------------------------
# Gamma family: Marsaglia-Tsang rejection sampling per element, as JAX does it (one
# key per element, a while_loop under vmap), so the numbers match jax.random's.


def _gamma_one(key, alpha, log_space):

    jnp = _jnp()
    dtype = alpha.dtype
    zero = np.asarray(0, dtype)
    one = np.asarray(1, dtype)
    minus_one = np.asarray(-1, dtype)
    half = np.asarray(0.5, dtype)
    third = np.asarray(1.0 / 3.0, dtype)
    squeeze = np.asarray(0.0331, dtype)
    # alpha < 1: sample Gamma(alpha + 1) and boost by Uniform^(1 / alpha)
    boost_mask = alpha >= one
    alpha_orig = alpha
    alpha = jnp.where(boost_mask, alpha, alpha + one)
    d = alpha - third
    c = third / jnp.sqrt(d)

    def cond_fn(state):
        _, X, V, U = state
        first = U >= one - squeeze * (X * X)
        second = jnp.log(U) >= X * half + d * (one - V + jnp.log(V))
        return jnp.logical_and(first, second)

    def next_kxv(kxv):
        k = kxv[0]
        k, sub = split(k)
        x = normal(sub, (), dtype)
        return k, x, one + x * c

    def body_fn(state):
        k = state[0]
        k, x_key, u_key = split(k, 3)
        _, x, v = _lax.while_loop(lambda kxv: kxv[2] <= zero, next_kxv, (x_key, zero, minus_one))
        U = uniform(u_key, (), dtype)
        return k, x * x, v * v * v, U

    key, subkey = split(key)
    init = (key, jnp.asarray(zero), jnp.asarray(one), jnp.asarray(np.asarray(2, dtype)))
    _, _, V, _ = _lax.while_loop(cond_fn, body_fn, init)
    if log_space:
        log_samples = -exponential(subkey, (), dtype)
        log_boost = jnp.where(
            jnp.logical_or(boost_mask, log_samples == 0), zero, log_samples * (one / alpha_orig)
        )
        return jnp.log(d) + jnp.log(V) + log_boost
    samples = 1 - uniform(subkey, (), dtype)
    boost = jnp.where(boost_mask, one, jnp.power(samples, one / alpha_orig))
    return d * V * boost


def _gamma(key, a, shape, dtype, log_space):

    jnp = _jnp()
    key = _key(key, "gamma")
    dtype = _float_dtype(dtype, "gamma")
    a = jnp.asarray(a, dtype)
    shape = a.shape if shape is None else _shape(shape)
    a = jnp.broadcast_to(a, shape)
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return jnp.zeros(shape, dtype)
    keys = split(key, n)
    samples = vmap(lambda k, al: _gamma_one(k, al, log_space))(keys, jnp.reshape(a, (n,)))
    return jnp.reshape(samples, shape)


def gamma(key, a, shape=None, dtype=None):
    """Gamma(a, 1) samples (JAX's rejection sampler; no gradient with respect to `a`)."""
    return _gamma(key, a, shape, dtype, log_space=False)


def loggamma(key, a, shape=None, dtype=None):
    """log of Gamma(a, 1) samples, accurate for small `a`."""
    return _gamma(key, a, shape, dtype, log_space=True)


def beta(key, a, b, shape=None, dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "beta")
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    shape = np.broadcast_shapes(a.shape, b.shape) if shape is None else _shape(shape)
    key_a, key_b = split(_key(key, "beta"))
    log_a = loggamma(key_a, jnp.broadcast_to(a, shape), shape, dtype)
    log_b = loggamma(key_b, jnp.broadcast_to(b, shape), shape, dtype)
    log_max = jnp.maximum(log_a, log_b)
    ga, gb = jnp.exp(log_a - log_max), jnp.exp(log_b - log_max)
    return ga / (ga + gb)


def dirichlet(key, alpha, shape=None, dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "dirichlet")
    alpha = jnp.asarray(alpha, dtype)
    shape = alpha.shape[:-1] if shape is None else _shape(shape)
    log_g = loggamma(key, alpha, shape + alpha.shape[-1:], dtype)
    log_g = log_g - jnp.max(log_g, axis=-1, keepdims=True)
    e = jnp.exp(log_g)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def chisquare(key, df, shape=None, dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "chisquare")
    df = jnp.asarray(df, dtype)
    shape = df.shape if shape is None else _shape(shape)
    return jnp.exp(loggamma(key, df / 2, shape, dtype)) * np.asarray(2, dtype)


def t(key, df, shape=(), dtype=None):
    jnp = _jnp()
    dtype = _float_dtype(dtype, "t")
    key_n, key_g = split(_key(key, "t"))
    n = normal(key_n, _shape(shape), dtype)
    half_df = jnp.asarray(df, dtype) / 2
    g = gamma(key_g, half_df, _shape(shape), dtype)
    return n * jnp.sqrt(half_df / g)


# ----------------------------------------------------------------------------
# Discrete distributions


def randint(key, shape, minval, maxval, dtype=None):
    """Integers uniform in [minval, maxval) (int32 by default), JAX's algorithm."""
    jnp = _jnp()
    key = _key(key, "randint")
    dtype = dtypes.int_ if dtype is None else dtypes.canonicalize(dtype)
    if not dtypes.is_int(dtype):
        raise user_error(DtypeError, f"randint needs an integer dtype, got {dtype}")
    shape = _shape(shape)
    small = np.iinfo(dtype)
    if small.bits < 32:
        # JAX (0.4.31+) samples narrow integers at 32 bits, then casts (less bias)
        lo = jnp.clip(jnp.asarray(minval).astype(dtypes.int_), int(small.min), int(small.max))
        hi = jnp.clip(jnp.asarray(maxval).astype(dtypes.int_), int(small.min), int(small.max) + 1)
        return randint(key, shape, lo, hi, dtypes.int_).astype(dtype)
    minval = jnp.asarray(minval)
    maxval = jnp.asarray(maxval)
    _check_broadcast("randint", shape, minval.shape, maxval.shape)
    if not dtypes.is_int(minval.dtype):
        minval = minval.astype(dtypes.int_)
    if not dtypes.is_int(maxval.dtype):
        maxval = maxval.astype(dtypes.int_)
    info = np.iinfo(dtype)
    # maxval may be one past the dtype's range (randint(k, s, 0, 256, uint8))
    big = np.dtype(np.int64) if info.bits < 64 else np.dtype(np.float64)
    maxval_out_of_range = jnp.greater(maxval.astype(big), np.asarray(info.max, big))
    minval = jnp.clip(minval.astype(big), info.min, info.max).astype(dtype)
    maxval = jnp.clip(maxval.astype(big), info.min, info.max).astype(dtype)
    nbits = info.bits
    k1, k2 = split(key)
    higher_bits = _random_bits(k1, nbits, shape)
    lower_bits = _random_bits(k2, nbits, shape)
    udt = _UINT[nbits]
    span = jnp.broadcast_to(jnp.subtract(maxval, minval).astype(udt), shape)
    le = jnp.broadcast_to(jnp.less_equal(maxval, minval), shape)
    span = jnp.where(le, np.asarray(1, udt), span)
    bump = jnp.broadcast_to(
        jnp.logical_and(maxval_out_of_range, jnp.greater(maxval, minval)), shape
    )
    span = jnp.where(bump, span + np.asarray(1, udt), span)
    # (a * 2^(n/2) + b) mod span without overflow: ((a % s) * m + b % s) % s
    multiplier = lax.rem(lax.full(shape, 2 ** (nbits // 2), udt), span)
    multiplier = lax.rem(lax.mul(multiplier, multiplier), span)
    offset = lax.add(lax.mul(lax.rem(higher_bits, span), multiplier), lax.rem(lower_bits, span))
    offset = lax.rem(offset, span)
    return jnp.add(minval, offset.astype(dtype)).astype(dtype)


def _poisson_knuth(key, lam, shape, dtype, max_iters):

    jnp = _jnp()

    def body_fn(carry):
        i, k, rng, log_prod = carry
        rng, subkey = split(rng)
        k = jnp.where(log_prod > -lam, k + 1, k)
        u = _uniform(subkey, shape, np.dtype(np.float32), 0.0, 1.0)
        return i + 1, k, rng, log_prod + jnp.log(u)

    def cond_fn(carry):
        i, log_prod = carry[0], carry[3]
        return jnp.logical_and(jnp.any(log_prod > -lam), i < max_iters)

    init = (0, jnp.zeros(shape, dtype), key, jnp.zeros(shape, np.float32))
    k = _lax.while_loop(cond_fn, body_fn, init)[1]
    return (k - 1).astype(dtype)


def _poisson_rejection(key, lam, shape, dtype, max_iters):
    jnp = _jnp()
    log_lam = jnp.log(lam)
    b = 0.931 + 2.53 * jnp.sqrt(lam)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)

    def body_fn(carry):
        i, k_out, accepted, rng = carry
        rng, subkey_0, subkey_1 = split(rng, 3)
        u = _uniform(subkey_0, shape, lam.dtype, 0.0, 1.0) - 0.5
        v = _uniform(subkey_1, shape, lam.dtype, 0.0, 1.0)
        u_shifted = 0.5 - jnp.abs(u)
        k = jnp.floor((2 * a / u_shifted + b) * u + lam + 0.43)
        s = jnp.log(v * inv_alpha / (a / (u_shifted * u_shifted) + b))
        t = -lam + k * log_lam - lgamma_p.bind(k + 1)  # scipy.special.gammaln of a float
        accept1 = jnp.logical_and(u_shifted >= 0.07, v <= v_r)
        reject = jnp.logical_or(k < 0, jnp.logical_and(u_shifted < 0.013, v > u_shifted))
        accept = jnp.logical_or(accept1, jnp.logical_and(jnp.logical_not(reject), s <= t))
        k_out = jnp.where(accept, k, k_out)
        return i + 1, k_out, jnp.logical_or(accepted, accept), rng

    def cond_fn(carry):
        i, _, accepted, _ = carry
        return jnp.logical_and(jnp.any(jnp.logical_not(accepted)), i < max_iters)

    init = (0, jnp.full(shape, -1, lam.dtype), jnp.zeros(shape, np.bool_), key)
    k = _lax.while_loop(cond_fn, body_fn, init)[1]
    return k.astype(dtype)


def poisson(key, lam, shape=None, dtype=None):
    """Poisson(lam) samples (int32 by default): Knuth's method below 10, rejection above,
    as JAX samples them."""
    jnp = _jnp()
    key = _key(key, "poisson")
    dtype = dtypes.int_ if dtype is None else dtypes.canonicalize(dtype)
    lam = jnp.asarray(lam, np.float32)
    shape = lam.shape if shape is None else _shape(shape)
    _check_broadcast("poisson", shape, lam.shape)
    lam = jnp.broadcast_to(lam, shape)
    use_knuth = jnp.logical_or(jnp.isnan(lam), lam < 10)
    lam_knuth = jnp.where(use_knuth, lam, 0.0)
    lam_rejection = jnp.where(use_knuth, 1e5, lam)
    max_iters = int(np.iinfo(dtype).max)
    result = jnp.where(
        use_knuth,
        _poisson_knuth(key, lam_knuth, shape, dtype, max_iters),
        _poisson_rejection(key, lam_rejection, shape, dtype, max_iters),
    )
    return jnp.where(lam == 0, jnp.zeros_like(result), result)


def _shuffle(key, x, axis):
    jnp = _jnp()
    size = int(np.prod(x.shape, dtype=np.int64))
    num_rounds = int(math.ceil(3 * math.log(max(1, size)) / math.log(2**32 - 1)))
    for _ in range(num_rounds):
        key, subkey = split(key)
        sort_keys = _random_bits(subkey, 32, tuple(x.shape))
        _, x = lax.sort([sort_keys, jnp.asarray(x)], dimension=axis, num_keys=1)
    return x


def permutation(key, x, axis=0, independent=False):
    """A random permutation of `arange(x)` (int `x`) or of `x` along `axis`."""
    jnp = _jnp()
    key = _key(key, "permutation")
    if isinstance(x, (int, np.integer)) or (
        not isinstance(x, Tracer) and np.ndim(x) == 0 and dtypes.is_int(np.asarray(x).dtype)
    ):
        n = int(x)
        return _shuffle(key, jnp.arange(n), 0)
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise user_error(ShapeError, "permutation: x must be an int or an array with ndim >= 1")
    axis = axis % x.ndim
    if independent or x.ndim == 1:
        return _shuffle(key, x, axis)
    ind = _shuffle(key, jnp.arange(x.shape[axis]), 0)
    return jnp.take(x, ind, axis=axis)


def shuffle(key, x, axis=0):
    return _shuffle(_key(key, "shuffle"), _jnp().asarray(x), axis)


def categorical(key, logits, axis=-1, shape=None):
    """Samples from a categorical distribution given unnormalized log-probabilities.

    Example:
        >>> import fflow.numpy as jnp, fflow.random as random
        >>> random.categorical(random.PRNGKey(0), jnp.array([0.0, 50.0, 0.0])).tolist()
        1
    """
    jnp = _jnp()
    key = _key(key, "categorical")
    logits = jnp.asarray(logits)
    if not dtypes.is_float(logits.dtype):
        logits = logits.astype(dtypes.float_)
    axis = axis % logits.ndim
    batch_shape = tuple(d for i, d in enumerate(logits.shape) if i != axis)
    if shape is None:
        shape = batch_shape
    else:
        shape = _shape(shape)
        _check_broadcast("categorical", shape, batch_shape)
    prefix = shape[: len(shape) - len(batch_shape)]
    logits_shape = list(shape[len(shape) - len(batch_shape) :])
    logits_shape.insert(axis, logits.shape[axis])
    g = gumbel(key, (*prefix, *logits_shape), logits.dtype)
    expanded = jnp.reshape(logits, (1,) * len(prefix) + logits.shape)
    return jnp.argmax(g + expanded, axis=axis + len(prefix))


def choice(key, a, shape=(), replace=True, p=None, axis=0):
    """Random samples from `a` (an int n means `arange(n)`), optionally weighted by `p`."""
    jnp = _jnp()
    key = _key(key, "choice")
    shape = _shape(shape)
    if isinstance(a, (int, np.integer)):
        arr = None
        n_inputs = int(a)
    else:
        arr = jnp.asarray(a)
        if arr.ndim == 0:
            n_inputs = int(arr)
            arr = None
        else:
            n_inputs = arr.shape[axis]
    n_draws = int(np.prod(shape, dtype=np.int64))
    if n_draws == 0:
        ind = jnp.zeros(shape, dtypes.int_)
    elif n_inputs <= 0:
        raise user_error(ValueError, "choice: a must be greater than 0 unless no samples are taken")
    elif not replace and n_draws > n_inputs:
        raise user_error(
            ValueError, f"choice: cannot take {n_draws} samples from {n_inputs} without replacement"
        )
    elif p is None:
        if replace:
            ind = randint(key, shape, 0, n_inputs)
        else:
            ind = jnp.reshape(permutation(key, n_inputs)[:n_draws], shape)
    else:
        p = jnp.asarray(p)
        if replace:
            p_cuml = jnp.cumsum(p)
            r = p_cuml[-1] * (1 - _uniform(key, shape, p_cuml.dtype, 0.0, 1.0))
            ind = jnp.searchsorted(p_cuml, r).astype(dtypes.int_)
        else:
            g = gumbel(key, (n_inputs,), p.dtype) - jnp.log(p)
            ind = jnp.reshape(jnp.argsort(-g)[:n_draws], shape)
    if arr is None:
        return ind
    return jnp.take(arr, ind, axis=axis)


__all__ = [
    "KeyArray",
    "PRNGKey",
    "ball",
    "generalized_normal",
    "key",
    "key_data",
    "wrap_key_data",
    "split",
    "fold_in",
    "clone",
    "bits",
    "uniform",
    "normal",
    "truncated_normal",
    "bernoulli",
    "gumbel",
    "exponential",
    "laplace",
    "logistic",
    "rademacher",
    "cauchy",
    "lognormal",
    "rayleigh",
    "pareto",
    "weibull_min",
    "maxwell",
    "geometric",
    "multivariate_normal",
    "orthogonal",
    "gamma",
    "loggamma",
    "beta",
    "dirichlet",
    "chisquare",
    "t",
    "randint",
    "poisson",
    "permutation",
    "shuffle",
    "categorical",
    "choice",
]


def __dir__():
    return list(__all__)

"""Basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, MLP, Sequential.

Layers take an explicit PRNG `key` to initialise, are pytrees (see module.py) and
accept optional SBP annotations for their parameters (`sbp=` for the main weight,
`bias_sbp=` for the bias), which `fflow.nn.sbp_of(model)` collects for `shard`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import nn
    >>> mlp = nn.MLP(4, 2, width_size=8, depth=2, key=fflow.random.PRNGKey(0))
    >>> mlp(jnp.ones((5, 4))).shape, nn.count_params(mlp)
    ((5, 2), 130)
"""

import fflow.numpy as jnp
from fflow import lax, random
from fflow.errors import user_error
from fflow.nn import functions as F
from fflow.nn import initializers as init
from fflow.nn.module import Module, field


def _check_features(layer, x, n):
    if x.shape[-1:] != (n,):
        raise user_error(
            ValueError,
            f"{layer} expects inputs whose last dimension is {n}, got shape {tuple(x.shape)}. "
            "Fix: reshape the input or build the layer with the right input size.",
        )


class Linear(Module):
    """y = x @ weight + bias on the last axis; weight is (in_features, out_features).

    Args:
        in_features, out_features: sizes.
        use_bias: add a bias (zeros at init).
        key: PRNG key for the weight (lecun_normal by default, as Flax).
        dtype: parameter dtype (float32).
        sbp: SBP of the weight under `shard` (e.g. `S(1)` column-parallel, `S(0)`
            row-parallel; a tuple per mesh axis on an N-D placement).
        bias_sbp: SBP of the bias.
    """

    weight: object
    bias: object
    in_features: int = field(static=True)
    out_features: int = field(static=True)
    sbp: object = field(static=True)
    bias_sbp: object = field(static=True)

    def __init__(self, in_features, out_features, use_bias=True, *, key, dtype=None,
                 kernel_init=None, bias_init=None, sbp=None, bias_sbp=None):  # fmt: skip
        wkey, bkey = random.split(key)
        kernel_init = kernel_init or init.lecun_normal()
        bias_init = bias_init or init.zeros
        self.weight = kernel_init(wkey, (in_features, out_features), dtype)
        self.bias = bias_init(bkey, (out_features,), dtype) if use_bias else None
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sbp, self.bias_sbp = sbp, bias_sbp

    def __call__(self, x, *, key=None):
        x = jnp.asarray(x)
        _check_features("Linear", x, self.in_features)
        y = x @ self.weight
        return y if self.bias is None else y + self.bias

    def param_sbp(self):
        return {"weight": self.sbp, "bias": self.bias_sbp}


class Embedding(Module):
    """A lookup table: ids (any int shape) -> vectors; `attend(x)` is x @ weight.T
    (an output layer tied to the embedding)."""

    weight: object
    num_embeddings: int = field(static=True)
    embedding_dim: int = field(static=True)
    sbp: object = field(static=True)

    def __init__(self, num_embeddings, embedding_dim, *, key, dtype=None, embedding_init=None,
                 sbp=None):  # fmt: skip
        embedding_init = embedding_init or init.variance_scaling(1.0, "fan_in", "normal", 1, 0)
        # fan_in over the embedding dim (Flax's default): entries have variance 1/dim
        self.weight = embedding_init(key, (num_embeddings, embedding_dim), dtype)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.sbp = sbp

    def __call__(self, ids, *, key=None):
        ids = jnp.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise user_error(TypeError, f"Embedding takes integer ids, got {ids.dtype}")
        return jnp.take(self.weight, ids, axis=0)

    def attend(self, x):
        return x @ self.weight.T

    def param_sbp(self):
        return {"weight": self.sbp}


def _shape(shape):
    return (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `shape` axes."""

    weight: object
    bias: object
    shape: tuple = field(static=True)
    eps: float = field(static=True)

    def __init__(self, shape, eps=1e-5, use_weight=True, use_bias=True, *, dtype=None):
        self.shape = _shape(shape)
        self.eps = float(eps)
        self.weight = jnp.ones(self.shape, dtype) if use_weight else None
        self.bias = jnp.zeros(self.shape, dtype) if use_bias else None

    def __call__(self, x, *, key=None):
        x = jnp.asarray(x)
        axes = tuple(range(x.ndim - len(self.shape), x.ndim))
        if tuple(x.shape[x.ndim - len(self.shape) :]) != self.shape:
            raise user_error(
                ValueError, f"LayerNorm{self.shape} got an input of shape {tuple(x.shape)}"
            )
        mean = jnp.mean(x, axis=axes, keepdims=True)
        centered = x - mean
        var = jnp.mean(jnp.square(centered), axis=axes, keepdims=True)
        y = centered * lax.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing `shape` axes."""

    weight: object
    shape: tuple = field(static=True)
    eps: float = field(static=True)

    def __init__(self, shape, eps=1e-6, use_weight=True, *, dtype=None):
        self.shape = _shape(shape)
        self.eps = float(eps)
        self.weight = jnp.ones(self.shape, dtype) if use_weight else None

    def __call__(self, x, *, key=None):
        x = jnp.asarray(x)
        axes = tuple(range(x.ndim - len(self.shape), x.ndim))
        y = x * lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + self.eps)
        return y if self.weight is None else y * self.weight


class Dropout(Module):
    """Zero entries with probability `p` and scale the rest by 1/(1-p) in training;
    the identity in inference (`inference=True`, or `nn.inference_mode(model)`)."""

    p: float = field(static=True)
    inference: bool = field(static=True)

    def __init__(self, p=0.5, inference=False):
        if not 0.0 <= p < 1.0:
            raise user_error(ValueError, f"Dropout probability must be in [0, 1), got {p}")
        self.p, self.inference = float(p), bool(inference)

    def __call__(self, x, *, key=None, inference=None):
        inference = self.inference if inference is None else inference
        if inference or self.p == 0.0:
            return x
        if key is None:
            raise user_error(
                ValueError,
                "Dropout in training mode needs a PRNG key: call it with key=..., or switch "
                "it off with inference=True / fflow.nn.inference_mode(model).",
            )
        x = jnp.asarray(x)
        keep = random.bernoulli(key, 1.0 - self.p, x.shape)
        return jnp.where(keep, x / (1.0 - self.p), jnp.zeros_like(x))


class Lambda(Module):
    """A parameter-free layer applying `fn` (e.g. an activation inside Sequential)."""

    fn: object = field(static=True)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x, *, key=None):
        return self.fn(x)


class Sequential(Module):
    """Layers applied in order; a `key` is split among them (for Dropout)."""

    layers: tuple

    def __init__(self, layers):
        self.layers = tuple(layers)

    def __call__(self, x, *, key=None):
        keys = [None] * len(self.layers) if key is None else random.split(key, len(self.layers))
        for layer, k in zip(self.layers, keys):
            x = layer(x, key=k)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)


class MLP(Module):
    """`depth` hidden layers of `width_size` with `activation` (Equinox's signature)."""

    layers: tuple
    activation: object = field(static=True)
    final_activation: object = field(static=True)

    def __init__(self, in_size, out_size, width_size, depth, activation=F.relu,
                 final_activation=F.identity, use_bias=True, *, key, dtype=None):  # fmt: skip
        sizes = [in_size] + [width_size] * depth + [out_size]
        keys = random.split(key, len(sizes) - 1)
        self.layers = tuple(
            Linear(a, b, use_bias, key=k, dtype=dtype)
            for a, b, k in zip(sizes[:-1], sizes[1:], keys)
        )
        self.activation, self.final_activation = activation, final_activation

    def __call__(self, x, *, key=None):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.final_activation(self.layers[-1](x))


def inference_mode(model, value=True):
    """`model` with every Dropout (and any layer with an `inference` field) switched to
    inference (value=True) or training (value=False)."""

    def flip(node):
        if isinstance(node, Module) and "inference" in type(node).__dataclass_fields__:
            return node.replace(inference=bool(value))
        return node

    return _map_modules(flip, model)


def _map_modules(fn, node):
    """Apply `fn` to every module of a tree, bottom-up."""
    if isinstance(node, Module):
        changes = {}
        for name in type(node).__dataclass_fields__:
            child = node.__dict__[name]
            if isinstance(child, (Module, list, tuple, dict)):
                changes[name] = _map_modules(fn, child)
        return fn(node.replace(**changes) if changes else node)
    if type(node) in (list, tuple):
        return type(node)(_map_modules(fn, c) for c in node)
    if type(node) is dict:
        return {k: _map_modules(fn, v) for k, v in node.items()}
    return node

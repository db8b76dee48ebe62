"""fflow.nn: `jax.nn`'s functions (activations, softmax, attention, initializers) and
layers as Equinox-style pytree modules (Linear, Embedding, Conv, LayerNorm, RMSNorm,
Dropout, MultiHeadAttention, MLP, Sequential, pooling).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import nn
    >>> nn.softmax(jnp.array([1000.0, 1000.0])).tolist()
    [0.5, 0.5]
    >>> model = nn.Sequential([nn.Linear(3, 4, key=fflow.random.PRNGKey(0)), nn.Lambda(nn.relu)])
    >>> grads = fflow.grad(lambda m, x: jnp.sum(m(x)))(model, jnp.ones((2, 3)))
    >>> grads.layers[0].weight.shape
    (3, 4)
"""

from fflow.nn import initializers
from fflow.nn.attention import MultiHeadAttention, make_causal_mask, make_padding_mask
from fflow.nn.conv import (
    AvgPool1d,
    AvgPool2d,
    Conv,
    Conv1d,
    Conv2d,
    MaxPool1d,
    MaxPool2d,
    avg_pool,
    max_pool,
)
from fflow.nn.functions import (
    celu,
    dot_product_attention,
    elu,
    gelu,
    glu,
    hard_sigmoid,
    hard_silu,
    hard_swish,
    hard_tanh,
    identity,
    leaky_relu,
    log1mexp,
    log_sigmoid,
    log_softmax,
    logmeanexp,
    logsumexp,
    mish,
    normalize,
    one_hot,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    soft_sign,
    softmax,
    softplus,
    sparse_plus,
    sparse_sigmoid,
    squareplus,
    standardize,
    swish,
    tanh,
)
from fflow.nn.layers import (
    MLP,
    Dropout,
    Embedding,
    Lambda,
    LayerNorm,
    Linear,
    RMSNorm,
    Sequential,
    inference_mode,
)
from fflow.nn.module import (
    Module,
    combine,
    count_params,
    field,
    is_array,
    is_inexact_array,
    partition,
    sbp_of,
    static_field,
    summary,
)

# the public names: jax.nn's that fflow has, and fflow's layers (submodules stay out)
__all__ = [
    "AvgPool1d",
    "AvgPool2d",
    "Conv",
    "Conv1d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Lambda",
    "LayerNorm",
    "Linear",
    "MLP",
    "MaxPool1d",
    "MaxPool2d",
    "Module",
    "MultiHeadAttention",
    "RMSNorm",
    "Sequential",
    "avg_pool",
    "celu",
    "combine",
    "count_params",
    "dot_product_attention",
    "elu",
    "field",
    "gelu",
    "glu",
    "hard_sigmoid",
    "hard_silu",
    "hard_swish",
    "hard_tanh",
    "identity",
    "inference_mode",
    "initializers",
    "is_array",
    "is_inexact_array",
    "leaky_relu",
    "log1mexp",
    "log_sigmoid",
    "log_softmax",
    "logmeanexp",
    "logsumexp",
    "make_causal_mask",
    "make_padding_mask",
    "max_pool",
    "mish",
    "normalize",
    "one_hot",
    "partition",
    "relu",
    "relu6",
    "sbp_of",
    "selu",
    "sigmoid",
    "silu",
    "soft_sign",
    "softmax",
    "softplus",
    "sparse_plus",
    "sparse_sigmoid",
    "squareplus",
    "standardize",
    "static_field",
    "summary",
    "swish",
    "tanh",
]


def __dir__():
    return list(__all__)

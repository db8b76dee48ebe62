"""fflow's public modules list their names in `__all__`, `dir()` shows exactly those
(no helper or imported module leaks), and they are the names of the matching jax
module plus fflow's own API, named here."""

import importlib

import pytest

# fflow module -> (jax module, fflow's own public names that jax's module lacks)
PUBLIC = {
    "fflow": (
        "jax",
        {
            # fflow's API: sharding (OneFlow's SBP), toolkit, reports, and jax submodules
            # that `import jax` does not load by itself
            "CheckpointManager",
            "accumulate_gradients",
            "ad_checkpoint",
            "amp",
            "compat",
            "explain",
            "extend",
            "flatten_util",
            "load",
            "make_global_array",
            "optim",
            "pipeline",
            "placement",
            "save",
            "sbp",
            "shard",
            "stop_gradient",
            "test_util",
            "to_global",
            "with_sbp",
            "with_sharding_constraint",
        },
    ),
    "fflow.numpy": ("jax.numpy", set()),
    "fflow.numpy.linalg": ("jax.numpy.linalg", set()),
    "fflow.numpy.fft": ("jax.numpy.fft", set()),
    "fflow.lax": ("jax.lax", set()),
    # shuffle and KeyArray (the type of typed keys): older JAX's names, kept
    "fflow.random": ("jax.random", {"shuffle", "KeyArray"}),
    "fflow.scipy.special": ("jax.scipy.special", set()),
    "fflow.tree_util": ("jax.tree_util", set()),
    "fflow.nn": (
        "jax.nn",
        {
            # fflow's Equinox-style layers and their helpers
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
            "combine",
            "count_params",
            "field",
            "inference_mode",
            "is_array",
            "is_inexact_array",
            "make_causal_mask",
            "make_padding_mask",
            "max_pool",
            "normalize",
            "partition",
            "sbp_of",
            "static_field",
            "summary",
        },
    ),
}


def _public(module):
    return {n for n in dir(module) if not n.startswith("_")}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_dir_is_all_and_every_listed_name_exists(name):
    module = importlib.import_module(name)
    lazy = {"bfloat16"} if name == "fflow.numpy" else set()  # loads on first use
    assert _public(module) == set(module.__all__) | lazy
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_names_are_jax_names_or_named_fflow_api(name):
    jax_name, extras = PUBLIC[name]
    theirs = _public(pytest.importorskip(jax_name))
    ours = _public(importlib.import_module(name))
    assert ours - theirs <= extras, (
        f"not jax's and not listed here: {sorted(ours - theirs - extras)}"
    )
    assert extras <= ours, f"listed here but gone: {sorted(extras - ours)}"

"""The runnable examples in the docstrings of fflow.numpy, fflow.nn, fflow.random and
fflow.scipy.special."""

import doctest
import importlib

import pytest

MODULES = [
    "fflow.numpy",
    "fflow.numpy.creation",
    "fflow.numpy.linalg",
    "fflow.numpy.linalg_ops",
    "fflow.numpy.more",
    "fflow.nn",
    "fflow.random",
    "fflow.scipy.special",
    "fflow.scipy.stats",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0

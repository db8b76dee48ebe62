"""The runnable docstring examples of fflow.nn's submodules and fflow.optim."""

import doctest
import importlib

import pytest

MODULES = [
    "fflow.nn.functions",
    "fflow.nn.initializers",
    "fflow.nn.module",
    "fflow.nn.layers",
    "fflow.nn.conv",
    "fflow.nn.attention",
    "fflow.optim",
    "fflow.optim.base",
    "fflow.optim.scalers",
    "fflow.optim.alias",
    "fflow.optim.schedules",
    "fflow.optim.accumulate",
    "fflow.optim.sharding",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0

"""Every worked example in the package's docstrings is run and must print what it says."""

import doctest
import importlib

import pytest

MODULES = ["leaf", "int_tuple", "layout", "composition", "algebra", "tiling", "swizzle", "tv", "parse", "draw"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"flydsl.layout.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and (result.attempted > 0 or name == "leaf")

"""What is refused before MLIR sees it: text nested too deeply, pass options MLIR would assert on."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
from flydsl.compiler.text_checks import BINARY_FORMATS, MAX_NESTING, check_nesting, check_pass_pipeline, nesting_depth


@pytest.mark.parametrize(
    "text, depth",
    [
        ("", 0),
        ("module {}", 1),
        ("func.func @f(%a: tuple<tuple<i32>>) { return }", 3),
        ("%x = fly.make_layout : !fly.layout<((4,2),8):((16,1),2)>", 3),
        ('%s = "test.op"() {text = "{{{{(((<<<"} : () -> ()', 1),  # brackets in a string do not nest
        ("// {{{{{{\nmodule {}", 1),  # nor in a comment
        ("!fly.foo<(i32) -> (i32)>", 2),  # nor an arrow's '>'
        ("affine_set<(d0) : (d0 >= 0, d0 <= 4)>", 2),
    ],
)
def test_nesting_depth_counts_the_brackets_that_nest(text, depth):
    assert nesting_depth(text) == depth


def test_check_nesting_names_where_the_bound_is_passed():
    text = "module {\n" + "  " + "[" * MAX_NESTING + "]" * MAX_NESTING + "\n}"
    with pytest.raises(
        flyc.CompilationError, match=rf"k.mlir:2:{MAX_NESTING + 2}: error: brackets nested more"
    ) as info:
        check_nesting(text, "k.mlir")
    assert info.value.stage == "input"
    check_nesting(text.replace("[", "", 1).replace("]", "", 1))  # exactly MAX_NESTING deep


@pytest.mark.parametrize("fmt", BINARY_FORMATS)
def test_every_binary_format_mlir_knows_is_accepted(fmt):
    check_pass_pipeline(f"builtin.module(gpu-module-to-binary{{format={fmt}}})")
    check_pass_pipeline(f'builtin.module(gpu-module-to-binary{{toolkit="" format="{fmt}"}})')


@pytest.mark.parametrize("fmt", ["bogus", '""', "ISA"])
def test_an_unknown_binary_format_is_refused(fmt):
    with pytest.raises(ValueError, match=f"gpu-module-to-binary's format must be one of .*; got {fmt}"):
        check_pass_pipeline(f"builtin.module(canonicalize,gpu-module-to-binary{{opts=-v format={fmt}}})")

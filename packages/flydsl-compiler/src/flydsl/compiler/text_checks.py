"""Checks of user text before MLIR sees it: how deeply MLIR text nests, and the pass options we parse ourselves.

MLIR's parser, verifier and passes recurse once per nesting level (regions, attribute dictionaries, types): a
module nested a few thousand deep overflows the stack (SIGSEGV). Brackets are counted first, cheaply, and text
nested deeper than ``MAX_NESTING`` is refused with its position. Some pass options abort on a bad value instead of
failing (``gpu-module-to-binary{format=bogus}`` asserts): those are checked against an allow-list here.
"""

from __future__ import annotations

import re
from itertools import accumulate

from flydsl.compiler.errors import CompilationError

__all__ = ["MAX_NESTING", "BINARY_FORMATS", "check_nesting", "check_pass_pipeline", "nesting_depth"]

# Deeper than any kernel (tens of levels); far below where MLIR 22's parser overflows an 8 MiB stack (~3,000).
MAX_NESTING = 256
# gpu-module-to-binary's formats (mlir/lib/Dialect/GPU/Transforms/ModuleToBinary.cpp); any other value asserts.
BINARY_FORMATS = ("offloading", "llvm", "assembly", "isa", "binary", "bin", "fatbinary", "fatbin")

# What cannot hold a bracket that nests: string literals, comments, and arrows and comparisons made with '<'/'>'.
_INERT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|->|>=|<=')
_OPENERS, _CLOSERS = "{([<", "})]>"
_DELTAS = {**{c: 1 for c in _OPENERS}, **{c: -1 for c in _CLOSERS}}
_BRACKETS = re.compile(r"[{}()\[\]<>]")


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of MLIR ``text`` (``{ ( [ <``), outside strings and comments."""
    brackets = _BRACKETS.findall(_INERT.sub("", text))
    return max(accumulate(_DELTAS[b] for b in brackets), default=0)


def check_nesting(text: str, filename: str = "<input>") -> None:
    """Refuses MLIR text nested deeper than ``MAX_NESTING`` (``CompilationError`` of stage 'input', naming where)."""
    if nesting_depth(text) <= MAX_NESTING:
        return
    blanked = _INERT.sub(lambda match: " " * len(match.group()), text)  # positions stay true
    depth = 0
    for match in _BRACKETS.finditer(blanked):
        depth += _DELTAS[match.group()]
        if depth > MAX_NESTING:
            line = text.count("\n", 0, match.start()) + 1
            column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
            raise CompilationError(
                "input",
                f"{filename}:{line}:{column}: error: brackets nested more than {MAX_NESTING} deep: the input is"
                " refused before parsing (MLIR's parser and passes recurse per level and would overflow the stack)",
            )


_BINARY_PASS = re.compile(r"gpu-module-to-binary\s*\{([^}]*)\}")
_FORMAT_OPTION = re.compile(r"(?:^|\s)format\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s}]+)")


def check_pass_pipeline(pipeline: str) -> None:
    """Refuses pass options that MLIR asserts on instead of rejecting (``ValueError`` naming the option)."""
    for options in _BINARY_PASS.findall(pipeline):
        for value in _FORMAT_OPTION.findall(options):
            if value.strip("\"'") not in BINARY_FORMATS:
                raise ValueError(
                    f"pass pipeline: gpu-module-to-binary's format must be one of {', '.join(BINARY_FORMATS)};"
                    f" got {value}"
                )

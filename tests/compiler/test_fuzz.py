"""Mutants of the repository's MLIR (``fuzz_mlir``) through ``compile_mlir`` and the opt CLI: each compiles or is
refused, and none kills this process or the CLI. ``FLYDSL_FUZZ_MUTANTS`` sets how many go each way (default 1000:
~25 s on a 2-core machine); ``python -m tests.compiler.fuzz_mlir COUNT SEED`` prints the crashes that isolation
caught."""

from __future__ import annotations

import os

from tests.compiler import fuzz_mlir

COUNT = int(os.environ.get("FLYDSL_FUZZ_MUTANTS", "1000"))


def test_no_mutant_kills_the_caller():
    by_compile, by_opt, result = fuzz_mlir.run(COUNT)
    print(f"\ncompile_mlir: {vars(by_compile)}\nopt: {vars(by_opt)}")
    assert by_compile.mutants == COUNT == by_compile.compiled + by_compile.refused + by_compile.worker_crashes
    assert by_compile.compiled and by_compile.refused  # the mutants reach both outcomes
    assert result.returncode in (0, 1), result.stderr[-4000:]
    assert result.stdout.count("// -----\n") == COUNT - 1  # the CLI answered for every mutant
    assert by_opt.compiled and by_opt.refused

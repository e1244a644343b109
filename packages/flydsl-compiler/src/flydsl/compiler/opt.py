"""``python -m flydsl.compiler.opt``: parse, verify, transform and print MLIR with the Fly dialect loaded.

    python -m flydsl.compiler.opt input.mlir                                   # round trip
    python -m flydsl.compiler.opt input.mlir -p 'builtin.module(fly-lower-layouts)'
    python -m flydsl.compiler.opt input.mlir --stage fly                       # a named compile stage
    python -m flydsl.compiler.opt - < input.mlir
    python -m flydsl.compiler.opt cases.mlir --split                         # each '// -----' chunk on its own

Errors go to stderr as ``file:line:col: error: message`` and the exit status is 1. The modules are parsed and
transformed in a forked child (``flydsl.compiler.isolate``; ``FLYDSL_COMPILE_ISOLATED=0``: in this process), so
that an LLVM assertion or abort is reported as an error of the module it was in, and the others go on in a new
child; text nested too deeply and pass options that MLIR
would assert on are refused before MLIR sees them (``flydsl.compiler.text_checks``).
"""

from __future__ import annotations

import argparse
import sys

from flydsl.compiler import isolate, settings
from flydsl.compiler.context import make_context
from flydsl.compiler.errors import CompilationError, format_mlir_error
from flydsl.compiler.lazy import lazy_import
from flydsl.compiler.target import SM90A
from flydsl.compiler.text_checks import check_nesting, check_pass_pipeline

ir = lazy_import("mlir.ir")
passmanager = lazy_import("mlir.passmanager")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flydsl.compiler.opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", help="an .mlir file, or - for stdin")
    parser.add_argument(
        "-p", "--pass-pipeline", help="a textual pass pipeline, e.g. 'builtin.module(fly-lower-layouts)'"
    )
    parser.add_argument("--stage", help="run one named stage of the sm_90a pipeline (fly, llvm, ptx)")
    parser.add_argument("--generic", action="store_true", help="print ops in generic form")
    parser.add_argument("--split", action="store_true", help="process each '// -----' separated chunk on its own")
    args = parser.parse_args(argv)

    text = sys.stdin.read() if args.input == "-" else open(args.input).read()
    filename = "<stdin>" if args.input == "-" else args.input
    pipelines = []
    if args.stage:
        stages = {stage.name: stage for stage in SM90A.stages()}
        if args.stage not in stages:
            parser.error(f"--stage: expected one of {sorted(stages)}, got {args.stage!r}")
        pipelines.append(f"builtin.module({stages[args.stage].passes})")
    if args.pass_pipeline:
        try:
            check_pass_pipeline(args.pass_pipeline)
        except ValueError as error:
            parser.error(f"--pass-pipeline: {error}")
        pipelines.append(args.pass_pipeline)

    cases = _chunks(text) if args.split else [text]
    if settings.current().compile_isolated:
        results = _process_isolated(cases, filename, pipelines, args.generic)
    else:
        results = [_process(case, filename, pipelines, args.generic) for case in cases]
    for _, diagnostics in results:
        if diagnostics:
            print(diagnostics, file=sys.stderr)
    sys.stdout.write("// -----\n".join(output or "" for output, _ in results))
    return 1 if any(output is None for output, _ in results) else 0


def _chunks(text: str) -> list[str]:
    """Splits on '// -----' lines, padding each chunk with blank lines so that line numbers stay true."""
    chunks, current, line_offset = [], [], 0
    for number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == "// -----":
            chunks.append("\n" * line_offset + "".join(current))
            current, line_offset = [], number + 1
        else:
            current.append(line)
    chunks.append("\n" * line_offset + "".join(current))
    return chunks


def _process_isolated(cases: list[str], filename: str, pipelines: list[str], generic: bool) -> list[tuple]:
    """``_process`` of every case in one forked child. Where the child dies, the case it was in gets the report of
    its death and a new child takes the other unfinished cases (those done before the death again: their results
    died with the child)."""
    results = {}
    pending = list(range(len(cases)))
    while pending:
        child = isolate.ForkedChild(_process_cases)
        try:
            done = isolate.outcome_of(child.run([cases[i] for i in pending], filename, pipelines, generic))
        except CompilationError as error:  # its stage is the position in pending of the case it died in
            dead = pending[int(error.stage) if error.stage.isdigit() else 0]
            results[dead] = (None, f"{filename}: error: {error.diagnostics}")
            pending.remove(dead)
            continue
        results.update(zip(pending, done, strict=True))
        pending = []
    return [results[i] for i in range(len(cases))]


def _process_cases(cases: list[str], filename: str, pipelines: list[str], generic: bool, on_stage) -> list[tuple]:
    """``_process`` of each case in turn; ``on_stage`` hears each case's position before it starts."""
    results = []
    for position, text in enumerate(cases):
        on_stage(str(position))
        results.append(_process(text, filename, pipelines, generic))
    return results


def _process(text: str, filename: str, pipelines: list[str], generic: bool) -> tuple[str | None, str]:
    """Parses and transforms one module: ``(its text, "")``, or ``(None, diagnostics)`` on failure."""
    try:
        check_nesting(text, filename)
    except CompilationError as error:
        return None, error.diagnostics
    with make_context():
        try:
            module = ir.Module.parse(text)
            for pipeline in pipelines:
                passmanager.PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as error:
            return None, format_mlir_error(error, filename)
        return module.operation.get_asm(print_generic_op_form=generic), ""


if __name__ == "__main__":
    sys.exit(main())

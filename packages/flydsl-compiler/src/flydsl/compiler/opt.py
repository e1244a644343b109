"""``python -m flydsl.compiler.opt``: parse, verify, transform and print MLIR with the Fly dialect loaded.

    python -m flydsl.compiler.opt input.mlir                                   # round trip
    python -m flydsl.compiler.opt input.mlir -p 'builtin.module(fly-lower-layouts)'
    python -m flydsl.compiler.opt input.mlir --stage fly                       # a named compile stage
    python -m flydsl.compiler.opt - < input.mlir
    python -m flydsl.compiler.opt cases.mlir --split                         # each '// -----' chunk on its own

Errors go to stderr as ``file:line:col: error: message`` and the exit status is 1. Each module is parsed and
transformed in a forked child (``flydsl.compiler.isolate``; ``FLYDSL_COMPILE_ISOLATED=0``: in this process), so
that an LLVM assertion or abort is reported as an error too; text nested too deeply and pass options that MLIR
would assert on are refused before MLIR sees them (``flydsl.compiler.text_checks``).
"""

from __future__ import annotations

import argparse
import functools
import sys

from mlir import ir
from mlir.passmanager import PassManager

from flydsl.compiler import isolate, settings
from flydsl.compiler.context import make_context
from flydsl.compiler.errors import CompilationError, format_mlir_error
from flydsl.compiler.target import SM90A
from flydsl.compiler.text_checks import check_nesting, check_pass_pipeline


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

    # Isolated, each module is processed in a forked child, in its copy of this context (made once: ~5 ms).
    isolated = settings.current().compile_isolated
    context = make_context() if isolated else None
    failed = False
    outputs = []
    for chunk in _chunks(text) if args.split else [text]:
        if isolated:
            output = _process_isolated(chunk, filename, pipelines, args.generic, context)
        else:
            output = _process(chunk, filename, pipelines, args.generic)
        failed |= output is None
        outputs.append(output or "")
    sys.stdout.write("// -----\n".join(outputs))
    return 1 if failed else 0


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


def _process_isolated(text: str, filename: str, pipelines: list[str], generic: bool, context) -> str | None:
    """``_process`` in a forked child; a child that dies is reported as an error of the step it was in."""
    try:
        child = isolate.ForkedChild(functools.partial(_process, context=context), capture_stderr=False)
        return isolate.outcome_of(child.run(text, filename, pipelines, generic))
    except CompilationError as error:
        print(f"{filename}: error: {error}", file=sys.stderr)
        return None


def _process(text: str, filename: str, pipelines: list[str], generic: bool, on_stage=None, context=None) -> str | None:
    """Parses and transforms one module (in ``context``, else a new one); prints diagnostics and returns None on
    failure. ``on_stage`` hears the step about to run ('input', then each pipeline)."""
    on_stage = on_stage or (lambda name: None)
    try:
        check_nesting(text, filename)
    except CompilationError as error:
        print(error.diagnostics, file=sys.stderr)
        return None
    with context or make_context():
        try:
            on_stage("input")
            module = ir.Module.parse(text)
            for pipeline in pipelines:
                on_stage(pipeline)
                PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as error:
            print(format_mlir_error(error, filename), file=sys.stderr)
            return None
        return module.operation.get_asm(print_generic_op_form=generic)


if __name__ == "__main__":
    sys.exit(main())

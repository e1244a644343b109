"""``python -m flydsl.compiler.opt``: parse, verify, transform and print MLIR with the Fly dialect loaded.

    python -m flydsl.compiler.opt input.mlir                                   # round trip
    python -m flydsl.compiler.opt input.mlir -p 'builtin.module(fly-lower-layouts)'
    python -m flydsl.compiler.opt input.mlir --stage fly                       # a named compile stage
    python -m flydsl.compiler.opt - < input.mlir
    python -m flydsl.compiler.opt cases.mlir --split                         # each '// -----' chunk on its own

Errors go to stderr as ``file:line:col: error: message`` and the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys

from mlir import ir
from mlir.passmanager import PassManager

from flydsl.compiler.context import make_context
from flydsl.compiler.errors import format_mlir_error
from flydsl.compiler.target import SM90A


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
        pipelines.append(args.pass_pipeline)

    failed = False
    outputs = []
    for chunk in _chunks(text) if args.split else [text]:
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


def _process(text: str, filename: str, pipelines: list[str], generic: bool) -> str | None:
    """Parses and transforms one module; prints diagnostics and returns None on failure."""
    with make_context():
        try:
            module = ir.Module.parse(text)
            for pipeline in pipelines:
                PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as error:
            print(format_mlir_error(error, filename), file=sys.stderr)
            return None
        return module.operation.get_asm(print_generic_op_form=generic)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m flydsl.compiler.opt``: parse, verify, transform and print MLIR with the Fly dialect loaded.

    python -m flydsl.compiler.opt input.mlir                                   # round trip
    python -m flydsl.compiler.opt input.mlir -p 'builtin.module(fly-lower-layouts)'
    python -m flydsl.compiler.opt input.mlir --stage fly                       # a named compile stage
    python -m flydsl.compiler.opt - < input.mlir

Errors go to stderr as ``file:line:col: error: message`` and the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys

from mlir import ir
from mlir.passmanager import PassManager

from flydsl.compiler.context import make_context
from flydsl.compiler.target import SM90A


def _location(diagnostic) -> str:
    return str(diagnostic.location).removeprefix("loc(").removesuffix(")").replace('"', "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flydsl.compiler.opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", help="an .mlir file, or - for stdin")
    parser.add_argument("-p", "--pass-pipeline", help="a textual pass pipeline, e.g. 'builtin.module(fly-lower-layouts)'")
    parser.add_argument("--stage", help="run one named stage of the sm_90a pipeline (fly, llvm)")
    parser.add_argument("--generic", action="store_true", help="print ops in generic form")
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

    with make_context():
        try:
            module = ir.Module.parse(text, filename)
            for pipeline in pipelines:
                PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as error:
            for diagnostic in error.error_diagnostics:
                print(f"{_location(diagnostic)}: error: {diagnostic.message}", file=sys.stderr)
                for note in diagnostic.notes:
                    print(f"{_location(note)}: note: {note.message}", file=sys.stderr)
            if not error.error_diagnostics:
                print(f"error: {error}", file=sys.stderr)
            return 1
        module.operation.print(print_generic_op_form=args.generic, file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

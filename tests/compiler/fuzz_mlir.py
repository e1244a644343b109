"""Mutated MLIR through ``compile_mlir`` and the opt CLI: every mutant compiles or is refused, none kills the caller.

The seeds are the repository's own MLIR: each ``// -----`` case of ``tests/native``, the examples' ``.mlir`` files
and the generated kernels' Fly-level IR (``tests/compiler/golden/*.fly.mlir``, compiled from after the 'fly' stage).
Mutations (a ``random.Random(seed)``, so a run is reproducible): a character replaced, a token deleted, a line
duplicated, deleted or swapped, an integer made huge, a line wrapped in deep nesting.

    python -m tests.compiler.fuzz_mlir [COUNT] [SEED]     # prints the totals and the crashes' distinct messages
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import flydsl.compiler as flyc

ROOT = Path(__file__).resolve().parents[2]
# The passes of the native tests' RUN lines, in one pipeline.
OPT_PIPELINE = "builtin.module(fly-lower-smem,fly-lower-tensors,fly-lower-layouts,canonicalize,cse)"
HUGE_INTEGERS = ("4294967296", "18446744073709551616", "9223372036854775807", "-9223372036854775809", "0", "-1")
PUNCTUATION = '{}()[]<>%@#!:,="?x0123456789-.\n'
# What a worker's child that died leaves in a CompilationError (isolate._crash_report).
DEATH = re.compile(r"the compiler process (was killed by \w+|exited with status \d+)")
# LLVM's last words: an assertion or a fatal error.
LAST_WORDS = re.compile(r"(Assertion `[^']*' failed|LLVM ERROR: [^\n]*|UNREACHABLE executed[^\n]*)")


@dataclass(frozen=True)
class Seed:
    name: str
    text: str
    start_after: str | None  # for compile_mlir; None: from the input stage
    compiles: bool  # holds a gpu.module, so compile_mlir can take it


def seeds() -> list[Seed]:
    found = []
    for path in sorted((ROOT / "tests" / "native").rglob("*.mlir")):
        for number, case in enumerate(path.read_text().split("// -----")):
            found.append(Seed(f"{path.name}#{number}", case, None, "gpu.module" in case))
    kernels = [Seed(path.name, path.read_text(), None, True) for path in sorted((ROOT / "examples").glob("*.mlir"))]
    for name in ("vector_add", "tiled_copy"):  # gemm_2_mma_sync's 127 KB would take most of the budget
        path = ROOT / "tests" / "compiler" / "golden" / f"{name}.fly.mlir"
        kernels.append(Seed(path.name, path.read_text(), "fly", True))
    for kernel in list(kernels):  # and each one's LLVM-level IR: what only LLVM's backend is left to compile
        stages = flyc.compile_mlir(kernel.text, start_after=kernel.start_after, keep_stages=True, assemble=False)
        kernels.append(Seed(f"{kernel.name}@llvm", stages.stages["llvm"], "llvm", True))
    return found + kernels


def mutate(text: str, rng: random.Random) -> str:
    """One to three mutations of ``text``."""
    for _ in range(rng.choice((1, 1, 2, 3))):
        text = rng.choice(_MUTATIONS)(text, rng)
    return text


def _replace_character(text, rng):
    at = rng.randrange(len(text))
    return text[:at] + rng.choice(PUNCTUATION) + text[at + 1 :]


def _delete_token(text, rng):
    tokens = list(re.finditer(r"[%@#!]?[\w.$-]+|[^\s\w]", text))
    match = rng.choice(tokens)
    return text[: match.start()] + text[match.end() :]


def _lines(text):
    return text.splitlines(keepends=True) or [text]


def _duplicate_line(text, rng):
    lines = _lines(text)
    at = rng.randrange(len(lines))
    return "".join(lines[: at + 1] + lines[at:])


def _delete_line(text, rng):
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "".join(lines)


def _swap_lines(text, rng):
    lines = _lines(text)
    a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[a], lines[b] = lines[b], lines[a]
    return "".join(lines)


def _huge_integer(text, rng):
    numbers = list(re.finditer(r"(?<![\w%#@!.])\d+(?![\w.])", text))
    if not numbers:
        return _replace_character(text, rng)
    match = rng.choice(numbers)
    return text[: match.start()] + rng.choice(HUGE_INTEGERS) + text[match.end() :]


def _deep_nesting(text, rng):
    lines = _lines(text)
    at = rng.randrange(len(lines))
    depth = rng.choice((50, 300, 5000))
    opener, closer = rng.choice((("builtin.module {\n", "}\n"), ("(", ")"), ("[", "]"), ("tuple<", ">")))
    lines.insert(at, opener * depth + closer * depth + "\n")
    return "".join(lines)


_MUTATIONS = (
    _replace_character,
    _replace_character,
    _delete_token,
    _delete_token,
    _duplicate_line,
    _delete_line,
    _swap_lines,
    _huge_integer,
    _huge_integer,
    _deep_nesting,
)


@dataclass
class Totals:
    mutants: int = 0
    compiled: int = 0
    refused: int = 0  # CompilationError / ValueError without a death
    worker_crashes: int = 0  # caught: a child died, the caller got a CompilationError
    messages: Counter = field(default_factory=Counter)  # LLVM's last words of each crash

    def crashed(self, diagnostics: str) -> None:
        self.worker_crashes += 1
        words = LAST_WORDS.findall(diagnostics)
        self.messages[words[-1] if words else DEATH.findall(diagnostics)[-1]] += 1


def through_compile_mlir(mutants: list[tuple[Seed, str]], totals: Totals) -> None:
    """Each mutant through ``compile_mlir`` in a worker's child; anything but success, ``CompilationError`` or
    ``ValueError`` propagates (and fails the test)."""
    for seed, text in mutants:
        totals.mutants += 1
        try:
            flyc.compile_mlir(text, start_after=seed.start_after, assemble=False, isolate=True)
            totals.compiled += 1
        except flyc.CompilationError as error:
            if DEATH.search(error.diagnostics):
                totals.crashed(error.diagnostics)
            else:
                totals.refused += 1
        except ValueError:
            totals.refused += 1


def through_opt(mutants: list[str], totals: Totals) -> subprocess.CompletedProcess:
    """All mutants, ``// -----`` apart, through one ``python -m flydsl.compiler.opt - --split`` (its children die,
    not it): the CLI must exit 0 or 1."""
    result = subprocess.run(
        [sys.executable, "-m", "flydsl.compiler.opt", "-", "--split", "-p", OPT_PIPELINE],
        input="\n// -----\n".join(text.replace("// -----", "//") for text in mutants),
        capture_output=True,
        text=True,
    )
    totals.mutants += len(mutants)
    answers = result.stdout.split("// -----\n")
    totals.compiled = sum(1 for answer in answers if answer)  # a case that failed printed nothing
    deaths = list(DEATH.finditer(result.stderr))  # each report holds the tail of the dead child's stderr
    ends = [death.start() for death in deaths[1:]] + [len(result.stderr)]
    for death, end in zip(deaths, ends):  # noqa: B905 (ends is one longer where there is no death)
        totals.crashed(result.stderr[death.start() : end])
    totals.refused = len(mutants) - totals.compiled - totals.worker_crashes
    return result


def run(count: int, seed: int = 37) -> tuple[Totals, Totals, subprocess.CompletedProcess]:
    """``count`` mutants through each of ``compile_mlir`` (of the seeds that hold a gpu.module) and the opt CLI."""
    rng = random.Random(seed)
    pool = seeds()
    compilable = [s for s in pool if s.compiles]
    by_compile = [(s, mutate(s.text, rng)) for s in (rng.choice(compilable) for _ in range(count))]
    by_opt = [mutate(rng.choice(pool).text, rng) for _ in range(count)]
    compile_totals, opt_totals = Totals(), Totals()
    with concurrent.futures.ThreadPoolExecutor(1) as executor:  # the CLI's process beside this one's worker
        result = executor.submit(through_opt, by_opt, opt_totals)
        through_compile_mlir(by_compile, compile_totals)
        return compile_totals, opt_totals, result.result()


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 37
    compile_totals, opt_totals, result = run(count, seed)
    for name, totals in (("compile_mlir", compile_totals), ("opt", opt_totals)):
        summary = {k: v for k, v in vars(totals).items() if k != "messages"}
        print(name, json.dumps(summary), f"(opt exit status {result.returncode})" if name == "opt" else "")
        for message, times in totals.messages.most_common():
            print(f"  {times:5d} x {message}")

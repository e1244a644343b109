"""Compiles in a worker process, so that a backend crash raises ``CompilationError`` instead of killing the caller.

LLVM reports some failures (``LLVM ERROR: Cannot select ...``) through ``report_fatal_error``, which aborts the
whole process. ``compile_mlir(..., isolate=True)`` (or ``FLYDSL_COMPILE_ISOLATED=1``) runs the compile here instead.

Design: one fresh ``python`` per compile, talking over pipes. The parent writes its ``sys.path`` and the request
(pickled) to the child's stdin; the child writes a stream of pickled messages to its stdout: ``("stage", name)``
before each stage starts, then ``("result", CompiledModule)`` or ``("error", ...)``. The child's stderr is kept
apart: it is where LLVM writes its last words, and it becomes the diagnostics of a crash. Why not
``multiprocessing``: fork is unsafe once MLIR contexts and threads exist; 'spawn'/'forkserver' re-import the
caller's ``__main__`` (scripts without a ``__main__`` guard, notebooks), and a dead pool worker surfaces as
``BrokenProcessPool`` without its stderr or exit status. A plain subprocess gives both directly, needs nothing from
the caller's program, and cannot leave a half-dead pool behind. The price is an interpreter start and the MLIR
imports per compile: measured on a 2-core CPU, ~170 ms added to a ~12 ms compile, mostly importing
``flydsl.compiler`` (its native extension and libLLVM ~60 ms, ``importlib.metadata`` ~30 ms); isolation is opt-in
for that reason.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
import sys
import traceback

from flydsl.compiler.errors import CompilationError

__all__ = ["compile_in_worker"]

# Stage of a child that died before it reached any (e.g. while importing): the backend as a whole.
BACKEND_STAGE = "backend"
# How much of a dead child's stderr becomes the diagnostics (the end holds "LLVM ERROR: ...").
STDERR_TAIL_CHARS = 4000

# Runs in the child: take the parent's import path before importing flydsl, so that the child imports the same
# flydsl as the parent however the parent found it (installed, editable, sys.path set by a test runner).
_BOOTSTRAP = (
    "import pickle, sys\n"
    "sys.path[:] = pickle.load(sys.stdin.buffer)\n"
    "from flydsl.compiler.isolate import _serve\n"
    "_serve()\n"
)


def compile_in_worker(request: dict):
    """Runs ``pipeline._compile_in_process(**request)`` in a child process and returns its ``CompiledModule``.

    Exceptions the child raises are raised here; a child that dies (signal, abort, non-zero exit) becomes a
    ``CompilationError`` whose stage is the last one the child started and whose diagnostics end with its stderr.
    """
    payload = pickle.dumps(list(sys.path)) + pickle.dumps(request)
    child = subprocess.run([sys.executable, "-c", _BOOTSTRAP], input=payload, capture_output=True, check=False)
    stderr = child.stderr.decode(errors="replace")
    stage, outcome = _read_messages(child.stdout)
    if outcome is not None:  # complete: whatever happened after it (exit status included) changes nothing
        if stderr:
            sys.stderr.write(stderr)  # warnings of a successful compile are the caller's to see
        kind, *body = outcome
        if kind == "result":
            return body[0]
        raise _rebuild_error(body)
    raise CompilationError(stage or BACKEND_STAGE, _crash_report(child.returncode, stderr))


def _read_messages(stream: bytes) -> tuple[str | None, tuple | None]:
    """The last stage started and the final message, from the child's stdout (a crash truncates it anywhere)."""
    stage, outcome = None, None
    reader = io.BytesIO(stream)
    while reader.tell() < len(stream):
        try:
            message = pickle.load(reader)
        except Exception:  # a message cut short by the crash
            break
        if message[0] == "stage":
            stage = message[1]
        else:
            outcome = message
    return stage, outcome


def _crash_report(returncode: int, stderr: str) -> str:
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    tail = stderr[-STDERR_TAIL_CHARS:].strip() or "(no output on stderr)"
    return f"the compiler process {how}; its stderr ends with:\n{tail}"


def _rebuild_error(body: list) -> BaseException:
    form, *fields = body
    if form == "compilation":
        return CompilationError(*fields)
    return pickle.loads(fields[0])


def _serve() -> None:
    """The child's side: read the request, compile, write the messages."""
    from flydsl.compiler import pipeline

    # Anything printed to stdout by a library would corrupt the message stream: give it stderr's descriptor and
    # keep the real stdout for the messages alone.
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    request = pickle.load(sys.stdin.buffer)
    stage = [BACKEND_STAGE]

    def send(message: tuple) -> None:
        pickle.dump(message, results)
        results.flush()  # before the stage runs: a crash inside it still leaves its name behind

    def on_stage(name: str) -> None:
        stage[0] = name
        send(("stage", name))

    try:
        send(("result", pipeline._compile_in_process(**request, on_stage=on_stage)))
    except CompilationError as error:
        send(("error", "compilation", error.stage, error.diagnostics))
    except Exception as error:  # every failure goes back to the caller
        send(("error", *_portable(error, stage[0])))
    results.close()
    sys.stderr.flush()
    os._exit(0)  # the answer is out: skip tearing down MLIR and the interpreter (tens of ms)


def _portable(error: Exception, stage: str) -> tuple:
    """The exception itself when it survives pickling, else a CompilationError that carries its traceback."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return ("pickled", data)
    except Exception:  # unpicklable, or not rebuilt the same
        return ("compilation", stage, "".join(traceback.format_exception(type(error), error, error.__traceback__)))

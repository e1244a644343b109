"""Compiles in a forked child, so that a backend crash raises ``CompilationError`` instead of killing the caller.

The pinned LLVM/MLIR build has assertions on, and LLVM reports some failures (``LLVM ERROR: Cannot select ...``)
through ``report_fatal_error``: both abort the whole process, as does a stack overflow on absurd input. Whatever
can still abort after the checks of ``pipeline``/``opt`` runs in a child process, where an abort is a death the
parent sees (signal or exit status, plus the tail of the child's stderr) and turns into a ``CompilationError``.

Design: a "zygote". The first isolated compile starts one worker (``python -c``, told the caller's ``sys.path``)
that imports ``flydsl.compiler``, registers the passes, compiles a small kernel once (LLVM's NVPTX backend and the
dialects initialise lazily: ~12 ms the first time), keeps that MLIR context and waits for requests, single-threaded
(``os.fork`` in a single-threaded process is safe). Each request is answered by a child forked before the request
came (``ForkedChild``: the fork is off the caller's path), which takes the caller's environment and working
directory, compiles in its copy of the worker's context (~5 ms less than a new one), writes a stream of pickled
messages to a pipe -- ``("stage", name)`` before each stage, then ``("result", value)`` or ``("error", ...)`` --
and exits. The child's stderr goes to a temporary file: it holds LLVM's last words when the child dies. The worker
sends the messages, the child's exit status and its stderr back to the caller, and forks the next child. Measured
on the 2-core development machine under load: ~5 ms added to a compile, against ~170 ms (660 ms under the same
load) for the fresh ``python`` per compile that this replaced (``benchmarks/isolation_bench.py``).

Why not ``multiprocessing``: 'fork' of the caller is unsafe (its threads: torch, CUDA); 'spawn'/'forkserver'
re-import the caller's ``__main__`` and a dead pool worker surfaces as ``BrokenProcessPool`` without its stderr or
exit status. The worker is the caller's child, started with ``subprocess``; it ends when the caller closes its
stdin (``stop_worker``, at exit, or when the caller dies).

``python -m flydsl.compiler.opt`` is its own zygote: the CLI process is single-threaded and forks one child for
the modules of a run, and a new one after a module that kills it (``ForkedChild`` directly).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from flydsl.compiler import settings
from flydsl.compiler.errors import CompilationError

__all__ = ["Finished", "ForkedChild", "compile_in_worker", "outcome_of", "start_worker", "stop_worker"]

# Stage of a child that died before it reached any (e.g. while importing): the backend as a whole.
BACKEND_STAGE = "backend"
# How much of a dead child's stderr becomes the diagnostics (the end holds "LLVM ERROR: ...").
STDERR_TAIL_CHARS = 4000

# Runs in the worker: take the parent's import path before importing flydsl, so that the worker imports the same
# flydsl as the parent however the parent found it (installed, editable, sys.path set by a test runner).
_BOOTSTRAP = (
    "import pickle, sys\n"
    "sys.path[:] = pickle.load(sys.stdin.buffer)\n"
    "from flydsl.compiler.isolate import _serve\n"
    "_serve()\n"
)


@dataclass(frozen=True)
class Finished:
    """What a forked child left: its pickled messages, its exit status (negative: the signal that killed it) and
    its stderr (None where it wrote to the parent's)."""

    messages: bytes
    returncode: int
    stderr: str | None


class ForkedChild:
    """A child forked from this (single-threaded) process, waiting for the arguments of ``function``.

    ``run(*args)`` sends the arguments and returns what the child left: it calls
    ``function(*args, on_stage=...)``, sends ``("stage", name)`` for each ``on_stage(name)``, then
    ``("result", value)`` or the error it raised; ``outcome_of`` turns that into the value or the exception.
    """

    def __init__(self, function: Callable, *, capture_stderr: bool = True):
        sys.stdout.flush()
        sys.stderr.flush()  # else the child's copy of the buffers is written twice
        request_read, self._request = os.pipe()
        self._results, results_write = os.pipe()
        self._stderr = tempfile.TemporaryFile() if capture_stderr else None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            try:
                os.close(self._request)
                os.close(self._results)
                if self._stderr is not None:
                    os.dup2(self._stderr.fileno(), 2)
                os.dup2(2, 1)  # what a library prints goes to stderr; the pipe carries the messages alone
                with os.fdopen(request_read, "rb") as request:
                    args = pickle.load(request)
                _answer(os.fdopen(results_write, "wb"), function, args)
            finally:
                os._exit(0)  # skip tearing down MLIR and the interpreter (tens of ms), and the parent's atexit
        os.close(request_read)
        os.close(results_write)

    def run(self, *args) -> Finished:
        try:
            with os.fdopen(self._request, "wb") as request:
                pickle.dump(args, request)
        except BrokenPipeError:  # the child died before reading: its status says how
            pass
        with os.fdopen(self._results, "rb") as messages:
            data = messages.read()
        _, status = os.waitpid(self.pid, 0)
        text = None
        if self._stderr is not None:
            self._stderr.seek(0)
            text = self._stderr.read().decode(errors="replace")
            self._stderr.close()
        return Finished(data, os.waitstatus_to_exitcode(status), text)


def _answer(results, function: Callable, args: tuple) -> None:
    stage = [BACKEND_STAGE]

    def send(message: tuple) -> None:
        pickle.dump(message, results)
        results.flush()  # before the stage runs: a crash inside it still leaves its name behind

    def on_stage(name: str) -> None:
        stage[0] = name
        send(("stage", name))

    try:
        send(("result", function(*args, on_stage=on_stage)))
    except CompilationError as error:
        send(("error", "compilation", error.stage, error.diagnostics))
    except Exception as error:  # every failure goes back to the caller
        send(("error", *_portable(error, stage[0])))
    results.close()
    sys.stderr.flush()


def outcome_of(finished: Finished):
    """The value the child returned; the exception it raised is raised here, and a child that died (signal, abort,
    non-zero exit) before answering becomes a ``CompilationError`` for the last stage it started."""
    stage, outcome = _read_messages(finished.messages)
    if outcome is None:
        raise CompilationError(stage or BACKEND_STAGE, _crash_report(finished.returncode, finished.stderr))
    if finished.stderr:
        sys.stderr.write(finished.stderr)  # warnings of a successful compile are the caller's to see
    kind, *body = outcome
    if kind == "result":
        return body[0]
    raise _rebuild_error(body)


def compile_in_worker(request: dict):
    """Runs ``pipeline._compile_in_process(**request)`` in a child of the worker and returns its
    ``CompiledModule``; errors are raised as ``outcome_of`` says. The child sees this process's environment and
    working directory as they are now. A compile that takes longer than ``FLYDSL_COMPILE_TIMEOUT`` seconds (a
    backend that loops) has the worker and its child killed and raises ``CompilationError``; the next compile starts
    a new worker."""
    timeout = settings.current().compile_timeout or None
    with _worker_lock:
        finished = _current_worker().call((request, dict(os.environ), os.getcwd()), timeout)
    if finished is None:
        raise CompilationError(
            BACKEND_STAGE,
            f"the compile did not finish within {timeout:g} s (FLYDSL_COMPILE_TIMEOUT): its worker was killed; "
            "FLYDSL_DUMP_IR=1 shows the stages it went through",
        )
    return outcome_of(finished)


def start_worker() -> None:
    """Starts the worker now where none runs, without waiting for it: a caller about to trace a kernel calls this
    first, so that the worker's start-up (a Python process importing MLIR and compiling once: ~250 ms of a first
    compile on the 2-core development machine) runs while the kernel is traced."""
    with _worker_lock:
        _current_worker()


def stop_worker() -> None:
    """Ends the worker process, if one runs (the next isolated compile starts another, with the ``sys.path`` of
    then)."""
    global _worker
    with _worker_lock:
        if _worker is not None:
            _worker.stop()
            _worker = None


class _Worker:
    """The zygote, from the caller's side."""

    def __init__(self):
        self.owner = os.getpid()
        self.path = list(sys.path)
        self.stderr = tempfile.TemporaryFile()  # the worker's own (its children's go elsewhere)
        self.process = subprocess.Popen(  # its own process group: a timeout kills it and the child it forked
            [sys.executable, "-c", _BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            start_new_session=True,
        )
        self._send(self.path)

    def _send(self, value) -> None:
        pickle.dump(value, self.process.stdin)
        self.process.stdin.flush()

    def call(self, request, timeout: float | None = None) -> Finished | None:
        """The worker's answer to ``request``, or None where none came within ``timeout`` seconds (the worker and
        its child are killed then)."""
        try:
            self._send(request)
            if timeout is not None and not select.select([self.process.stdout], [], [], timeout)[0]:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.stop()
                return None
            return pickle.load(self.process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):  # the worker itself died
            text = self.stop()
            return Finished(b"", self.process.returncode, text)
        except BaseException:  # KeyboardInterrupt while waiting: its answer would answer the next request
            self.stop()
            raise

    def stop(self) -> str:
        """Ends the worker; returns what it wrote to its stderr."""
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:  # a broken pipe to a dead worker
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.stderr.closed:
            return ""
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        self.stderr.close()
        return text


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _current_worker() -> _Worker:
    """The running worker; a new one where none runs, where it died, where this process is a fork of the one that
    started it (the pipes are shared then), or where ``sys.path`` changed since."""
    global _worker
    if _worker is not None and _worker.owner != os.getpid():
        _worker = None  # the parent's: leave it to the parent
    if _worker is not None and (_worker.process.poll() is not None or _worker.path != sys.path):
        _worker.stop()
        _worker = None
    if _worker is None:
        _worker = _Worker()
    return _worker


@atexit.register
def _stop_at_exit() -> None:
    if _worker is not None and _worker.owner == os.getpid():
        _worker.stop()


def _serve() -> None:
    """The worker's side: warm up, then answer each request with a child forked before the request came (the
    spare), forking the next spare once the answer is out."""
    from flydsl.compiler import pipeline

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C interrupts the caller, which stops the worker
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # as in a child: stdout carries the answers alone
    os.environ.pop("FLYDSL_DUMP_IR", None)  # the warm-up compile dumps nothing (children take the caller's)
    global _context
    _context = pipeline.warm_up()
    gc.freeze()  # the collector of a child leaves what the worker holds alone: fewer pages copied on write
    while True:
        spare = ForkedChild(_compile_request)
        try:
            request = pickle.load(requests)
        except EOFError:
            os._exit(0)  # the spare sees its request pipe close and exits too
        pickle.dump(spare.run(*request), answers)
        answers.flush()


# The worker's MLIR context, its dialects loaded, that each child compiles in (its own copy: a fork's).
_context = None


def _compile_request(request: dict, environment: dict, cwd: str, on_stage: Callable[[str], None]):
    from flydsl.compiler import pipeline

    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    return pipeline._compile_in_process(**request, on_stage=on_stage, context=_context)


def _read_messages(stream: bytes) -> tuple[str | None, tuple | None]:
    """The last stage started and the final message, from the child's messages (a crash truncates them anywhere)."""
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


def _crash_report(returncode: int, stderr: str | None) -> str:
    if returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    if stderr is None:
        return f"the compiler process {how} (its last words are on stderr above)"
    tail = stderr[-STDERR_TAIL_CHARS:].strip() or "(no output on stderr)"
    return f"the compiler process {how}; its stderr ends with:\n{tail}"


def _rebuild_error(body: list) -> BaseException:
    form, *fields = body
    if form == "compilation":
        return CompilationError(*fields)
    return pickle.loads(fields[0])


def _portable(error: Exception, stage: str) -> tuple:
    """The exception itself when it survives pickling, else a CompilationError that carries its traceback."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return ("pickled", data)
    except Exception:  # unpicklable, or not rebuilt the same
        return ("compilation", stage, "".join(traceback.format_exception(type(error), error, error.__traceback__)))

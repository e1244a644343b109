"""Autotuning: time an op's candidate configurations once per key, keep the winner in memory and in the disk cache.

    import flydsl.compiler as flyc
    if flyc.autotune.enabled(tune):                         # the argument, else FLYDSL_AUTOTUNE=1; default off
        cfg = flyc.autotune.choose("gemm", ("4096x4096x4096", "bf16", device), configs, run, timer=median_ms)

:func:`choose` returns the winner of ``candidates`` for ``(name, key)``: from memory, else from the disk cache, else
by timing ``run(candidate)`` for each one (``timer(lambda: run(candidate))``: milliseconds; a candidate that raises is
left out, its error kept). The winner is kept in memory and on disk as a record entry of the kernel cache
(:func:`flydsl.compiler.cache.store_record`: the same entry format, checks and ``FLYDSL_CACHE_DIR``), whose key text
(:func:`key_text`, built by :func:`flydsl.compiler.cache.key_text` as the JIT cache's) holds the compiler and ptxas
fingerprints, the op's name, the caller's key and every candidate's ``repr``: a new compiler, another candidate list
or a changed candidate is tuned again. The record keeps the winner's index and ``repr`` and the whole timings table
(:func:`record`). ``FLYDSL_RUNTIME_ENABLE_CACHE=0`` keeps winners in memory only.

The key is the caller's: what the winner depends on (shapes or shape buckets, dtypes, layouts) and the device's
identity (its name and SM count), which this module cannot know. :func:`bucket` rounds an extent up to a power of two
for callers that tune once per bucket (their candidates must then come from the bucket, not the exact shape, so that
every shape of the bucket has the same key). A tuning that takes more than :data:`PROGRESS_SECONDS` (the first call's
cost: each candidate compiled and timed) prints one line to stderr naming the op, the key and the winner.

Nothing here imports torch until it has to time without a timer given (:func:`cuda_timer`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from flydsl.compiler import cache, settings, toolchain

__all__ = [
    "PROGRESS_SECONDS",
    "AutotuneError",
    "bucket",
    "choose",
    "clear",
    "cuda_timer",
    "enabled",
    "key_text",
    "record",
]

PROGRESS_SECONDS = 1.0  # a tuning longer than this prints its progress line
_RECORD_VERSION = 1  # the layout of the record below (its key text changes with the compiler anyway)
_winners: dict[str, int] = {}  # key text -> the winner's index in the candidates
_clock = time.perf_counter  # (tests replace it)


class AutotuneError(RuntimeError):
    """No candidate of an op could be timed (each one's error in the message), or nothing to time with."""


def enabled(argument: bool | None = None) -> bool:
    """Whether to autotune: ``argument`` when given, else ``FLYDSL_AUTOTUNE`` (``1`` turns it on; default off)."""
    return settings.current().autotune if argument is None else bool(argument)


def bucket(extent: int) -> int:
    """``extent`` rounded up to a power of two (0 stays 0): 1, 2, 4, 8, ... 4096, 8192 (``bucket(3000) == 4096``)."""
    if extent < 0:
        raise ValueError(f"bucket: expected an extent >= 0, got {extent}")
    return 0 if extent == 0 else 1 << (extent - 1).bit_length()


def key_text(name: str, key, candidates: Sequence) -> str:
    """The full key text of the winner of ``candidates`` for ``(name, key)`` (its cache entry:
    ``cache.entry_path(key_text(...))``)."""
    return cache.key_text(
        "autotune",
        cache.compiler_fingerprint(),
        toolchain.fingerprint(),
        name,
        key,
        tuple(repr(candidate) for candidate in candidates),
    )


def record(name: str, key, candidates: Sequence) -> dict | None:
    """What the disk cache holds for ``(name, key)`` and these candidates (None: nothing, or the cache disabled):
    ``{"op", "key", "winner", "candidate", "ms", "seconds", "timings": [{"candidate", "ms", "error"}, ...]}``."""
    return cache.load_record(key_text(name, key, candidates))


def clear() -> None:
    """Forgets the winners kept in memory (the disk keeps its own: remove ``FLYDSL_CACHE_DIR`` to forget those)."""
    _winners.clear()


def choose(
    name: str,
    key,
    candidates: Sequence,
    run: Callable[[object], None],
    *,
    timer: Callable[[Callable[[], None]], float] | None = None,
    label: str | None = None,
):
    """The fastest of ``candidates`` for op ``name`` and ``key`` (a str, or a tuple of plain values whose ``repr``
    is stable across processes: numbers, strings, tuples): kept in memory, else on disk, else timed, each one as
    ``timer(lambda: run(candidate))`` (its median time in ms; default :func:`cuda_timer`), and kept. A candidate
    that raises is left out; :class:`AutotuneError` when none can be timed, naming the op, the key and each error.
    ``label``: how the progress line names the key (default: its parts, spaced)."""
    if not candidates:
        raise AutotuneError(f"flyc.autotune {name}: no candidates to choose from")
    text = key_text(name, key, candidates)
    index = _winners.get(text)
    if index is not None:
        return candidates[index]
    kept = cache.load_record(text)
    if kept is not None:
        index = _stored_winner(kept, candidates)
        if index is None:
            path = cache.entry_path(text)
            cache._warn_once(path, f"ignoring the autotuning record {path} ({name}: no winner of these); tuning again")
    if index is None:
        index, kept = _tune(name, key, candidates, run, timer, label)
        cache.store_record(text, kept)
    _winners[text] = index
    return candidates[index]


def _stored_winner(kept: dict, candidates: Sequence) -> int | None:
    """The winner's index a record names, where it is one of ``candidates`` as recorded (else None)."""
    index = kept.get("winner")
    if kept.get("version") != _RECORD_VERSION or type(index) is not int or not 0 <= index < len(candidates):
        return None
    return index if kept.get("candidate") == repr(candidates[index]) else None


def _describe(key) -> str:
    return " ".join(str(part) for part in key) if isinstance(key, tuple) else str(key)


def _tune(name: str, key, candidates: Sequence, run, timer, label) -> tuple[int, dict]:
    """(the winner's index, its record) from timing every candidate."""
    timer = timer or cuda_timer
    start = _clock()
    timings = []
    for candidate in candidates:
        try:
            ms = float(timer(lambda candidate=candidate: run(candidate)))
            timings.append({"candidate": repr(candidate), "ms": ms, "error": None})
        except AutotuneError:  # nothing to time with: not the candidate's fault
            raise
        except Exception as error:  # noqa: BLE001 (a candidate that does not compile or launch is left out)
            timings.append({"candidate": repr(candidate), "ms": None, "error": f"{type(error).__name__}: {error}"})
    seconds = _clock() - start
    label = _describe(key) if label is None else label
    timed = [i for i, row in enumerate(timings) if row["ms"] is not None]
    if not timed:
        errors = "\n".join(f"  #{i} {row['candidate']}: {row['error']}" for i, row in enumerate(timings))
        raise AutotuneError(f"flyc.autotune {name} {label}: every candidate failed:\n{errors}")
    index = min(timed, key=lambda i: timings[i]["ms"])
    best = timings[index]
    if seconds > PROGRESS_SECONDS:
        failed = len(timings) - len(timed)
        print(
            f"flydsl autotune {name} {label}: {len(candidates)} configs"
            + (f" ({failed} failed)" if failed else "")
            + f", {seconds:.1f} s, best #{index} {best['candidate']} {best['ms']:.3f} ms",
            file=sys.stderr,
            flush=True,
        )
    kept = {
        "version": _RECORD_VERSION,
        "op": name,
        "key": label,
        "winner": index,
        "candidate": best["candidate"],
        "ms": best["ms"],
        "seconds": seconds,
        "timings": timings,
    }
    return index, kept


def cuda_timer(fn: Callable[[], None], reps: int = 10, warmup: int = 2, flush_bytes: int = 256 << 20) -> float:
    """The median of ``reps`` CUDA-event timings of ``fn()`` in ms, after ``warmup`` calls (the first compiles),
    through torch (imported here), each after ``flush_bytes`` of zeros written on the stream (0: none), as the
    zoo's benchmarks time (triton's ``do_bench``): a candidate is chosen for the L2 a call finds in a model, not for
    operands left in L2 by its own previous call (a GEMM's weights of a few MB fit in the 50 MB L2 and favour other
    tiles). :class:`AutotuneError` without torch or a CUDA device."""
    import statistics  # here: it imports fractions and decimal (~3 ms of a process start)

    try:
        import torch
    except ImportError as error:
        raise AutotuneError("flyc.autotune: timing without a timer given needs torch with CUDA") from error
    if not torch.cuda.is_available():
        raise AutotuneError("flyc.autotune: timing without a timer given needs a CUDA device (torch sees none)")
    for _ in range(warmup):
        fn()
    flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda") if flush_bytes else None
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()  # (before the start event, on the same stream: not timed)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)

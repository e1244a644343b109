"""Host time per call while a sleep kernel keeps the GPU busy (the host never waits for the device): the method of
benchmarks/host_overhead.py's parts, which import it. Not a script."""

from __future__ import annotations

import statistics
import time

import torch
from record import error_text

CLOCK_HZ = 1.98e9  # H200 boost clock: sleep cycles per second


def host_us_interleaved(fns: dict, calls: int, repeats: int, loaded_count=lambda: 0) -> dict:
    """Each of ``fns``' host time per call: ``calls`` back-to-back calls behind a sleep kernel (4x an idle batch),
    median of ``repeats``, their batches interleaved: each repeat times every function in turn, so that the host's
    drift between repeats falls on all of them alike (:func:`paired_ratio` compares them). ``gpu_busy_after``: the
    stream was still busy at the end of every batch; ``compiles``: ``loaded_count()``'s growth over the timed
    batches. A function that raises gets ``{"error": ...}``; the others go on."""
    rows, cycles = {}, {}
    for name, fn in fns.items():
        try:
            fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            estimate = time.perf_counter() - start  # a batch with the GPU idle: sizes the sleep below
            cycles[name] = int(min(max(4 * estimate * CLOCK_HZ, 2e7), 4e9))
        except Exception as error:  # noqa: BLE001 - a failing path is reported, the others still run
            rows[name] = _failed(error)
    samples, busy, before = {name: [] for name in cycles}, dict.fromkeys(cycles, True), loaded_count()
    stream = torch.cuda.current_stream()
    for _ in range(repeats):
        for name in [name for name in cycles if name not in rows]:
            fn = fns[name]
            try:
                torch.cuda._sleep(cycles[name])  # keep the GPU busy: launches queue, the host never waits
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append((time.perf_counter() - start) / calls * 1e6)
                busy[name] = busy[name] and not stream.query()
                torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001
                rows[name] = _failed(error)
    compiles = loaded_count() - before
    for name in cycles:
        if name not in rows:
            rows[name] = {
                "host_us": round(statistics.median(samples[name]), 2),
                "samples_us": [round(sample, 2) for sample in samples[name]],
                "calls": calls,
                "gpu_busy_after": busy[name],
                "compiles": compiles,
            }
    return {name: rows[name] for name in fns}


def host_us_rounds(fns: dict, calls: int, repeats: int, loaded_count=lambda: 0) -> dict:
    """As :func:`host_us_interleaved`, but interleaved call by call: each of ``repeats`` blocks runs ``calls`` rounds
    that call every function once, each call timed alone, and a block's sample is the median of its calls' times. For
    calls that hand work to another thread (``torch.autograd.grad`` wakes autograd's device thread), whose batch
    times swing by tens of percent with the wake-ups: a wake-up's delay falls on one call, which the median drops,
    and the host's drift falls on every function alike within a round."""
    rows, names = {}, []
    for name, fn in fns.items():
        try:
            fn()
            names.append(name)
        except Exception as error:  # noqa: BLE001 - a failing path is reported, the others still run
            rows[name] = _failed(error)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        for name in names:
            fns[name]()
    torch.cuda.synchronize()
    cycles = int(min(max(4 * (time.perf_counter() - start) * CLOCK_HZ, 2e7), 4e9))
    samples, busy, before = {name: [] for name in names}, dict.fromkeys(names, True), loaded_count()
    stream, clock = torch.cuda.current_stream(), time.perf_counter
    for _ in range(repeats):
        times = {name: [] for name in names if name not in rows}
        torch.cuda._sleep(cycles)
        for _ in range(calls):
            for name, kept in times.items():
                if name in rows:
                    continue
                try:
                    start = clock()
                    fns[name]()
                    kept.append(clock() - start)
                except Exception as error:  # noqa: BLE001
                    rows[name] = _failed(error)
        for name, kept in times.items():
            if name not in rows:
                samples[name].append(statistics.median(kept) * 1e6)
                busy[name] = busy[name] and not stream.query()
        torch.cuda.synchronize()
    compiles = loaded_count() - before
    for name in names:
        if name not in rows:
            rows[name] = {
                "host_us": round(statistics.median(samples[name]), 2),
                "samples_us": [round(sample, 2) for sample in samples[name]],
                "calls": calls,
                "timing": "per call, interleaved",
                "gpu_busy_after": busy[name],
                "compiles": compiles,
            }
    return {name: rows[name] for name in fns}


def paired_ratio(ours: dict | None, theirs: dict | None) -> float | None:
    """The median over repeats of ``ours``' sample over ``theirs``' of the same repeat (rows of one
    :func:`host_us_interleaved`), None where either has no samples."""
    if not ours or not theirs or not ours.get("samples_us") or not theirs.get("samples_us"):
        return None
    return round(statistics.median(a / b for a, b in zip(ours["samples_us"], theirs["samples_us"], strict=True)), 3)


def _failed(error: BaseException) -> dict:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a sticky CUDA error: the next paths report it too
        pass
    return {"error": error_text(error)}

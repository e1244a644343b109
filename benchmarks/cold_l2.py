"""Timing a call from a cold L2, with the flush leaving the L2 dirty or clean.

``triton.testing.do_bench`` empties the L2 before each timed call by zeroing a 256 MB buffer: the L2 is then full
of dirty lines, and a kernel that reads X bytes also makes the L2 write up to X bytes of that buffer back to HBM
while it runs (up to the L2's size, 50 MB on the H200). For a kernel that streams a few tens of MB, such as a
decode-time GEMM reading its weights, that write-back is as large as the kernel's own traffic. In a model the L2
before such a GEMM holds mostly clean lines (the previous layer's weights), so this module can flush both ways:

- ``"dirty"``: zero a 256 MB buffer before each call, as ``do_bench`` does;
- ``"clean"``: read a 256 MB buffer before each call (a reduction): the L2 holds none of the call's data, and
  nothing that must be written back.

    from cold_l2 import bench_cold         # benchmarks/ is the script's directory, so it is importable
    ms = bench_cold(lambda: f(x), flush="clean")   # median milliseconds per call

The loop is do_bench's (warm-up, then one flush, start event, call, end event per repeat; median of the events'
times), so ``flush="dirty"`` measures what ``do_bench`` does.

A call timed alone between two events carries a fixed GPU-side cost (~4 us on the H200 for a one-element
``zero_``: the events and the launch's dispatch after the flush), as large as a small layer's whole read. In a
model's decode step the GEMMs run back to back, each on weights the previous ones evicted: ``bench_rotating``
times that, a pass of calls each on its own inputs (together larger than the L2) between one pair of events.
"""

from __future__ import annotations

import statistics

FLUSHES = ("dirty", "clean")
_FLUSH_BYTES = 256 * 1024 * 1024
_buffers = {}


def _flusher(flush: str):
    import torch

    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}")
    if "buffer" not in _buffers:
        _buffers["buffer"] = torch.ones(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        _buffers["sum"] = torch.empty((), dtype=torch.int64, device="cuda")
    buffer, total = _buffers["buffer"], _buffers["sum"]
    if flush == "dirty":
        return buffer.zero_
    return lambda: torch.sum(buffer, dim=0, out=total)


def _per_call_ms(call, count: int) -> float:
    """Milliseconds per call of ``count`` calls in a row: an estimate that turns milliseconds asked for into counts."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        call()
    end.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) / count, 1e-3)


def _median_ms(before, call, repeats: int) -> float:
    """The median of ``repeats`` event timings of ``call()``, each queued after ``before()`` (not timed)."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for begin, finish in zip(starts, ends, strict=True):
        before()
        begin.record()
        call()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(f) for b, f in zip(starts, ends, strict=True))


def host_seconds(fn) -> float:
    """The host's time to queue one ``fn()`` (the GPU kept busy meanwhile by a long sleep kernel, so no launch waits
    for a free slot)."""
    import time

    import torch

    torch.cuda.synchronize()
    torch.cuda._sleep(10_000_000)
    began = time.perf_counter()
    fn()
    host = time.perf_counter() - began
    torch.cuda.synchronize()
    return host


def bench_cold(fn, *, flush: str = "dirty", warmup: float = 25, rep: float = 100, queued: bool = False) -> float:
    """Median milliseconds of ``fn()`` after a flush of the given kind; ``warmup``/``rep`` in milliseconds, as for
    ``do_bench``. ``queued``: each flush waits behind a sleep kernel longer than the host takes to queue ``fn()``
    (at least ~100 us; 1.5 x the host's time, measured once, at up to 2 GHz), so that the host has enqueued the call
    before the GPU reaches it: the GPU's time, not the host's, for calls whose host side outlasts the flush."""
    import torch

    flush_l2 = _flusher(flush)
    fn()
    torch.cuda.synchronize()
    if queued:
        flush_only = flush_l2
        sleep_cycles = max(200_000, int(3 * host_seconds(fn) * 2e9) + 20_000)
        flush_l2 = lambda: (torch.cuda._sleep(sleep_cycles), flush_only())  # noqa: E731
    estimate = _per_call_ms(lambda: (flush_l2(), fn()), 5)  # a flushed call
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    return _median_ms(flush_l2, fn, max(1, int(rep / estimate)))


def copy_tbps(gigabytes: float = 1.0, flush: str = "dirty") -> float:
    """The HBM ceiling of the same run: a device-to-device ``copy_`` of ``gigabytes`` (bytes read plus written over
    time, TB/s)."""
    import torch

    n = int(gigabytes * 1e9 / 2) // 2
    src = torch.randn(n, device="cuda").bfloat16()
    dst = torch.empty_like(src)
    ms = bench_cold(lambda: dst.copy_(src), flush=flush, warmup=10, rep=50)
    return 2 * n * 2 / ms / 1e9


def bench_rotating(calls, *, warmup: float = 25, rep: float = 100) -> float:
    """Median milliseconds per call of back-to-back passes over ``calls`` (callables, each on its own inputs: make
    them together larger than the L2 so that each call reads what the others evicted; no flush in between), one
    pair of events around each pass; ``warmup``/``rep`` in milliseconds as for :func:`bench_cold`. Each pass waits
    behind a sleep kernel longer than the host takes to queue it, so the GPU runs it without waiting for launches
    (as a queued decode step does)."""
    import torch

    def one_pass():
        for call in calls:
            call()

    one_pass()
    host_s = host_seconds(one_pass)
    estimate = _per_call_ms(one_pass, 3)
    sleep_cycles = int(3 * host_s * 2e9) + 20_000  # >= 1.5 x the host's time at up to 2 GHz
    for _ in range(max(1, int(warmup / estimate))):
        one_pass()
    passes = max(3, int(rep / estimate))
    return _median_ms(lambda: torch.cuda._sleep(sleep_cycles), one_pass, passes) / len(calls)

"""GEMM autotuning (``flyc.autotune``): the configurations worth timing for a problem, and the tuned plan of a call.

Off by default: the cost models choose (:func:`~flydsl.kernels.gemm.config.choose_config`,
:func:`~flydsl.kernels.gemm.skinny.choose_skinny_config`); ``FLYDSL_AUTOTUNE=1`` (or the caller's argument to
``flyc.autotune.enabled``) has the launcher time a handful of candidates once per key and keep the winner on disk.

* :func:`dense_candidates` / :func:`skinny_candidates`: the cost model's choice first, then at most
  :data:`MAX_CANDIDATES` - 1 alternatives valid for the shape (each passes its config's own checks).
* :func:`tuned_plan`: the plan of a call with the winning configuration of its route (the skinny kernel's or the
  warp-specialized one's, as the cost model routes it). Its key: the route, M rounded up to a power of two
  (``flyc.autotune.bucket``: one tuning serves every M of the bucket, its candidates made for the bucket's M), N, K,
  each operand's dtype, major and alignment, the epilogue, the device (name, SM count) and a hash of this package's
  sources (a changed kernel is tuned again).
* :func:`tuned`: ``flyc.autotune.choose`` with this package's timer (:func:`flydsl.kernels.bench.median_ms`,
  :data:`REPS` timed runs after :data:`WARMUP`, the first of which compiles), L2 flushed before each timed run: a
  layer's weights are not in L2 when it runs in a model step, and timed warm the candidates rank differently (on
  bf16 64 x 4096 x 4096 a warm-L2 winner ran 0.83x cuBLAS against the cost model's 0.93x, flushed).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import flydsl.compiler as flyc
from flydsl.kernels.gemm.config import (
    GemmConfig,
    candidate_configs,
    choose_config,
    choose_fp8_config,
    estimated_seconds,
    fp8_config,
)
from flydsl.kernels.gemm.operands import OPERAND_BYTES, MatrixSpec
from flydsl.kernels.gemm.plan import GemmPlan, plan_dense, plan_gemm, plan_skinny
from flydsl.kernels.gemm.skinny import SkinnyConfig, choose_skinny_config

__all__ = ["MAX_CANDIDATES", "REPS", "WARMUP", "dense_candidates", "skinny_candidates", "tuned", "tuned_plan"]

MAX_CANDIDATES = 8  # configurations timed per key (each one compiled: ~1 s apiece the first time)
REPS = 10
WARMUP = 2


def _family(cfg: GemmConfig) -> tuple:
    """What makes two configurations different kernels rather than two pipeline depths of one."""
    shape = (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n)
    return shape + (cfg.split_k, cfg.split_tail, cfg.schedule, cfg.stream_k)


def dense_candidates(m: int, n: int, k: int, sms: int, operand_bytes: int = 2) -> list[GemmConfig]:
    """The warp-specialized kernel's configurations worth timing for an (m, n, k) problem of 2-byte (bf16/fp16) or
    1-byte (fp8) operands: the cost model's choice (:func:`choose_config` / :func:`choose_fp8_config`), then the best
    the model ranks of each kind it never chooses but :func:`candidate_configs` offers for the shape (stream-K,
    pingpong, 256 x 128 tiles, clusters along N, split tails: they win where timed, at shapes the model cannot tell),
    then the next best of the other tile widths, clusters and splits, :data:`MAX_CANDIDATES` in all, no two alike.
    fp8: the configurations of K / 2 in K steps of 128, as :func:`choose_fp8_config` makes them."""
    if operand_bytes not in (1, 2):
        raise ValueError(f"dense_candidates: operand_bytes must be 1 (fp8) or 2 (bf16/fp16), got {operand_bytes}")
    k_model = k if operand_bytes == 2 else -(-k // 2)  # an fp8 K is a bf16 K / 2 to the cost model
    first = (choose_config if operand_bytes == 2 else choose_fp8_config)(m, n, k, sms)
    ranked = sorted(candidate_configs(m, n, k_model, sms), key=lambda cfg: estimated_seconds(m, n, k_model, cfg, sms))
    if operand_bytes == 1:
        ranked = [fp8_config(cfg) for cfg in ranked]
    unchosen = (
        lambda cfg: cfg.stream_k,
        lambda cfg: cfg.schedule == "pingpong",
        lambda cfg: cfg.tile_m == 256 and cfg.cluster_n == 1,
        lambda cfg: cfg.cluster_n > 1,
        lambda cfg: cfg.split_tail,
    )
    picks, families = [first], {_family(first)}

    def pick(cfg: GemmConfig) -> None:
        if len(picks) < MAX_CANDIDATES and _family(cfg) not in families:
            picks.append(cfg)
            families.add(_family(cfg))

    for kind in unchosen:
        found = next((cfg for cfg in ranked if kind(cfg)), None)
        if found is not None:
            pick(found)
    for cfg in ranked:
        pick(cfg)
    return picks


def skinny_candidates(m: int, n: int, k: int, sms: int, element_bytes: int = 2) -> list[SkinnyConfig]:
    """The weight-streaming kernel's configurations worth timing for M <= 16: :func:`choose_skinny_config`'s first
    (given K in 16-bit steps, as :func:`~flydsl.kernels.gemm.plan.plan_skinny` asks it), then variants of it: other
    weight rows per warp (groups), loads per step (unroll), warps side by side along N, a register cap of 2 CTAs per
    SM, half and twice the K splits; :data:`MAX_CANDIDATES` in all, no two alike. fp8 operands (``element_bytes``
    1): no K splits (the scaled kernel does not split K), the cost model's choice included."""
    if element_bytes not in (1, 2):
        raise ValueError(f"skinny_candidates: element_bytes must be 1 (fp8) or 2 (bf16/fp16), got {element_bytes}")
    first = choose_skinny_config(m, n, k * element_bytes // 2, sms, element_bytes)
    if element_bytes == 1:
        first = dataclasses.replace(first, splits=1)
    replace = functools.partial(dataclasses.replace, first)
    variants = [
        replace(groups=4, unroll=2),
        replace(groups=1),
        replace(unroll=8),
        replace(unroll=2),
        replace(warps_n=2),
        replace(min_blocks=None if first.min_blocks else 2),
        replace(warps=4),
    ]
    if element_bytes == 2:
        variants += [replace(splits=max(1, first.splits // 2)), replace(splits=min(64, 2 * first.splits))]
    picks = [first]
    for cfg in variants:
        fits = cfg.splits == 1 or cfg.splits * cfg.k_step(element_bytes) <= k  # each split at least one step
        if fits and cfg not in picks and len(picks) < MAX_CANDIDATES:
            picks.append(cfg)
    return picks


@functools.lru_cache(maxsize=1)
def _sources() -> str:
    """A hash of this package's sources: a tuning is of these kernels."""
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _device(device: int | None) -> tuple:
    """(name, SM count) of CUDA device ``device`` (default: the current one), through torch (imported here)."""
    import torch

    return _identity(torch.cuda.current_device() if device is None else device)


@functools.lru_cache(maxsize=16)
def _identity(index: int) -> tuple:
    import torch

    from flydsl.kernels.device import sm_count

    return (torch.cuda.get_device_name(index), f"{sm_count(index)} SMs")


def _timer(fn: Callable[[], None]) -> float:
    from flydsl.kernels.bench import median_ms

    return median_ms(fn, REPS, warmup=WARMUP, flush=True)


def tuned(name: str, key: tuple, candidates, run: Callable, *, device: int | None = None, label: str | None = None):
    """``flyc.autotune.choose(name, key + (device's name, SM count, the package's sources), candidates, run)`` timed by
    :func:`flydsl.kernels.bench.median_ms` (:data:`REPS` runs after :data:`WARMUP`): the fastest candidate, timed
    once per key and device, then from memory or the disk cache. ``label``: the progress line's (default: ``key``'s
    parts)."""
    label = " ".join(str(part) for part in key) if label is None else label
    key = tuple(key) + _device(device) + (_sources(),)
    return flyc.autotune.choose(name, key, candidates, run, timer=_timer, label=label)


def _operand(spec: MatrixSpec) -> tuple:
    """An operand's dtype, major (which dimension is contiguous) and alignment: what its plan reads besides shape."""
    major = "row" if spec.strides[-1] == 1 else "column" if spec.strides[0] == 1 else "strided"
    return (spec.dtype, major, spec.aligned)


def tuned_plan(
    a: MatrixSpec,
    b: MatrixSpec,
    out: MatrixSpec,
    run: Callable[[GemmPlan], None],
    *,
    sms: int,
    bias: MatrixSpec | None = None,
    activation: str | None = None,
    scales: tuple = (),
    planner=plan_gemm,
    device: int | None = None,
) -> GemmPlan | None:
    """The plan of a GEMM call (``plan_gemm``'s arguments; ``planner``: :func:`plan_gemm` or :func:`plan_skinny`)
    with the tuned configuration of the route the cost model gives it: the skinny kernel's
    (:func:`skinny_candidates`) or the warp-specialized kernel's (:func:`dense_candidates`), those that plan for these
    operands each timed as ``run(plan)`` (the caller launches it on the call's tensors). Keyed as the module docstring
    says; the first call of a key compiles and times every candidate (a progress line on stderr when over 1 s)."""
    options = dict(sms=sms, bias=bias, activation=activation, scales=scales)
    default = planner(a, b, out, **options)
    if default is None:  # (plan_skinny declining: nothing of its own to tune)
        return default
    (m, k), n = a.shape, out.shape[1]  # (out's: b may be prepared weights' panels)
    element_bytes = OPERAND_BYTES[a.dtype]
    bucket = flyc.autotune.bucket(m)
    if default.route == "skinny":
        candidates, plan_of = skinny_candidates(bucket, n, k, sms, element_bytes), plan_skinny
    else:
        candidates, plan_of = dense_candidates(bucket, n, k, sms, element_bytes), plan_dense
    plans = {}
    for cfg in candidates:
        try:
            plan = plan_of(a, b, out, config=cfg, **options)
        except ValueError:  # not for these operands (e.g. an MN-major B's 64-column boxes)
            continue
        if plan is not None:  # (the scaled skinny kernel refuses split K)
            plans[cfg] = plan
    if len(plans) < 2:
        return default
    epilogue = (
        None if bias is None else bias.dtype,
        activation,
        tuple(str(scale) for scale, _ in scales),
        _operand(out)[0],
    )
    key = (default.route, bucket, n, k, _operand(a), _operand(b), epilogue)
    label = f"{default.route} {m}x{n}x{k} (M bucket {bucket}) {a.dtype}"
    best = tuned(f"gemm.{default.route}", key, list(plans), lambda cfg: run(plans[cfg]), device=device, label=label)
    return plans[best]

"""Every environment variable FlyDSL reads, in one place (nothing else reads ``os.environ``).

=============================  ==================================================================
``FLYDSL_PTXAS``               path of the ``ptxas`` to assemble PTX with (else ``PATH``,
                               ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``)
``CUDA_HOME`` / ``CUDA_PATH``  CUDA toolkit root, searched for ``ptxas``
``FLYDSL_DUMP_IR``             ``1``: every compile writes each stage's IR, the PTX, the cubin and its
                               SASS (``nvdisasm``, when found) to ``FLYDSL_DUMP_DIR``; any other
                               value is taken as that directory
``FLYDSL_DUMP_DIR``            where dumps go (default ``./flydsl_dump``)
``FLYDSL_CACHE_DIR``           on-disk kernel cache (default ``~/.cache/flydsl``)
``FLYDSL_RUNTIME_ENABLE_CACHE`` ``0`` bypasses the JIT cache (and keeps autotuning winners in memory only)
``FLYDSL_CACHE_MAX_SIZE``      the disk cache's bound: bytes, or with a K/M/G suffix (default ``4G``; ``0``: none);
                               the least recently used entries go past it (``flydsl.compiler.cache.prune``)
``FLYDSL_AUTOTUNE``            ``1``: ops that can autotune time their candidate configurations once per key
                               (``flyc.autotune``; default off: the cost models choose)
``FLYDSL_COMPILE_ISOLATED``    unset/``1``: compile in a forked child of a worker process, so that
                               an LLVM assertion or abort raises ``CompilationError`` instead of
                               ending the program (~3 ms a compile); ``0``: in this process
``FLYDSL_COMPILE_TIMEOUT``     seconds an isolated compile may take before its worker is killed and the compile
                               raises ``CompilationError`` (default 600; ``0``: no limit)
``FLYDSL_LAUNCH_REPLAY``       ``0``: the zoo's launch plans are never replayed natively (each call runs its
                               Python plan; ``flydsl.kernels.plans``)
``FLYDSL_PLAN_CACHE``          ``0``: replayable launch plans are not kept in the disk cache (default: they are, and
                               a new process's first call of a kept signature replays without routing or importing
                               the kernels; ``flydsl.kernels.plan_cache``)
``FLYDSL_TORCH_C_API``         ``0``: torch tensors are read through their Python attributes only, never through
                               torch's C API (``flydsl.compiler.torch_c_api``)
``FLYDSL_TORCH_NODES``         ``0``: flydsl.torch's eager calls record gradients through a Python autograd.Function
                               instead of the C++ autograd node (``flydsl.torch._nodes``: built once per torch
                               version where a C++ compiler is, ~20 s; where it cannot be, the Function, with one
                               warning); ``1``: the node, warning in every process where it is not available
``FLYDSL_MOE_DECODE``          for A/B timing: the ``fused_moe`` decode modes allowed, comma-separated ("direct",
                               "combine", "single", "quantize", "quantize_h"; "none" or empty: none); unset:
                               direct and combine (``flydsl.kernels.moe.decode.decode_modes``)
=============================  ==================================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings", "current", "parse_size"]


@dataclass(frozen=True)
class Settings:
    ptxas: str | None
    cuda_home: str | None
    dump_ir_dir: Path | None
    cache_dir: Path
    cache_enabled: bool
    cache_max_bytes: int = 4 << 30
    compile_isolated: bool = True
    compile_timeout: float = 600.0
    autotune: bool = False
    launch_replay: bool = True
    plan_cache: bool = True
    torch_c_api: bool = True
    torch_nodes: bool | None = None  # None: the node where it builds (FLYDSL_TORCH_NODES unset)
    moe_decode: frozenset | None = None


def _switch(value: str | None) -> bool | None:
    """An on/off variable: True, False, or None where it is unset (or empty)."""
    if not value:
        return None
    return value.lower() in ("1", "true", "yes", "on")


def _words(value: str | None) -> frozenset | None:
    """A comma-separated list's words ("none": no word), or None where the variable is unset."""
    if value is None:
        return None
    return frozenset(word.strip() for word in value.split(",") if word.strip() and word.strip() != "none")


def parse_size(name: str, value: str | None, default: int) -> int:
    """A size in bytes from ``value`` ("123", "500K", "4G"; None: ``default``), or a ValueError naming ``name``."""
    if value is None or not value.strip():
        return default
    text = value.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):
        size = -1
    if size < 0:
        raise ValueError(f"{name}={value!r}: expected a size in bytes, e.g. 4G, 500M or 0 (no bound)")
    return size


def _seconds(name: str, value: str | None, default: float) -> float:
    """A duration in seconds from ``value`` (None or empty: ``default``), or a ValueError naming ``name``."""
    if value is None or not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{name}={value!r}: expected a number of seconds (0: no limit)")
    return seconds


def current() -> Settings:
    """The settings as the environment gives them now (read on each call: cheap, and tests can patch)."""
    env = os.environ
    dump = env.get("FLYDSL_DUMP_IR", "")
    dump_dir = None
    if dump.lower() in ("1", "true", "yes", "on"):
        dump_dir = Path(env.get("FLYDSL_DUMP_DIR") or "flydsl_dump")
    elif dump and dump.lower() not in ("0", "false", "no", "off"):
        dump_dir = Path(dump)
    return Settings(
        ptxas=env.get("FLYDSL_PTXAS") or None,
        cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH") or None,
        dump_ir_dir=dump_dir,
        cache_dir=Path(env.get("FLYDSL_CACHE_DIR") or Path.home() / ".cache" / "flydsl"),
        cache_enabled=env.get("FLYDSL_RUNTIME_ENABLE_CACHE", "1") != "0",
        cache_max_bytes=parse_size("FLYDSL_CACHE_MAX_SIZE", env.get("FLYDSL_CACHE_MAX_SIZE"), 4 << 30),
        compile_isolated=env.get("FLYDSL_COMPILE_ISOLATED", "1") != "0",
        compile_timeout=_seconds("FLYDSL_COMPILE_TIMEOUT", env.get("FLYDSL_COMPILE_TIMEOUT"), 600.0),
        autotune=env.get("FLYDSL_AUTOTUNE", "").lower() in ("1", "true", "yes", "on"),
        launch_replay=env.get("FLYDSL_LAUNCH_REPLAY", "1").lower() not in ("0", "false", "no", "off"),
        plan_cache=env.get("FLYDSL_PLAN_CACHE", "1").lower() not in ("0", "false", "no", "off"),
        torch_c_api=env.get("FLYDSL_TORCH_C_API", "1").lower() not in ("0", "false", "no", "off"),
        torch_nodes=_switch(env.get("FLYDSL_TORCH_NODES")),
        moe_decode=_words(env.get("FLYDSL_MOE_DECODE")),
    )

"""The row ops' one router: which kernel and configuration run for an input, as one lookup.

    from flydsl.kernels.rows.router import RowOp, route
    route(RowOp.LAYER_NORM, 4096, "bf16")          # Route(op, kernel=RowKernel.REGISTER, config=RowConfig(...))

or ``python -m flydsl.kernels.route layer_norm 4096 --dtype bf16`` from a shell. The decision depends on the op, N,
the dtype, whether the row tensors (and the weight and bias) start at 16-byte boundaries, the device's SM count,
whether the caller's framework can allocate the kernels' scratch memory (torch and cupy can), and, for the norms'
backward, which column sums are kept. The tables below are the data it reads, first match wins; why each entry is
what it is, and the measurements behind it: docs/tuning/norms.md. Tuning scripts that edit a table in place call
:func:`clear_cache` after.

Three kernels serve every op (:class:`RowKernel`): the register kernel (a row in registers; any N, any strides), the
looped forward (one CTA per row walks it twice, L1/L2 serving the second read) and the staged kernel (rows through
a shared-memory ring, a row over a cluster or a team pushing partial results instead of waiting at a barrier).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

from flydsl.kernels import plans
from flydsl.kernels.rows.configs import (
    FORWARD_STAGE_BYTES,
    MAX_FORWARD_TEAM,
    STAGED_THREADS,
    BackwardConfig,
    LoopedForwardConfig,
    LoopedShape,
    StagedBackwardShape,
    StagedForwardConfig,
    StagedForwardShape,
    TeamShape,
    looped_forward_config,
    make_backward_config,
    staged_backward_config,
    staged_forward_config,
    team_backward_config,
)
from flydsl.kernels.rows.layout import PLAIN_HINTS, CacheHints, RowConfig, forward_row_config, row_config
from flydsl.kernels.validation import element_bytes

__all__ = [
    "RowOp",
    "RowKernel",
    "Route",
    "route",
    "clear_cache",
    "staged_forward_shape",
    "softmax_backward_shape",
    "backward_staged_shapes",
    "team_shape",
    "LOOPED_FORWARD",
    "STAGED_FORWARD",
    "STAGED_FORWARD_MIN_N",
    "SOFTMAX_BACKWARD_MIN_N",
    "SOFTMAX_BACKWARD",
    "FORWARD_STORE_GROUP",
    "BACKWARD_STAGED",
    "BACKWARD_TEAM",
    "BACKWARD_REGISTERS",
]


class RowOp(str, enum.Enum):
    """A row op of the zoo (its public function's name)."""

    SOFTMAX = "softmax"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    FUSED_ADD_RMS_NORM = "fused_add_rms_norm"
    SOFTMAX_BACKWARD = "softmax_backward"
    LAYER_NORM_BACKWARD = "layer_norm_backward"
    RMS_NORM_BACKWARD = "rms_norm_backward"

    @property
    def backward(self) -> bool:
        return self.value.endswith("_backward")

    @property
    def kind(self) -> str:
        """The tables' key: "softmax", "layer", "rms" or "fused"."""
        return _KINDS[self]


_KINDS = {
    RowOp.SOFTMAX: "softmax",
    RowOp.LAYER_NORM: "layer",
    RowOp.RMS_NORM: "rms",
    RowOp.FUSED_ADD_RMS_NORM: "fused",
    RowOp.SOFTMAX_BACKWARD: "softmax",
    RowOp.LAYER_NORM_BACKWARD: "layer",
    RowOp.RMS_NORM_BACKWARD: "rms",
}


class RowKernel(enum.Enum):
    """The kind of kernel a route runs."""

    REGISTER = "register"  # a row in registers (strided rows, any N)
    LOOPED = "looped"  # the forward walking one row per CTA twice
    STAGED = "staged"  # rows through a shared-memory ring


# The kernel function of each (op family, kernel), for the route's description.
_FUNCTIONS = {
    ("softmax", False, RowKernel.REGISTER): "flydsl.kernels.softmax.kernels:softmax_forward_kernel",
    ("softmax", False, RowKernel.STAGED): "flydsl.kernels.softmax.kernels:softmax_forward_staged_kernel",
    ("softmax", True, RowKernel.REGISTER): "flydsl.kernels.softmax.kernels:softmax_backward_kernel",
    ("softmax", True, RowKernel.STAGED): "flydsl.kernels.softmax.kernels:softmax_backward_staged_kernel",
    ("norm", False, RowKernel.REGISTER): "flydsl.kernels.norms.forward:norm_forward_kernel",
    ("norm", False, RowKernel.LOOPED): "flydsl.kernels.norms.forward:norm_forward_looped_kernel",
    ("norm", False, RowKernel.STAGED): "flydsl.kernels.norms.forward:norm_forward_staged_kernel",
    ("norm", True, RowKernel.REGISTER): "flydsl.kernels.norms.backward:norm_backward_kernel",
    ("norm", True, RowKernel.STAGED): "flydsl.kernels.norms.backward:norm_backward_kernel",
}


class Route(NamedTuple):
    """What runs for an input: the op, the kernel and its configuration."""

    op: RowOp
    kernel: RowKernel
    config: RowConfig | LoopedForwardConfig | StagedForwardConfig | BackwardConfig

    @property
    def function(self) -> str:
        """The kernel function (``module:name``)."""
        family = "softmax" if self.op.kind == "softmax" else "norm"
        return _FUNCTIONS[family, self.op.backward, self.kernel]


# --- the tables -----------------------------------------------------------------------------------------------------

_EVICT_LAST_FIRST = (CacheHints(rows="evict_last", vectors="evict_last"), CacheHints(rows="evict_first"))


def _looped(low: int, high: int, threads: int, chunks: int, *more) -> tuple:
    """A LOOPED_FORWARD row: N from ``low`` to ``high`` in a :class:`LoopedShape` read with torch.compile's hints
    (the first read keeps x in L1/L2 for the second, which evicts it first)."""
    return low, high, LoopedShape(threads, chunks, *_EVICT_LAST_FIRST, *more)


# The looped forward (16-byte aligned rows and weights, N a multiple of 16 bytes): per (kind, dtype), (min N, max N,
# shape) (docs/tuning/norms.md#looped-forward-ranges).
LOOPED_FORWARD: dict = {
    ("fused", "f32"): [
        _looped(769, 1024, 256, 1),
        _looped(1025, 2048, 512, 1),
        _looped(2049, 8192, 1024, 1),
        _looped(8193, 16384, 1024, 4),
        _looped(16385, 32768, 1024, 8),
    ],
    ("fused", "bf16"): [_looped(2049, 4096, 512, 1), _looped(4097, 16384, 512, 2), _looped(16385, 32768, 1024, 2)],
    ("rms", "f32"): [
        _looped(1025, 2048, 256, 2),
        _looped(2049, 4096, 512, 2),
        _looped(7169, 8192, 512, 4, 0, 0, True),  # N compiled in
        _looped(8193, 16384, 1024, 2),
        _looped(16385, 32768, 1024, 8),
    ],
    ("rms", "bf16"): [_looped(2049, 4096, 256, 2), _looped(4097, 8192, 512, 2), _looped(16385, 32768, 512, 8)],
    ("layer", "f32"): [
        _looped(1793, 3072, 128, 4),
        _looped(3073, 6144, 256, 2),
        _looped(8192, 8192, 512, 4, 3, 0, True),  # 3 CTAs per SM, N compiled in
    ],
}
LOOPED_FORWARD.update({(kind, "f16"): LOOPED_FORWARD[kind, "bf16"] for kind in ("fused", "rms")})  # (as bf16)

# The register norm forwards' RowConfig.store_group per dtype (docs/tuning/norms.md#store-groups).
FORWARD_STORE_GROUP = {"f32": 1, "f16": 2, "bf16": 2}

# The staged forward from these N on (16-byte aligned rows, N a multiple of 16 bytes): per (kind, dtype).
STAGED_FORWARD_MIN_N = {
    (kind, dtype): 32768 for kind in ("layer", "rms", "fused", "softmax") for dtype in ("bf16", "f16")
}
STAGED_FORWARD_MIN_N.update({("layer", "f32"): 32768, ("rms", "f32"): 32768, ("fused", "f32"): 65536})
STAGED_FORWARD_MIN_N[("softmax", "f32")] = 65536

# A claim_rows value: claimed where each CTA of its cluster holds N / cluster elements (equal_shares)
WHERE_SHARES_EQUAL = "where shares are equal"


def _staged(most: int, threads: int, chunks: int, lag: int, stages: int, **more) -> tuple:
    """A STAGED_FORWARD row: rows of up to ``most`` 64 KB ring rows (CTAs of the default shape) in this shape."""
    return most, StagedForwardShape(threads, chunks, lag, stages, **more)


_HALF = STAGED_THREADS // 2
# The staged forward's shapes: per (kind, dtype class), rows of (most CTAs of 64 KB per row, shape); a row needing
# more than the last entry's keeps the register kernel (docs/tuning/norms.md#staged-forward-shapes).
STAGED_FORWARD: dict = {
    ("layer", "16-bit"): [
        _staged(1, _HALF, 8, 0, 1, blocks_per_sm=2, claim_rows=True),
        _staged(2, STAGED_THREADS, 4, 0, 2, keep_weights=True, claim_rows=True),
        _staged(4, _HALF, 4, 0, 2, keep_weights=True, blocks_per_sm=2, claim_rows=WHERE_SHARES_EQUAL),
        _staged(8, STAGED_THREADS, 4, 0, 2, keep_weights=True, claim_rows=WHERE_SHARES_EQUAL),
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 4, 1, 3, team=True),
    ],
    ("layer", "f32"): [
        _staged(1, _HALF, 8, 0, 1, blocks_per_sm=2, claim_rows=True),
        _staged(2, STAGED_THREADS, 4, 0, 2, hold=2, claim_rows=True),
        _staged(4, STAGED_THREADS, 4, 0, 2, keep_weights=True, claim_rows=True),
        _staged(8, STAGED_THREADS, 4, 0, 2, keep_weights=True, claim_rows=WHERE_SHARES_EQUAL),
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 4, 1, 3, keep_weights=True, team=True),
    ],
    ("rms", "any"): [
        _staged(4, STAGED_THREADS, 4, 0, 3, hold=4, claim_rows=True),
        _staged(8, STAGED_THREADS, 4, 0, 3, keep_weights=True, claim_rows=True),
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 4, 1, 3, keep_weights=True, team=True),
    ],
    ("fused", "any"): [
        _staged(1, STAGED_THREADS, 2, 0, 3, claim_rows=True),
        _staged(8, STAGED_THREADS, 2, 1, 3),
        _staged(16, STAGED_THREADS, 4, 0, 1),  # 1 MB rows: 8 CTAs of 128 KB, a single-row ring
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 2, 1, 3, team=True),
    ],
    ("softmax", "16-bit"): [
        _staged(1, _HALF, 8, 0, 1, blocks_per_sm=2, claim_rows=True),
        _staged(2, STAGED_THREADS, 8, 0, 1, claim_rows=True),  # one CTA per row, a single-row ring of 128 KB
        _staged(4, STAGED_THREADS, 4, 0, 3, hold=4, claim_rows=True),
        _staged(8, STAGED_THREADS, 4, 0, 3, hold=4),  # not claimed: the claim loop spills there
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 4, 1, 3, team=True),
    ],
    ("softmax", "f32"): [  # from 65536 (4 ring rows) on
        _staged(4, _HALF, 8, 0, 3, hold=8, claim_rows=True),
        _staged(8, STAGED_THREADS, 4, 0, 3, hold=4, claim_rows=True),
        _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 4, 1, 3, team=True),
    ],
}

# Softmax's backward on the staged kernel from these N on (docs/tuning/norms.md#softmax-backward).
SOFTMAX_BACKWARD_MIN_N = {"bf16": 8192, "f16": 8192, "f32": 131072}
# Its shapes, as STAGED_FORWARD's (two sources in the ring: dy and y); (exactly, shape) rows match one CTA count.
SOFTMAX_BACKWARD = [
    (1, StagedForwardShape(STAGED_THREADS, 2, 0, 2, 0)),
    (4, StagedForwardShape(STAGED_THREADS, 1, 0, 4, 0)),
]
SOFTMAX_BACKWARD_RANGES = [
    _staged(8, STAGED_THREADS, 2, 1, 3),
    _staged(MAX_FORWARD_TEAM, STAGED_THREADS, 2, 1, 3, team=True),
]

# The staged backward's shapes, in order of preference: per (dtype class, column sums), rows of (most CTAs per row,
# shape) (docs/tuning/norms.md#staged-backward-shapes).
BACKWARD_STAGED: dict = {
    ("f32", 2): [
        (2, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
        (8, StagedBackwardShape(_HALF, 2, 1, 6, keep_weights=True)),
        (8, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
    ],
    ("f32", 1): [
        (2, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
        (8, StagedBackwardShape(STAGED_THREADS, 1, 1, None, keep_weights=True)),
        (8, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
    ],
    ("16-bit", 2): [
        (1, StagedBackwardShape(STAGED_THREADS, 2, 1, None, fma_dx=True)),
        (8, StagedBackwardShape(_HALF, 2, 1, 6, keep_weights=True, fma_dx=True)),
        (8, StagedBackwardShape(_HALF, 4, 1, None, keep_weights=True)),
    ],
    ("16-bit", 1): [
        (1, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
        (8, StagedBackwardShape(STAGED_THREADS, 1, 1, None, keep_weights=True)),
        (8, StagedBackwardShape(STAGED_THREADS, 2, 1, None, keep_weights=True)),
    ],
}
BACKWARD_STAGED[("f32", 0)] = BACKWARD_STAGED[("f32", 1)]
BACKWARD_STAGED[("16-bit", 0)] = BACKWARD_STAGED[("16-bit", 1)]

# Rows past a cluster: a team of this shape per (dtype class, column sums) (docs/tuning/norms.md#backward-teams).
BACKWARD_TEAM: dict = {
    ("f32", sums): TeamShape(STAGED_THREADS, 2, 3, 1, prefetch_pairs=False, fma_dx=False, bulk=False)
    for sums in range(3)
}
BACKWARD_TEAM.update(
    {("16-bit", sums): TeamShape(_HALF, 2, 6, 2, prefetch_pairs=True, fma_dx=sums == 2, bulk=True) for sums in range(3)}
)

# The register backward's (chunks, registers per thread) of its dense (256-thread CTAs) and lean (up to 1024)
# layouts per dtype class (docs/tuning/norms.md#register-backward).
BACKWARD_REGISTERS = {"f32": ((2, 64), (2, 64)), "16-bit": ((2, 80), (1, 64))}


def _dtype_class(dtype: str) -> str:
    return "f32" if dtype == "f32" else "16-bit"


# --- the lookups ----------------------------------------------------------------------------------------------------


def looped_shape(kind: str, n: int, dtype: str) -> LoopedShape | None:
    """The :data:`LOOPED_FORWARD` shape for ``kind`` rows of ``n`` ``dtype`` elements, or None (N not a multiple of
    16 bytes, or outside every range)."""
    if n % (16 // element_bytes(dtype)):
        return None
    for low, high, shape in LOOPED_FORWARD.get((kind, dtype), ()):
        if low <= n <= high:
            return shape
    return None


def staged_forward_shape(kind: str, n: int, dtype: str) -> StagedForwardShape | None:
    """The :data:`STAGED_FORWARD` shape of the staged forward for ``kind`` rows of ``n`` ``dtype`` elements, or None
    where the register kernel stays."""
    if n < STAGED_FORWARD_MIN_N[kind, dtype]:
        return None
    sources = 2 if kind == "fused" else 1
    ctas = -(-sources * n * element_bytes(dtype) // FORWARD_STAGE_BYTES)  # ring rows of 64 KB
    table = STAGED_FORWARD.get((kind, _dtype_class(dtype))) or STAGED_FORWARD[kind, "any"]
    for most, shape in table:
        if ctas <= most:
            if shape.claim_rows == WHERE_SHARES_EQUAL:  # the shares of the cluster this shape gives N
                strided = staged_forward_config(n, dtype, shape._replace(claim_rows=False), residual=kind == "fused")
                shape = shape._replace(claim_rows=strided is not None and strided.equal_shares)
            return shape
    return None


def softmax_backward_shape(n: int, dtype: str) -> StagedForwardShape | None:
    """The shape of the staged kernel softmax's backward takes (:data:`SOFTMAX_BACKWARD`), or None."""
    if n < SOFTMAX_BACKWARD_MIN_N[dtype]:
        return None
    ctas = -(-2 * n * element_bytes(dtype) // FORWARD_STAGE_BYTES)
    for exactly, shape in SOFTMAX_BACKWARD:
        if ctas == exactly:
            return shape
    for most, shape in SOFTMAX_BACKWARD_RANGES:
        if ctas <= most:
            return shape
    return None


def backward_staged_shapes(dtype: str, sums: int) -> list:
    """The staged backward's (most CTAs, shape) rows for ``dtype`` and ``sums`` column sums."""
    return BACKWARD_STAGED[_dtype_class(dtype), sums]


def team_shape(dtype: str, sums: int) -> TeamShape:
    """The backward team's shape for ``dtype`` and ``sums`` column sums."""
    return BACKWARD_TEAM[_dtype_class(dtype), sums]


def _staged_backward(n: int, dtype: str, sums: int) -> BackwardConfig | None:
    """The first staged backward shape that holds a row in its most CTAs, else a team, else None."""
    for most, shape in backward_staged_shapes(dtype, sums):
        cfg = staged_backward_config(n, dtype, sums, shape)
        if cfg is not None and cfg.row.cluster <= most:
            return cfg
    return team_backward_config(n, dtype, sums, team_shape(dtype, sums))


def _backward_config(n: int, dtype: str, sums: int, staged: bool) -> BackwardConfig:
    """The norms' backward config: rows that fit a 256-thread CTA (several rows per CTA), rows that fit one CTA of
    up to 1024 threads, then (``staged``) the staged kernel or a team, then clusters of the register kernel."""
    dense, lean = BACKWARD_REGISTERS[_dtype_class(dtype)]
    cfg = make_backward_config(n, dtype, sums, *dense)
    if cfg.row.cluster == 1:
        return cfg
    cfg = make_backward_config(n, dtype, sums, *lean, cta_threads=1024)
    if cfg.row.cluster == 1:
        return cfg
    if staged:
        ring = _staged_backward(n, dtype, sums)
        if ring is not None:
            return ring
    if dtype != "f32" and n <= 8 * 256 * 16:
        return make_backward_config(n, dtype, sums, *dense)
    return make_backward_config(n, dtype, sums, *lean)


def _team_fits(cfg, sms: int) -> bool:
    """All of one row's CTAs are resident at once (a team's CTAs wait for each other's pairs)."""
    return not cfg.row.team or cfg.row.cluster <= cfg.blocks_per_sm * sms


def _staged_route(op: RowOp, cfg: StagedForwardConfig | None, sms: int, scratch: bool) -> Route | None:
    """``cfg`` as a route where it can launch: a team needs its exchange tensor (``scratch``) and room for all its
    CTAs at once; claimed rows need a counter (without ``scratch``: every ``groups``-th row instead)."""
    if cfg is None or (cfg.row.team and not (scratch and _team_fits(cfg, sms))):
        return None
    if cfg.claim_rows and not scratch:
        cfg = dataclasses.replace(cfg, claim_rows=False)
    return Route(op, RowKernel.STAGED, cfg)


@functools.lru_cache(maxsize=4096)
def route(
    op: RowOp,
    n: int,
    dtype: str,
    *,
    rows_aligned: bool = True,
    vectors_aligned: bool = True,
    sms: int = 132,
    scratch: bool = True,
    sums: int = 0,
    staged: bool = True,
) -> Route:
    """The kernel and configuration for ``op`` on rows of ``n`` ``dtype`` elements: ``rows_aligned`` (every row
    tensor's rows start at 16-byte boundaries), ``vectors_aligned`` (so do the weight and bias), ``sms`` (the
    device's), ``scratch`` (the caller's framework allocates the kernels' scratch memory: torch, cupy), ``sums``
    (the norms' backward: 0, 1 for dweight, 2 for dweight and dbias), ``staged`` (False: the register kernel
    everywhere, for tests and comparisons). Cached: it runs on every call."""
    op = RowOp(op)
    kind = op.kind
    if op is RowOp.SOFTMAX_BACKWARD:
        shape = softmax_backward_shape(n, dtype) if staged and rows_aligned else None
        found = shape and _staged_route(op, staged_forward_config(n, dtype, shape, residual=True), sms, scratch)
        if found:
            return found
        held = 2 if dtype != "f32" and n >= 65536 else 4
        return Route(op, RowKernel.REGISTER, row_config(n, dtype, held=held))
    if op.backward:
        cfg = _backward_config(n, dtype, sums, staged and rows_aligned)
        if cfg.row.team and not (scratch and _team_fits(cfg, sms)):
            cfg = _backward_config(n, dtype, sums, False)
        return Route(op, RowKernel.STAGED if cfg.staged else RowKernel.REGISTER, cfg)
    if staged and rows_aligned and vectors_aligned and kind != "softmax":
        shape = looped_shape(kind, n, dtype)
        if shape is not None:
            return Route(op, RowKernel.LOOPED, looped_forward_config(n, dtype, shape))
    if staged and rows_aligned:
        shape = staged_forward_shape(kind, n, dtype)
        cfg = shape and staged_forward_config(n, dtype, shape, residual=kind == "fused")
        found = _staged_route(op, cfg, sms, scratch)
        if found:
            return found
    if kind == "softmax":
        cfg = forward_row_config(n, dtype)
        return Route(op, RowKernel.REGISTER, _plain_unless(cfg, rows_aligned))
    held = 2 if kind == "fused" else 1
    cfg = forward_row_config(n, dtype, held, FORWARD_STORE_GROUP[dtype])
    return Route(op, RowKernel.REGISTER, _plain_unless(cfg, rows_aligned and vectors_aligned))


def _plain_unless(cfg: RowConfig, aligned: bool) -> RowConfig:
    """``cfg`` without its cache hints (16-byte hinted instructions) unless the tensors are 16-byte aligned."""
    return cfg if aligned or cfg.hints == PLAIN_HINTS else dataclasses.replace(cfg, hints=PLAIN_HINTS)


def clear_cache() -> None:
    """Forgets the routes found (after a table, or a layout constant of :mod:`flydsl.kernels.rows.layout`, was
    edited in place), and the launch plans that hold them (:mod:`flydsl.kernels.plans`; none is looked up or kept on
    disk from then on in this process: the disk cache's keys do not see edits in place)."""
    plans.clear_all(routes_edited=True)
    route.cache_clear()
    for cached in (staged_forward_config, staged_backward_config, team_backward_config, looped_forward_config):
        cached.cache_clear()
    row_config.cache_clear()

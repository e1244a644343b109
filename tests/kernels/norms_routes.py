"""The routes the row ops' property tests check (test_norms_routes_cpu.py compiles them, test_norms_routes_gpu.py runs
them on data): per op and dtype, N at both ends of every range of the router's tables (the looped forward's N
ranges, the staged forward's and softmax backward's CTA counts, the staged backward's clusters, the teams), where
the staged kernels start and stop, the register kernels' regimes (a warp or less, a CTA, a cluster) and odd N (per
element tails). The N come from the tables themselves: a retuned table moves them along."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from flydsl.kernels.rows import router
from flydsl.kernels.rows.configs import FORWARD_STAGE_BYTES, MAX_BACKWARD_TEAM, BackwardConfig
from flydsl.kernels.rows.router import Route, RowKernel, RowOp, route
from flydsl.kernels.validation import element_bytes

DTYPES = ("f32", "f16", "bf16")
# The column sums each backward can ask for: LayerNorm's bias gradient comes with its weight's (0 or 2); RMSNorm
# has no bias (0 or 1).
SUMS = {RowOp.LAYER_NORM_BACKWARD: (0, 2), RowOp.RMS_NORM_BACKWARD: (0, 1)}
# The register kernels' regimes: one thread's row, rows of a warp, one CTA, a cluster, rows past the registers
# (two passes, spills); odd N take per-element accesses.
REGISTER_N = (1, 3, 32, 1000, 1024, 4097, 8192, 20001, 65537, 262147)
# The register kernels' regimes the CPU tests compile, a dtype each (as the routes' other N follow the same layouts).
REGISTER_CASES = (
    (1, "f32"),
    (3, "f16"),
    (32, "bf16"),
    (1000, "f32"),
    (1024, "bf16"),
    (4097, "f16"),
    (8192, "f32"),
    (20001, "bf16"),
    (65537, "f16"),
    (262147, "f32"),
)
# The register backward of rows under a warp compiles slowly (it spills kilobytes: test_norms_routes_cpu.KNOWN_SPILLS):
# the CPU tests compile it at (3, "f16") only, not at these register cases.
SLOW_BACKWARD_CASES = ((1, "f32"), (32, "bf16"))
MAX_N = 1 << 21


class Case(NamedTuple):
    """One input of the grid and the route it takes."""

    op: RowOp
    dtype: str
    n: int
    sums: int
    route: Route

    @property
    def variant(self) -> tuple:
        """What selects the compiled kernel besides the config: the op and its column sums."""
        return self.op, self.sums

    @property
    def name(self) -> str:
        sums = f"-sums{self.sums}" if self.op.backward and self.op is not RowOp.SOFTMAX_BACKWARD else ""
        return f"{self.op.value}-{self.dtype}-{self.n}{sums}-{self.route.kernel.value}"


def vec(dtype: str) -> int:
    """Elements per 16-byte chunk."""
    return 16 // element_bytes(dtype)


def _dtype_class(dtype: str) -> str:
    return "f32" if dtype == "f32" else "16-bit"


def _ctas_to_n(ctas: int, sources: int, dtype: str) -> int:
    """The longest N whose ring rows (``sources`` of them, FORWARD_STAGE_BYTES per CTA) fill ``ctas`` CTAs."""
    return ctas * FORWARD_STAGE_BYTES // (sources * element_bytes(dtype))


def _ranges(bounds, first: int, dtype: str) -> set:
    """Both ends of each range ``(previous top, top]`` of ``bounds`` (tops, ascending) from ``first`` on, and the N
    just past the last."""
    step, found, previous = vec(dtype), set(), 0
    for top in bounds:
        if top >= first:
            found |= {max(first, previous + step), top}
        previous = top
    return found | {previous + step}


def _first_staged(op: RowOp, dtype: str, sums: int, top: int) -> int:
    """The shortest row (a multiple of 16 bytes up to ``top``) the backward stages: past the rows one CTA of the
    register kernel holds (a bisection: the register kernel's layouts grow with N)."""
    step = vec(dtype)
    low, high = 0, top // step  # route(low * step) is not staged (or low is 0), route(high * step) is
    while high - low > 1:
        mid = (low + high) // 2
        if route(op, mid * step, dtype, sums=sums).kernel is RowKernel.STAGED:
            high = mid
        else:
            low = mid
    return high * step


def table_edges(op: RowOp, dtype: str) -> set:
    """N at both ends of every table range ``op`` reads for ``dtype`` (multiples of 16 bytes: the tables' kernels
    take no others), and past them."""
    step, kind = vec(dtype), op.kind
    found = set()
    if op is RowOp.SOFTMAX_BACKWARD:
        first = router.SOFTMAX_BACKWARD_MIN_N[dtype]
        found |= {first - step, first}
        found |= {_ctas_to_n(exactly, 2, dtype) for exactly, _ in router.SOFTMAX_BACKWARD}
        found |= _ranges([_ctas_to_n(most, 2, dtype) for most, _ in router.SOFTMAX_BACKWARD_RANGES], first, dtype)
    elif op.backward:
        for sums in SUMS[op]:
            shapes = router.backward_staged_shapes(dtype, sums)
            tops = [most * shape.threads * shape.chunks * step for most, shape in shapes]
            team = router.team_shape(dtype, sums)
            tops.append(MAX_BACKWARD_TEAM * team.threads * team.chunks * step)
            found |= _ranges(sorted(set(tops)), _first_staged(op, dtype, sums, min(tops)), dtype)
    else:
        for low, high, _ in router.LOOPED_FORWARD.get((kind, dtype), ()):
            low = -(-low // step) * step
            found |= {low - step, low, high, high + step}
        first = router.STAGED_FORWARD_MIN_N[kind, dtype]
        sources = 2 if kind == "fused" else 1
        table = router.STAGED_FORWARD.get((kind, _dtype_class(dtype))) or router.STAGED_FORWARD[kind, "any"]
        found |= {first - step} | _ranges([_ctas_to_n(most, sources, dtype) for most, _ in table], first, dtype)
    return {n for n in found if 0 < n <= MAX_N}


def grid(op: RowOp, dtype: str) -> list:
    """The N checked for ``op`` and ``dtype``: its tables' edges and the register kernels' regimes."""
    return sorted(table_edges(op, dtype) | set(REGISTER_N))


def cases(**where) -> list:
    """Every (op, dtype, N, column sums) of the grid with the route it takes (``where``: :func:`route`'s keyword
    arguments besides ``sums``)."""
    found = []
    for op in RowOp:
        for dtype in DTYPES:
            for n in grid(op, dtype):
                for sums in SUMS.get(op, (0,)):
                    found.append(Case(op, dtype, n, sums, route(op, n, dtype, sums=sums, **where)))
    return found


def distinct(found) -> list:
    """The first case of each compiled kernel (the route's kernel and config, the op and its sums)."""
    seen = {}
    for case in found:
        seen.setdefault((case.route.function, case.route.config, case.variant), case)
    return list(seen.values())


def is_table_route(case: Case) -> bool:
    """Whether the route comes from a tuned table (looped, staged, team), not the register kernels' layouts."""
    return case.route.kernel is not RowKernel.REGISTER


def compile_sample() -> list:
    """The routes the CPU tests compile: every table route at both ends of its range in float32 and bfloat16 (float16
    takes bfloat16's shapes: at the top ends only, powers of two), the register kernels at :data:`REGISTER_CASES`;
    a backward's config once, with its most column sums (without a weight the kernel keeps none: less to hold)."""
    chosen = {}
    for c in cases():
        if is_table_route(c) and c.dtype == "f16" and c.n & (c.n - 1):
            continue
        if not is_table_route(c) and (c.n, c.dtype) not in REGISTER_CASES:
            continue
        if isinstance(c.route.config, BackwardConfig) and (c.n, c.dtype) in SLOW_BACKWARD_CASES:
            continue
        cfg = c.route.config
        if isinstance(cfg, BackwardConfig):
            cfg = dataclasses.replace(cfg, sums=0)
        key = (c.route.function, cfg, c.op)
        if key not in chosen or c.sums > chosen[key].sums:
            chosen[key] = c
    return list(chosen.values())

"""What the norms' backward row loops share (:mod:`.backward_register`, :mod:`.backward_staged`): the loop's
context (:class:`BackwardRows`), the row math (``dx = rstd * (g - xhat * c1 - c2)``: :func:`row_constants`,
:func:`dx_values`), a row's statistics, and the CTA's row of the float32 partial column sums (:class:`PartialRow`)."""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import vector
from flydsl.kernels.rows.configs import BackwardConfig, NormFlags
from flydsl.kernels.rows.layout import RowConfig
from flydsl.kernels.rows.reduce import row_reduce
from flydsl.kernels.rows.tiles import chunk_index

_llvm = lazy_import("mlir.dialects.llvm")

__all__ = [
    "BackwardTensors",
    "BackwardRows",
    "PartialRow",
    "row_constants",
    "row_stats",
    "dx_values",
    "load4",
    "store4",
    "masked_load",
    "sum_index",
]


class BackwardTensors(NamedTuple):
    """The backward kernel's tensors (``mean`` is rstd's tensor, unread, for RMSNorm; ``dweight`` and ``dbias`` are
    written by a direct config only)."""

    dy: object
    x: object
    weight: object
    mean: object
    rstd: object
    dx: object
    dweight: object = None
    dbias: object = None


class BackwardRows(NamedTuple):
    """What a backward row loop takes from the kernel: its config and variant, tensors, reduction and column-sum
    memory, this thread's position, the row count and length, and its CTA group among ``groups`` walking
    ``row_groups`` groups of rows."""

    cfg: BackwardConfig
    flags: NormFlags
    tensors: BackwardTensors
    smem: object
    sums_smem: object
    partial_row: object
    pos: object
    n: object
    rows: object
    group: object
    groups: object
    row_groups: object
    exchange: object


def sum_index(cfg: BackwardConfig, pos, s: int, slot, j: int, q: int):
    """Float4 index in shared memory of column sum ``s``, row slot ``slot``, chunk ``j``, quarter ``q`` of this
    thread: lanes contiguous (16-byte accesses without bank conflicts)."""
    rc = cfg.row
    return (((s * rc.rows_per_cta + slot) * rc.chunks + j) * (rc.vec // 4) + q) * rc.threads_per_row + pos.lane


def load4(view, ok=None):
    cls = vector.vector_class(fx.Float32, 4)
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(cls(0.0).value, raw, alignment=buffer.base_alignment)
    fx.copy(view, buffer, predicate=ok)
    loaded = cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))
    return [loaded[e] for e in range(4)]


def store4(view, values, ok=None):
    """Float32 ``values`` into ``view``, converted to its dtype."""
    chunk = vector.from_elements(vector.vector_class(fx.Float32, len(values)).mlir_type(), values)
    if fx.const_expr(view.dtype != fx.Float32):
        chunk = chunk.to(view.dtype)
    raw, buffer = vector.register_buffer(type(chunk))
    _llvm.store(chunk.value, raw, alignment=buffer.base_alignment)
    fx.copy(buffer, view, predicate=ok)


def masked_load(t, row, col, ok):
    """``t[row, col]`` where ``ok``, else 0 (and no access out of bounds: row and column clamped to 0)."""
    safe_row = fx.arith.select(ok, row, type(row)(0))
    return fx.arith.select(ok, t[safe_row, fx.arith.select(ok, col, type(col)(0))], fx.Float32(0.0))


class PartialRow:
    """This thread's columns of the CTA's row of the ``(groups, sums * N)`` float32 partial tensor: 16-byte
    accesses when N is a multiple of 4 (every chunk is then whole or absent), else one element at a time."""

    def __init__(self, cfg: BackwardConfig, partial, group, pos, n):
        self.cfg, self.partial, self.group, self.pos, self.n = cfg, partial, group, pos, n
        self.wide = cfg.row.even

    def _columns(self, s: int, j: int, q: int):
        col = chunk_index(self.cfg.row, self.pos, j) * self.cfg.row.vec + 4 * q
        return col, s * self.n + col

    def load(self, s: int, j: int, q: int):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            return load4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], col < self.n)
        return [masked_load(self.partial, self.group, at + e, col + e < self.n) for e in range(4)]

    def store(self, s: int, j: int, q: int, values):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            store4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], values, col < self.n)
        else:
            for e in fx.range_constexpr(4):
                view = fx.local_tile(self.partial, (1, 1), (self.group, at + e))[0, None]
                store4(view, [values[e]], col + e < self.n)

    def store_final(self, target, j: int, q: int, values):
        """This thread's columns of a finished column sum into ``target`` ((N,), in its dtype): a direct config's
        dweight or dbias."""
        col = self._columns(0, j, q)[0]
        if fx.const_expr(self.wide):
            store4(fx.local_tile(target, (4,), (col // 4,)), values, col < self.n)
        else:
            for e in fx.range_constexpr(4):
                store4(fx.local_tile(target, (1,), (col + e,)), [values[e]], col + e < self.n)


def row_constants(rc: RowConfig, flags: NormFlags, pos, smem, parity, dots, inv_n, overlap=None):
    """``c1 = mean(g * xhat)`` and ``c2 = mean(g)`` (0 for RMSNorm) of the row, from the threads' partial sums (and
    what ``overlap`` returned, when given: see :func:`row_reduce`)."""
    reduced = row_reduce(rc, pos, smem, parity, dots, overlap=overlap)
    sums, extra = reduced if overlap is not None else (reduced, None)
    means = [v * inv_n for v in sums]
    c2 = fx.Float32(0.0)
    if fx.const_expr(not flags.rms):
        c2 = means[1]
    return means[0], c2, extra


def row_stats(flags: NormFlags, mean_in, rstd_in, row, rows):
    """Row ``row``'s rstd and mean (RMSNorm: mean 0); both 0 past the last row, where xhat is then 0 (row 0's
    statistics could make the padding's xhat overflow, and 0 * inf is NaN in the column sums)."""
    inside = row < rows
    safe_row = fx.arith.select(inside, row, type(row)(0))
    zero = fx.Float32(0.0)
    mu = zero
    if fx.const_expr(not flags.rms):
        mu = fx.arith.select(inside, mean_in[safe_row], zero)
    return fx.arith.select(inside, rstd_in[safe_row], zero), mu


def dx_values(rstd, g, h, k, c2):
    """``dx = rstd * (g - xhat * c1 - c2)`` as ``rstd * fma(-h, k, g - c2)``: ``h = xhat, k = c1``, or ``h = x -
    mean, k = rstd * c1``. ``g - c2`` first: where ``xhat`` is 0 (N = 1) dx is then exactly 0."""
    return [rstd * fx.math.fma(-v, k, a - c2) for a, v in zip(g, h, strict=True)]

"""Softmax over rows, forward and backward, on the shared row-reduction base (:mod:`flydsl.kernels.reduction`).

Forward (the register kernel): the row is read once into registers, ``max`` reduced, ``exp2((x - max) *
log2(e))`` (``ex2.approx``, 2 ulp), ``sum`` reduced, each value scaled by ``1 / sum`` and written. Long rows
(16-byte aligned, N a multiple of 16 bytes; see :func:`flydsl.kernels.norm_config.forward_shape`) take the staged
kernel by default (:mod:`flydsl.kernels.softmax_staged`: rows through a shared-memory ring, a row's CTAs pushing
their partial ``(max, sum)`` to each other); ``forward(..., staged=False)`` or ``FLYDSL_NORM_STAGED_FORWARD=0``
keep the register kernel. Backward: ``dx = y * (dy - sum(dy * y))``; 16-byte aligned rows from 8192 elements
(float32: 131072; :data:`flydsl.kernels.norm_config.SOFTMAX_BACKWARD_STAGED_MIN_N`) take the staged kernel
(:func:`flydsl.kernels.softmax_staged.backward_staged`: dy and y through the ring) unless ``staged=False``.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import nvvm
from flydsl.kernels import normalization, softmax_staged
from flydsl.kernels.reduction import (
    RowConfig,
    forward_row_config,
    load_row,
    row_config,
    row_done,
    row_position,
    row_reduce,
    row_smem,
    store_row,
    thread_reduce,
)

__all__ = ["forward", "backward", "softmax_forward_kernel", "softmax_backward_kernel"]

_LOG2E = 1.4426950408889634


@flyc.kernel
def softmax_forward_kernel(x: fx.Tensor, out: fx.Tensor, cfg: fx.Constexpr[RowConfig]):
    rows, n = x.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=2)
    xs, _ = load_row(cfg, x, pos, n, rows, fill=float("-inf"))  # -inf: neutral for max, exp gives 0
    row_max = row_reduce(cfg, pos, smem, 0, thread_reduce(xs, "max"), "max")
    shift = row_max * _LOG2E
    es = [nvvm.ex2_approx(v * _LOG2E - shift, ftz=True) for v in xs]
    total = row_reduce(cfg, pos, smem, 1, thread_reduce(es), "add", last=True)
    scale = 1.0 / total
    store_row(cfg, out, pos, n, rows, [e * scale for e in es])
    row_done(cfg)


@flyc.kernel
def softmax_backward_kernel(dy: fx.Tensor, y: fx.Tensor, dx: fx.Tensor, cfg: fx.Constexpr[RowConfig]):
    rows, n = y.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=1)
    dys, _ = load_row(cfg, dy, pos, n, rows)
    ys, _ = load_row(cfg, y, pos, n, rows)
    dot = row_reduce(cfg, pos, smem, 0, thread_reduce([a * b for a, b in zip(dys, ys, strict=True)]), "add", last=True)
    store_row(cfg, dx, pos, n, rows, [b * (a - dot) for a, b in zip(dys, ys, strict=True)])
    row_done(cfg)


def _launch(kernel, cfg: RowConfig, rows: int, *tensors) -> None:
    if rows == 0:
        return
    cluster = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    kernel(*tensors, cfg).launch(grid=cfg.grid(rows), block=cfg.block, cluster=cluster)


def forward(x, out, staged: bool | None = None) -> None:
    """Launches the forward on validated :class:`~flydsl.kernels.host.RowTensor` arguments: the staged kernel where
    :func:`~flydsl.kernels.softmax_staged.softmax_staged_config` has a config and the rows are 16-byte aligned
    (``staged``: default :data:`flydsl.kernels.normalization.STAGED_FORWARD`, as the norms' forward), else the
    register kernel."""
    rows, n = x.shape
    if n == 0:
        return
    if staged is None:
        staged = normalization.STAGED_FORWARD  # read at each call: benchmarks and tests switch it
    if staged and softmax_staged.forward_staged(x, out):
        return
    cfg = normalization.plain_unless_aligned(forward_row_config(n, x.dtype), (x, out))
    _launch(softmax_forward_kernel, cfg, rows, x.obj, out.obj)


def backward(dy, y, dx, staged: bool | None = None) -> None:
    """Launches the backward on validated RowTensor arguments: the staged kernel where
    :func:`~flydsl.kernels.norm_config.softmax_backward_shape` has a shape and the rows are 16-byte aligned
    (``staged``: default :data:`flydsl.kernels.normalization.STAGED_FORWARD`, the forward's switch), else the
    register kernel."""
    rows, n = y.shape
    if n == 0:
        return
    if staged is None:
        staged = normalization.STAGED_FORWARD
    if staged and softmax_staged.backward_staged(dy, y, dx):
        return
    # 16-bit rows from 64K: two chunks per thread (held=2; 1024-thread CTAs with one chunk left too little in
    # flight: 2.75 -> 3.27 TB/s at 65536 bf16, measured 2026-11-30).
    held = 2 if y.dtype != "f32" and n >= 65536 else 4
    _launch(softmax_backward_kernel, row_config(n, y.dtype, held=held), rows, dy.obj, y.obj, dx.obj)

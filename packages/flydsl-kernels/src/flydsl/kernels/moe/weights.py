"""MoE weights laid out for the kernels, once per weight (as :func:`flydsl.kernels.gemm.prepare_weight` lays out fp8
weights): :func:`prepare_w13` and its inverse :func:`unprepare_w13`. Pure torch, any device.

Stage 1 computes ``act(x @ gate.T) * (x @ up.T)`` from ``w1`` (E, 2I, H), gate rows ``[0, I)`` then up rows
``[I, 2I)``. Prepared, each expert's rows are interleaved per ``group`` (8)::

    gate 0..7, up 0..7, gate 8..15, up 8..15, ...       # prepared[e, 16 b + r] = w1[e, 8 b + r], r < 8
                                                        # prepared[e, 16 b + 8 + r] = w1[e, I + 8 b + r]

Why: in the GEMM's accumulator fragment (wgmma's and mma's), a thread's elements j and j + 4 of each 8-column chunk
are columns c and c + 8 of one row. With this layout a tile of 2N output columns (a multiple of 16, starting at one)
holds gate column i and up column i side by side 8 columns apart, so the gated epilogue pairs them in registers, with
no shuffle or shared-memory exchange, whatever the tile width (any multiple of 16), and writes N columns of h.
"""

from __future__ import annotations

__all__ = ["W13_GROUP", "prepare_w13", "unprepare_w13"]

W13_GROUP = 8  # the accumulator fragment's column distance between elements j and j + 4


def _halves(who: str, name: str, w, group) -> tuple[int, int]:
    """``(E, I)`` of an (E, 2I, H) weight whose I is a multiple of ``group``."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"{who}: group: expected a positive int, got {group!r}")
    if w.dim() != 3 or w.shape[1] % (2 * group):
        raise ValueError(
            f"{who}: {name}: expected (E, 2I, H) with I a multiple of group = {group}, got shape {tuple(w.shape)}"
        )
    return w.shape[0], w.shape[1] // 2


def prepare_w13(w1, group: int = W13_GROUP):
    """``w1`` (E, 2I, H), gate rows ``[0, I)`` then up rows ``[I, 2I)``, with each expert's gate and up rows
    interleaved per ``group`` rows: ``[gate 0..group-1, up 0..group-1, gate group.., up group.., ...]`` (same shape,
    a new contiguous tensor). I must be a multiple of ``group``."""
    experts, inter = _halves("flydsl.kernels.moe.prepare_w13", "w1", w1, group)
    hidden = w1.shape[2]
    # (E, half, block, r, H) -> (E, block, half, r, H)
    return w1.reshape(experts, 2, inter // group, group, hidden).transpose(1, 2).reshape(w1.shape).contiguous()


def unprepare_w13(w13, group: int = W13_GROUP):
    """The inverse of :func:`prepare_w13`: gate rows ``[0, I)`` then up rows ``[I, 2I)`` again."""
    experts, inter = _halves("flydsl.kernels.moe.unprepare_w13", "w13", w13, group)
    hidden = w13.shape[2]
    return w13.reshape(experts, inter // group, 2, group, hidden).transpose(1, 2).reshape(w13.shape).contiguous()

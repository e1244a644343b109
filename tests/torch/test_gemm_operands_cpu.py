"""flydsl.kernels.gemm's host side with CPU torch tensors (no GPU needed): each operand's TMA view (shape, strides,
box, major) for both layouts of A and B, the per-address tile cache, the copies of operands TMA cannot read, the
errors naming the operand, and where C goes through the TMA-store epilogue."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm import GemmConfig, MatrixSpec, plan_gemm  # noqa: E402
from flydsl.kernels.gemm.operands import copy_for_tma, operand_view, tma_copied, tma_copy_kind, tma_tile  # noqa: E402
from flydsl.kernels.gemm.plan import Tma  # noqa: E402

CFG = GemmConfig()
M, N, K = 392, 520, 328


@pytest.mark.parametrize(
    "make, mn_dim, rows, expected",
    [
        (lambda: torch.empty(M, K, dtype=torch.bfloat16), 0, CFG.tile_m, ((M, K), (K, 1), (128, 64), "K")),
        (lambda: torch.empty(K, M, dtype=torch.bfloat16).t(), 0, CFG.tile_m, ((K, M), (M, 1), (64, 64), "MN")),
        (lambda: torch.empty(N, K, dtype=torch.bfloat16).t(), 1, 128, ((N, K), (K, 1), (128, 64), "K")),
        (lambda: torch.empty(K, N, dtype=torch.float16), 1, 128, ((K, N), (N, 1), (64, 64), "MN")),
    ],
)
def test_each_operand_is_seen_as_wgmma_reads_it(make, mn_dim, rows, expected):
    t = make()
    view = operand_view(MatrixSpec.of(t), mn_dim, rows, CFG.tile_k, "x")
    tile = tma_tile(t, view)
    assert (tile.shape, tile.strides, tile.box, view.major) == expected
    assert (view.matrix, view.strides, view.box) == expected[:3]
    assert tile.source is None  # the cache keeps addresses, not tensors
    assert tma_tile(t, view) is tile


def test_operands_tma_cannot_read_are_refused_by_name():
    with pytest.raises(ValueError, match="gemm a: .*not a multiple of 16 bytes"):
        operand_view(MatrixSpec.of(torch.empty(64, 30, dtype=torch.bfloat16)), 0, 128, 64, "a")
    with pytest.raises(ValueError, match="gemm b: expected a row- or column-major matrix"):
        operand_view(MatrixSpec.of(torch.empty(64, 64, 2, dtype=torch.bfloat16)[:, :, 0]), 1, 128, 64, "b")


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda: torch.randn(37, 1001).bfloat16(), "rows"),  # odd K: rows not a multiple of 16 bytes
        (lambda: torch.randn(1001, 37).bfloat16().t(), "columns"),  # column-major with an odd column stride
        (lambda: torch.randn(200, 154).bfloat16()[:, ::2], "rows"),  # every other column
        (lambda: torch.randn(1, 64).bfloat16().expand(72, 64), "rows"),  # rows overlapping (stride 0)
        (lambda: torch.randn(64 * 64 + 1).bfloat16()[1:].view(64, 64), "rows"),  # a start 2 bytes past alignment
        (lambda: torch.randn(64, 72).bfloat16(), None),
        (lambda: torch.randn(72, 64).bfloat16().t(), None),
    ],
)
def test_operands_are_copied_only_where_tma_cannot_read_them(make, kind):
    """The copy keeps the values, its geometry is what the plan assumed, and TMA can read it."""
    t = make()
    spec = MatrixSpec.of(t)
    assert tma_copy_kind(spec) == kind
    copied = copy_for_tma(t, kind)
    assert (copied is t) == (kind is None) and torch.equal(copied, t)
    assert MatrixSpec.of(copied) == tma_copied(spec, kind)
    assert tma_copy_kind(MatrixSpec.of(copied)) is None


def _store(out, cfg):
    """The TMA view C is stored through under ``cfg``, or None (from registers)."""
    a, b = torch.empty(out.shape[0], 64, dtype=torch.bfloat16), torch.empty(out.shape[1], 64, dtype=torch.bfloat16).t()
    plan = plan_gemm(MatrixSpec.of(a), MatrixSpec.of(b), MatrixSpec.of(out), sms=132, config=cfg)
    c_store = plan.launches[0].arguments[3]
    assert isinstance(c_store, Tma) and (plan.epilogue.store == "tma") == (c_store.role == "out")
    return c_store.view if c_store.role == "out" else None


def test_tma_store_is_used_only_where_it_applies():
    """C goes through the TMA-store epilogue when it is 16-bit, its rows 16-byte aligned and not overlapping, and
    the staging boxes fit beside the pipeline; otherwise from registers (None)."""
    wide = torch.empty(M, N + 72, dtype=torch.bfloat16)
    assert _store(torch.empty(M, N, dtype=torch.bfloat16), CFG).box == (64, 64)
    assert _store(wide[:, :N], CFG).strides == (N + 72, 1)  # padded rows: the view's extent, its stride
    assert _store(torch.empty(M, N, dtype=torch.float32), CFG) is None  # fp32: stmatrix stores 16-bit
    assert _store(torch.empty(M, N + 1, dtype=torch.bfloat16), CFG) is None  # rows not 16-byte aligned
    assert _store(torch.empty(8, 1, dtype=torch.bfloat16).expand(8, 64), CFG) is None  # overlapping rows
    one_row = torch.empty(64 * 8, dtype=torch.bfloat16).as_strided((1, 64), (8, 1))
    assert _store(one_row, CFG) is None  # a one-row view with a short row stride
    assert _store(torch.empty(M, N, dtype=torch.bfloat16), GemmConfig(tile_n=128, stages=7)) is None

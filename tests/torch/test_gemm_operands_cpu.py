"""flydsl.kernels.gemm's host side with CPU torch tensors (no GPU needed): each operand's TMA view (shape, strides,
box, major) for both layouts of A and B, the per-geometry cache, and the errors naming the operand."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm import GemmConfig, _operand_tile  # noqa: E402

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
    tile, major = _operand_tile(t, mn_dim, rows, CFG.tile_k, "x")
    assert (tile.shape, tile.strides, tile.box, major) == expected
    assert tile.source is None  # the cache keeps addresses, not tensors
    assert _operand_tile(t, mn_dim, rows, CFG.tile_k, "x")[0] is tile


def test_operands_tma_cannot_read_are_refused_by_name():
    with pytest.raises(ValueError, match="gemm a: .*not a multiple of 16 bytes"):
        _operand_tile(torch.empty(64, 30, dtype=torch.bfloat16), 0, 128, 64, "a")
    with pytest.raises(ValueError, match="gemm b: expected a row- or column-major matrix"):
        _operand_tile(torch.empty(64, 64, 2, dtype=torch.bfloat16)[:, :, 0], 1, 128, 64, "b")


def test_tma_store_is_used_only_where_it_applies():
    """C goes through the TMA-store epilogue when it is 16-bit, its rows 16-byte aligned and not overlapping, and
    the staging boxes fit beside the pipeline; otherwise from registers (None)."""
    from flydsl.kernels.gemm import _store_tile_of

    wide = torch.empty(M, N + 72, dtype=torch.bfloat16)
    assert _store_tile_of(torch.empty(M, N, dtype=torch.bfloat16), CFG).box == (64, 64)
    assert _store_tile_of(wide[:, :N], CFG).strides == (N + 72, 1)  # padded rows: the view's extent, its stride
    assert _store_tile_of(torch.empty(M, N, dtype=torch.float32), CFG) is None  # fp32: stmatrix stores 16-bit
    assert _store_tile_of(torch.empty(M, N + 1, dtype=torch.bfloat16), CFG) is None  # rows not 16-byte aligned
    assert _store_tile_of(torch.empty(8, 1, dtype=torch.bfloat16).expand(8, 64), CFG) is None  # overlapping rows
    one_row = torch.empty(64 * 8, dtype=torch.bfloat16).as_strided((1, 64), (8, 1))
    assert _store_tile_of(one_row, CFG) is None  # a one-row view with a short row stride
    assert _store_tile_of(torch.empty(M, N, dtype=torch.bfloat16), GemmConfig(tile_n=128, stages=7)) is None

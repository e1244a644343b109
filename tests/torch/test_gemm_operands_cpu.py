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

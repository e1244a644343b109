"""skinny_gemm_grouped_scaled_kernel (W8A8: e4m3 activations and weights, float32 scales per row of each) on the GPU,
called directly with a routing from align_tokens in blocks of 16, against a float64 reference of the dequantized
operands: the gated stage 1 (x's rows by index, and the positions it notes) and a plain stage (A in the aligned
order), with K tails, N tails, dropped ids and many experts. Operands are random bytes over every finite e4m3 value;
scales span 2^-4..2^4 so that a scale read at a wrong row shows; outputs are poisoned with NaN (rows past
padded_count stay unwritten). fused_moe's use of it: test_moe_experts_gpu.py::test_fp8_decode_precision.

Tolerance: the relative Frobenius error of the bf16 outputs under 8e-3 (fp8_gemm's: each output rounded to bf16,
the fp8 MMA's accumulation), and NaN nowhere a routed row lies."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm.epilogue import Epilogue  # noqa: E402
from flydsl.kernels.gemm.skinny import SkinnyVariant  # noqa: E402
from flydsl.kernels.gemm.skinny_grouped import (  # noqa: E402
    GROUPED_BLOCK,
    GroupedMode,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_scaled_kernel,
)
from flydsl.kernels.moe import align_tokens  # noqa: E402

from .test_skinny_grouped_fp8_gpu import DEVICE, _fp8, _generator, _routing, _scales  # noqa: E402


def _launch(a, a_scale, w, w_scale, c, routing, positions, top_k, gated, ids):
    sorted_ids, expert_of_block, padded_count = routing
    cfg = choose_grouped_skinny_config(a.shape[1], gated, 1, quantized=True)
    variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
    cols = cfg.rows // 2 if gated else cfg.rows
    grid = (-(-c.shape[1] // cols), min(sorted_ids.numel() // GROUPED_BLOCK, ids))
    skinny_gemm_grouped_scaled_kernel(
        a, w, c, sorted_ids, expert_of_block, padded_count, positions, w_scale, a_scale, top_k, cfg, variant,
        GroupedMode(),
    ).launch(grid=grid, block=cfg.threads)  # fmt: skip
    torch.cuda.synchronize()


def _close(got, expected):
    assert not got.isnan().any()
    error = ((got.double() - expected).norm() / expected.norm()).item()
    assert error < 8e-3, error


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter,dropped",
    [
        (2, 8, 2, 512, 128, False),  # K one masked step
        (5, 16, 4, 4112, 64, False),  # two whole steps and a masked one with a K tail of 16
        (37, 64, 8, 2048, 768, True),  # Qwen3-30B-A3B's shapes, dropped ids
        (64, 256, 8, 1024, 64, False),  # decode's bound: 512 ids over 256 experts
        (16, 32, 8, 7168, 256, False),  # DeepSeek-V3's H
    ],
)
def test_gated_stage_1(tokens, experts, top_k, hidden, inter, dropped):
    """h[positions[t * k + s]] = silu(x_t . gate_e) * (x_t . up_e), x and the weights dequantized by their rows'
    scales; positions noted for the placed ids only."""
    g = _generator(tokens * 1000 + hidden + 3)
    x8, x_scale = _fp8((tokens, hidden), g), _scales((tokens,), g) * 2.0**-8
    w1 = _fp8((experts, 2 * inter, hidden), g)
    w1_scale = _scales((experts * 2 * inter,), g) * 2.0**-8
    ids = _routing(tokens, experts, top_k, g, dropped)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, _, padded_count = routing
    h = torch.full((sorted_ids.numel(), inter), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    positions = torch.full((tokens * top_k,), -1, dtype=torch.int32, device=DEVICE)
    w1_rows = w1.view(experts * 2 * inter, hidden)
    _launch(x8, x_scale, w1_rows, w1_scale, h, routing, positions, top_k, True, tokens * top_k)

    flat = ids.view(-1).long()
    placed = torch.nonzero((flat >= 0) & (flat < experts)).squeeze(1)
    assert (positions[torch.nonzero(flat < 0).squeeze(1)] == -1).all()
    where = positions[placed].long()
    padded = int(padded_count.item())
    assert ((where >= 0) & (where < padded)).all() and (sorted_ids[where].long() == placed).all()
    xd = x8.double() * x_scale.double()[:, None]
    wd = (w1_rows.double() * w1_scale.double()[:, None]).view(experts, 2 * inter, hidden)
    expected = torch.zeros(tokens * top_k, inter, dtype=torch.float64, device=DEVICE)
    for e in flat[placed].unique().tolist():
        mine = placed[flat[placed] == e]
        gate_up = xd[mine // top_k] @ wd[e].T
        expected[mine] = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    _close(h[where], expected[placed])
    assert h[padded:].isnan().all()


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter",
    [
        (5, 16, 4, 1000, 256),  # an N tail, K one step
        (3, 8, 2, 512, 320),  # short K with a masked step
        (37, 64, 8, 2048, 768),  # Qwen3-30B-A3B's I
        (2, 8, 2, 512, 4160),  # long K: whole steps and a masked one
    ],
)
def test_plain_stage(tokens, experts, top_k, hidden, inter):
    """y[p] = a[p] . w_e[n] with both dequantized by their rows' scales, for every aligned row p below padded_count
    (a pad row reads its block's first row, and that row's scale)."""
    g = _generator(tokens * 1000 + inter + 5)
    ids = _routing(tokens, experts, top_k, g, False)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, expert_of_block, padded_count = routing
    capacity = sorted_ids.numel()
    a8, a_scale = _fp8((capacity, inter), g), _scales((capacity,), g) * 2.0**-8
    w2 = _fp8((experts, hidden, inter), g)
    w2_scale = _scales((experts * hidden,), g) * 2.0**-8
    y = torch.full((capacity, hidden), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    positions = torch.full((tokens * top_k,), -7, dtype=torch.int32, device=DEVICE)
    _launch(a8, a_scale, w2.view(experts * hidden, inter), w2_scale, y, routing, positions, 0, False, tokens * top_k)
    assert (positions == -7).all()

    padded = int(padded_count.item())
    rows_read = torch.arange(padded, device=DEVICE)
    rows_read = torch.where(sorted_ids[:padded] < tokens * top_k, rows_read, rows_read - rows_read % GROUPED_BLOCK)
    ad = (a8.double() * a_scale.double()[:, None])[rows_read]
    wd = w2.double() * w2_scale.double().view(experts, hidden, 1)
    expected = torch.empty(padded, hidden, dtype=torch.float64, device=DEVICE)
    for block_index, e in enumerate(expert_of_block[: padded // GROUPED_BLOCK].tolist()):
        rows = slice(block_index * GROUPED_BLOCK, (block_index + 1) * GROUPED_BLOCK)
        expected[rows] = ad[rows] @ wd[e].T
    _close(y[:padded], expected)
    assert y[padded:].isnan().all()

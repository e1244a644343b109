"""skinny_gemm_grouped_scaled_kernel (fp8 e4m3 operands with per-token and per-weight-row float32 scales) on the GPU,
called directly with a routing from align_tokens in blocks of 16, against a float64 reference of the dequantized
operands: the gated stage 1 (x's rows by index, and the positions it notes) and the plain stage 2 (A in the aligned
order: every row below padded_count, pad rows included), with K tails (a masked step), N tails, dropped ids and many
experts. Scales span 2^-4..2^4 so that one read at a wrong row or weight row shows; outputs are poisoned with NaN
(rows past padded_count stay unwritten).

Tolerance: 1e-2 relative (one bf16 rounding of the output: 2^-9) plus 1e-3 of the row's largest value (the fp32
sums in another order than the reference's)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm.epilogue import Epilogue  # noqa: E402
from flydsl.kernels.gemm.skinny import (  # noqa: E402
    GROUPED_BLOCK,
    GROUPED_SCALES,
    SkinnyVariant,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_scaled_kernel,
)
from flydsl.kernels.moe import align_tokens  # noqa: E402

DEVICE = "cuda"


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _fp8(shape, g):
    """Random e4m3 values, each row of its own power-of-two magnitude in 2^-2..2^2."""
    magnitude = 2.0 ** torch.randint(-2, 3, (*shape[:-1], 1), device=DEVICE, generator=g).float()
    return (torch.randn(shape, device=DEVICE, generator=g) * magnitude).clamp(-448, 448).to(torch.float8_e4m3fn)


def _scales(count: int, g):
    """float32 scales in 2^-4..2^4."""
    return 2.0 ** (torch.rand(count, device=DEVICE, generator=g) * 8 - 4)


def _routing(tokens: int, experts: int, top_k: int, g, dropped: bool):
    """Distinct experts per token; ``dropped``: every third token's first slot -1 (not served: not placed)."""
    ids = torch.rand(tokens, experts, device=DEVICE, generator=g).topk(top_k, dim=1).indices.to(torch.int32)
    if dropped:
        ids[::3, 0] = -1
    return ids.contiguous()


def _close(got, expected):
    """Element-wise within the module docstring's tolerance (NaN fails)."""
    tolerance = 1e-2 * expected.abs() + 1e-3 * expected.abs().amax(dim=1, keepdim=True)
    error = (got.double() - expected).abs()
    assert not got.isnan().any()
    worst = divmod(error.argmax().item(), got.shape[1])
    assert (error <= tolerance).all(), f"max error {error.max().item()} at {worst}"


def _launch(a, w, c, routing, positions, a_scale, w_scale, top_k, gated, ids):
    """One stage as fused_moe's decode launches it: grid (column tiles, at most as many blocks as ``ids``: each
    block below padded_count holds one)."""
    sorted_ids, expert_of_block, padded_count = routing
    cfg = choose_grouped_skinny_config(a.shape[1], gated, 1)
    variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None, scales=GROUPED_SCALES), True)
    cols = cfg.rows // 2 if gated else cfg.rows
    grid = (-(-c.shape[1] // cols), min(sorted_ids.numel() // GROUPED_BLOCK, ids))
    skinny_gemm_grouped_scaled_kernel(
        a, w, c, sorted_ids, expert_of_block, padded_count, positions, a_scale, w_scale, top_k, cfg, variant
    ).launch(grid=grid, block=cfg.threads)
    torch.cuda.synchronize()


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter,dropped",
    [
        (1, 8, 2, 512, 128, False),  # one token
        (5, 16, 4, 1008, 100, False),  # K one masked step (steps of 1024), N tail (columns of 8)
        (5, 16, 4, 2064, 100, False),  # two whole steps and a masked one
        (37, 64, 8, 2048, 768, True),  # dropped ids: not placed, their positions not written
        (64, 256, 8, 1024, 64, False),  # decode's bound: 512 ids over 256 experts
        (4, 32, 8, 7168, 256, False),  # DeepSeek-V3's H: 7 whole steps
    ],
)
def test_gated_stage_1(tokens, experts, top_k, hidden, inter, dropped):
    """h[positions[t * k + s]] = silu(x_t . gate_e) * (x_t . up_e), each dot product scaled by x's row's scale and
    its weight row's; positions noted for the placed ids only."""
    g = _generator(tokens * 1000 + hidden)
    x8, x_scale = _fp8((tokens, hidden), g), _scales(tokens, g)
    w1, w1_scale = _fp8((experts, 2 * inter, hidden), g), _scales(experts * 2 * inter, g)
    ids = _routing(tokens, experts, top_k, g, dropped)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, _, padded_count = routing
    capacity = sorted_ids.numel()
    h = torch.full((capacity, inter), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    positions = torch.full((tokens * top_k,), -1, dtype=torch.int32, device=DEVICE)
    w1_rows = w1.view(experts * 2 * inter, hidden)
    _launch(x8, w1_rows, h, routing, positions, x_scale, w1_scale, top_k, True, tokens * top_k)

    flat = ids.view(-1).long()
    placed = torch.nonzero((flat >= 0) & (flat < experts)).squeeze(1)
    dropped_flats = torch.nonzero(flat < 0).squeeze(1)
    assert (positions[dropped_flats] == -1).all()
    where = positions[placed].long()
    padded = int(padded_count.item())
    assert ((where >= 0) & (where < padded)).all() and (sorted_ids[where].long() == placed).all()

    xd = x8.double() * x_scale.double()[:, None]
    expected = torch.zeros(tokens * top_k, inter, dtype=torch.float64, device=DEVICE)
    for e in flat[placed].unique().tolist():
        mine = placed[flat[placed] == e]
        wd = w1[e].double() * w1_scale.view(experts, 2 * inter)[e].double()[:, None]
        gate_up = xd[mine // top_k] @ wd.T
        expected[mine] = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    _close(h[where], expected[placed])
    assert h[padded:].isnan().all()


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter,dropped",
    [
        (1, 8, 2, 512, 256, False),  # one token, K one whole step of 128 x 2
        (5, 16, 4, 1000, 256, False),  # N tail (32 columns per CTA)
        (3, 8, 2, 512, 272, False),  # short K with a masked step (steps of 128)
        (37, 64, 8, 2048, 768, True),  # Qwen3-30B-A3B's I, dropped ids
        (64, 256, 8, 1024, 1024, False),  # decode's bound
        (2, 8, 2, 512, 2064, False),  # long K: two whole steps of 1024 and a masked one
        (1, 8, 2, 256, 14336, False),  # Mixtral's I
    ],
)
def test_plain_stage_2(tokens, experts, top_k, hidden, inter, dropped):
    """y[p] = a[p] . w2_e rows, scaled by a's row p's scale and each weight row's, for every aligned row p below
    padded_count (e: its block's expert)."""
    g = _generator(tokens * 1000 + inter)
    ids = _routing(tokens, experts, top_k, g, dropped)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, expert_of_block, padded_count = routing
    capacity = sorted_ids.numel()
    a8, a_scale = _fp8((capacity, inter), g), _scales(capacity, g)
    w2, w2_scale = _fp8((experts, hidden, inter), g), _scales(experts * hidden, g)
    y = torch.full((capacity, hidden), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    unread = torch.empty(1, dtype=torch.int32, device=DEVICE)  # (positions: only rows by index note them)
    _launch(a8, w2.view(experts * hidden, inter), y, routing, unread, a_scale, w2_scale, 0, False, tokens * top_k)

    padded = int(padded_count.item())
    assert padded > 0
    ad = a8.double() * a_scale.double()[:, None]
    expected = torch.empty(padded, hidden, dtype=torch.float64, device=DEVICE)
    for block, e in enumerate(expert_of_block[: padded // GROUPED_BLOCK].tolist()):
        rows = slice(block * GROUPED_BLOCK, (block + 1) * GROUPED_BLOCK)
        wd = w2[e].double() * w2_scale.view(experts, hidden)[e].double()[:, None]
        expected[rows] = ad[rows] @ wd.T
    _close(y[:padded], expected)
    assert y[padded:].isnan().all()

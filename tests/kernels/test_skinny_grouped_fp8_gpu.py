"""skinny_gemm_grouped_fp8_kernel (weight-only fp8: e4m3 weights converted exactly in registers, bf16 or fp16
activations, float32 scales per stacked weight row or per 128 x 128 block) on the GPU, called directly with a routing
from align_tokens in blocks of 16, against a float64 reference of the dequantized weights and the activations as they
are: the gated stage 1 (x's rows by index, and the positions it notes) and the plain stage 2 (A in the aligned order:
every row below padded_count, pad rows reading their block's first), with K tails (a masked step), N tails, dropped
ids and many experts. The weights are random bytes over every finite e4m3 value (zeros, subnormals, +-448: the
conversion is exact for all); scales span 2^-4..2^4 so that one read at a wrong row, block or K block shows; outputs
are poisoned with NaN (rows past padded_count stay unwritten).

Tolerance: 1e-2 relative (one bf16 rounding of the output: 2^-9, and of h before the up product) plus 1e-3 of the
row's largest value (fp32 sums in another order than the reference's). The products themselves are exact."""

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
    skinny_gemm_grouped_fp8_kernel,
)
from flydsl.kernels.moe import align_tokens  # noqa: E402

DEVICE = "cuda"
BLOCK = 128


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _fp8(shape, g):
    """Random e4m3 bytes, each finite value equally likely (not 0x7f / 0xff: NaN)."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8, device=DEVICE)
    index = torch.randint(0, finite.numel(), shape, device=DEVICE, generator=g)
    return finite[index].view(torch.float8_e4m3fn)


def _activations(shape, g, dtype):
    """Activations of order one, each row of its own power-of-two magnitude in 2^-2..2^2."""
    magnitude = 2.0 ** torch.randint(-2, 3, (*shape[:-1], 1), device=DEVICE, generator=g).float()
    return (torch.randn(shape, device=DEVICE, generator=g) * magnitude).to(dtype)


def _scales(shape, g):
    """float32 scales in 2^-4..2^4 (the weights reach 448: outputs of order 10^3 at most per product)."""
    return 2.0 ** (torch.rand(shape, device=DEVICE, generator=g) * 8 - 4)


def _weight_scales(experts: int, rows: int, k: int, block: bool, g, unit: float = 1.0):
    """(the kernel's scale tensor, the (E, rows, K) float64 factor of each weight): per stacked row (E * rows,), or per
    128 x 128 block of the stacked weights (E * rows / 128, ceil(K / 128)); times ``unit`` (fp16: outputs in range)."""
    if not block:
        scales = _scales((experts * rows,), g) * unit
        return scales, scales.double().view(experts, rows, 1).expand(experts, rows, k)
    scales = _scales((experts * rows // BLOCK, -(-k // BLOCK)), g) * unit
    factor = scales.double().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:, :k]
    return scales, factor.reshape(experts, rows, k)


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


def _launch(a, w, c, routing, positions, w_scale, top_k, gated, ids):
    """One stage as fused_moe's decode launches it: grid (column tiles, at most as many blocks as ``ids``: each
    block below padded_count holds one)."""
    sorted_ids, expert_of_block, padded_count = routing
    cfg = choose_grouped_skinny_config(a.shape[1], gated, 1)
    variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
    cols = cfg.rows // 2 if gated else cfg.rows
    grid = (-(-c.shape[1] // cols), min(sorted_ids.numel() // GROUPED_BLOCK, ids))
    skinny_gemm_grouped_fp8_kernel(
        a, w, c, sorted_ids, expert_of_block, padded_count, positions, w_scale, top_k, cfg, variant, GroupedMode(),
    ).launch(grid=grid, block=cfg.threads)  # fmt: skip
    torch.cuda.synchronize()


@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter,dropped",
    [
        (1, 8, 2, 512, 128, False),  # one token: K one masked step (steps of 2048)
        (5, 16, 4, 1024, 192, False),  # N tail (gated: 8 columns per CTA: none); 2I = 384: 3 row blocks
        (5, 16, 4, 4224, 64, False),  # two whole steps and a masked one (row scales: a K tail of 16 at H 4112 below)
        (37, 64, 8, 2048, 768, True),  # dropped ids: not placed, their positions not written
        (64, 256, 8, 1024, 64, False),  # decode's bound: 512 ids over 256 experts
        (4, 32, 8, 7168, 256, False),  # DeepSeek-V3's H: 3 whole steps and half a step
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gated_stage_1(tokens, experts, top_k, hidden, inter, dropped, block, dtype):
    """h[positions[t * k + s]] = silu(x_t . gate_e) * (x_t . up_e) with the dequantized weights (each weight row's
    scale, or each 128 x 128 block's: the up rows' blocks their own); positions noted for the placed ids only."""
    if not block and hidden == 4224:
        hidden = 4112  # (row scales: K a multiple of 16 only)
    g = _generator(tokens * 1000 + hidden + block)
    x = _activations((tokens, hidden), g, dtype)
    w1 = _fp8((experts, 2 * inter, hidden), g)
    unit = 2.0**-12 if dtype == torch.float16 else 1.0  # (fp16's range: h within 65504)
    w1_scale, factor = _weight_scales(experts, 2 * inter, hidden, block, g, unit)
    ids = _routing(tokens, experts, top_k, g, dropped)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, _, padded_count = routing
    capacity = sorted_ids.numel()
    h = torch.full((capacity, inter), float("nan"), dtype=dtype, device=DEVICE)
    positions = torch.full((tokens * top_k,), -1, dtype=torch.int32, device=DEVICE)
    w1_rows = w1.view(experts * 2 * inter, hidden)
    _launch(x, w1_rows, h, routing, positions, w1_scale, top_k, True, tokens * top_k)

    flat = ids.view(-1).long()
    placed = torch.nonzero((flat >= 0) & (flat < experts)).squeeze(1)
    dropped_flats = torch.nonzero(flat < 0).squeeze(1)
    assert (positions[dropped_flats] == -1).all()
    where = positions[placed].long()
    padded = int(padded_count.item())
    assert ((where >= 0) & (where < padded)).all() and (sorted_ids[where].long() == placed).all()

    xd = x.double()
    expected = torch.zeros(tokens * top_k, inter, dtype=torch.float64, device=DEVICE)
    for e in flat[placed].unique().tolist():
        mine = placed[flat[placed] == e]
        gate_up = xd[mine // top_k] @ (w1[e].double() * factor[e]).T
        expected[mine] = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    _close(h[where], expected[placed])
    assert h[padded:].isnan().all()


@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter,dropped",
    [
        (1, 8, 2, 512, 256, False),  # one token, K one whole step of 256
        (5, 16, 4, 1024, 256, False),  # N: 16 CTAs of 64 columns
        (3, 8, 2, 512, 320, False),  # short K with a masked step (steps of 256); block: the last K block half (64)
        (37, 64, 8, 2048, 768, True),  # Qwen3-30B-A3B's I, dropped ids
        (64, 256, 8, 1024, 1024, False),  # decode's bound
        (2, 8, 2, 512, 4160, False),  # long K: two whole steps of 2048 and a masked one
        (1, 8, 2, 256, 14336, False),  # Mixtral's I
    ],
)
def test_plain_stage_2(tokens, experts, top_k, hidden, inter, dropped, block):
    """y[p] = a[p] . (w2_e rows, dequantized) for every aligned row p below padded_count (e: its block's expert; a pad
    row p reads its block's first row)."""
    if not block and hidden == 1024:
        hidden = 1000  # (row scales: an N tail)
    g = _generator(tokens * 1000 + inter + block)
    ids = _routing(tokens, experts, top_k, g, dropped)
    routing = align_tokens(ids, experts, GROUPED_BLOCK)
    sorted_ids, expert_of_block, padded_count = routing
    capacity = sorted_ids.numel()
    a = _activations((capacity, inter), g, torch.bfloat16)
    w2 = _fp8((experts, hidden, inter), g)
    w2_scale, factor = _weight_scales(experts, hidden, inter, block, g)
    y = torch.full((capacity, hidden), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    # positions: unwritten by stage 2 (only rows by index note them); its extent, T * k, is the pads' sentinel
    positions = torch.full((tokens * top_k,), -7, dtype=torch.int32, device=DEVICE)
    _launch(a, w2.view(experts * hidden, inter), y, routing, positions, w2_scale, 0, False, tokens * top_k)
    assert (positions == -7).all()

    padded = int(padded_count.item())
    assert padded > 0
    rows_read = torch.arange(padded, device=DEVICE)
    rows_read = torch.where(sorted_ids[:padded] < tokens * top_k, rows_read, rows_read - rows_read % GROUPED_BLOCK)
    ad = a.double()[rows_read]
    expected = torch.empty(padded, hidden, dtype=torch.float64, device=DEVICE)
    for block_index, e in enumerate(expert_of_block[: padded // GROUPED_BLOCK].tolist()):
        rows = slice(block_index * GROUPED_BLOCK, (block_index + 1) * GROUPED_BLOCK)
        expected[rows] = ad[rows] @ (w2[e].double() * factor[e]).T
    _close(y[:padded], expected)
    assert y[padded:].isnan().all()


@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
def test_landed_steps_give_the_same_bits(block):
    """One token's direct stage 1 with ``landed`` (a step's MMAs wait for all its activations; the default at one
    token) gives exactly the bits of the same configuration without it: the dependency adds a zero."""
    import dataclasses

    g = _generator(7)
    experts, top_k, hidden, inter = 16, 8, 1024, 384
    x = _activations((1, hidden), g, torch.bfloat16)
    w = _fp8((experts * 2 * inter, hidden), g)
    scales, _factor = _weight_scales(experts, 2 * inter, hidden, block, g)
    pairs = _routing(1, experts, top_k, g, False).reshape(-1)
    landed = choose_grouped_skinny_config(hidden, True, 1, direct=True)
    assert landed.landed
    variant = SkinnyVariant(True, Epilogue(gate="silu"), True)
    outputs = []
    for cfg in (landed, dataclasses.replace(landed, landed=False)):
        h = torch.full((top_k * GROUPED_BLOCK, inter), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        positions = torch.empty(top_k, dtype=torch.int32, device=DEVICE)
        skinny_gemm_grouped_fp8_kernel(
            x, w, h, pairs, pairs, pairs, positions, scales, top_k, cfg, variant, GroupedMode(direct=True)
        ).launch(grid=(-(-inter // (cfg.rows // 2)), top_k), block=cfg.threads)
        torch.cuda.synchronize()
        outputs.append(h[::GROUPED_BLOCK].clone())  # each pair's row (the pad rows are not defined)
    assert not outputs[0].isnan().any()
    assert torch.equal(outputs[0].view(torch.int16), outputs[1].view(torch.int16))

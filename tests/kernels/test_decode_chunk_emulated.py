"""The paged decode's per-warp math run on the CPU: ``_load_queries``, ``_page_of``, ``_load_chunk``, ``_lane_rows``
(:mod:`flydsl.kernels.attention.decode`) and ``chunk_step`` (:mod:`~flydsl.kernels.attention.chunk`) executed on a
model of one warp (``warp_emulator``: fragments and conversions from the PTX ISA), chunk after chunk of a paged
context; the lanes' accumulators and statistics are then gathered into attention rows and compared with float64
attention over the same (dequantized) cache. Both layouts of the scores (``S = Q K^T`` for more than 8 rows,
``S^T = K Q^T`` up to 8), bf16 and e4m3 caches with scales per tensor and per token, partial last chunks, 2 queries
per sequence, maxima that grow chunk after chunk (the rescaling) and ones that settle, and per-token value scales
spread over 2^-24 and all below f16's smallest normal, after a page of zero scales, the larger half negative (P
carries them in f16)."""

from __future__ import annotations

import pytest

from flydsl.kernels.attention import chunk as chunk_module
from flydsl.kernels.attention import decode
from flydsl.kernels.attention.merge import NO_MAX

from . import warp_emulator as emu

torch = pytest.importorskip("torch")

CASES = {  # name: (head_dim, kv, group, queries, scales (or (key, value) scales), block_size, context, growing logits)
    "narrow-bf16-g8": (128, "bf16", 8, 1, None, 16, 77, False),
    "narrow-bf16-g4-q2-growing": (128, "bf16", 4, 2, None, 32, 90, True),
    "narrow-e4m3-tensor-g8-growing": (128, "e4m3", 8, 1, "tensor", 16, 61, True),
    "narrow-e4m3-token-keys-g4-growing": (128, "e4m3", 4, 1, ("token", "tensor"), 32, 83, True),
    "narrow-e4m3-token-g4-growing": (128, "e4m3", 4, 1, "token", 64, 100, True),
    "narrow-e4m3-token-g8-spread": (128, "e4m3", 8, 1, "token", 16, 75, False),
    "narrow-bf16-d64-g2": (64, "bf16", 2, 1, None, 16, 40, False),
    "wide-bf16-g16-growing": (128, "bf16", 16, 1, None, 16, 70, True),
    "wide-e4m3-tensor-g16": (128, "e4m3", 16, 1, "tensor", 16, 45, False),
    "wide-e4m3-token-g8-q2-growing": (128, "e4m3", 8, 2, "token", 16, 52, True),
    "wide-e4m3-token-g16-spread": (128, "e4m3", 16, 1, "token", 32, 70, True),
    "narrow-e4m3-token-values-g8-spread": (128, "e4m3", 8, 1, ("tensor", "token"), 16, 66, True),
    "narrow-e4m3-token-d64-g2-q2": (64, "e4m3", 2, 2, "token", 16, 47, True),
    "narrow-e4m3-token-d256-g4-spread": (256, "e4m3", 4, 1, "token", 16, 50, False),  # rescaled every chunk
}
VALUE_SPREAD = (16, 24)  # "-spread": each token's values times 2^-(16 + u), u uniform in [0, 24): scales ~2^-23..-47
HKV, BLOCKS = 2, 12


@pytest.fixture
def warp(monkeypatch):
    """The decode and chunk modules' expr modules replaced by the emulator's; yields its memory."""
    memory = emu.Memory()
    for module in (decode, chunk_module):
        for name, fake in emu.modules(memory).items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, fake)
    return memory


def _cache(generator, shape, kv, scales, growing, spread=None):
    """Keys or values (blocks, block_size, Hkv, D): float64 values, what the kernel reads (bf16 or e4m3 patterns),
    their scales (per tensor: a float32 (1,); per token: (blocks, block_size, Hkv)). ``spread`` ``(low, width)``: each
    token's values times 2^-(low + u), u uniform in [0, width)."""
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    if spread:
        low, width = spread
        values *= torch.exp2(-low - width * torch.rand((*shape[:-1], 1), generator=generator, dtype=torch.float64))
    if growing:  # later blocks' logits larger: the running maximum moves chunk after chunk
        values *= torch.linspace(0.5, 3.0, shape[0], dtype=torch.float64)[:, None, None, None]
    if kv == "bf16":
        stored = emu.bf16_bits(values.float())
        return emu.half_value(stored, "bf16").double(), stored.to(torch.int16), torch.ones(1)
    if scales == "tensor":
        scale = (values.abs().max() / 448).float().reshape(1)
    else:
        scale = (values.abs().amax(-1) / 448).float()
    spread = scale if scales == "tensor" else scale[..., None]
    stored = emu.e4m3_bytes((values / spread).float())
    return emu.e4m3_value(stored).double() * spread.double(), stored.to(torch.uint8), scale


@pytest.mark.parametrize("case", list(CASES))
def test_chunk_math_matches_float64_attention(case, warp):
    dim, kv, group, queries, scales, block_size, context, growing = CASES[case]
    k_kind, v_kind = scales if isinstance(scales, tuple) else (scales, scales)
    cfg = decode.DecodeConfig(
        head_dim=dim, kv=kv, q="bf16", group=group, queries=queries, k_scale=k_kind, v_scale=v_kind,
        block_size=block_size,
    )  # fmt: skip
    assert cfg.narrow == case.startswith("narrow")
    generator = torch.Generator().manual_seed(sum(map(ord, case)))
    shape = (BLOCKS, block_size, HKV, dim)
    keys, k_stored, k_scale = _cache(generator, shape, kv, k_kind, growing)
    spread = VALUE_SPREAD if case.endswith("-spread") else None
    values, v_stored, v_scale = _cache(generator, shape, kv, v_kind, False, spread)
    q_bits = emu.bf16_bits(torch.randn((1, queries, HKV * group, dim), generator=generator))
    pages = torch.randperm(BLOCKS, generator=generator).to(torch.int32)  # sequence 0's pages, scattered
    if spread:  # the first page's values all zero, their scales 0: the first rows' maxima come from no scale at all
        first = int(pages[0])
        values[first], v_stored[first], v_scale[first] = 0.0, 0, 0.0
        # and the larger half of the scales negative, the bytes negated (the same values)
        flip = v_scale > v_scale.median()
        v_scale[flip] = -v_scale[flip]
        v_stored[flip] ^= 0x80
    hkv, softmax_scale = 1, dim**-0.5

    q = warp.tensor(q_bits.to(torch.int16))
    caches = (warp.tensor(k_stored), warp.tensor(v_stored), warp.tensor(k_scale), warp.tensor(v_scale))
    tables = warp.tensor(pages[None, :])
    lane_g, lane_c = emu.Int(emu.LANE // 4), emu.Int(emu.LANE % 4)

    q_fragments, factors = decode._load_queries(cfg, q, 0, hkv, 0, lane_g, lane_c)
    scale = softmax_scale * (float(k_scale[0]) if k_kind == "tensor" else 1.0)
    scale_rows, lows, highs = decode._lane_rows(cfg, scale, factors, (context, 0, context, 0), 0, lane_g, lane_c)
    consts = (scale_rows, 0.0, lows, highs, lane_g, lane_c)
    table_row, width = decode.nvvm.address(tables, (0, 0)), emu.Int(BLOCKS)
    accumulators = [emu.VecType(emu.FLOAT32, 4)(0.0) for _ in range(dim // 16 * cfg.p_tiles)]
    state = [[emu.Float(NO_MAX)] * 2, [emu.Float(0.0)] * 2, accumulators]
    for chunk in range(0, context + 16, 16):  # one chunk past the context too: it must load and count nothing
        page = decode._page_of(cfg, table_row, chunk, width)
        loaded = decode._load_chunk(cfg, caches, hkv, chunk, page, context, lane_g, lane_c)
        state = chunk_module.chunk_step(cfg, state, loaded, q_fragments, chunk, consts)

    out = _gather(cfg, state) * (float(v_scale[0]) if v_kind == "tensor" else 1.0)
    written = []  # _finish's statistics: one lane writes each row's max and sum
    for row, top, total, writes in decode._row_totals(cfg, state[0], state[1], lane_g, lane_c):
        for lane in torch.nonzero(writes.v).flatten().tolist():
            r = int(row.v[lane])
            written.append(r)
            if r < cfg.rows:
                assert float(total.v[lane]) == pytest.approx(float(_sum_of(cfg, state, r)), rel=1e-5), (r, lane)
                assert float(top.v[lane]) == float(_max_of(cfg, state, r))
    assert sorted(written) == list(range(8 if cfg.narrow else 16))
    expected = _attention(q_bits, keys, values, pages, context, cfg, hkv, softmax_scale)
    error = float((out - expected).abs().max() / expected.abs().max())
    assert error < 2e-2, f"{case}: relative error {error:.3g}"


def _lanes_of(cfg, row):
    """The state entry (0, 1) and the lanes that hold ``row``."""
    g, c = emu.LANE // 4, emu.LANE % 4
    return (row % 2, c == row // 2) if cfg.narrow else (row // 8, g == row % 8)


def _sum_of(cfg, state, row):
    half, lanes = _lanes_of(cfg, row)
    return state[1][half].v[lanes].double().sum()


def _max_of(cfg, state, row):
    half, lanes = _lanes_of(cfg, row)
    maxima = state[0][half].v[lanes]
    assert bool((maxima == maxima[0]).all()), "a row's lanes disagree on its maximum"
    return maxima[0]


def _gather(cfg, state):
    """Attention rows (rows, D) from one warp's state: each row's accumulators over its sum (summed over its
    lanes). O^T's fragment: lane (g, c), element e holds head-dim row g + 8 (e // 2) of a 16-row tile (head dim
    g D / 8 + 2 tile + e // 2, of the lane's own values) and query column 2c + e % 2 (+ 8 in the second p tile)."""
    acc = state[2]
    dim, g, c = cfg.head_dim, emu.LANE // 4, emu.LANE % 4
    out = torch.zeros((cfg.rows, dim), dtype=torch.float64)
    for row in range(cfg.rows):
        _max_of(cfg, state, row)
        total = _sum_of(cfg, state, row)
        p_tile, column = divmod(row, 8)
        holders = c == column // 2
        for tile in range(dim // 16):
            fragment = acc[tile * cfg.p_tiles + p_tile]
            for e in (column % 2, 2 + column % 2):
                dims = g * (dim // 8) + 2 * tile + e // 2
                out[row, dims[holders]] = fragment[e].v[holders].double() / total
    return out


def _attention(q_bits, keys, values, pages, context, cfg, hkv, scale):
    """float64 attention of the KV head's query rows over the context's tokens (gathered through the pages); query
    i sees positions up to ``context - queries + i``."""
    k = torch.cat([keys[p, :, hkv] for p in pages.tolist()])[:context]
    v = torch.cat([values[p, :, hkv] for p in pages.tolist()])[:context]
    q = emu.half_value(q_bits, "bf16").double()[0]  # (queries, Hq, D)
    out = torch.zeros((cfg.rows, cfg.head_dim), dtype=torch.float64)
    for row in range(cfg.rows):
        query, head = row // cfg.group, hkv * cfg.group + row % cfg.group
        seen = context - cfg.queries + 1 + query
        logits = k[:seen] @ q[query, head] * scale
        p = torch.exp(logits - logits.max())
        out[row] = p @ v[:seen] / p.sum()
    return out

"""write_kv and the paged-attention reference without a GPU: the kernel's PTX for each cache and scale kind (16-byte
loads and stores, the saturating fp8 conversion after a true division, the per-token amax's butterfly, the slot
widened to 64 bits before it meets the cache's stride; assembled for sm_90a without spills), the argument checks
(described tensors: flyc.TensorSpec), the torch reference of write_kv used by test_attention_cache_gpu.py, and
paged_decode_reference against scaled_dot_product_attention over the same keys and values laid out contiguously."""

from __future__ import annotations

import math
import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.attention.cache import FP8_MAX, WriteKVConfig, check_write_kv, write_kv, write_kv_kernel

from .ptxas_report import spill_bytes

WHO = r"flydsl\.kernels\.attention\.write_kv: "


def lower_write_kv(cfg: WriteKVConfig, *, tokens=64, heads=8, slots=4096, source="bf16", slot_dtype="i32"):
    """The kernel compiled for described tensors laid out as write_kv passes them (caches (slots, Hkv, D); fp8:
    (slots, Hkv, D / 8) int64 words)."""
    dim = cfg.head_dim
    k = flyc.TensorSpec((tokens, heads, dim), source)
    fp8 = cfg.cache == "fp8"
    cache = flyc.TensorSpec((slots, heads, dim // 8 if fp8 else dim), "i64" if fp8 else cfg.cache)
    slot_mapping = flyc.TensorSpec((tokens,), slot_dtype)

    def scales(kind):
        shape = {"token": (slots, heads), "tensor": (1,)}.get(kind)
        return slot_mapping if shape is None else flyc.TensorSpec(shape, "f32")

    return write_kv_kernel.lower(
        k, k, cache, cache, slot_mapping, scales(cfg.k_scale), scales(cfg.v_scale), 0.5, 2.0, cfg
    )


def _accesses(ptx: str) -> set:
    return set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx))


@pytest.mark.parametrize(
    "cache,k_scale,v_scale,dim,source,store",
    [
        ("bf16", None, None, 128, "bf16", "st.global.v4.b32"),
        ("f16", None, None, 64, "bf16", "st.global.v4.b32"),  # converted
        ("bf16", None, None, 256, "f16", "st.global.v4.b32"),
        ("fp8", "value", "value", 128, "bf16", "st.global.v4.b32"),  # 16 elements a thread: one 16-byte store
        ("fp8", "tensor", "tensor", 256, "f16", "st.global.v4.b32"),
        ("fp8", "token", "token", 128, "bf16", "st.global.v4.b32"),
        ("fp8", "token", "value", 64, "bf16", "st.global.v4.b32"),
        ("bf16", None, None, 96, "bf16", "st.global.v4.b32"),  # 12 chunks on 16 lanes: the last predicated
        ("fp8", "token", "token", 72, "bf16", "st.global.b64"),  # D % 16 != 0: 8 elements, one 8-byte store
        ("fp8", "tensor", "token", 576, "bf16", "st.global.v4.b32"),  # 36 chunks on 32 lanes, 2 each
    ],
)
def test_write_kv_kernel_uses_16_byte_accesses_and_assembles(cache, k_scale, v_scale, dim, source, store):
    cfg = WriteKVConfig(head_dim=dim, cache=cache, k_scale=k_scale, v_scale=v_scale)
    module = lower_write_kv(cfg, source=source)
    ptx = module.ptx
    accesses = _accesses(ptx)
    assert "ld.global.v4.b32" in accesses and store in accesses  # k and v rows in 16-byte chunks
    assert not any(a.startswith("ld.global") and a.endswith((".b16", ".u16", ".b8", ".u8")) for a in accesses)
    fp8 = cache == "fp8"
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == fp8
    divisions = 2 * cfg.per_thread * cfg.vec if fp8 else 0  # value / scale for each value a thread holds
    assert len(re.findall(r"div\.rn\.f32", ptx)) == divisions
    assert not re.search(r"div\.(approx|full)|rcp\.", ptx)
    tokens = [k_scale, v_scale].count("token")
    shuffles = len(re.findall(r"shfl\.sync\.bfly\.b32", ptx))
    assert shuffles == tokens * int(math.log2(cfg.lanes))  # each per-token row's amax: a butterfly over its lanes
    assert len(re.findall(r"st\.global\.b32\b", ptx)) == tokens  # and one scale store
    if flyc.toolchain.find_ptxas() is not None:
        assert module.cubin is not None
        assert spill_bytes(ptx) == 0


@pytest.mark.parametrize("slot_dtype,load", [("i32", "ld.global.s32"), ("i64", "ld.global.b64")])
@pytest.mark.parametrize("cache,scale", [("bf16", None), ("fp8", "token")])
def test_cache_offsets_are_64_bit(cache, scale, slot_dtype, load):
    """The slot is loaded into a 64-bit register (int32 slots sign-extended) and multiplied by the cache's row stride
    in 64 bits, in the ordinary binary and in the one for caches past 2^31 elements."""
    cfg = WriteKVConfig(head_dim=128, cache=cache, k_scale=scale, v_scale=scale)
    for slots in (4096, 16 * 300_000):  # 300k blocks of 16 x 8 x 128: 4.9e9 elements
        module = lower_write_kv(cfg, slots=slots, slot_dtype=slot_dtype)
        ptx = module.ptx
        slot = re.search(rf"{re.escape(load)}\s+(%rd\d+),", ptx)
        assert slot, ptx
        assert re.search(rf"(?:mul|mad)\.lo\.s64\s+[^;]*{slot.group(1)}\b", ptx)
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= _accesses(ptx)
        if flyc.toolchain.find_ptxas() is not None:
            assert module.cubin is not None


@pytest.mark.parametrize(
    "dim,cache,vec,lanes,per_thread,ragged",
    [
        (128, "bf16", 8, 16, 1, False),
        (64, "f16", 8, 8, 1, False),
        (256, "bf16", 8, 32, 1, False),
        (128, "fp8", 16, 8, 1, False),
        (256, "fp8", 16, 16, 1, False),
        (72, "fp8", 8, 16, 1, True),
        (576, "bf16", 8, 32, 3, True),
        (8, "fp8", 8, 1, 1, False),
    ],
)
def test_write_kv_config_lays_rows_out_on_lanes(dim, cache, vec, lanes, per_thread, ragged):
    scale = "tensor" if cache == "fp8" else None
    cfg = WriteKVConfig(head_dim=dim, cache=cache, k_scale=scale, v_scale=scale)
    assert (cfg.vec, cfg.lanes, cfg.per_thread, cfg.ragged) == (vec, lanes, per_thread, ragged)
    assert cfg.teams == cfg.block // lanes and cfg.grid(1000) == -(-1000 // cfg.teams)


def test_write_kv_config_is_checked():
    with pytest.raises(ValueError, match="head_dim must be a multiple of 8"):
        WriteKVConfig(head_dim=100, cache="bf16")
    with pytest.raises(ValueError, match="an fp8 cache needs scale kinds"):
        WriteKVConfig(head_dim=128, cache="fp8")
    with pytest.raises(ValueError, match="an fp8 cache needs scale kinds"):
        WriteKVConfig(head_dim=128, cache="bf16", k_scale="token", v_scale="token")
    with pytest.raises(ValueError, match="block must be a multiple of 32"):
        WriteKVConfig(head_dim=128, cache="bf16", block=48)


# --- argument checks ------------------------------------------------------------------------------------------------

_ADDRESSES = iter(range(1 << 32, 1 << 60, 1 << 40))  # described tensors far apart: no false overlaps


def spec(shape, dtype, strides=None, at=None):
    """A described tensor (no memory, device 0) at an address of its own (or ``at``: to make overlaps)."""
    t = flyc.TensorSpec(shape, dtype, strides)
    t.pointer = next(_ADDRESSES) if at is None else at
    return t


def _arguments(cache="f8E4M3FN", tokens=5, heads=2, dim=64, blocks=4, block_size=16):
    k = spec((tokens, heads, dim), "bf16")
    v = spec((tokens, heads, dim), "bf16")
    caches = [spec((blocks, block_size, heads, dim), cache) for _ in range(2)]
    scale = 0.5 if cache == "f8E4M3FN" else None
    return dict(
        k=k,
        v=v,
        k_cache=caches[0],
        v_cache=caches[1],
        slot_mapping=spec((tokens,), "i64"),
        k_scale=scale,
        v_scale=scale,
    )


def test_valid_arguments_give_the_kernel_configuration():
    args = _arguments()
    assert check_write_kv(**args) == (WriteKVConfig(head_dim=64, cache="fp8", k_scale="value", v_scale="value"), 10)
    args.update(k_scale=spec((1, 1), "f32"), v_scale=spec((4, 16, 2), "f32"))
    assert check_write_kv(**args)[0] == WriteKVConfig(head_dim=64, cache="fp8", k_scale="tensor", v_scale="token")
    args = _arguments("bf16", tokens=0)
    assert check_write_kv(**args) == (WriteKVConfig(head_dim=64, cache="bf16"), 0)


@pytest.mark.parametrize(
    "change,error,message",
    [
        (dict(k=((5, 2, 64), "f32")), TypeError, "k: expected dtype bfloat16 or float16, got float32"),
        (dict(k=((5, 128), "bf16")), ValueError, r"k: expected a 3-D tensor \(T, Hkv, D\), got shape \(5, 128\)"),
        (dict(k=((5, 2, 100), "bf16")), ValueError, "k: head size D = 100: expected a multiple of 8"),
        (dict(k=((5, 2, 2048), "bf16")), ValueError, "k: head size D = 2048: expected a multiple of 8 .* to 1024"),
        (dict(v=((5, 2, 32), "bf16")), ValueError, r"v: expected shape \(5, 2, 64\) \(k's\), got \(5, 2, 32\)"),
        (dict(v=((5, 2, 64), "f16")), TypeError, r"v: expected dtype bfloat16 \(k's\), got float16"),
        (dict(v=((5, 2, 64), "bf16", (128, 1, 2))), ValueError, "v: expected unit stride on D"),
        (
            dict(k_cache=((4, 16, 4, 64), "f8E4M3FN")),
            ValueError,
            r"k_cache: expected shape \(num_blocks, block_size, 2, 64\)",
        ),
        (
            dict(k_cache=((4, 16, 2, 64), "f8E5M2")),
            TypeError,
            "k_cache: expected dtype bfloat16, float16 or float8_e4m3fn, got float8_e5m2",
        ),
        (dict(v_cache=((4, 16, 2, 64), "bf16")), TypeError, r"v_cache: expected dtype float8_e4m3fn \(k_cache's\)"),
        (
            dict(v_cache=((8, 16, 2, 64), "f8E4M3FN")),
            ValueError,
            r"v_cache: expected shape \(4, 16, 2, 64\) \(k_cache's\)",
        ),
        (
            dict(k_cache=((4, 16, 2, 64), "f8E4M3FN", (4096, 128, 64, 1))),
            ValueError,
            "k_cache: expected a contiguous cache",
        ),
        (dict(slot_mapping=((5,), "f32")), TypeError, "slot_mapping: expected int32 or int64, got float32"),
        (
            dict(slot_mapping=((6,), "i32")),
            ValueError,
            r"slot_mapping: expected shape \(5,\) \(one slot per token of k\)",
        ),
        (dict(k_scale=None), ValueError, r"k_scale: an fp8 cache needs a scale: .* float32 \(4, 16, 2\) tensor"),
        (dict(v_scale=0.0), ValueError, "v_scale: expected a positive finite scale, got 0.0"),
        (dict(v_scale=math.nan), ValueError, "v_scale: expected a positive finite scale, got nan"),
        (
            dict(k_scale=((2,), "f32")),
            ValueError,
            r"k_scale: expected one float32 scale .* \(4, 16, 2\), got shape \(2,\)",
        ),
        (dict(k_scale=((1,), "bf16")), TypeError, "k_scale: expected dtype float32, got bfloat16"),
        (dict(v_scale=((4, 16, 2), "f32", (64, 2, 1))), ValueError, "v_scale: expected contiguous per-token scales"),
    ],
)
def test_write_kv_arguments_are_refused_naming_them(change, error, message):
    """Refused by write_kv itself, before anything is launched (described tensors: no memory)."""
    args = _arguments()
    args.update({name: spec(*value) if isinstance(value, tuple) else value for name, value in change.items()})
    with pytest.raises(error, match=WHO + message):
        write_kv(**args)


def test_16_bit_caches_take_no_scale():
    args = _arguments("bf16")
    args["v_scale"] = 0.5
    with pytest.raises(ValueError, match=WHO + "v_scale: a 16-bit cache holds the values themselves: expected None"):
        write_kv(**args)


def test_written_memory_must_not_overlap():
    args = _arguments()
    args["v_cache"] = spec((4, 16, 2, 64), "f8E4M3FN", at=args["k_cache"].pointer + 64)
    with pytest.raises(ValueError, match=WHO + "v_cache: overlaps k_cache in memory"):
        write_kv(**args)
    args = _arguments()
    shared = spec((4, 16, 2), "f32")
    args.update(k_scale=shared, v_scale=shared)
    with pytest.raises(ValueError, match=WHO + "v_scale: overlaps k_scale in memory"):
        write_kv(**args)
    args = _arguments()
    args["k_scale"] = spec((4, 16, 2), "f32", at=args["v_cache"].pointer)
    with pytest.raises(ValueError, match=WHO + "k_scale: overlaps v_cache in memory"):
        write_kv(**args)


def test_rows_are_counted_in_32_bits():
    args = _arguments("bf16", tokens=1 << 28, heads=8, dim=8)
    with pytest.raises(ValueError, match=WHO + r"k: expected fewer than 2\^31 \(token, head\) rows"):
        write_kv(**args)


def test_cpu_tensors_are_refused():
    torch = pytest.importorskip("torch")
    k = torch.zeros(3, 2, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=WHO + "k: expected a CUDA tensor, got one on cpu"):
        write_kv(k, k, cache, cache.clone(), torch.zeros(3, dtype=torch.int32))


# --- the torch reference of write_kv (test_attention_cache_gpu.py's) -----------------------------------------------


def reference_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """write_kv by its definition, on copies: ``(k_cache, v_cache, k_scale, v_scale)`` after the call (scale tensors
    per token copied and written; others as given). Tokens whose slot is negative or past the cache are skipped;
    fp8 rows are ``value / scale`` (a true division: the scale as a tensor) clamped to +-448 and cast (torch rounds
    to nearest even, as cvt.rn.satfinite), per token with ``scale = amax * (1 / 448)`` and a divisor of 1 where it
    is 0."""
    import torch

    out = []
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        cache = cache.clone()
        rows = cache.view(-1, *cache.shape[2:])
        keep = (slot_mapping >= 0) & (slot_mapping < rows.shape[0])
        slots, x = slot_mapping[keep].long(), x[keep]
        if cache.dtype != torch.float8_e4m3fn:
            rows[slots] = x.to(cache.dtype)
            out.append((cache, scale))
            continue
        rows = rows.view(torch.uint8)  # (fp8 indexing is not on every device: its bytes are)
        if isinstance(scale, float):
            divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
        elif scale.dim() == 3:
            amax = x.float().abs().amax(dim=-1)  # (tokens, Hkv)
            per_row = amax * (1.0 / FP8_MAX)
            scale = scale.clone()
            scale.view(-1, scale.shape[2])[slots] = per_row
            divisor = torch.where(per_row == 0, torch.ones_like(per_row), per_row)[..., None]
        else:
            divisor = scale.reshape(())
        rows[slots] = (x.float() / divisor).clamp(-FP8_MAX, FP8_MAX).to(cache.dtype).view(torch.uint8)
        out.append((cache, scale))
    (k_cache, k_scale), (v_cache, v_scale) = out
    return k_cache, v_cache, k_scale, v_scale


def test_reference_write_kv_round_trips_through_gather_kv():
    """What the reference writes for a sequence's slots reads back through gather_kv: exactly (bf16), within fp8's
    rounding (per tensor and per token); skipped tokens leave their rows alone."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.attention.reference import gather_kv

    generator = torch.Generator().manual_seed(0)
    tokens, heads, dim, blocks, block_size = 20, 2, 64, 6, 4
    k = torch.randn(tokens, heads, dim, generator=generator).to(torch.bfloat16)
    v = torch.randn(tokens, heads, dim, generator=generator).to(torch.bfloat16)
    k[3] = 0
    table = torch.randperm(blocks, generator=generator)[:5].to(torch.int32)  # 20 positions on 5 pages
    slots = table.long().repeat_interleave(block_size) * block_size + torch.arange(tokens) % block_size
    lens = torch.tensor([tokens], dtype=torch.int32)
    for dtype, scale in ((torch.bfloat16, None), (torch.float8_e4m3fn, 0.01), (torch.float8_e4m3fn, "token")):
        caches = [torch.full((blocks, block_size, heads, dim), float("nan")).to(dtype) for _ in range(2)]
        scales = torch.full((blocks, block_size, heads), float("nan")) if scale == "token" else scale
        kc, vc, ks, vs = reference_write_kv(k, v, *caches, slots, scales, None if scales is None else scales)
        k_back, v_back = gather_kv(kc, vc, table[None], lens, 0, k_scale=ks, v_scale=vs)
        bound = 0 if scale is None else 2.0**-4 * k.float().abs() + 0.01 * 2.0**-9
        assert ((k_back - k.float()).abs() <= bound).all() and not k_back.isnan().any()
        if scale == "token":
            assert (ks.view(-1, heads)[slots[3]] == 0).all() and (k_back[3] == 0).all()  # zeros stay zeros
        unused = torch.ones(blocks, dtype=torch.bool)
        unused[table.long()] = False
        assert kc[unused].float().isnan().all() and vc[unused].float().isnan().all()
        skipped = slots.clone()
        skipped[::2] = -1
        kc2, _, _, _ = reference_write_kv(k, v, *caches, skipped, scales, scales)
        untouched = kc2.view(-1, heads, dim)[slots].float().isnan().flatten(1).all(dim=1)
        assert torch.equal(untouched, skipped < 0)


# --- paged_decode_reference -----------------------------------------------------------------------------------------


def _paged(torch, generator, lengths, heads, dim, block_size, dtype, scale=None):
    """Contiguous keys and values per sequence (float32, rounded to what the cache holds) and the same scattered into
    NaN-poisoned pages of a random block table: ``(ks, vs, k_cache, v_cache, block_tables, context_lens, k_scale,
    v_scale)``. ``scale``: None, a float (per tensor) or "token" (per (token, head) scales of random magnitudes)."""
    pages = [-(-n // block_size) for n in lengths]
    blocks = sum(pages) + 3
    order = torch.randperm(blocks, generator=generator)
    tables = torch.full((len(lengths), max(pages) + 1), blocks + 7, dtype=torch.int32)  # junk past each sequence
    k_cache = torch.full((blocks, block_size, heads, dim), float("nan")).to(dtype)
    v_cache = k_cache.clone()
    scales = [torch.full((blocks, block_size, heads), float("nan")) for _ in range(2)] if scale == "token" else None
    ks, vs, start = [], [], 0
    for b, n in enumerate(lengths):
        tables[b, : pages[b]] = order[start : start + pages[b]].to(torch.int32)
        start += pages[b]
        position = torch.arange(n)
        block, row = tables[b, position // block_size].long(), position % block_size
        contiguous = []
        for cache, which in ((k_cache, 0), (v_cache, 1)):
            x = torch.randn(n, heads, dim, generator=generator)
            if scale is None:
                cache[block, row] = x.to(dtype)
                contiguous.append(cache[block, row].float())
                continue
            factor = scale if scale != "token" else 2.0 ** torch.randint(-6, 2, (n, heads, 1), generator=generator)
            cache[block, row] = (x / factor).to(dtype)
            if scale == "token":
                scales[which][block, row] = factor[..., 0]
            contiguous.append(cache[block, row].float() * factor)
        ks.append(contiguous[0])
        vs.append(contiguous[1])
    lens = torch.tensor(lengths, dtype=torch.int32)
    k_scale, v_scale = (scale, scale) if scale != "token" else scales
    return ks, vs, k_cache, v_cache, tables, lens, k_scale, v_scale


def _expected(torch, q, ks, vs, scale, window=None, soft_cap=None):
    """Per sequence: scaled_dot_product_attention over its contiguous keys (kv heads repeated for the query heads)
    with a boolean mask of the causal tail and the window; with a soft cap the same masked softmax written out."""
    import torch.nn.functional as F

    out = []
    for b in range(q.shape[0]):
        queries = q[b].float().transpose(0, 1)  # (Hq, Q, D)
        count, n = queries.shape[1], ks[b].shape[0]
        group = queries.shape[0] // ks[b].shape[1]
        k = ks[b].repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, n, D)
        v = vs[b].repeat_interleave(group, dim=1).transpose(0, 1)
        position = torch.arange(n - count, n)[:, None]
        key = torch.arange(n)[None, :]
        mask = (key <= position) & ((key > position - window) if window else True)
        if soft_cap is None:
            o = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask, scale=scale)
        else:
            logits = soft_cap * torch.tanh(queries @ k.transpose(1, 2) * scale / soft_cap)
            o = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1) @ v
        out.append(o.transpose(0, 1))
    return torch.stack(out)


@pytest.mark.parametrize(
    "count,q_heads,kv_heads,window,soft_cap",
    [
        (1, 8, 2, None, None),
        (3, 8, 2, None, None),  # the causal tail
        (3, 4, 4, 5, None),  # sliding window
        (1, 8, 1, 7, None),
        (3, 8, 2, None, 30.0),  # soft cap
        (2, 6, 2, 4, 5.0),
    ],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_paged_decode_reference_is_attention_over_the_contiguous_keys(
    count, q_heads, kv_heads, window, soft_cap, dtype
):
    torch = pytest.importorskip("torch")
    from flydsl.kernels.attention.reference import gather_kv, paged_decode_reference

    generator = torch.Generator().manual_seed(count * 100 + q_heads + (window or 0))
    lengths, dim, block_size = [1 + count, 17, 64, 33], 64, 16
    ks, vs, k_cache, v_cache, tables, lens, _, _ = _paged(
        torch, generator, lengths, kv_heads, dim, block_size, getattr(torch, dtype)
    )
    q = torch.randn(len(lengths), count, q_heads, dim, generator=generator).to(getattr(torch, dtype))
    for b in range(len(lengths)):
        k, v = gather_kv(k_cache, v_cache, tables, lens, b)
        assert torch.equal(k, ks[b]) and torch.equal(v, vs[b])  # exactly what was scattered, in position order
    out = paged_decode_reference(q, k_cache, v_cache, tables, lens, sliding_window=window, soft_cap=soft_cap)
    expected = _expected(torch, q, ks, vs, 1 / math.sqrt(dim), window, soft_cap)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    if count == 1:  # (B, Hq, D): one query per sequence
        single = paged_decode_reference(
            q[:, 0], k_cache, v_cache, tables, lens, sliding_window=window, soft_cap=soft_cap
        )
        assert single.shape == q[:, 0].shape and torch.equal(single, out[:, 0])


@pytest.mark.parametrize("scale", [0.03, "token"])
def test_paged_decode_reference_dequantizes_fp8_caches(scale):
    torch = pytest.importorskip("torch")
    from flydsl.kernels.attention.reference import paged_decode_reference

    generator = torch.Generator().manual_seed(7)
    lengths, heads, dim = [5, 40, 16], 2, 128
    ks, vs, k_cache, v_cache, tables, lens, k_scale, v_scale = _paged(
        torch, generator, lengths, heads, dim, 16, torch.float8_e4m3fn, scale
    )
    q = torch.randn(len(lengths), 2, 4, dim, generator=generator)
    if scale != "token":  # a one-element tensor reads as the float
        k_scale = torch.tensor([scale])
    out = paged_decode_reference(q, k_cache, v_cache, tables, lens, scale=0.1, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, _expected(torch, q, ks, vs, 0.1), rtol=1e-5, atol=1e-5)


def test_a_window_of_one_sees_only_its_own_key():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.attention.reference import paged_decode_reference

    generator = torch.Generator().manual_seed(3)
    _, vs, k_cache, v_cache, tables, lens, _, _ = _paged(torch, generator, [9, 20], 2, 64, 8, torch.bfloat16)
    q = torch.randn(2, 3, 4, 64, generator=generator)
    out = paged_decode_reference(q, k_cache, v_cache, tables, lens, sliding_window=1)
    for b, n in enumerate((9, 20)):
        torch.testing.assert_close(out[b], vs[b][n - 3 :].repeat_interleave(2, dim=1))


def test_paged_decode_reference_refuses_what_it_cannot_mean():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.attention.reference import paged_decode_reference

    cache = torch.zeros(2, 16, 2, 64)
    tables = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"context_lens: sequence 0 has 2 positions, fewer than Q = 3 queries"):
        paged_decode_reference(torch.zeros(1, 3, 4, 64), cache, cache, tables, torch.tensor([2], dtype=torch.int32))
    with pytest.raises(
        ValueError, match=r"k_cache: expected \(num_blocks, block_size, Hkv, 64\) with Hkv dividing Hq = 3"
    ):
        paged_decode_reference(torch.zeros(1, 3, 64), cache, cache, tables, torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="sliding_window: expected a positive number of keys"):
        paged_decode_reference(
            torch.zeros(1, 4, 64), cache, cache, tables, torch.ones(1, dtype=torch.int32), sliding_window=0
        )

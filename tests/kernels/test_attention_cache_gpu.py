"""write_kv on the GPU against its definition (test_attention_cache.reference_write_kv), bit for bit: caches poisoned
first (16-bit: NaN; fp8: the byte 0x5A; per-token scales: NaN), so every row the kernel should not touch is checked
unchanged, and every row it writes is compared. Inputs are strided views of a fused qkv buffer with magnitudes of
their own per (token, head) (per-token scales differ from row to row), a row of zeros and, per token, a row holding
NaN; some slots are negative (skipped) and one is past the cache (skipped)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.attention.cache import write_kv  # noqa: E402

from .test_attention_cache import reference_write_kv  # noqa: E402
from .test_quantize import assert_same_fp8, assert_same_scales  # noqa: E402

DEVICE = "cuda"
POISON = 0x5A  # an fp8 byte that is a number (not NaN): a stray write of any other byte shows
_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "fp8": torch.float8_e4m3fn}


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _inputs(tokens, heads, dim, dtype, generator, strided=True):
    """``k``, ``v`` (T, Hkv, D): views of a fused (T, (2 Hkv + 2 Hkv + Hkv) D) qkv buffer (query heads first: token
    stride 5 Hkv D) or contiguous, each (token, head) row of a magnitude 2^-8 .. 2^8 of its own."""
    width = 5 * heads * dim if strided else 2 * heads * dim
    qkv = torch.randn(tokens, width, device=DEVICE, generator=generator)
    rows = qkv.view(tokens, -1, dim)
    rows *= 2.0 ** torch.randint(-8, 9, (tokens, rows.shape[1], 1), device=DEVICE, generator=generator).float()
    qkv = qkv.to(dtype)
    start = 2 * heads * dim if strided else 0
    k = qkv[:, start : start + heads * dim].view(tokens, heads, dim)
    v = qkv[:, start + heads * dim : start + 2 * heads * dim].view(tokens, heads, dim)
    return k, v


def _slots(tokens, num_slots, dtype, generator, skip=True):
    """Distinct random slots; with ``skip`` every seventh negative (padding) and one past the cache."""
    slots = torch.randperm(num_slots, device=DEVICE, generator=generator)[:tokens]
    if skip:
        slots[3::7] = -1
        slots[tokens // 2] = num_slots + 5 if tokens > 1 else slots[0]
    return slots.to(dtype)


def _poisoned(blocks, block_size, heads, dim, dtype):
    shape = (blocks, block_size, heads, dim)
    if dtype == torch.float8_e4m3fn:
        return torch.full(shape, POISON, dtype=torch.uint8, device=DEVICE).view(dtype)
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _scale_args(kind, x, shape):
    """A scale argument of ``kind``: "float", "tensor" (one element), "token" (NaN-poisoned (blocks, bs, Hkv)) or
    None; per tensor a quarter of what covers x's amax, so the largest values saturate."""
    if kind is None:
        return None
    if kind == "token":
        return torch.full(shape, float("nan"), device=DEVICE)
    scale = x.float().abs().amax().item() / 448.0 / 4
    return scale if kind == "float" else torch.tensor([scale], device=DEVICE)


def _assert_same_cache(cache, expected):
    if cache.dtype == torch.float8_e4m3fn:
        assert_same_fp8(cache, expected)  # equal bytes; NaN where the reference has NaN (a NaN row's)
    else:
        assert torch.equal(cache.view(torch.int16), expected.view(torch.int16))  # NaN poison: same bits


def _check(k, v, k_cache, v_cache, slots, k_scale=None, v_scale=None):
    """write_kv in place against the reference on copies of the same (poisoned) caches and scales."""
    expected = reference_write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    write_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    torch.cuda.synchronize()
    _assert_same_cache(k_cache, expected[0])
    _assert_same_cache(v_cache, expected[1])
    for scale, reference in ((k_scale, expected[2]), (v_scale, expected[3])):
        if isinstance(scale, torch.Tensor) and scale.dim() == 3:
            assert_same_scales(scale, reference)


# (cache dtype, k scale kind, v scale kind)
CACHES = [
    ("bf16", None, None),
    ("f16", None, None),
    ("fp8", "float", "float"),
    ("fp8", "tensor", "tensor"),
    ("fp8", "token", "token"),
    ("fp8", "token", "float"),
]


@pytest.mark.parametrize("tokens", [1, 77, 4096])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("cache,k_kind,v_kind", CACHES)
def test_write_kv_is_the_reference(cache, k_kind, v_kind, dim, tokens):
    """D = 128 from fp16 inputs, the others from bf16 (into a 16-bit cache of the other dtype: converted); int64
    slots for odd T, int32 otherwise."""
    generator = _generator(dim + tokens)
    heads, block_size = 8, 16
    source = torch.float16 if dim == 128 else torch.bfloat16
    k, v = _inputs(tokens, heads, dim, source, generator)
    k[0, 0] = 0  # a row of zeros: scale 0, zeros
    for x, kind in ((k, k_kind), (v, v_kind)):
        if kind == "token" and tokens > 2:
            x[-1, 1, 5] = float("nan")  # that row's scale and values NaN
    blocks = -(-tokens * 3 // 2 // block_size) + 2  # a third of the slots left untouched
    slots = _slots(tokens, blocks * block_size, torch.int64 if tokens % 2 else torch.int32, generator)
    k_cache, v_cache = (_poisoned(blocks, block_size, heads, dim, _DTYPES[cache]) for _ in range(2))
    k_scale = _scale_args(k_kind, k, (blocks, block_size, heads))
    v_scale = _scale_args(v_kind, v, (blocks, block_size, heads))
    _check(k, v, k_cache, v_cache, slots, k_scale, v_scale)


@pytest.mark.parametrize("dim", [8, 72, 96, 576])
@pytest.mark.parametrize("cache,k_kind,v_kind", [("bf16", None, None), ("fp8", "token", "tensor")])
def test_head_sizes_that_leave_lanes_idle(cache, k_kind, v_kind, dim):
    """D / chunk not a power of two (the row's last chunks predicated) or more chunks than a warp (several per
    thread); three kv heads, pages of 8, contiguous inputs."""
    generator = _generator(dim)
    tokens, heads, block_size, blocks = 50, 3, 8, 10
    k, v = _inputs(tokens, heads, dim, torch.bfloat16, generator, strided=False)
    slots = _slots(tokens, blocks * block_size, torch.int32, generator)
    k_cache, v_cache = (_poisoned(blocks, block_size, heads, dim, _DTYPES[cache]) for _ in range(2))
    k_scale = _scale_args(k_kind, k, (blocks, block_size, heads))
    v_scale = _scale_args(v_kind, v, (blocks, block_size, heads))
    _check(k, v, k_cache, v_cache, slots, k_scale, v_scale)


def test_no_tokens_writes_nothing():
    k = torch.empty(0, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    k_cache, v_cache = (_poisoned(4, 16, 8, 128, torch.bfloat16) for _ in range(2))
    write_kv(k, k, k_cache, v_cache, torch.empty(0, dtype=torch.int32, device=DEVICE))
    torch.cuda.synchronize()
    assert k_cache.isnan().all() and v_cache.isnan().all()


@pytest.mark.parametrize("cache,kind", [("bf16", None), ("fp8", "token")])
def test_write_kv_is_captured_in_a_cuda_graph(graphed, cache, kind):
    """Captured once, replayed with new tokens and slots copied into the same tensors: the slots are read on the
    device only."""
    generator = _generator(11)
    tokens, heads, dim, block_size, blocks = 96, 8, 128, 16, 12
    k, v = _inputs(tokens, heads, dim, torch.bfloat16, generator)
    slots = _slots(tokens, blocks * block_size, torch.int64, generator)
    k_cache, v_cache = (_poisoned(blocks, block_size, heads, dim, _DTYPES[cache]) for _ in range(2))
    scales = [_scale_args(kind, k, (blocks, block_size, heads)) for _ in range(2)]
    graph, _ = graphed(lambda: write_kv(k, v, k_cache, v_cache, slots, k_scale=scales[0], v_scale=scales[1]))
    new_k, new_v = _inputs(tokens, heads, dim, torch.bfloat16, generator)
    k.copy_(new_k)
    v.copy_(new_v)
    slots.copy_(_slots(tokens, blocks * block_size, torch.int64, generator))
    fresh = [_poisoned(blocks, block_size, heads, dim, _DTYPES[cache]) for _ in range(2)]
    k_cache.copy_(fresh[0])
    v_cache.copy_(fresh[1])
    for s in scales:
        if s is not None:
            s.fill_(float("nan"))
    expected = reference_write_kv(k, v, k_cache, v_cache, slots, *scales)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_cache(k_cache, expected[0])
    _assert_same_cache(v_cache, expected[1])
    if kind == "token":
        assert_same_scales(scales[0], expected[2])
        assert_same_scales(scales[1], expected[3])


@pytest.mark.parametrize("cache,kind", [("bf16", None), ("fp8", "token")])
def test_caches_past_2_31_elements(cache, kind):
    """Caches of more than 2^31 elements (131088 pages of 16 x 8 x 128), tokens written to the first and the last
    pages: the slot's offset computed in 64 bits."""
    if torch.cuda.get_device_properties(0).total_memory < 48 << 30:
        pytest.skip("needs 48 GiB of GPU memory (two caches of 2^31 elements and their references)")
    generator = _generator(5)
    tokens, heads, dim, block_size = 64, 8, 128, 16
    blocks = (1 << 31) // (block_size * heads * dim) + 16
    k, v = _inputs(tokens, heads, dim, torch.bfloat16, generator)
    num_slots = blocks * block_size
    slots = torch.cat([torch.arange(8), torch.arange(num_slots - tokens + 8, num_slots)]).to(DEVICE)
    slots = slots[torch.randperm(tokens, device=DEVICE, generator=generator)]
    k_cache, v_cache = (_poisoned(blocks, block_size, heads, dim, _DTYPES[cache]) for _ in range(2))
    assert k_cache.numel() > 1 << 31
    scales = [_scale_args(kind, x, (blocks, block_size, heads)) for x in (k, v)]
    _check(k, v, k_cache, v_cache, slots, *scales)


def test_tensors_on_two_devices_are_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    k = torch.zeros(4, 2, 64, dtype=torch.bfloat16, device="cuda:0")
    k_cache = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16, device="cuda:0")
    v_cache = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16, device="cuda:1")
    slots = torch.zeros(4, dtype=torch.int32, device="cuda:0")
    with pytest.raises(ValueError, match=r"write_kv: v_cache: expected a tensor on cuda:0 \(the input's\), got cuda:1"):
        write_kv(k, k, k_cache, v_cache, slots)

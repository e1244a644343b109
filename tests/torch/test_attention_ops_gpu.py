"""torch.ops.flydsl.paged_decode and write_kv on the GPU: the ops give the kernels' results (flydsl.kernels.attention,
bit for bit) and the float32 reference's (bf16 caches; fp8 caches with scales per tensor, as one-element tensors, and
per token and head); a decode step (write_kv of each sequence's new token, then paged_decode over the caches it wrote)
compiled with torch.compile(fullgraph=True) equals the eager step, caches included; the step, eager or compiled, is
captured in a CUDA graph once and replayed with new queries, keys, values, slots and context lengths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flydsl.torch  # noqa: E402, F401  (registers the ops)
from flydsl.kernels.attention import paged_decode, write_kv  # noqa: E402
from flydsl.kernels.attention.reference import paged_decode_reference  # noqa: E402

pytestmark = pytest.mark.gpu

E4M3 = torch.float8_e4m3fn
BLOCK = 16
TOLERANCE = {None: 1e-2, "tensor": 2e-2, "token": 2e-2}  # relative error against the reference (as the kernels')


def _relative_error(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def _same_bytes(a, b) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


class Paged:
    """Caches of random keys and values (fp8: quantized with scales per tensor, one-element float32 tensors, or per
    token and head) and block tables: each sequence owns ``max_blocks`` distinct random pages (so any context length
    up to ``capacity`` is valid), a few pages spare."""

    def __init__(self, *, fp8=None, batch=3, q_heads=8, kv_heads=2, dim=128, max_blocks=8, seed=0):
        g = self.generator = torch.Generator(device="cuda").manual_seed(seed)
        self.fp8, self.batch, self.q_heads, self.kv_heads, self.dim = fp8, batch, q_heads, kv_heads, dim
        self.capacity = max_blocks * BLOCK
        blocks = batch * max_blocks + 3
        shape = (blocks, BLOCK, kv_heads, dim)
        k = torch.randn(shape, device="cuda", generator=g)
        v = torch.randn(shape, device="cuda", generator=g)
        if fp8 is None:
            self.k_cache, self.v_cache = k.bfloat16(), v.bfloat16()
            self.k_scale = self.v_scale = None
        elif fp8 == "tensor":
            self.k_scale = torch.tensor([0.02], device="cuda")
            self.v_scale = torch.tensor([0.03], device="cuda")
            self.k_cache = (k / 0.02).clamp(-448, 448).to(E4M3)
            self.v_cache = (v / 0.03).clamp(-448, 448).to(E4M3)
        else:
            self.k_scale = k.abs().amax(-1) / 448.0
            self.v_scale = v.abs().amax(-1) / 448.0
            self.k_cache = (k / self.k_scale[..., None]).to(E4M3)
            self.v_cache = (v / self.v_scale[..., None]).to(E4M3)
        pages = torch.randperm(blocks, device="cuda", generator=g)[: batch * max_blocks]
        self.tables = pages.view(batch, max_blocks).to(torch.int32).contiguous()

    def state(self) -> tuple:
        """What a decode step writes: the caches and the scales (None for 16-bit caches)."""
        return self.k_cache, self.v_cache, self.k_scale, self.v_scale

    def clone(self) -> Paged:
        other = object.__new__(Paged)
        other.__dict__.update(self.__dict__)
        other.k_cache, other.v_cache = self.k_cache.clone(), self.v_cache.clone()
        other.k_scale = None if self.k_scale is None else self.k_scale.clone()
        other.v_scale = None if self.v_scale is None else self.v_scale.clone()
        return other

    def queries(self, count=1):
        shape = (self.batch, self.q_heads, self.dim) if count == 1 else (self.batch, count, self.q_heads, self.dim)
        return torch.randn(shape, device="cuda", generator=self.generator).bfloat16()

    def new_tokens(self, lengths):
        """One new token per sequence, its last position (``length - 1``): ``(k, v, slots, lens)``, k and v (B, Hkv,
        D) bf16, slots int64 (block ``tables[b, p // BLOCK]``, row ``p % BLOCK``), lens int32."""
        lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        position = lens.long() - 1
        page = self.tables.long().gather(1, (position // BLOCK)[:, None])[:, 0]
        slots = page * BLOCK + position % BLOCK
        shape = (self.batch, self.kv_heads, self.dim)
        k = torch.randn(shape, device="cuda", generator=self.generator).bfloat16()
        v = torch.randn(shape, device="cuda", generator=self.generator).bfloat16()
        return k, v, slots, lens

    def reference(self, q, lens, **options):
        return paged_decode_reference(
            q, self.k_cache, self.v_cache, self.tables, lens, k_scale=self.k_scale, v_scale=self.v_scale, **options
        )


def _step(q, k, v, slots, lens, tables, k_cache, v_cache, k_scale, v_scale, max_context: int):
    """A decode step: the new tokens into the caches, then attention over them (context lengths include them)."""
    torch.ops.flydsl.write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    return torch.ops.flydsl.paged_decode(
        q, k_cache, v_cache, tables, lens, None, k_scale, v_scale, None, None, max_context
    )


# --- the ops against the kernels and the reference -------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [None, "tensor", "token"])
def test_paged_decode_op_equals_the_kernel_and_the_reference(fp8):
    paged = Paged(fp8=fp8)
    q = paged.queries()
    lens = torch.tensor((1, 37, paged.capacity), dtype=torch.int32, device="cuda")
    args = (q, paged.k_cache, paged.v_cache, paged.tables, lens)
    out = torch.ops.flydsl.paged_decode(*args, None, paged.k_scale, paged.v_scale)
    expected = paged_decode(*args, k_scale=paged.k_scale, v_scale=paged.v_scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.equal(out, expected)
    given = torch.full_like(q, float("nan"))
    torch.ops.flydsl.paged_decode_out(*args, None, paged.k_scale, paged.v_scale, None, None, None, out=given)
    assert torch.equal(given, expected)
    assert _relative_error(out, paged.reference(q, lens)) < TOLERANCE[fp8]


@pytest.mark.parametrize("fp8", [None, "token"])
def test_the_functional_forms_equal_the_ops(fp8):
    """flydsl.torch.functional.write_kv / paged_decode (no dispatcher in eager mode; the second call a kept plan's
    replay) write and return what the ops do, bit for bit."""
    paged = Paged(fp8=fp8)
    twin = paged.clone()
    k, v, slots, lens = paged.new_tokens((5, 40, paged.capacity))
    q = paged.queries()
    for _ in range(2):
        flydsl.torch.functional.write_kv(k, v, *paged.state()[:2], slots, *paged.state()[2:])
        torch.ops.flydsl.write_kv(k, v, *twin.state()[:2], slots, *twin.state()[2:])
        assert all(a is None or _same_bytes(a, b) for a, b in zip(paged.state(), twin.state(), strict=True))
        out = flydsl.torch.functional.paged_decode(
            q, paged.k_cache, paged.v_cache, paged.tables, lens, k_scale=paged.k_scale, v_scale=paged.v_scale
        )
        expected = torch.ops.flydsl.paged_decode(
            q, twin.k_cache, twin.v_cache, twin.tables, lens, None, twin.k_scale, twin.v_scale
        )
        assert torch.equal(out, expected)


def test_paged_decode_op_passes_its_options():
    """Several queries per sequence, a sliding window, soft-capping, a scale and max_context reach the kernel."""
    paged = Paged(fp8="token", q_heads=16, kv_heads=4, dim=64)
    q = paged.queries(3) * 8
    lens = torch.tensor((3, 70, 100), dtype=torch.int32, device="cuda")
    options = dict(scale=0.1, sliding_window=20, soft_cap=5.0)
    out = torch.ops.flydsl.paged_decode(
        q, paged.k_cache, paged.v_cache, paged.tables, lens, 0.1, paged.k_scale, paged.v_scale, 20, 5.0, 112
    )
    expected = paged_decode(
        q, paged.k_cache, paged.v_cache, paged.tables, lens, k_scale=paged.k_scale, v_scale=paged.v_scale,
        max_context=112, **options,
    )  # fmt: skip
    assert torch.equal(out, expected)
    assert _relative_error(out, paged.reference(q, lens, **options)) < 2e-2


@pytest.mark.parametrize("fp8", [None, "tensor", "token"])
def test_write_kv_op_equals_the_kernel(fp8):
    paged = Paged(fp8=fp8)
    other = paged.clone()
    k, v, slots, _ = paged.new_tokens((5, 40, 128))
    slots[1] = -1  # padding: skipped
    versions = paged.k_cache._version, paged.v_cache._version
    assert torch.ops.flydsl.write_kv(k, v, paged.k_cache, paged.v_cache, slots, paged.k_scale, paged.v_scale) is None
    assert paged.k_cache._version > versions[0] and paged.v_cache._version > versions[1]
    write_kv(k, v, other.k_cache, other.v_cache, slots, k_scale=other.k_scale, v_scale=other.v_scale)
    assert _same_bytes(paged.k_cache, other.k_cache) and _same_bytes(paged.v_cache, other.v_cache)
    if fp8 is not None:
        assert torch.equal(paged.k_scale, other.k_scale) and torch.equal(paged.v_scale, other.v_scale)
    if fp8 is None:  # the rows themselves
        rows = paged.k_cache.view(-1, paged.kv_heads, paged.dim)
        assert torch.equal(rows[slots[0]], k[0]) and torch.equal(rows[slots[2]], k[2])


def test_write_kv_op_refuses_inputs_that_require_grad():
    paged = Paged()
    k, v, slots, _ = paged.new_tokens((5, 40, 128))
    with pytest.raises(RuntimeError, match="flydsl.write_kv: an input requires grad"):
        torch.ops.flydsl.write_kv(k.float().bfloat16().requires_grad_(), v, paged.k_cache, paged.v_cache, slots)
    with torch.no_grad():
        torch.ops.flydsl.write_kv(k.requires_grad_(), v, paged.k_cache, paged.v_cache, slots)


def test_opcheck():
    paged = Paged()
    q = paged.queries()
    k, v, slots, lens = paged.new_tokens((5, 40, 128))
    torch.library.opcheck(torch.ops.flydsl.paged_decode, (q, paged.k_cache, paged.v_cache, paged.tables, lens))
    torch.library.opcheck(torch.ops.flydsl.write_kv, (k, v, paged.k_cache, paged.v_cache, slots))


# --- a decode step: torch.compile and CUDA graphs --------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [None, "token"])
def test_compiled_decode_step_equals_eager(fp8):
    torch._dynamo.reset()
    paged = Paged(fp8=fp8)
    compiled_paged = paged.clone()
    q = paged.queries()
    k, v, slots, lens = paged.new_tokens((1, 50, paged.capacity))
    compiled = torch.compile(_step, fullgraph=True)
    with torch.no_grad():
        eager_out = _step(q, k, v, slots, lens, paged.tables, *paged.state(), paged.capacity)
        compiled_out = compiled(q, k, v, slots, lens, paged.tables, *compiled_paged.state(), paged.capacity)
    assert torch.equal(compiled_out, eager_out)
    for ours, theirs in zip(compiled_paged.state(), paged.state(), strict=True):
        assert ours is None or _same_bytes(ours, theirs)  # the compiled step wrote the caches given it
    assert _relative_error(eager_out, paged.reference(q, lens)) < TOLERANCE[fp8]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("fp8", [None, "tensor"])
def test_decode_step_replays_in_a_cuda_graph(graphed, mode, fp8):
    """The step captured once (grid sized from max_context, never from the lengths), then replayed on new queries,
    tokens, slots and context lengths copied into the captured tensors: each replay writes the new tokens and attends
    over the caches with them, as the reference computes it afterwards."""
    torch._dynamo.reset()
    paged = Paged(fp8=fp8)
    q = paged.queries()
    k, v, slots, lens = paged.new_tokens((3, 20, 100))
    step = _step if mode == "eager" else torch.compile(_step, fullgraph=True)

    def run():
        with torch.no_grad():
            return step(q, k, v, slots, lens, paged.tables, *paged.state(), paged.capacity)

    graph, out = graphed(run)
    for lengths in ((1, 2, paged.capacity), (paged.capacity, 17, 64), (40, 100, 5)):
        new_k, new_v, new_slots, new_lens = paged.new_tokens(lengths)
        for static, value in ((q, paged.queries()), (k, new_k), (v, new_v), (slots, new_slots), (lens, new_lens)):
            static.copy_(value)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any(), "unwritten outputs"
        assert _relative_error(out, paged.reference(q, lens)) < TOLERANCE[fp8], lengths
        if fp8 is None:  # the replay wrote this round's tokens
            rows = paged.k_cache.view(-1, paged.kv_heads, paged.dim)
            assert torch.equal(rows[slots], k)

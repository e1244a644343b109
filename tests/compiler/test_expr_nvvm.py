"""nvvm intrinsics and fx.printf. CPU: each compiles to its PTX instruction and ptxas accepts it for sm_90a; GPU
(``gpu``): numerics against references computed on the host with torch."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu, nvvm, vector

from .fakes import FakeGpuTensor


@flyc.kernel
def special_functions(x: fx.Tensor, out: fx.Tensor):
    """out rows: ex2.approx(x), rcp.approx.ftz(x), rcp.approx(x), ex2.approx.ftz(x)."""
    t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    n = gpu.grid_dim.x * gpu.block_dim.x
    v = x[t]
    out[t] = nvvm.ex2_approx(v)
    out[n + t] = nvvm.rcp_approx(v)
    out[2 * n + t] = nvvm.rcp_approx(v, ftz=False)
    out[3 * n + t] = nvvm.ex2_approx(v, ftz=True)


@flyc.kernel
def fp8_round_trip(x: fx.Tensor, packed: fx.Tensor, back: fx.Tensor, e5m2: fx.Constexpr[bool]):
    """Pairs (x[2t], x[2t+1]) -> one 16-bit fp8x2 (packed[t]) -> back[2t], back[2t+1]."""
    t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    fmt = "e5m2" if e5m2 else "e4m3"
    bits = nvvm.cvt_f32x2_to_fp8x2(x[2 * t], x[2 * t + 1], fmt)
    packed[t] = bits.to(fx.Int32)
    hi, lo = nvvm.cvt_fp8x2_to_f32x2(bits, fmt)
    back[2 * t] = hi
    back[2 * t + 1] = lo


@flyc.kernel
def shuffles(x: fx.Tensor, out: fx.Tensor):
    """Rows of out (per thread): idx from lane 31 - lane, xor 5, down 3, up 2 within segments of 8."""
    t = gpu.thread_idx.x
    lane = gpu.lane_id()
    v = x[t]
    out[t] = nvvm.shfl_sync(v, 31 - lane, "idx")
    out[64 + t] = nvvm.shfl_sync(v, 5, "xor")
    out[128 + t] = nvvm.shfl_sync(v, 3, "down")
    out[192 + t] = nvvm.shfl_sync(v, 2, "up", width=8)


@flyc.kernel
def elect_and_named_barriers(out: fx.Tensor):
    """out[t]: 1 where elected; out[128 + t]: the value its partner thread wrote before a named barrier of its half."""
    t = gpu.thread_idx.x
    out[t] = fx.Int32(0)
    if nvvm.elect_sync():
        out[t] = fx.Int32(1)
    scratch = fx.SmemAllocator().allocate(fx.Int32, 128)
    scratch[t] = t * 3
    if t < 64:
        nvvm.barrier(1, 64)  # threads 0..63 only
    else:
        nvvm.barrier(2, 64)  # threads 64..127 only
    half = (t // 64) * 64
    out[128 + t] = scratch[half + (t + 17) % 64]


@flyc.kernel
def arrive_then_read(out: fx.Tensor):
    """Threads 0..63 write and arrive at named barrier 3 without waiting; threads 64..127 wait there and read what
    their partner (t - 64) wrote: out[t - 64] = 5 t for the writers, the value read for the readers."""
    t = gpu.thread_idx.x
    scratch = fx.SmemAllocator().allocate(fx.Int32, 64)
    if t < 64:
        scratch[t] = t * 5
        out[t] = t * 5
        nvvm.barrier_arrive(3, 128)
    else:
        nvvm.barrier(3, 128)
        out[t] = scratch[t - 64]


@flyc.kernel
def async_copies(src: fx.Tensor, out: fx.Tensor):
    """Per thread: 16 bytes (cg), 8 bytes (ca), 4 bytes (ca) and 16 bytes of which only 8 are read (zero fill)."""
    t = gpu.thread_idx.x
    staged = fx.SmemAllocator().allocate(fx.Float32, 32 * 12)
    nvvm.cp_async(staged, src, 16, dst_coord=t * 12, src_coord=t * 12)
    nvvm.cp_async(staged, src, 8, dst_coord=t * 12 + 4, src_coord=t * 12 + 4)
    nvvm.cp_async(staged, src, 4, dst_coord=t * 12 + 6, src_coord=t * 12 + 6)
    nvvm.cp_async(staged, src, 16, dst_coord=t * 12 + 8, src_coord=t * 12 + 8, src_bytes=8)
    nvvm.cp_async_commit_group()
    nvvm.cp_async_wait_group(0)
    gpu.barrier()
    for i in fx.range_constexpr(12):
        out[t * 12 + i] = staged[((t + 1) % 32) * 12 + i]  # another thread's copies: visible after the barrier
    # element 7 of each row was never copied: written here so the output is fully defined
    out[t * 12 + 7] = fx.Float32(-1.0)


@flyc.kernel
def copies_then_arrive(src: fx.Tensor, out: fx.Tensor):
    """Each of 32 threads copies 8 floats of src into shared memory by 4-byte cp.async, then arrives on one mbarrier
    (32 arrivals) once they have landed; every thread waits on it and reads another's floats."""
    t = gpu.thread_idx.x
    staged = fx.SmemAllocator().allocate(fx.Float32, 256, alignment=16)
    bar = fx.mbarrier.allocate(fx.SmemAllocator(), 1)[0]
    if t == 0:
        bar.init(32)
        fx.mbarrier.fence_init()
    gpu.barrier()
    for i in fx.range_constexpr(8):
        nvvm.cp_async(staged, src, 4, dst_coord=t * 8 + i, src_coord=t * 8 + i)
    bar.arrive_on_cp_async()
    bar.wait(0)
    for i in fx.range_constexpr(8):
        out[t * 8 + i] = staged[((t + 1) % 32) * 8 + i]


@flyc.kernel
def bulk_copy(src: fx.Tensor, out: fx.Tensor):
    """Thread 0 copies src's 256 floats into shared memory by two bulk copies (768 bytes at a dynamic size, then 256)
    and a third of 0 bytes (none issued), all on one mbarrier; every thread waits on it and reads another's floats."""
    t = gpu.thread_idx.x
    staged = fx.SmemAllocator().allocate(fx.Float32, 256, alignment=16)
    bar = fx.mbarrier.allocate(fx.SmemAllocator(), 1)[0]
    if t == 0:
        bar.init(1)
        fx.mbarrier.fence_init()
    gpu.barrier()
    if t == 0:
        bar.arrive_expect_tx(1024)
        nvvm.cp_async_bulk(staged, src, fx.Int32(768) + t, bar, dst_coord=0, src_coord=0)
        nvvm.cp_async_bulk(staged, src, 256, bar, dst_coord=192, src_coord=192)
        nvvm.cp_async_bulk(staged, src, 0, bar, dst_coord=0, src_coord=0)
    bar.wait(0)
    for i in fx.range_constexpr(8):
        out[t * 8 + i] = staged[((t + 1) % 32) * 8 + i]


@flyc.kernel
def mma_16x8x16(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, d: fx.Tensor, f16: fx.Constexpr[bool]):
    """One warp: D (16x8) = A (16x16) @ B (16x8) + C, all row-major; A and B through shared memory and ldmatrix."""
    lane = gpu.thread_idx.x
    dtype = fx.Float16 if f16 else fx.BFloat16
    s_a = fx.SmemAllocator().allocate(dtype, fx.make_layout((16, 16), (16, 1)))
    s_b = fx.SmemAllocator().allocate(dtype, fx.make_layout((16, 8), (8, 1)))
    nvvm.cp_async(s_a, a, 16, dst_coord=(lane // 2, (lane % 2) * 8), src_coord=(lane // 2, (lane % 2) * 8))
    if lane < 16:
        nvvm.cp_async(s_b, b, 16, dst_coord=(lane, 0), src_coord=(lane, 0))
    nvvm.cp_async_commit_group()
    nvvm.cp_async_wait_group(0)
    gpu.barrier()
    a_frag = nvvm.ldmatrix(s_a, (lane % 16, (lane // 16) * 8), num=4)
    b_frag = nvvm.ldmatrix(s_b, (lane % 16, 0), num=2, trans=True)
    group, pair = lane // 4, (lane % 4) * 2
    acc = vector.from_elements(
        fx.T.f32x4, [c[group, pair], c[group, pair + 1], c[group + 8, pair], c[group + 8, pair + 1]]
    )
    result = nvvm.mma_sync(a_frag, b_frag, acc, dtype=dtype)
    d[group, pair] = result[0]
    d[group, pair + 1] = result[1]
    d[group + 8, pair] = result[2]
    d[group + 8, pair + 1] = result[3]


@flyc.kernel
def ldmatrix_x1(m: fx.Tensor, out: fx.Tensor):
    """One 8x8 bf16 matrix: lane l gets row l // 4, columns 2 (l % 4) and +1, as the bits of one Int32."""
    lane = gpu.thread_idx.x
    s = fx.SmemAllocator().allocate(fx.BFloat16, fx.make_layout((8, 8), (8, 1)))
    if lane < 8:
        nvvm.cp_async(s, m, 16, dst_coord=(lane, 0), src_coord=(lane, 0))
    nvvm.cp_async_commit_group()
    nvvm.cp_async_wait_group(0)
    gpu.barrier()
    out[lane] = nvvm.ldmatrix(s, (lane % 8, 0), num=1)[0]


@flyc.kernel
def printing(x: fx.Tensor):
    if gpu.thread_idx.x == 0:
        fx.printf("flydsl printf: i=%d f=%f u=%u\n", fx.Int32(3), x[0], fx.Uint8(200))


def _fake(shape, typestr="<f4", k=0):
    return FakeGpuTensor(shape, typestr, pointer=(1 << 20) + k * (1 << 16))


def _ptx(kernel, *args) -> str:
    module = kernel.lower(*args)
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def test_special_functions_compile_to_approximate_instructions():
    ptx = _ptx(special_functions, _fake((256,)), _fake((1024,), k=1))
    assert "ex2.approx.f32" in ptx and "ex2.approx.ftz.f32" in ptx
    assert "rcp.approx.ftz.f32" in ptx and "rcp.approx.f32" in ptx


@pytest.mark.parametrize("e5m2, name", [(False, "e4m3"), (True, "e5m2")])
def test_fp8_conversions(e5m2, name):
    ptx = _ptx(fp8_round_trip, _fake((256,)), _fake((128,), "<i4", 1), _fake((256,), k=2), e5m2)
    assert f"cvt.rn.satfinite.{name}x2.f32" in ptx
    assert f"cvt.rn.f16x2.{name}x2" in ptx


def test_shuffles_elect_and_named_barriers():
    ptx = _ptx(shuffles, _fake((64,)), _fake((256,), k=1))
    for kind in ("idx", "bfly", "down", "up"):
        assert f"shfl.sync.{kind}.b32" in ptx
    ptx = _ptx(elect_and_named_barriers, _fake((256,), "<i4"))
    assert "elect.sync" in ptx
    assert re.search(r"bar.sync \t(%r\d+|1), 64;", ptx)  # LLVM may merge the two branches' barriers
    text = elect_and_named_barriers.trace(
        elect_and_named_barriers.specialize(elect_and_named_barriers._bind([_fake((256,), "<i4")], {})).key
    )
    assert text.count('"llvm.nvvm.barrier.cta.sync.aligned.count"') == 2


def test_barrier_arrive_signals_without_waiting():
    ptx = _ptx(arrive_then_read, _fake((128,), "<i4"))
    assert re.search(r"bar.arrive (%r\d+|3), 128;", ptx) and re.search(r"bar.sync \t(%r\d+|3), 128;", ptx)
    with pytest.raises(ValueError, match="1..15"):
        nvvm.barrier_arrive(0, 128)
    with pytest.raises(ValueError, match="multiple of 32"):
        nvvm.barrier_arrive(3, 100)


def test_async_copies_and_matrix_instructions():
    ptx = _ptx(async_copies, _fake((384,)), _fake((384,), k=1))
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    assert "cp.async.commit_group" in ptx and "cp.async.wait_group \t0" in ptx
    assert ", 16, 8;" in ptx  # the zero-filling form: src-size 8 of 16
    bf16 = (16, 16), (16, 8)
    args = [_fake(bf16[0], "<bfloat16"), _fake(bf16[1], "<bfloat16", 1), _fake((16, 8), k=2), _fake((16, 8), k=3)]
    ptx = _ptx(mma_16x8x16, *args, False)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    args[:2] = [_fake(bf16[0], "<f2"), _fake(bf16[1], "<f2", 1)]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in _ptx(mma_16x8x16, *args, True)
    assert "ldmatrix.sync.aligned.m8n8.x1.shared.b16" in _ptx(
        ldmatrix_x1, _fake((8, 8), "<bfloat16"), _fake((32,), "<i4", 1)
    )


def test_bulk_copies_complete_on_an_mbarrier():
    ptx = _ptx(bulk_copy, _fake((256,)), _fake((256,), k=1))
    copies = re.findall(r"@p cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx)
    assert len(copies) == 3 and "setp.ne.b32 p" in ptx  # each predicated on a size other than 0
    assert "mbarrier.arrive.expect_tx" in ptx and "mbarrier.try_wait.parity" in ptx
    with pytest.raises(ValueError, match="multiple of 16"):

        @flyc.kernel
        def ragged(x: fx.Tensor):
            bar = fx.mbarrier.allocate(fx.SmemAllocator(), 1)[0]
            nvvm.cp_async_bulk(fx.SmemAllocator().allocate(fx.Float32, 64), x, 24, bar)

        ragged.trace(ragged.specialize(ragged._bind([_fake((64,))], {})).key)


def test_cp_async_copies_arrive_on_an_mbarrier():
    ptx = _ptx(copies_then_arrive, _fake((256,)), _fake((256,), k=1))
    assert len(re.findall(r"cp\.async\.ca\.shared\.global \[%rd\d+(\+\d+)?\], \[%rd\d+(\+\d+)?\], 4;", ptx)) == 8
    assert re.search(r"cp\.async\.mbarrier\.arrive\.noinc\.shared(::cta)?\.b64", ptx)
    assert "mbarrier.try_wait.parity" in ptx


def test_trap_is_emitted_where_the_condition_holds():
    @flyc.kernel
    def checked(x: fx.Tensor):
        rows, n = x.shape
        if n % 64 != 0:  # a condition that must never hold
            nvvm.trap()
        x[0, gpu.thread_idx.x] = fx.Float32(1.0)

    ptx = _ptx(checked, _fake((4, 256)))
    assert ptx.count("trap;") == 1 and re.search(r"@%p\d+ bra", ptx)  # behind a branch, not unconditional


def test_globaltimer_reads_stay_apart_around_a_barrier():
    """Two reads of the clock around a barrier are two reads (volatile: not merged), in program order."""

    @flyc.kernel
    def stamped(out: fx.Tensor):
        began = nvvm.globaltimer()
        gpu.barrier()
        out[gpu.thread_idx.x] = nvvm.globaltimer() - began

    ptx = _ptx(stamped, _fake((128,), "<i4"))
    reads = [m.start() for m in re.finditer(r"mov\.u32 %r\d+, %globaltimer_lo;", ptx)]
    assert len(reads) == 2 and reads[0] < ptx.index("bar.sync") < reads[1]


def test_printf_lowers_to_vprintf_with_promoted_arguments():
    text = printing.trace(printing.specialize(printing._bind([_fake((4,))], {})).key)
    assert "gpu.printf" in text and "arith.extf" in text and "arith.extui" in text
    assert "vprintf" in _ptx(printing, _fake((4,)))


def test_addresses_of_allocator_buffers_are_element_addresses():
    """nvvm.address emits fly.element_address for any tensor: SmemAllocator buffers (placed after tracing), slices of
    them and swizzled layouts get their addresses when the compiler lowers the tensor accesses."""

    @flyc.kernel
    def swizzled_ldmatrix(m: fx.Tensor, out: fx.Tensor):
        lane = gpu.thread_idx.x
        tile = fl.ComposedLayout(fl.Swizzle(3, 3, 3), 0, fl.Layout((8, 64), (64, 1)))
        s = fx.SmemAllocator().allocate(fx.BFloat16, tile)
        nvvm.cp_async(s, m, 16, dst_coord=(lane % 8, (lane // 8) * 8), src_coord=lane * 8)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)
        gpu.barrier()
        out[lane] = nvvm.ldmatrix(s, (lane % 8, 8), num=1)[0]

    args = [_fake((256,), "<bfloat16"), _fake((32,), "<i4", 1)]
    text = swizzled_ldmatrix.trace(swizzled_ldmatrix.specialize(swizzled_ldmatrix._bind(args, {})).key)
    assert text.count("fly.element_address") == 3  # the shared destination, the global source, ldmatrix
    assert "llvm.mlir.global" not in text  # no static __shared__ array
    module = swizzled_ldmatrix.lower(*args)
    assert "ldmatrix.sync.aligned.m8n8.x1.shared.b16" in module.ptx and "cp.async.cg.shared.global" in module.ptx
    assert module.shared_bytes["swizzled_ldmatrix"] == 8 * 64 * 2


def test_misuse_is_reported_at_trace_time():
    @flyc.kernel
    def not_a_tensor(x: fx.Tensor):
        nvvm.address(fx.Int32(0))

    @flyc.kernel
    def bad_num(x: fx.Tensor):
        nvvm.ldmatrix(fx.SmemAllocator().allocate(fx.BFloat16, 64), 0, num=3)

    @flyc.kernel
    def bad_size(x: fx.Tensor):
        nvvm.cp_async(fx.SmemAllocator().allocate(fx.Float32, 64), x, 12)

    @flyc.kernel
    def swapped_spaces(x: fx.Tensor):
        nvvm.cp_async(x, fx.SmemAllocator().allocate(fx.Float32, 64), 16)

    @flyc.kernel
    def bad_coordinate(x: fx.Tensor):
        nvvm.ldmatrix(fx.SmemAllocator().allocate(fx.BFloat16, fx.make_layout((8, 8), (8, 1))), (1, 2, 3))

    def trace(kernel):
        return kernel.trace(kernel.specialize(kernel._bind([_fake((64,))], {})).key)

    with pytest.raises(TypeError, match="expected a fx.Tensor"):
        trace(not_a_tensor)
    with pytest.raises(ValueError, match="1, 2 or 4"):
        trace(bad_num)
    with pytest.raises(ValueError, match="4, 8 or 16"):
        trace(bad_size)
    with pytest.raises(TypeError, match="shared pointer"):
        trace(swapped_spaces)
    with pytest.raises(IndexError, match=r"indexing a tensor of shape \(8,8\) \(rank 2\) with \(1,2,3\)"):
        trace(bad_coordinate)


# --- GPU -----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_special_functions_are_within_their_ulp_bounds():
    torch = pytest.importorskip("torch")
    x = torch.cat([torch.linspace(-20, 20, 1000), torch.tensor([0.5, 1.0, 3.0, -7.25, -130.0, -149.5] * 4)]).cuda()
    n = x.numel()  # 1024: 4 blocks of 256
    out = torch.full((4 * n,), float("nan"), device="cuda")
    special_functions(x, out).launch(grid=4, block=256)
    torch.cuda.synchronize()
    host = x.cpu().double()
    ex2, rcp_ftz, rcp, ex2_ftz = out.cpu().double().view(4, n)
    torch.testing.assert_close(ex2, torch.exp2(host), rtol=2.5e-7, atol=1e-45)  # 2 ulp of float32 (subnormals kept)
    normal = host > -126  # 2^x below 2^-126 (x = -130, -149.5) is subnormal: flushed to 0 with ftz
    torch.testing.assert_close(ex2_ftz[normal], torch.exp2(host[normal]), rtol=2.5e-7, atol=0)
    assert (ex2_ftz[~normal] == 0).all()
    nonzero = host != 0
    torch.testing.assert_close(rcp_ftz[nonzero], 1 / host[nonzero], rtol=1.3e-7, atol=0)  # 1 ulp
    torch.testing.assert_close(rcp[nonzero], 1 / host[nonzero], rtol=1.3e-7, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("e5m2", [False, True])
def test_fp8_conversions_match_torch(e5m2):
    torch = pytest.importorskip("torch")
    fp8 = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    limit = 40000.0 if e5m2 else 400.0  # inside the finite range: torch does not saturate
    x = (torch.rand(512) * 2 - 1) * limit
    x[:8] = torch.tensor([0.0, -0.0, 1.0, -1.5, 0.1, 3.3, -250.0, 17.0])
    x = x.cuda()
    packed = torch.zeros(256, dtype=torch.int32, device="cuda")
    back = torch.full((512,), float("nan"), device="cuda")
    fp8_round_trip(x, packed, back, e5m2).launch(grid=2, block=128)
    torch.cuda.synchronize()
    expected_fp8 = x.cpu().to(fp8)
    assert torch.equal(back.cpu(), expected_fp8.float())
    bytes_ = expected_fp8.view(torch.uint8).to(torch.int32).view(256, 2)
    assert torch.equal(packed.cpu() & 0xFFFF, (bytes_[:, 0] << 8) | bytes_[:, 1])  # first value in the high byte


@pytest.mark.gpu
def test_shuffles_move_values_between_lanes():
    torch = pytest.importorskip("torch")
    x = torch.arange(64, dtype=torch.float32, device="cuda") * 1.5
    out = torch.full((256,), float("nan"), device="cuda")
    shuffles(x, out).launch(grid=1, block=64)
    torch.cuda.synchronize()
    got = out.cpu().view(4, 64)
    lanes = torch.arange(64)
    warp = (lanes // 32) * 32
    lane = lanes % 32
    source = x.cpu()
    assert torch.equal(got[0], source[warp + 31 - lane])
    assert torch.equal(got[1], source[warp + (lane ^ 5)])
    assert torch.equal(got[2], source[torch.where(lane + 3 < 32, lanes + 3, lanes)])
    assert torch.equal(got[3], source[torch.where(lane % 8 >= 2, lanes - 2, lanes)])


@pytest.mark.gpu
def test_elect_sync_and_named_barriers():
    torch = pytest.importorskip("torch")
    out = torch.full((256,), -1, dtype=torch.int32, device="cuda")
    elect_and_named_barriers(out).launch(grid=1, block=128)
    torch.cuda.synchronize()
    got = out.cpu()
    assert got[:128].view(4, 32).sum(dim=1).tolist() == [1, 1, 1, 1]  # one elected lane per warp
    t = torch.arange(128)
    assert torch.equal(got[128:], ((t // 64) * 64 + (t + 17) % 64) * 3)


@pytest.mark.gpu
def test_barrier_arrive_orders_the_writers_before_the_readers():
    torch = pytest.importorskip("torch")
    out = torch.full((128,), -1, dtype=torch.int32, device="cuda")
    arrive_then_read(out).launch(grid=1, block=128)
    torch.cuda.synchronize()
    expected = torch.arange(64) * 5
    assert torch.equal(out.cpu(), torch.cat([expected, expected]))


@pytest.mark.gpu
def test_async_copies_land_and_zero_fill():
    torch = pytest.importorskip("torch")
    src = torch.randn(384, device="cuda")
    out = torch.full((384,), float("nan"), device="cuda")
    async_copies(src, out).launch(grid=1, block=32)
    torch.cuda.synchronize()
    rows = src.cpu().view(32, 12).roll(-1, dims=0)  # thread t reads the row of thread t + 1
    expected = rows.clone()
    expected[:, 7] = -1.0
    expected[:, 10:] = 0.0  # src_bytes=8 of 16: the last two floats are zeros
    assert torch.equal(out.cpu().view(32, 12), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [bulk_copy, copies_then_arrive], ids=["bulk", "cp_async"])
def test_copies_completing_on_an_mbarrier_land(kernel):
    """Each thread reads what another copied, once the mbarrier says the copies landed."""
    torch = pytest.importorskip("torch")
    src = torch.randn(256, device="cuda")
    out = torch.full((256,), float("nan"), device="cuda")
    kernel(src, out).launch(grid=1, block=32)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu().view(32, 8), src.cpu().view(32, 8).roll(-1, dims=0))


@pytest.mark.gpu
@pytest.mark.parametrize("f16", [False, True])
def test_mma_sync_with_ldmatrix_fragments(f16):
    torch = pytest.importorskip("torch")
    dtype = torch.float16 if f16 else torch.bfloat16
    a = torch.randn(16, 16, device="cuda").to(dtype)
    b = torch.randn(16, 8, device="cuda").to(dtype)
    c = torch.randn(16, 8, device="cuda")
    d = torch.full((16, 8), float("nan"), device="cuda")
    mma_16x8x16(a, b, c, d, f16).launch(grid=1, block=32)
    torch.cuda.synchronize()
    reference = a.double().cpu() @ b.double().cpu() + c.double().cpu()
    torch.testing.assert_close(d.cpu().double(), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_ldmatrix_x1_fragment_layout():
    torch = pytest.importorskip("torch")
    m = torch.arange(64, dtype=torch.int16).view(torch.bfloat16).view(8, 8).cuda()  # element (r, c) has bits 8r + c
    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    ldmatrix_x1(m, out).launch(grid=1, block=32)
    torch.cuda.synchronize()
    lane = torch.arange(32)
    low = (lane // 4) * 8 + (lane % 4) * 2  # row lane // 4, column 2 (lane % 4): the low half
    assert torch.equal(out.cpu(), low | ((low + 1) << 16))


@pytest.mark.gpu
def test_printf_prints_from_the_device(capfd):
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.5, 0, 0, 0], device="cuda")
    printing(x).launch(grid=1, block=32)
    torch.cuda.synchronize()
    assert "flydsl printf: i=3 f=1.500000 u=200" in capfd.readouterr().out


@flyc.kernel
def ldmatrix_stmatrix(m: fx.Tensor, out: fx.Tensor, trans: fx.Constexpr[bool]):
    """One warp: a 16x16 bf16 matrix into shared memory, four 8x8 matrices out with ldmatrix and back into another
    buffer with stmatrix (both transposed or neither): the second buffer equals the first."""
    lane = gpu.thread_idx.x
    smem = fx.SmemAllocator()
    s_in = smem.allocate(fx.BFloat16, fx.make_layout((16, 16), (16, 1)))
    s_out = smem.allocate(fx.BFloat16, fx.make_layout((16, 16), (16, 1)))
    for i in fx.range_constexpr(8):
        s_in[lane // 2, (lane % 2) * 8 + i] = m[lane // 2, (lane % 2) * 8 + i]
    gpu.barrier()
    row, col = lane % 16, (lane // 16) * 8
    nvvm.stmatrix(s_out, nvvm.ldmatrix(s_in, (row, col), num=4, trans=trans), (row, col), trans=trans)
    gpu.barrier()
    for i in fx.range_constexpr(8):
        out[lane // 2, (lane % 2) * 8 + i] = s_out[lane // 2, (lane % 2) * 8 + i]


@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_compiles(trans):
    ptx = _ptx(ldmatrix_stmatrix, _fake((16, 16), "<bfloat16"), _fake((16, 16), "<bfloat16", 1), trans)
    assert f"stmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_then_stmatrix_is_the_identity_on_gpu(trans):
    torch = pytest.importorskip("torch")
    m = torch.randn(16, 16, device="cuda").bfloat16()
    out = torch.full_like(m, float("nan"))
    ldmatrix_stmatrix(m, out, trans).launch(grid=1, block=32)
    torch.cuda.synchronize()
    assert torch.equal(out, m)

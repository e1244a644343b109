"""TMA descriptors, mbarriers, TMA pipelines, the tile scheduler and kernel attributes.

CPU: the shared-memory swizzle layouts against the PTX ISA's pattern, host-side argument checks, PTX that assembles
for sm_90a with the descriptor passed as a 128-byte grid constant. GPU (``gpu``): a TMA round trip of a tile with
every swizzle and element size (threads read the box through ``desc.smem_layout``: the layout matches what the
hardware wrote), and a multi-stage TMA pipeline, against torch on the host."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu
from flydsl.expr.tma import swizzle_layout

# (dtype name for TensorSpec, torch dtype name, element bytes)
ELEMENTS = [("f32", "float32", 4), ("bf16", "bfloat16", 2), ("f16", "float16", 2), ("i8", "int8", 1)]
SWIZZLES = [0, 32, 64, 128]


@flyc.kernel
def tma_round_trip(src: fx.TmaDescriptor, dst: fx.TmaDescriptor, seen: fx.Tensor):
    """Block (i, j) loads box (i, j) of src with TMA; every thread copies its share of the box from shared memory
    (through the swizzled layout) to ``seen``; the box, doubled in shared memory, goes back to dst by a TMA store."""
    rows, cols = src.box
    smem = fx.SmemAllocator()
    tile = src.allocate(smem)
    bars = fx.mbarrier.allocate(smem, 1)
    tid = gpu.thread_idx.x
    row0 = gpu.block_idx.x * rows
    col0 = gpu.block_idx.y * cols
    if tid == 0:
        bars[0].init(1)
        fx.mbarrier.fence_init()
    gpu.barrier()
    if tid == 0:
        src.prefetch()
        bars[0].arrive_expect_tx(src.box_bytes)
        src.load(tile, (row0, col0), bars[0])
    bars[0].wait(0)
    for i in range(tid, rows * cols, gpu.block_dim.x):
        r = i // cols
        c = i % cols
        value = tile[r, c]
        if row0 + r < src.shape[0]:
            if col0 + c < src.shape[1]:
                seen[row0 + r, col0 + c] = value
        tile[r, c] = value + value
    fx.nvvm.fence_proxy_async()  # the threads' writes, visible to the TMA store
    gpu.barrier()
    if tid == 0:
        dst.store(tile, (row0, col0))
        fx.tma.commit_group()
        fx.tma.wait_group(0)


@flyc.kernel
def pipelined_row_sums(x: fx.TmaDescriptor, out: fx.Tensor, stages: fx.Constexpr[int]):
    """out[r] = sum of row r of x (rows = the box's rows): thread 0 streams boxes along the row through a TMA
    pipeline of ``stages`` slots; threads 32 .. 32 + rows - 1 (one per row) consume them."""
    rows, cols = x.box
    smem = fx.SmemAllocator()
    tiles = x.allocate(smem, stages)
    pipe = fx.TmaPipeline(smem, stages, x.box_bytes, consumers=rows)
    pipe.init()
    k_tiles = (x.shape[1] + (cols - 1)) // cols
    tid = gpu.thread_idx.x
    if tid == 0:
        state = pipe.producer_start()
        for k in range(k_tiles):
            pipe.producer_acquire(state)
            x.load(tiles[None, None, state.index], (0, k * cols), pipe.full[state.index])
            state = state.advance()
    if tid >= 32:
        r = tid - 32
        state = pipe.consumer_start()
        total = fx.Float32(0.0)
        for _ in range(k_tiles):
            pipe.consumer_wait(state)
            for c in fx.range_constexpr(cols):
                total = total + tiles[r, c, state.index]
            pipe.consumer_release(state)
            state = state.advance()
        out[r] = total


@flyc.kernel
def pipeline_positions(out: fx.Tensor, stages: fx.Constexpr[int]):
    """Thread t: the position ``t`` slots after (index 1, phase 0), by ``advance_by(t)`` (row 0) and by ``t`` calls
    of ``advance`` (row 1), as (index, phase) pairs."""
    t = gpu.thread_idx.x
    start = fx.PipelineState(stages, 1, 0)
    jumped = start.advance_by(t)
    walked = start
    for _ in range(t):
        walked = walked.advance()
    out[0, t, 0], out[0, t, 1] = jumped.index, jumped.phase
    out[1, t, 0], out[1, t, 1] = walked.index, walked.phase


@flyc.kernel(cluster=(2, 1, 1))
def tma_multicast(src: fx.TmaDescriptor, seen: fx.Tensor):
    """CTA 0 of each cluster of two loads box (cluster, 0) once, multicast into both CTAs' shared memory; every CTA
    copies what landed in its own shared memory to its rows of ``seen``."""
    rows, cols = src.box
    smem = fx.SmemAllocator()
    tile = src.allocate(smem)
    bars = fx.mbarrier.allocate(smem, 1)
    tid = gpu.thread_idx.x
    if tid == 0:
        bars[0].init(1)
        fx.mbarrier.fence_init()
    fx.cluster.sync()  # both CTAs' barriers are initialized before a multicast can complete on them
    if tid == 0:
        bars[0].arrive_expect_tx(src.box_bytes)
        if fx.cluster.block_rank() == 0:
            src.load(tile, (gpu.block_idx.x // 2 * rows, 0), bars[0], multicast_mask=0b11)
    bars[0].wait(0)
    for i in range(tid, rows * cols, gpu.block_dim.x):
        seen[gpu.block_idx.x * rows + i // cols, i % cols] = tile[i // cols, i % cols]
    fx.cluster.sync()


@flyc.kernel(threads=384, min_blocks_per_sm=1, cluster=(2, 1, 1))
def warp_specialized_registers(out: fx.Tensor):
    """Warpgroup 0 gives registers back, the others take more (``setmaxnreg`` needs the entry register cap that
    threads + min_blocks_per_sm give)."""
    warpgroup = gpu.thread_idx.x // 128
    if warpgroup == 0:
        fx.nvvm.setmaxnreg(40, increase=False)
    else:
        fx.nvvm.setmaxnreg(232, increase=True)
    out[gpu.thread_idx.x] = warpgroup


@flyc.kernel
def scheduled_tiles(out: fx.Tensor, tiles_m: fx.Int32, tiles_n: fx.Int32, group_m: fx.Constexpr[int]):
    """out[t] = (m, n) of linear tile t as the persistent scheduler visits it."""
    sched = fx.TileScheduler(tiles_m, tiles_n, group_m=group_m)
    for t in range(sched.first, sched.count, sched.stride):
        m, n = sched.coords(t)
        out[t, 0] = m
        out[t, 1] = n


# --- CPU --------------------------------------------------------------------------------------------------------


def _tma_swizzled_offset(row: int, col: int, row_elements: int, element_bytes: int, swizzle: int) -> int:
    """The PTX ISA's swizzle: the 16-byte chunk index within a ``swizzle``-byte row XOR (row mod swizzle/16)."""
    byte = (row * row_elements + col) * element_bytes
    if swizzle:
        chunk_bits = swizzle // 16 - 1
        byte ^= ((byte >> 7) & chunk_bits) << 4
    return byte // element_bytes


@pytest.mark.parametrize("element_bytes", [1, 2, 4])
@pytest.mark.parametrize("swizzle", SWIZZLES)
def test_swizzle_layout_is_the_ptx_pattern(element_bytes, swizzle):
    cols = (swizzle or 64) // element_bytes
    rows = 16
    layout = swizzle_layout(element_bytes, swizzle, (rows, cols))
    for r in range(rows):
        for c in range(cols):
            assert layout(r, c) == _tma_swizzled_offset(r, c, cols, element_bytes, swizzle), (r, c)


def test_stages_start_on_the_swizzle_repeat():
    layout = swizzle_layout(2, 128, (4, 64), stages=3)  # 256 elements (512 bytes): stages 512 elements apart
    assert fl.cosize(layout) >= 2 * 512 + 4 * 64
    assert layout(0, 0, 1) == 512 and layout(1, 0, 2) == 1024 + 64 + 8


def test_tma_tile_checks_its_arguments():
    spec = flyc.TensorSpec((256, 128), "bf16")
    with pytest.raises(ValueError, match="box row of 256 bytes does not fit a 128-byte swizzle"):
        fx.TmaTile(spec, box=(64, 128), swizzle=128)
    with pytest.raises(ValueError, match="box: expected 2 ints in 1..256"):
        fx.TmaTile(spec, box=(64,), swizzle=128)
    with pytest.raises(ValueError, match="swizzle: expected one of"):
        fx.TmaTile(spec, box=(64, 64), swizzle=96)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        fx.TmaTile(flyc.TensorSpec((256, 128), "bf16", strides=(1, 256)), box=(64, 64))
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        fx.TmaTile(flyc.TensorSpec((256, 100), "bf16", strides=(100, 1)), box=(64, 64))
    with pytest.raises(TypeError, match="argument 'src': expected a fx.TmaTile"):
        tma_round_trip.lower(spec, fx.TmaTile(spec, (64, 64)), spec)


def test_tma_kernel_takes_descriptors_as_128_byte_grid_constants():
    spec = flyc.TensorSpec((300, 200), "bf16", strides=(200, 1))
    compiled = tma_round_trip.lower(
        fx.TmaTile(spec, (32, 64)), fx.TmaTile(spec, (32, 64)), flyc.TensorSpec((300, 200), "bf16")
    )
    assert compiled.kernels["tma_round_trip"].startswith("mllm")  # descriptor, its 2 extents; twice
    ptx = compiled.ptx
    assert re.search(r"\.param \.align 64 \.b8 tma_round_trip_param_0\[128\]", ptx)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx and "mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "prefetch.tensormap" in ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_a_stage_count_below_one_is_refused_naming_stages():
    with pytest.raises(ValueError, match="stages: expected a positive int"):
        swizzle_layout(2, 128, (64, 64), stages=0)


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_tma_pipeline_compiles(stages):
    """A pipeline of ``stages`` slots, one included: ``allocate(smem, stages)`` keeps the stage mode for any count."""
    spec = flyc.TensorSpec((64, 4096), "f32")
    compiled = pipelined_row_sums.lower(fx.TmaTile(spec, (64, 32)), flyc.TensorSpec((64,), "f32"), stages)
    assert compiled.ptx.count("mbarrier.init.shared") >= 2 * stages or compiled.ptx.count("mbarrier.init") >= 2
    assert compiled.shared_bytes["pipelined_row_sums"] >= stages * 64 * 32 * 4 + 2 * stages * 8


def test_kernel_attributes_reach_the_ptx():
    compiled = warp_specialized_registers.lower(flyc.TensorSpec((384,), "i32"))
    ptx = compiled.ptx
    assert ".reqntid 384, 1, 1" in ptx or ".reqntid 384" in ptx
    assert ".minnctapersm 1" in ptx and ".reqnctapercluster 2, 1, 1" in ptx
    assert re.search(r"setmaxnreg.dec.sync.aligned.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg.inc.sync.aligned.u32\s+232;", ptx)


def test_kernel_attributes_are_checked():
    with pytest.raises(ValueError, match="threads: a block has at most 1024 threads"):
        flyc.kernel(threads=(64, 32))(lambda out: None)
    with pytest.raises(ValueError, match="max_registers: expected an int in 24..255"):
        flyc.kernel(max_registers=300)(lambda out: None)


def test_multicast_load_compiles():
    spec = flyc.TensorSpec((96, 64), "bf16")
    ptx = tma_multicast.lower(fx.TmaTile(spec, (32, 64)), flyc.TensorSpec((192, 64), "bf16")).ptx
    assert ".multicast::cluster" in ptx and ".reqnctapercluster 2, 1, 1" in ptx


def test_tile_scheduler_compiles():
    compiled = scheduled_tiles.lower(flyc.TensorSpec((64, 2), "i32"), 8, 8, 4)
    assert "scheduled_tiles" in compiled.kernels


# --- GPU --------------------------------------------------------------------------------------------------------


def _random(torch, shape, torch_dtype):
    if torch_dtype == "int8":
        return torch.randint(-50, 50, shape, dtype=torch.int8, device="cuda")
    # Small integers: exact in every dtype, doubled included.
    return torch.randint(-64, 64, shape, device="cuda").to(getattr(torch, torch_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", SWIZZLES)
@pytest.mark.parametrize("dtype,torch_dtype,element_bytes", ELEMENTS)
def test_tma_round_trip_on_gpu(swizzle, dtype, torch_dtype, element_bytes):
    torch = pytest.importorskip("torch")
    cols = (swizzle or 64) // element_bytes
    rows = 16
    m, n = 3 * rows + 5, 2 * cols + 3  # partial boxes at both edges: zero-filled loads, clipped stores
    # Rows padded to 16 bytes, as TMA needs: a strided view.
    padded = -(-n * element_bytes // 16) * 16 // element_bytes
    src = _random(torch, (m, padded), torch_dtype)[:, :n]
    dst = torch.full((m, padded), 7, dtype=src.dtype, device="cuda")[:, :n]
    seen = torch.full((m, n), 7, dtype=src.dtype, device="cuda")
    grid = (-(-m // rows), -(-n // cols))
    call = tma_round_trip(fx.TmaTile(src, (rows, cols), swizzle), fx.TmaTile(dst, (rows, cols), swizzle), seen)
    call.launch(grid=grid, block=128)
    torch.cuda.synchronize()
    assert torch.equal(seen, src)
    assert torch.equal(dst, src + src)


@pytest.mark.gpu
def test_tma_multicast_on_gpu():
    torch = pytest.importorskip("torch")
    rows, cols, clusters = 32, 64, 3
    src = _random(torch, (rows * clusters, cols), "bfloat16")
    seen = torch.full((2 * rows * clusters, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    tma_multicast(fx.TmaTile(src, (rows, cols), 128), seen).launch(grid=2 * clusters, block=128)
    torch.cuda.synchronize()
    expected = src.view(clusters, 1, rows, cols).expand(clusters, 2, rows, cols).reshape(-1, cols)
    assert torch.equal(seen, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_tma_pipeline_on_gpu(stages):
    torch = pytest.importorskip("torch")
    rows, cols, k = 64, 32, 32 * 37 + 11  # many rounds of the ring; a partial last box
    x = torch.randint(-8, 8, (rows, -(-k // 4) * 4), device="cuda").float()[:, :k]  # rows 16-byte aligned
    out = torch.full((rows,), float("nan"), device="cuda")
    pipelined_row_sums(fx.TmaTile(x, (rows, cols), 128), out, stages).launch(grid=1, block=32 + rows)
    torch.cuda.synchronize()
    assert torch.equal(out, x.double().sum(dim=1).float())


def test_pipeline_advance_by_compiles():
    ptx = pipeline_positions.lower(flyc.TensorSpec((2, 64, 2), "i32"), 3).ptx
    assert "rem" in ptx or "mul.hi" in ptx  # the slot of a run-time jump: a remainder


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipeline_advance_by_walks_like_advance_on_gpu(stages):
    torch = pytest.importorskip("torch")
    out = torch.full((2, 64, 2), -1, dtype=torch.int32, device="cuda")
    pipeline_positions(out, stages).launch(grid=1, block=64)
    torch.cuda.synchronize()
    assert torch.equal(out[0], out[1])
    expected = [((1 + t) % stages, ((1 + t) // stages) % 2) for t in range(64)]
    assert out[0].tolist() == [list(p) for p in expected]


@pytest.mark.gpu
def test_setmaxnreg_kernel_runs_on_gpu():
    torch = pytest.importorskip("torch")
    out = torch.full((384 * 2,), -1, dtype=torch.int32, device="cuda")
    warp_specialized_registers(out).launch(grid=2, block=384)
    torch.cuda.synchronize()
    assert out[:384].tolist() == [t // 128 for t in range(384)]


@pytest.mark.gpu
@pytest.mark.parametrize("tiles_m,tiles_n,group_m", [(7, 5, 3), (16, 16, 8), (1, 9, 8)])
def test_tile_scheduler_visits_every_tile_once_on_gpu(tiles_m, tiles_n, group_m):
    torch = pytest.importorskip("torch")
    count = tiles_m * tiles_n
    out = torch.full((count, 2), -1, dtype=torch.int32, device="cuda")
    scheduled_tiles(out, tiles_m, tiles_n, group_m).launch(grid=4, block=1)
    torch.cuda.synchronize()
    pairs = [tuple(p) for p in out.tolist()]
    assert sorted(pairs) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    # grouped order: consecutive tiles walk down a group of group_m rows before the next column
    assert pairs[: min(group_m, tiles_m)] == [(m, 0) for m in range(min(group_m, tiles_m))]


def test_kernel_attributes_can_be_set_while_tracing():
    @flyc.kernel
    def sized(out: fx.Tensor, threads: fx.Constexpr[int]):
        if gpu.thread_idx.x == 0:
            flyc.set_kernel_attributes(threads=threads, max_registers=128)  # from inside a branch, too
        out[gpu.thread_idx.x] = 1

    compiled = sized.lower(flyc.TensorSpec((256,), "i32"), 256)
    assert re.search(r"\.reqntid 256(, 1, 1)?", compiled.ptx) and ".maxnreg 128" in compiled.ptx
    assert compiled.launch_shapes == {"sized": ((256, 1, 1), None)}  # what launches are checked against
    with pytest.raises(RuntimeError, match="call it from a kernel body"):
        flyc.set_kernel_attributes(threads=32)


def test_a_tile_of_raw_memory_specializes_like_one_of_a_tensor():
    raw = fx.TmaTile.of_memory(1 << 20, (300, 200), (200, 1), "bf16", (32, 64))
    spec = fx.TmaTile(flyc.TensorSpec((300, 200), "bf16", strides=(200, 1)), (32, 64))
    assert raw.key() == spec.key() and raw.source is None and raw.shape == (300, 200)
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        fx.TmaTile.of_memory(1 << 20, (300, 201), (201, 1), "bf16", (32, 64))
    promoted = fx.TmaTile.of_memory(1 << 20, (300, 200), (200, 1), "bf16", (32, 64), l2_promotion=256)
    assert promoted.l2_promotion == 256 and promoted.key() == raw.key()  # a descriptor property, not the kernel's
    with pytest.raises(ValueError, match="l2_promotion: expected 0, 64, 128 or 256"):
        fx.TmaTile.of_memory(1 << 20, (300, 200), (200, 1), "bf16", (32, 64), l2_promotion=512)


def test_launches_against_the_compiled_block_shape_are_refused_on_every_path(monkeypatch):
    calls = []
    monkeypatch.setattr(warp_specialized_registers, "_dispatch", lambda *args: calls.append(args) or True)
    out = flyc.TensorSpec((384,), "i32")
    with pytest.raises(ValueError, match=r"block: kernel 'warp_specialized_registers' was compiled for blocks of"):
        warp_specialized_registers(out).launch(grid=2, block=256)
    assert calls == []  # refused before the native dispatcher
    warp_specialized_registers(out).launch(grid=2, block=(384, 1, 1))
    assert len(calls) == 1

"""flydsl.kernels.gemm on the CPU: gemm_ws compiles to wgmma and TMA that assembles for sm_90a for each operand
major, tile shape, cluster, schedule, split K and stream-K, with wgmma kept pipelined (no C7514) and the epilogues'
loads as expected; the TMA store's staging boxes are reused safely; configurations and boxes are checked; the cost
model plans the kernel's units; argument errors. The GPU side is tests/kernels/test_gemm_gpu.py."""

from __future__ import annotations

import itertools
import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler import toolchain
from flydsl.kernels.gemm import (
    Epilogue,
    GemmConfig,
    candidate_configs,
    gemm,
    gemm_ws,
    max_stages,
    split_k_reduce,
    staging_bytes,
    staging_fits,
)
from flydsl.kernels.gemm.config import STORE_BOXES
from flydsl.kernels.gemm.epilogue import staging_wait
from flydsl.kernels.gemm.schedulers import split_plan

CFG = GemmConfig()
NONE = Epilogue()  # no bias, no activation, stored from registers
TMA = Epilogue(store="tma")


def _lower(a_tile, b_tile, c, cfg, majors=("K", "K"), epilogue=NONE, bias=None, c_store=None, scratch=None):
    """gemm_ws.lower with the unused arguments filled in: C's TMA store descriptor (``a_tile`` without "tma" in
    the epilogue), the bias, stream-K's workspace and flags (``scratch``)."""
    workspace, flags = scratch or (c, c)
    return gemm_ws.lower(a_tile, b_tile, c, c_store or a_tile, bias or c, workspace, flags, cfg, majors, epilogue)


def _candidate_structures():
    """One config per kernel structure candidate_configs offers on issue 8's shapes (tile, cluster, schedule, split or
    stream-K, staging boxes, stages; the split count folded to 2)."""
    import dataclasses

    nk = [(4096, 4096), (14336, 4096), (4096, 14336), (1536, 7168), (7168, 16384), (18432, 7168), (28672, 8192)]
    seen = {}
    for m in (64, 128, 512, 2048, 8192):
        for n, k in nk:
            for cfg in candidate_configs(m, n, k, 132):
                cfg = dataclasses.replace(cfg, split_k=min(cfg.split_k, 2))
                seen.setdefault(cfg, None)
    return list(seen)


@pytest.mark.skipif(toolchain.find_ptxas() is None, reason="needs ptxas")
def test_every_candidate_kernel_keeps_its_wgmma_pipelined():
    """ptxas serializes every wgmma of a kernel (C7514, a PerformanceWarning: an error here) where an accumulator read
    may come before the wait that retires its MMA: 128x192 tiles and every split-K kernel did, 10-25% slower. Each
    kernel structure the cost model can pick, with the epilogue gemm() gives it (TMA stores where they fit)."""
    m, n, k = 1000, 776, 520
    for cfg in _candidate_structures():
        a_spec, b_spec, c = (flyc.TensorSpec(shape, "bf16") for shape in ((m, k), (n, k), (m, n)))
        a_tile = fx.TmaTile(a_spec, (cfg.tile_m // cfg.cluster_n, 64))
        b_tile = fx.TmaTile(b_spec, (cfg.tile_n // cfg.cluster_m, 64))
        tma = staging_fits(cfg)
        scratch = (flyc.TensorSpec((1 << 22,), "f32"), flyc.TensorSpec((1024,), "i32"))
        epilogue = TMA if tma else NONE
        c_store = fx.TmaTile(c, (64, 64)) if tma else None
        compiled = _lower(a_tile, b_tile, c, cfg, epilogue=epilogue, c_store=c_store, scratch=scratch)
        assert compiled.cubin is not None and not compiled.performance_notes, cfg


@pytest.mark.parametrize("a_major,b_major", [("K", "K"), ("K", "MN"), ("MN", "K"), ("MN", "MN")])
def test_gemm_compiles_to_wgmma_and_tma(a_major, b_major):
    m, n, k = 1000, 776, 520
    a_spec = flyc.TensorSpec((m, k) if a_major == "K" else (k, m), "bf16")
    b_spec = flyc.TensorSpec((n, k) if b_major == "K" else (k, n), "bf16")
    a_box = (CFG.tile_m, 64) if a_major == "K" else (CFG.tile_k, 64)
    b_box = (CFG.tile_n // CFG.cluster_m, 64) if b_major == "K" else (CFG.tile_k, 64)
    c = flyc.TensorSpec((m, n), "bf16")
    compiled = _lower(fx.TmaTile(a_spec, a_box), fx.TmaTile(b_spec, b_box), c, CFG, (a_major, b_major))
    ptx = compiled.ptx
    assert len(re.findall(r"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ptx)) == CFG.tile_k // 16
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert ".multicast::cluster" in ptx and f".reqnctapercluster {CFG.cluster_m}, 1, 1" in ptx
    assert re.search(r"setmaxnreg.inc.sync.aligned.u32\s+232;", ptx)
    assert compiled.shared_bytes["gemm_ws"] >= CFG.stages * CFG.stage_bytes()
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_gemm_sass_uses_hgmma():
    """The assembled kernel multiplies with Hopper's warpgroup MMA (HGMMA in the SASS), not a fallback."""
    spec = flyc.TensorSpec((512, 512), "bf16")
    compiled = _lower(fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (128, 64)), spec, CFG)
    sass = toolchain.disassemble_cubin(compiled.cubin) if compiled.cubin is not None else None
    if sass is None:
        pytest.skip("needs ptxas and nvdisasm (pip install nvidia-cuda-nvdisasm)")
    assert "HGMMA.64x256x16.F32.BF16" in sass
    assert "UTMALDG" in sass  # the TMA loads


@pytest.mark.parametrize(
    "epilogue",
    [
        Epilogue(bias=True),
        Epilogue(bias=True, activation="gelu"),
        Epilogue(activation="silu"),
        Epilogue(bias=True, activation="relu"),
    ],
)
def test_epilogues_compile(epilogue):
    spec = flyc.TensorSpec((512, 512), "bf16")
    bias = flyc.TensorSpec((512,), "f32")
    compiled = _lower(fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (128, 64)), spec, CFG, epilogue=epilogue, bias=bias)
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None
    assert compiled.ptx.count("wgmma.mma_async") == CFG.tile_k // 16  # the main loop is the same
    # The epilogue is computed once per element (not once per store path): each thread reads its 64 bias columns
    # once (a 32-bit bias: ld.global.f32/b32), however the tile is stored.
    bias_loads = len(re.findall(r"ld\.global(?:\.nc)?\.(?:f32|b32)", compiled.ptx))
    assert bias_loads == (CFG.tile_n // 4 if epilogue.bias else 0)


@pytest.mark.parametrize("epilogue", [TMA, Epilogue(bias=True, activation="gelu", store="tma")])
def test_tma_store_epilogue_compiles(epilogue):
    """The TMA-store epilogue: stmatrix into two 128B-swizzled staging boxes per consumer, TMA stores from them; it
    fits beside the 4-stage pipeline of 128 x 256 tiles, without spills."""
    spec = flyc.TensorSpec((1000, 520), "bf16")
    a_tile, c_tile = fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (64, 64))
    bias = flyc.TensorSpec((520,), "f32")
    compiled = _lower(a_tile, fx.TmaTile(spec, (128, 64)), spec, CFG, epilogue=epilogue, bias=bias, c_store=c_tile)
    ptx = compiled.ptx
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == CFG.tile_n // 16  # 4 per 64-column part
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx and "cp.async.bulk.wait_group.read" in ptx
    assert not re.search(r"st\.global\.(b16|b32)", ptx)  # no register stores left
    assert CFG.stages * CFG.stage_bytes() + staging_bytes(CFG) <= compiled.shared_bytes["gemm_ws"] <= 227 * 1024
    sass = toolchain.disassemble_cubin(compiled.cubin) if compiled.cubin is not None else None
    if sass is not None:
        assert "STSM" in sass and "UTMASTG" in sass and "STL" not in sass


def test_staging_boxes_are_read_before_they_are_rewritten():
    """The TMA-store epilogue's wait before each part rewrites its staging box (part p of a consumer tile: box
    p % boxes, a ring of one, two or four boxes) leaves pending only stores of other boxes, over tiles stored one
    after another, and no fewer than it may. Where the tile's part count is not a multiple of the ring (tile_n 64 or
    192 with two boxes), an early part's box was last used by the previous tile's late part: fewer groups since."""
    for boxes, parts in itertools.product(STORE_BOXES, range(1, 9)):
        stores = []  # the box of every bulk group committed so far, oldest first
        for _ in range(3):  # tiles
            for part in range(parts):
                box = part % boxes
                wait = staging_wait(part, parts, boxes)
                still_reading = stores[max(0, len(stores) - wait) :] if wait else []  # after the wait
                assert box not in still_reading, (boxes, parts, part)
                if wait < boxes - 1 and len(stores) > wait:
                    assert stores[-wait - 1] == box, (boxes, parts, part)  # waiting for one store fewer would race
                stores.append(box)


@pytest.mark.parametrize(
    "tile_m,tile_n,schedule,boxes,full_waits",
    [(128, 192, "cooperative", 2, 1), (128, 64, "pingpong", 2, 0), (256, 128, "cooperative", 1, 4)],
)
def test_tma_store_waits_with_odd_parts(tile_m, tile_n, schedule, boxes, full_waits):
    """A consumer tile of 3 parts (64 x 192) in two boxes: its first part waits until the previous tile's last store
    has read the box both use (``wait_group.read 0``); two parts (pingpong's 128 x 64: two 64-row blocks) never need
    to, nor do 64 x 256 blocks; with one box every part waits."""
    spec = flyc.TensorSpec((1000, 520), "bf16")
    stages = max_stages(tile_m, tile_n, store_boxes=boxes)
    cfg = GemmConfig(tile_m=tile_m, tile_n=tile_n, stages=stages, cluster_m=1, schedule=schedule, store_boxes=boxes)
    a_tile, b_tile, c_tile = fx.TmaTile(spec, (tile_m, 64)), fx.TmaTile(spec, (tile_n, 64)), fx.TmaTile(spec, (64, 64))
    ptx = _lower(a_tile, b_tile, spec, cfg, epilogue=TMA, c_store=c_tile).ptx
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)) == full_waits
    full = _lower(
        fx.TmaTile(spec, (128, 64)),
        fx.TmaTile(spec, (128, 64)),
        spec,
        CFG,
        epilogue=TMA,
        c_store=c_tile,
    ).ptx
    assert not re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", full)


@pytest.mark.parametrize("split_k,split_tail", [(2, False), (5, False), (3, True)])
def test_split_k_compiles(split_k, split_tail):
    """Split K: every part of a tile writes fp32 partials (16-byte workspace quads) and counts itself on the tile's
    counter (acq_rel atomic); the part that counts last sums them and stores C through the TMA-store epilogue: no
    second kernel, no spin wait."""
    cfg = GemmConfig(split_k=split_k, cluster_m=1, split_tail=split_tail)
    a, b = flyc.TensorSpec((16, 4096), "bf16"), flyc.TensorSpec((4096, 4096), "bf16")
    out, bias = flyc.TensorSpec((16, 4096), "bf16"), flyc.TensorSpec((4096,), "f32")
    scratch = flyc.TensorSpec((split_k * 16 * 128 * 256,), "f32"), flyc.TensorSpec((split_k * 32,), "i32")
    c_tile = fx.TmaTile(out, (64, 64))
    tiles = fx.TmaTile(a, (128, 64)), fx.TmaTile(b, (256, 64))
    epilogue = Epilogue(bias=True, activation="silu", store="tma")
    compiled = _lower(*tiles, out, cfg, epilogue=epilogue, bias=bias, c_store=c_tile, scratch=scratch)
    ptx = compiled.ptx
    assert ptx.count("wgmma.mma_async") == cfg.tile_k // 16
    assert "atom.acq_rel.gpu.global.add.s32" in ptx and "ld.acquire" not in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
    # the skinny kernel's split K still sums its partials in split_k_reduce
    partials = flyc.TensorSpec((split_k * 16, 4096), "f32")
    reduce_ptx = split_k_reduce.lower(partials, out, bias, split_k, Epilogue(bias=True, activation="silu")).ptx
    assert reduce_ptx.count("ld.global.f32") + reduce_ptx.count("ld.global.b32") >= split_k


def test_gemm_config_and_boxes_are_checked():
    with pytest.raises(ValueError, match="tile_m must split into 2 consumer warpgroups"):
        GemmConfig(tile_m=64)
    with pytest.raises(ValueError, match="cluster_m must be 1, 2 or 4"):
        GemmConfig(cluster_m=3)
    with pytest.raises(ValueError, match="cluster_n must be 1, 2 or 4 and split tile_m into 64-row parts"):
        GemmConfig(tile_m=64, consumers=1, cluster_m=1, cluster_n=2)
    with pytest.raises(ValueError, match="along M .cluster_m. or along N .cluster_n., not both"):
        GemmConfig(tile_m=256, tile_n=128, cluster_m=2, cluster_n=2)
    with pytest.raises(ValueError, match="split_tail splits the last wave's tiles into split_k parts"):
        GemmConfig(split_tail=True)
    with pytest.raises(ValueError, match="split_k must be an int in 1..64"):
        GemmConfig(split_k=0)
    with pytest.raises(ValueError, match="parts of a multiple of 8 columns"):
        GemmConfig(tile_n=144, cluster_m=4)  # 36-column parts
    with pytest.raises(ValueError, match=r"store_boxes must be one of \(1, 2, 4\)"):
        GemmConfig(store_boxes=3)
    spec = flyc.TensorSpec((512, 512), "bf16")
    with pytest.raises(ValueError, match=r"gemm_ws b: expected TMA boxes of \(128, 64\)"):
        _lower(fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (256, 64)), spec, CFG)


@pytest.mark.parametrize(
    "tile_m,tile_n,consumers,cluster_m",
    [(128, 128, 2, 1), (128, 128, 2, 2), (128, 64, 2, 1), (64, 256, 1, 1), (128, 192, 2, 1), (256, 128, 2, 2)],
)
def test_tile_shapes_compile(tile_m, tile_n, consumers, cluster_m):
    stages = max_stages(tile_m, tile_n)
    cfg = GemmConfig(tile_m=tile_m, tile_n=tile_n, stages=stages, consumers=consumers, cluster_m=cluster_m)
    spec = flyc.TensorSpec((512, 512), "bf16")
    a_tile, b_tile = fx.TmaTile(spec, (tile_m, 64)), fx.TmaTile(spec, (tile_n // cluster_m, 64))
    compiled = _lower(a_tile, b_tile, spec, cfg)
    wgmmas = compiled.ptx.count(f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16")
    assert wgmmas and wgmmas % (cfg.tile_k // 16) == 0  # LLVM may duplicate the K step's body (a short one)
    assert f".reqntid {cfg.threads}, 1, 1" in compiled.ptx
    assert cfg.stages * cfg.stage_bytes() <= compiled.shared_bytes["gemm_ws"] <= 227 * 1024
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("tile_m,cluster_n", [(256, 2), (128, 2), (256, 4)])
def test_cluster_along_n_compiles(a_major, tile_m, cluster_n):
    """Clusters along N: the CTAs share the A tile (each loads tile_m / cluster_n rows of it, multicast to all) and
    take consecutive tile columns; B is loaded whole, without multicast."""
    cfg = GemmConfig(tile_m=tile_m, tile_n=128, stages=max_stages(tile_m, 128), cluster_m=1, cluster_n=cluster_n)
    assert cfg.cluster == cluster_n
    m, n, k = 1000, 776, 520
    a_spec = flyc.TensorSpec((m, k) if a_major == "K" else (k, m), "bf16")
    a_box = (tile_m // cluster_n, 64) if a_major == "K" else (64, 64)
    b_spec = flyc.TensorSpec((n, k), "bf16")
    compiled = _lower(
        fx.TmaTile(a_spec, a_box), fx.TmaTile(b_spec, (128, 64)), flyc.TensorSpec((m, n), "bf16"), cfg, (a_major, "K")
    )
    ptx = compiled.ptx
    assert f".reqnctapercluster {cluster_n}, 1, 1" in ptx
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global[^;]*;", ptx)
    multicast = [load for load in loads if ".multicast::cluster" in load]
    assert multicast and len(multicast) < len(loads)  # A's parts multicast, B's tile loaded alone
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None
    with pytest.raises(ValueError, match="expected TMA boxes"):  # the whole A tile per CTA: the wrong box
        _lower(
            fx.TmaTile(a_spec, (tile_m, 64) if a_major == "K" else (64, 64)),
            fx.TmaTile(b_spec, (64, 64)),
            flyc.TensorSpec((m, n), "bf16"),
            cfg,
            (a_major, "K"),
        )


@pytest.mark.parametrize("cluster_m", [1, 2])
def test_pingpong_compiles(cluster_m):
    """Each consumer multiplies whole 128 x 128 tiles (two m64n128 atoms per K step) without spilling."""
    cfg = GemmConfig(tile_n=128, stages=max_stages(128, 128), cluster_m=cluster_m, schedule="pingpong")
    assert cfg.consumer_rows == 128 and cfg.threads == 384
    spec = flyc.TensorSpec((1000, 520), "bf16")
    compiled = _lower(fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (128 // cluster_m, 64)), spec, cfg)
    wgmmas = compiled.ptx.count("wgmma.mma_async.sync.aligned.m64n128k16")
    assert wgmmas and wgmmas % (2 * cfg.tile_k // 16) == 0
    # full + empty per slot, and the consumers' order barriers (their turns at the K steps)
    assert compiled.ptx.count("mbarrier.init") == 2 * cfg.stages + 2
    sass = toolchain.disassemble_cubin(compiled.cubin) if compiled.cubin is not None else None
    if sass is not None:
        assert "HGMMA.64x128x16.F32.BF16" in sass and "STL" not in sass


@pytest.mark.parametrize("tile_n,cluster_m", [(256, 2), (192, 1)])
def test_stream_k_compiles(tile_n, cluster_m):
    """Stream-K: partial tiles go through 16-byte workspace stores and loads, handed over by release/acquire flags
    (named barriers per consumer warpgroup), with no spills."""
    cfg = GemmConfig(tile_n=tile_n, stages=max_stages(128, tile_n), cluster_m=cluster_m, stream_k=True)
    spec = flyc.TensorSpec((1000, 520), "bf16")
    workspace, flags = flyc.TensorSpec((132 * 128 * tile_n,), "f32"), flyc.TensorSpec((264,), "i32")
    a_tile, b_tile = fx.TmaTile(spec, (128, 64)), fx.TmaTile(spec, (tile_n // cluster_m, 64))
    compiled = _lower(a_tile, b_tile, spec, cfg, scratch=(workspace, flags))
    ptx = compiled.ptx
    assert "red.release.gpu.global.add.s32" in ptx and "ld.acquire.gpu.global.b32" in ptx
    assert ptx.count("st.global.v4.b32") == ptx.count("ld.global.v4.b32") == tile_n // 8  # 16-byte quads
    sass = toolchain.disassemble_cubin(compiled.cubin) if compiled.cubin is not None else None
    if sass is not None:
        assert f"HGMMA.64x{tile_n}x16.F32.BF16" in sass and "STL" not in sass


def test_pingpong_configs_are_checked():
    with pytest.raises(ValueError, match="pingpong takes 2 consumers"):
        GemmConfig(tile_n=256, schedule="pingpong")  # 128 x 256 accumulators per consumer: too many registers
    with pytest.raises(ValueError, match="pingpong takes 2 consumers"):
        GemmConfig(tile_n=128, split_k=2, schedule="pingpong")
    with pytest.raises(ValueError, match="schedule must be"):
        GemmConfig(schedule="stream")
    with pytest.raises(ValueError, match="stream_k takes the cooperative schedule and no split K"):
        GemmConfig(split_k=2, stream_k=True)
    with pytest.raises(ValueError, match="stream_k takes clusters of at most 2 CTAs"):
        GemmConfig(tile_n=256, cluster_m=4, stream_k=True)
    assert GemmConfig(tile_m=64, tile_n=256, cluster_m=1, schedule="pingpong").consumer_rows == 64


def test_candidate_configs_fit_the_problem():
    for m, n, k in [(64, 4096, 4096), (128, 1536, 7168), (512, 8192, 8192), (8192, 8192, 8192)]:
        configs = candidate_configs(m, n, k, 132)
        assert configs and len(set(configs)) == len(configs)
        for cfg in configs:
            assert cfg.tile_m == 128 or (m <= 64) == (cfg.tile_m == 64)  # 64-row tiles only for problems that small
            assert cfg.tile_m < 256 or (m >= 2048 and cfg.tile_n == 128)  # 256 x 128 tiles for large M
            assert cfg.cluster_m == 1 or m > cfg.tile_m  # a cluster shares B between two tile rows
            tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
            slots = 132 // cfg.cluster_m * cfg.cluster_m
            if cfg.split_tail:  # only a last wave that leaves SMs idle is split
                assert tiles >= 132 and tiles % slots
            else:
                assert cfg.split_k == 1 or tiles < 132  # K is split only when the tiles leave SMs idle
            # the deepest pipeline: one staging box per consumer only where it buys a stage (128 x 192 tiles)
            deepest = max(max_stages(cfg.tile_m, cfg.tile_n, store_boxes=boxes) for boxes in (1, 2))
            assert cfg.stages == max_stages(cfg.tile_m, cfg.tile_n, store_boxes=cfg.store_boxes) == deepest >= 4
            assert cfg.store_boxes == 2 or max_stages(cfg.tile_m, cfg.tile_n) < deepest


def test_split_plan_splits_only_the_last_wave():
    tail = GemmConfig(split_k=3, split_tail=True)
    assert split_plan(150, 66, tail) == (132, 132 + 18 * 3)  # 2 whole waves, the 18 tiles past them in 3 parts
    assert split_plan(132, 66, tail) == (132, 132)  # full waves: nothing split
    assert split_plan(50, 66, tail) == (0, 150)  # fewer tiles than CTAs: all split, as without split_tail
    assert split_plan(150, 66, GemmConfig(split_k=3)) == (0, 450)
    assert split_plan(150, 66, GemmConfig()) == (150, 150)
    assert any(c.split_tail for c in candidate_configs(2048, 7168, 18432, 132))
    assert not any(c.split_tail for c in candidate_configs(128, 4096, 4096, 132))  # fewer tiles than SMs


def test_cost_model_plans_the_kernels_units(monkeypatch):
    """estimated_seconds plans split tails as gemm() and the kernel do: over cluster tiles and clusters (3 tile rows
    in 2-CTA clusters run as 2 cluster rows, a row of CTAs past C's edge included)."""
    import flydsl.kernels.gemm.config as gemm_config

    calls = []
    real = gemm_config.split_plan
    monkeypatch.setattr(gemm_config, "split_plan", lambda *args: calls.append(args[:2]) or real(*args))
    cfg = GemmConfig(tile_n=128, stages=6, cluster_m=2, split_k=3, split_tail=True)
    gemm_config.estimated_seconds(384, 14336, 7168, cfg, 132)
    assert calls == [(2 * 112, 66)]  # ceil(3 / 2) cluster rows x 112 tile columns, over 66 clusters


def test_gemm_rejects_bad_arguments_before_launch():
    """The devices first (CPU tensors are refused by name), then shapes, dtypes, strides and overlaps, checked on CPU
    tensors here through check_arguments, which gemm() runs next."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm.arguments import check_arguments

    a = torch.randn(64, 32).bfloat16()
    with pytest.raises(ValueError, match="flydsl.kernels.gemm: a: expected a CUDA tensor, got one on cpu"):
        gemm(a, torch.randn(32, 64).bfloat16())

    def check(*args, out=None, bias=None, activation=None):
        return check_arguments("flydsl.kernels.gemm", *args, out, bias, activation)

    assert check(a, torch.randn(32, 48).bfloat16()) == (64, 48, 32)
    with pytest.raises(ValueError, match=r"flydsl.kernels.gemm: b: expected 32 rows \(a's columns\)"):
        check(a, torch.randn(16, 64).bfloat16())
    with pytest.raises(TypeError, match=r"b: expected dtype bfloat16 \(a's\), got float16"):
        check(a, torch.randn(32, 64).half())
    with pytest.raises(ValueError, match="flydsl.kernels.gemm: activation: expected one of"):
        check(a, torch.randn(32, 64).bfloat16(), activation="tanh")
    with pytest.raises(ValueError, match=r"flydsl.kernels.gemm: bias: expected a \(64,\) vector, contiguous"):
        check(a, torch.randn(32, 64).bfloat16(), bias=torch.randn(32))
    with pytest.raises(ValueError, match=r"flydsl.kernels.gemm: out: expected a row-major \(64, 64\) tensor"):
        check(a, torch.randn(32, 64).bfloat16(), out=torch.empty(64, 64).t())
    with pytest.raises(ValueError, match="flydsl.kernels.gemm: out: overlaps a in memory"):
        square = torch.randn(64, 64).bfloat16()
        check(square, torch.randn(64, 64).bfloat16(), out=square)
    b = torch.randn(32, 64).bfloat16()
    check(a, b, out=torch.empty(64, 64).bfloat16())  # its own memory: accepted


def test_b_parts_of_96_columns_multicast_from_a_k_major_b():
    """128 x 192 tiles in clusters along M (cuBLAS's choice at 2048 x 1536 x 7168): each CTA loads 96 rows of a
    K-major B box and multicasts them; one staging box per consumer leaves room for a fifth stage. An MN-major B
    (64-column TMA boxes) cannot be cut into 96-column parts: refused when traced, naming the operand."""
    assert (max_stages(128, 192), max_stages(128, 192, store_boxes=1)) == (4, 5)
    cfg = GemmConfig(tile_n=192, stages=5, cluster_m=2, store_boxes=1)
    m, n, k = 1000, 776, 520
    a_spec, c = flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((m, n), "bf16")
    a_tile, c_tile = fx.TmaTile(a_spec, (128, 64)), fx.TmaTile(c, (64, 64))
    b_tile = fx.TmaTile(flyc.TensorSpec((n, k), "bf16"), (96, 64))
    compiled = _lower(a_tile, b_tile, c, cfg, epilogue=TMA, c_store=c_tile)
    assert compiled.shared_bytes["gemm_ws"] >= 5 * cfg.stage_bytes() + staging_bytes(cfg)
    ptx = compiled.ptx
    assert "multicast::cluster" in ptx and "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16" in ptx
    # one box per consumer: every part's store waits until the box's previous store has read it
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)) == 3 * cfg.consumer_rows // 64
    b_mn = fx.TmaTile(flyc.TensorSpec((k, n), "bf16"), (64, 64))
    with pytest.raises(ValueError, match="gemm_ws b: MN-major parts of 96 rows"):
        _lower(a_tile, b_mn, c, cfg, ("K", "MN"))


@pytest.mark.parametrize("tile_m,tile_n", [(64, 96), (128, 144), (128, 176), (128, 80)])
def test_tile_widths_off_the_64_column_grid_compile_for_a_k_major_b(tile_m, tile_n):
    """cuBLAS's one-wave widths (64x96 at 512x1536x7168, 128x144 at 128x18432x7168, 128x176 at 2048x7168x16384):
    wgmma takes any N that is a multiple of 8, a K-major B any box height; C is stored from registers (the TMA-store
    boxes are 64 columns wide, refused here), and an MN-major B (64-column boxes) is refused when traced."""
    consumers = 1 if tile_m == 64 else 2
    cfg = GemmConfig(tile_m=tile_m, tile_n=tile_n, consumers=consumers, stages=4, cluster_m=1)
    m, n, k = 1000, 776, 520
    a_spec, c = flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((m, n), "bf16")
    a_tile, b_tile = fx.TmaTile(a_spec, (tile_m, 64)), fx.TmaTile(flyc.TensorSpec((n, k), "bf16"), (tile_n, 64))
    ptx = _lower(a_tile, b_tile, c, cfg).ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.bf16.bf16" in ptx
    assert "cp.async.bulk.tensor" in ptx and "cp.async.bulk.tensor.2d.global.shared" not in ptx  # loads, no stores
    with pytest.raises(ValueError, match="TMA-store epilogue takes tile_n in 64-column parts"):
        _lower(a_tile, b_tile, c, cfg, epilogue=TMA, c_store=fx.TmaTile(c, (64, 64)))
    b_mn = fx.TmaTile(flyc.TensorSpec((k, n), "bf16"), (64, 64))
    with pytest.raises(ValueError, match=f"gemm_ws b: MN-major parts of {tile_n} rows"):
        _lower(a_tile, b_mn, c, cfg, ("K", "MN"))
    with pytest.raises(ValueError, match="tile_n a multiple of 16"):
        GemmConfig(tile_n=88, cluster_m=1)

"""Hopper wgmma (flydsl.expr.wgmma). CPU: layout atoms and descriptor fields against values derived by hand from the
PTX ISA's matrix-descriptor rules, layouts wgmma cannot read, PTX with wgmma.mma_async assembling for sm_90a. GPU
(``gpu``): one wgmma tile per configuration against an fp32 torch reference, with the accumulate flag set at run
time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu, nvvm, wgmma

from .fakes import FakeGpuTensor

# --- the kernel under test ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One wgmma tile: A (64, K) from shared memory (or registers: ``rs``), B (N, K), K = 4 instructions."""

    dtype: str = "bf16"  # bf16, f16, e4m3, e5m2
    n: int = 64
    a_swizzle: int = 128
    b_swizzle: int = 128
    b_major: str = "K"  # MN: B stored N-contiguous (global B is (K, N) row-major)
    rs: bool = False
    tile_m: int = 64
    warpgroups: int = 1

    @property
    def element(self):
        return {"bf16": fx.BFloat16, "f16": fx.Float16, "e4m3": fx.Float8E4M3FN, "e5m2": fx.Float8E5M2}[self.dtype]

    @property
    def storage(self):
        """What the tensors hold in memory: fp8 as bytes."""
        return fx.Int8 if self.element.width == 8 else self.element  # uint8 tensors arrive as i8

    @property
    def k_tile(self) -> int:
        return 4 * (32 // (self.element.width // 8))

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups


def _copy_to_shared(src, dst, rows: int, cols: int, transpose: bool, tid, threads: int, col0=0):
    """dst[r, c] = src[r, col0 + c] (src[col0 + c, r] when ``transpose``) for a rows x cols tile, by plain threads."""
    for i in range(0, rows * cols // threads, 1):
        index = i * threads + tid
        r, c = index // cols, index % cols
        target = r + rows * c  # dst's linear (column-major) index: its modes may be nested
        if fx.const_expr(transpose):
            dst[target] = src[col0 + c, r]
        else:
            dst[target] = src[r, col0 + c]


@flyc.kernel
def wgmma_tile(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, accumulate: fx.Int32, init: fx.Float32, case: fx.Constexpr):
    """C (tile_m, N) = A (tile_m, K) @ B^T (+ init when accumulate != 0), K = 4 wgmma steps."""
    tid = gpu.thread_idx.x
    storage, k = case.storage, case.k_tile
    a_layout = wgmma.smem_layout(storage, (case.tile_m, k), "K", case.a_swizzle)
    b_layout = wgmma.smem_layout(storage, (case.n, k), case.b_major, case.b_swizzle)
    smem = fx.SmemAllocator()
    s_a = smem.allocate(storage, a_layout, alignment=wgmma.smem_alignment(a_layout, storage))  # (M, K)
    s_b = smem.allocate(storage, b_layout, alignment=wgmma.smem_alignment(b_layout, storage))  # (N, K)
    _copy_to_shared(a, s_a, case.tile_m, k, False, tid, case.threads)
    _copy_to_shared(b, s_b, case.n, k, case.b_major == "MN", tid, case.threads)
    nvvm.fence_proxy_async("shared")  # the generic-proxy stores above, before wgmma reads them (async proxy)
    gpu.barrier()

    atom = wgmma.MmaAtom(case.element, case.n, a_from_registers=case.rs)
    mma = wgmma.TiledMma(atom, tile_m=case.tile_m, warpgroups_m=case.warpgroups)
    accumulators = mma.make_accumulators(init)
    a_operand = s_a
    if fx.const_expr(case.rs):
        steps = k // atom.k
        a_operand = [atom.load_a(fx.local_tile(s_a, (64, atom.k), (mi, ks))) for ks in range(steps) for mi in [0]]
    accumulators = wgmma.fence(accumulators)
    accumulators = mma.mma(a_operand, s_b, accumulators, accumulate=accumulate != 0)
    wgmma.commit_group()
    accumulators = wgmma.wait_group(0, accumulators)
    mma.store_accumulators(accumulators, c)


@flyc.kernel
def wgmma_k_loop(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, k_tiles: fx.Int32, case: fx.Constexpr):
    """C (64, N) = A (64, K) @ B^T over a run-time number of K tiles through a 2-stage shared buffer: accumulators
    carried by an scf.for, the accumulate flag ``kt > 0`` decided at run time, descriptors of a dynamic stage."""
    tid = gpu.thread_idx.x
    storage, k = case.storage, case.k_tile
    a_layout = wgmma.smem_layout(storage, (64, k, 2), "K", case.a_swizzle)  # (M, K, stage)
    b_layout = wgmma.smem_layout(storage, (case.n, k, 2), case.b_major, case.b_swizzle)  # (N, K, stage)
    smem = fx.SmemAllocator()
    s_a = smem.allocate(storage, a_layout, alignment=wgmma.smem_alignment(a_layout, storage))
    s_b = smem.allocate(storage, b_layout, alignment=wgmma.smem_alignment(b_layout, storage))
    mma = wgmma.TiledMma(wgmma.MmaAtom(case.element, case.n))
    for kt, accumulators in range(0, k_tiles, 1, init=mma.make_accumulators(float("nan"))):
        s_a_stage, s_b_stage = s_a[None, None, kt % 2], s_b[None, None, kt % 2]  # (M, K), (N, K)
        _copy_to_shared(a, s_a_stage, 64, k, False, tid, 128, kt * k)
        _copy_to_shared(b, s_b_stage, case.n, k, case.b_major == "MN", tid, 128, kt * k)
        nvvm.fence_proxy_async("shared")
        gpu.barrier()
        accumulators = wgmma.fence(accumulators)
        accumulators = mma.mma(s_a_stage, s_b_stage, accumulators, accumulate=kt > 0)  # NaN start dropped at kt 0
        wgmma.commit_group()
        accumulators = wgmma.wait_group(0, accumulators)
        results = yield accumulators
    mma.store_accumulators(results, c)


def _fake(shape, typestr, k=0):
    return FakeGpuTensor(shape, typestr, pointer=(1 << 20) + k * (1 << 16))


_TYPESTR = {"bf16": "<bfloat16", "f16": "<f2", "e4m3": "|u1", "e5m2": "|u1"}


def _fake_args(case: Case):
    b_shape = (case.k_tile, case.n) if case.b_major == "MN" else (case.n, case.k_tile)
    return [
        _fake((case.tile_m, case.k_tile), _TYPESTR[case.dtype]),
        _fake(b_shape, _TYPESTR[case.dtype], 1),
        _fake((case.tile_m, case.n), "<f4", 2),
        1,
        0.0,
        case,
    ]


def _ptx(case: Case) -> str:
    module = wgmma_tile.lower(*_fake_args(case))
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


# --- CPU: layout atoms ----------------------------------------------------------------------------------------------

# PTX ISA, "Shared Memory Matrix Layout", table of swizzle atoms in 128-bit units (MN x K): MN-major 128B 8x8, 64B
# 4x8, 32B 2x8, none 1x8; K-major 128B 8x8, 64B 8x4, 32B 8x2, none 8x1. Along the leading (contiguous) dimension a
# 128-bit unit holds 16 / element_bytes elements.
_ATOMS_IN_128_BIT_UNITS = {
    ("MN", 128): (8, 8),
    ("MN", 64): (4, 8),
    ("MN", 32): (2, 8),
    ("MN", 0): (1, 8),
    ("K", 128): (8, 8),
    ("K", 64): (8, 4),
    ("K", 32): (8, 2),
    ("K", 0): (8, 1),
}


@pytest.mark.parametrize("dtype", [fx.BFloat16, fx.Float8E4M3FN])
@pytest.mark.parametrize("major, swizzle", list(_ATOMS_IN_128_BIT_UNITS))
def test_layout_atoms_follow_the_ptx_table(dtype, major, swizzle):
    per_unit = 16 // (dtype.width // 8)
    mn_units, k_units = _ATOMS_IN_128_BIT_UNITS[(major, swizzle)]
    expected = (mn_units * per_unit, k_units) if major == "MN" else (mn_units, k_units * per_unit)
    atom = wgmma.layout_atom(dtype, major, swizzle)
    assert fl.product_each(atom.shape) == expected
    # The swizzle xors bits 4.. of byte offsets with bits 7..: Swizzle<log2(swizzle / 16), 4, 3> in bytes.
    bits = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle]
    assert atom.outer == fl.Swizzle(bits, 4 - (dtype.width // 8 - 1), 3)
    assert fl.cosize(atom.inner) == fl.size(atom.inner)  # compact: one element per offset
    contiguous = (1, 0) if major == "MN" else (0, 1)
    assert atom.inner(contiguous) == 1


def test_smem_layouts_tile_the_atom():
    layout = wgmma.smem_layout(fx.BFloat16, (128, 64, 3), "K", 128)
    assert str(layout) == "Sw<3,3,3> o 0 o (128,64,3):(64,1,8192)"  # 16 atoms of 8 x 128 B down M, then stages
    assert wgmma.smem_alignment(layout, fx.BFloat16) == 1024
    assert wgmma.smem_alignment(wgmma.smem_layout(fx.BFloat16, (64, 64), "MN", 32), fx.BFloat16) == 256
    assert wgmma.smem_alignment(wgmma.smem_layout(fx.Float8E4M3FN, (64, 64), "K", 0), fx.Float8E4M3FN) == 128
    with pytest.raises(ValueError, match=r"covers \(64, 8\); shape \(96, 64\) is not a multiple"):
        wgmma.smem_layout(fx.BFloat16, (96, 64), "MN", 128)
    with pytest.raises(ValueError, match="swizzle must be one of"):
        wgmma.layout_atom(fx.BFloat16, "K", 16)
    with pytest.raises(TypeError, match="16-bit or 8-bit"):
        wgmma.layout_atom(fx.Float32, "K", 128)


# --- CPU: descriptor fields, derived by hand from the PTX ISA -------------------------------------------------------
#
# A core matrix is 8 rows of 16 bytes. K-major: SBO is the distance between 8-row groups along M/N; LBO (no swizzle
# only) between the two 16-byte core columns of K. MN-major: without swizzle, SBO is between 16-byte chunks along
# M/N and LBO between groups of 8 K rows; swizzled, LBO is between swizzle-width chunks along M/N and SBO between
# groups of 8 K rows. Tiles are atoms repeated down MN first, then along K (smem_layout's order).
#
# bf16, A tile (64, 64), instruction (64, 16):
#  K none : cores of 128 B, 8 down M (SBO 128), K cores after all 8: LBO = 8 * 128 = 1024
#  K 32B  : atoms of 8 x 32 B = 256 B down M: SBO 256
#  K 64B  : 8 x 64 B = 512: SBO 512;  K 128B: 8 x 128 B: SBO 1024 (LBO unused: 1)
#  MN none: 16-byte chunks along M are 128-byte cores, 8 of them down M: SBO 128; K+8 after them: LBO 1024
#  MN 32B : atoms of 32 B x 8 K = 256 B, 4 along M: LBO 256; K+8 after the 4: SBO 1024
#  MN 64B : 512-byte atoms, 2 along M: LBO 512, SBO 1024
#  MN 128B: one 1024-byte atom covers M = 64 (LBO unused: 1); K+8 after it: SBO 1024
_BF16_A_FIELDS = {
    ("K", 0): (1024, 128),
    ("K", 32): (None, 256),
    ("K", 64): (None, 512),
    ("K", 128): (None, 1024),
    ("MN", 0): (1024, 128),
    ("MN", 32): (256, 1024),
    ("MN", 64): (512, 1024),
    ("MN", 128): (None, 1024),
}


@pytest.mark.parametrize("major, swizzle", list(_BF16_A_FIELDS))
def test_descriptor_fields_of_bf16_tiles(major, swizzle):
    layout = wgmma.smem_layout(fx.BFloat16, (64, 64), major, swizzle)
    fmt = wgmma.descriptor_format(layout, fx.BFloat16, (64, 16))
    assert (fmt.major, fmt.swizzle, (fmt.lbo, fmt.sbo)) == (major, swizzle, _BF16_A_FIELDS[(major, swizzle)])
    assert fmt.transposed == (major == "MN")
    # Every K step of the tile reads the same canonical layout (the descriptor only moves its start address).
    for ks in range(4):
        assert wgmma.descriptor_format(layout, fx.BFloat16, (64, 16), (0, 16 * ks)) == fmt


def test_descriptor_fields_of_wider_b_and_fp8_tiles():
    # B (N=128, K=64) MN-major 128B: two 1024-byte atoms along N (LBO 1024), K+8 after both (SBO 2048).
    fmt = wgmma.descriptor_format(wgmma.smem_layout(fx.BFloat16, (128, 64), "MN", 128), fx.BFloat16, (128, 16))
    assert (fmt.lbo, fmt.sbo) == (1024, 2048)
    # N = 8: one 8-row group, SBO unused.
    fmt = wgmma.descriptor_format(wgmma.smem_layout(fx.BFloat16, (8, 64), "K", 128), fx.BFloat16, (8, 16))
    assert (fmt.lbo, fmt.sbo) == (None, None)
    # fp8 K-major (64, 128): the same bytes as bf16 (64, 64): rows of 16/32/64/128 bytes.
    for swizzle, fields in ((0, (1024, 128)), (32, (None, 256)), (64, (None, 512)), (128, (None, 1024))):
        layout = wgmma.smem_layout(fx.Float8E4M3FN, (64, 128), "K", swizzle)
        fmt = wgmma.descriptor_format(layout, fx.Float8E4M3FN, (64, 32))
        assert (fmt.lbo, fmt.sbo, fmt.element_bytes) == (*fields, 1)


def test_descriptor_words():
    # bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 mode (1 = 128B, 2 = 64B, 3 = 32B, 0 none)
    sw128 = wgmma.DescriptorFormat("K", 128, None, 1024, (64, 16), 2)
    assert sw128.encode(0x1000) == 0x100 | (1 << 16) | (64 << 32) | (1 << 62)
    assert sw128.encode(0x1000 + 32) == sw128.encode(0x1000) + 2  # a K step of 16 bf16 inside the 128-byte row
    none = wgmma.DescriptorFormat("MN", 0, 1024, 128, (64, 16), 2)
    assert none.encode(0x2A0) == 0x2A | (64 << 16) | (8 << 32)
    sw32 = wgmma.DescriptorFormat("MN", 32, 256, 1024, (64, 16), 2)
    assert sw32.encode(0x40000 + 0x100) == 0x10 | (16 << 16) | (64 << 32) | (3 << 62)  # 18-bit address window
    assert wgmma.DescriptorFormat("K", 64, None, 512, (64, 16), 2).high_bits >> 62 == 2


# --- CPU: layouts wgmma cannot read -----------------------------------------------------------------------------


def test_layouts_wgmma_cannot_read_are_reported():
    def fields(layout, dtype=fx.BFloat16, shape=(64, 16)):
        return wgmma.descriptor_format(layout, dtype, shape)

    with pytest.raises(ValueError, match=r"not a layout wgmma can read: element \(1, 0\) is at byte 128"):
        fields(fl.Layout((64, 64), (64, 1)))  # row-major without swizzle: 128-byte rows, not 16-byte cores
    with pytest.raises(ValueError, match="not a layout wgmma can read"):
        fields(fl.Layout((64, 64), (72, 1)))  # padded rows (the mma.sync example's tiles)
    with pytest.raises(ValueError, match=r"is Sw<3,5,3> on byte offsets"):
        fields(fl.ComposedLayout(fl.Swizzle(3, 4, 3), 0, fl.Layout((64, 64), (64, 1))))  # byte swizzle on bf16 units
    with pytest.raises(ValueError, match="8-bit operands K-major only"):
        fields(wgmma.smem_layout(fx.Float8E4M3FN, (128, 64), "MN", 128), fx.Float8E4M3FN, (128, 32))
    with pytest.raises(ValueError, match="does not fit"):
        fields(wgmma.smem_layout(fx.BFloat16, (64, 8), "K", 0))
    with pytest.raises(ValueError, match="neither K nor MN is contiguous"):
        fields(fl.Layout((64, 64), (2, 128)))
    # 128B-swizzled K-major rows in the wrong order inside each group of 8 (row 1 four rows down).
    rows = fl.Layout((((2, 4), 8), 64), (((256, 64), 512), 1))
    with pytest.raises(ValueError, match=r"element \(1, 0\) is at byte 512, the canonical layout .* puts it at 128"):
        fields(fl.ComposedLayout(fl.Swizzle(3, 3, 3), 0, rows))
    # Padded groups of 8 rows are fine: SBO is whatever the layout says (2048 bytes here).
    padded = fl.ComposedLayout(fl.Swizzle(3, 3, 3), 0, fl.Layout(((8, 8), 64), ((64, 1024), 1)))
    assert fields(padded).sbo == 2048


def _trace(kernel, *args):
    return kernel.trace(kernel.specialize(kernel._bind(list(args), {})).key)


def test_misuse_is_reported_at_trace_time():
    layout = wgmma.smem_layout(fx.BFloat16, (64, 64), "K", 128)

    @flyc.kernel
    def misaligned(x: fx.Tensor):
        s = fx.SmemAllocator().allocate(fx.BFloat16, layout, alignment=128)
        wgmma.make_descriptor(s, (64, 16))

    @flyc.kernel
    def global_operand(x: fx.Tensor):
        wgmma.make_descriptor(x, (64, 16))

    @flyc.kernel
    def wrong_shape(x: fx.Tensor):
        s = fx.SmemAllocator().allocate(fx.BFloat16, layout, alignment=1024)
        atom = wgmma.MmaAtom(fx.BFloat16, 64)
        desc = wgmma.make_descriptor(s, (64, 16))
        atom(desc, wgmma.make_descriptor(s, (32, 16)), atom.make_accumulator())

    @flyc.kernel
    def bad_wait(x: fx.Tensor):
        wgmma.wait_group(9)

    x = _fake((64, 64), "<bfloat16")
    with pytest.raises(ValueError, match="must start on a 1024-byte boundary"):
        _trace(misaligned, x)
    with pytest.raises(TypeError, match="expected a shared-memory fx.Tensor"):
        _trace(global_operand, x)
    with pytest.raises(ValueError, match=r"describes a \(32, 16\) operand, this atom reads \(64, 16\)"):
        _trace(wrong_shape, x)
    with pytest.raises(ValueError, match="n must be an int in 0..7"):
        _trace(bad_wait, x)
    with pytest.raises(ValueError, match="multiple of 8 in 8..256"):
        wgmma.MmaAtom(fx.BFloat16, 12)
    with pytest.raises(TypeError, match="16-bit A and B must have one type"):
        wgmma.MmaAtom(fx.BFloat16, 64, b_dtype=fx.Float8E4M3FN)
    with pytest.raises(TypeError, match="expected fx.BFloat16"):
        wgmma.MmaAtom(fx.Float32, 64)
    with pytest.raises(ValueError, match="must split into 2 warpgroup"):
        wgmma.TiledMma(wgmma.MmaAtom(fx.BFloat16, 64), tile_m=64, warpgroups_m=2)


# --- CPU: fragment layouts ----------------------------------------------------------------------------------------


def _row_col(layout_tv, rows, t, v):
    offset = layout_tv(t, v)
    return offset % rows, offset // rows


@pytest.mark.parametrize("n", [8, 24, 256])
def test_accumulator_layout_is_the_ptx_fragment(n):
    """PTX ISA, wgmma .m64nNk16 accumulator D: warp w holds rows 16w..16w+15; lane l, register i: row
    16w + l/4 + 8 ((i/2) % 2), column 8 (i/4) + 2 (l % 4) + i % 2."""
    atom = wgmma.MmaAtom(fx.BFloat16, n)
    layout = atom.accumulator_layout
    assert fl.size(layout[0]) == 128 and fl.size(layout[1]) == n // 2
    seen = set()
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 2):
            expected = (16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2)
            assert _row_col(layout, 64, t, i) == expected
            seen.add(expected)
    assert len(seen) == 64 * n


@pytest.mark.parametrize("dtype", [fx.BFloat16, fx.Float8E4M3FN])
def test_a_register_fragment_layout(dtype):
    """A in registers (RS): per warp the mma.sync m16n8k16 (16-bit) / m16n8k32 (8-bit) A fragment, warp w on rows
    16w..: element i of the 4 registers is row l/4 + 8 ((i / per) % 2), column per (l % 4) + i % per + 4 per (i / (2
    per)) with per = elements per 32-bit register (2 or 4)."""
    atom = wgmma.MmaAtom(dtype, 64, a_from_registers=True)
    per = 32 // dtype.width
    seen = set()
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(4 * per):
            row = 16 * w + lane // 4 + 8 * ((i // per) % 2)
            col = per * (lane % 4) + i % per + 4 * per * (i // (2 * per))
            assert _row_col(atom.a_layout, 64, t, i) == (row, col)
            seen.add((row, col))
    assert len(seen) == 64 * atom.k


def test_tiled_mma_accumulator_layout_covers_its_tile():
    mma = wgmma.TiledMma(wgmma.MmaAtom(fx.BFloat16, 64), tile_m=256, tile_n=128, warpgroups_m=2)
    assert mma.threads == 256 and mma.repeats == (2, 2)
    layout = mma.accumulator_layout
    offsets = {layout(t, v) for t in range(256) for v in range(fl.size(layout[1]))}
    assert offsets == set(range(256 * 128))
    # Thread 130 (warpgroup 1, warp 0, lane 2), value 0: row 128 + 0, column 4 of the first atom.
    assert _row_col(layout, 256, 130, 0) == (128, 4)


# --- CPU: PTX ---------------------------------------------------------------------------------------------------------

_PTX_CASES = [
    Case("bf16", 256),
    Case("e4m3", 128, a_swizzle=64, b_swizzle=32),
    Case("bf16", 128, rs=True, b_major="MN", b_swizzle=64),
    Case("e5m2", 64, rs=True, b_swizzle=0),
    Case("bf16", 64, tile_m=128, warpgroups=2),
]


@pytest.mark.parametrize(
    "case", _PTX_CASES, ids=lambda c: f"{c.dtype}-n{c.n}-{'rs' if c.rs else 'ss'}-wg{c.warpgroups}"
)
def test_wgmma_kernels_assemble_for_sm90a(case):
    ptx = _ptx(case)
    k = 32 // (case.element.width // 8)
    ab = {"bf16": "bf16.bf16", "e4m3": "e4m3.e4m3", "e5m2": "e5m2.e5m2"}[case.dtype]
    instructions = [line.strip() for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(instructions) == 4 * (case.tile_m // 64 // case.warpgroups)  # K steps x M repeats per warpgroup
    assert all(i.startswith(f"wgmma.mma_async.sync.aligned.m64n{case.n}k{k}.f32.{ab} {{") for i in instructions)
    if case.rs:  # A as four 32-bit registers
        assert all("}, {%r" in i for i in instructions)
    trans = (", 0, 1;" if not case.rs else ", 1;") if case.b_major == "MN" else ", 0, 0;" if not case.rs else ""
    if case.element.width == 16:
        assert all(i.endswith(trans) for i in instructions)
    else:  # fp8 has no transpose operands
        assert all(i.endswith("p, 1, 1;") for i in instructions)
    for needed in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned"):
        assert needed in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert "setp.ne.b32 p" in ptx  # scale-d from a register: the runtime accumulate flag


def test_k_loop_and_epilogue_ptx():
    """A run-time K loop over a 2-stage buffer (descriptors of a dynamic stage, accumulators carried by scf.for)
    assembles; the epilogue stores two adjacent fp32 per access."""
    case = Case("bf16", 128)
    args = [_fake((64, 3 * case.k_tile), "<bfloat16"), _fake((128, 3 * case.k_tile), "<bfloat16", 1)]
    module = wgmma_k_loop.lower(*args, _fake((64, 128), "<f4", 2), 3, case)
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None
    assert module.ptx.count("wgmma.mma_async.sync.aligned.m64n128k16") == 4  # one K tile's steps, in the loop
    assert module.shared_bytes["wgmma_k_loop"] == 2 * (64 + 128) * 64 * 2
    stores = [line for line in module.ptx.splitlines() if "st.global" in line]
    assert len(stores) == 32 and all("st.global.v2.b32" in line for line in stores)


def test_fence_proxy_async_spaces():
    @flyc.kernel
    def fences(x: fx.Tensor):
        nvvm.fence_proxy_async()
        nvvm.fence_proxy_async("shared::cluster")
        nvvm.fence_proxy_async("global")
        nvvm.fence_proxy_async(None)

    module = fences.lower(_fake((4,), "<f4"))
    for text in ("fence.proxy.async.shared::cta", "fence.proxy.async.shared::cluster", "fence.proxy.async.global"):
        assert text in module.ptx
    assert "fence.proxy.async;" in module.ptx
    with pytest.raises(ValueError, match="fence_proxy_async space"):

        @flyc.kernel
        def bad(x: fx.Tensor):
            nvvm.fence_proxy_async("local")

        _trace(bad, _fake((4,), "<f4"))


def test_fence_operands_pins_packed_16_bit_and_int_vectors():
    """fence_operands takes any vector of whole 32-bit registers (the GEMM epilogue pins its packed bf16 values
    right after the wait): one empty asm per vector, "=r" operands, the values unchanged; odd 16-bit counts are
    refused."""

    @flyc.kernel
    def pinned(x: fx.Tensor, y: fx.Tensor):
        t = gpu.thread_idx.x.to(fx.Int32)
        halves = fx.vector.from_elements(fx.vector.vector_class(fx.BFloat16, 4), [x[4 * t + i] for i in range(4)])
        words = fx.vector.from_elements(fx.vector.vector_class(fx.Int32, 2), [t, t + 1])
        halves, words = wgmma.fence_operands([halves, words])
        for i in range(4):
            x[4 * t + i] = halves[i]
        y[t] = words[0] + words[1]

    ptx = pinned.lower(_fake((512,), "<bfloat16"), _fake((128,), "<i4", 1)).ptx
    assert ptx.count("// begin inline asm") == 2
    with pytest.raises(TypeError, match="whole 32-bit registers, got BFloat16x3"):

        @flyc.kernel
        def odd(x: fx.Tensor):
            wgmma.fence_operands(fx.vector.from_elements(fx.vector.vector_class(fx.BFloat16, 3), [x[0], x[1], x[2]]))

        _trace(odd, _fake((4,), "<bfloat16"))


# --- GPU ----------------------------------------------------------------------------------------------------------

GPU_CASES = [
    *(Case("bf16", n) for n in (8, 64, 128, 256)),  # K-major, 128B swizzle
    *(Case("bf16", 64, a_swizzle=s, b_swizzle=s) for s in (0, 32, 64)),
    *(Case("bf16", 64, b_major="MN", b_swizzle=s) for s in (0, 32, 64, 128)),
    Case("bf16", 8, b_major="MN", b_swizzle=0),
    Case("bf16", 128, b_major="MN", b_swizzle=128, a_swizzle=32),
    Case("f16", 128, b_major="MN", b_swizzle=64),
    Case("bf16", 128, rs=True),
    Case("bf16", 64, rs=True, b_major="MN", b_swizzle=32),
    *(Case("e4m3", n) for n in (8, 64, 256)),
    *(Case("e4m3", 64, a_swizzle=s, b_swizzle=s) for s in (0, 32, 64)),
    Case("e5m2", 128, a_swizzle=64),
    Case("e4m3", 128, rs=True, b_swizzle=32),
    Case("bf16", 64, tile_m=128),  # two atoms along M in one warpgroup
    Case("bf16", 128, tile_m=128, warpgroups=2),  # TiledMma over two warpgroups
]


def _case_id(c: Case) -> str:
    source = "rs" if c.rs else "ss"
    return f"{c.dtype}-m{c.tile_m}n{c.n}-A{c.a_swizzle}-B{c.b_major}{c.b_swizzle}-{source}-wg{c.warpgroups}"


def _operands(case: Case, k: int, seed: int):
    """Random A (tile_m, k) and B (N, k) of the case's type, the float64 product A B^T, and the device tensors as the
    kernels take them (B transposed when N-major, fp8 as bytes)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    # Multiples of 1/4 in [-2, 2]: products and sums are exact in fp32, so any misplaced element shows.
    a = (torch.randint(-8, 9, (case.tile_m, k), generator=generator) / 4).to(dtypes[case.dtype])
    b = (torch.randint(-8, 9, (case.n, k), generator=generator) / 4).to(dtypes[case.dtype])
    reference = a.double() @ b.double().T
    b_stored = b.T.contiguous() if case.b_major == "MN" else b
    if case.element.width == 8:
        a, b_stored = a.view(torch.uint8), b_stored.view(torch.uint8)
    return a.cuda(), b_stored.cuda(), reference


def run_case(case: Case, seed: int = 0, out_dtype=None):
    """Runs the tile twice (accumulate off with a NaN start, on with 1.5) and returns (outputs, references)."""
    import torch

    out_dtype = out_dtype or torch.float32
    a, b, reference = _operands(case, case.k_tile, seed)
    outputs = []
    for accumulate, init in ((0, float("nan")), (1, 1.5)):
        c = torch.full((case.tile_m, case.n), float("nan"), device="cuda", dtype=out_dtype)  # poisoned
        wgmma_tile(a, b, c, accumulate, init, case).launch(grid=1, block=case.threads)
        torch.cuda.synchronize()
        outputs.append(c.cpu().double())
    references = [reference.to(out_dtype).double(), (reference + 1.5).to(out_dtype).double()]
    return outputs, references


def _assert_equal(got, expected, what: str):
    wrong = (got != expected).nonzero()
    assert wrong.numel() == 0, (
        f"{what}: {wrong.shape[0]} of {got.numel()} elements differ, first at {wrong[0].tolist()}:"
        f" {got[tuple(wrong[0])].item()} vs {expected[tuple(wrong[0])].item()}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
def test_wgmma_tile_matches_torch(case):
    pytest.importorskip("torch")
    outputs, references = run_case(case)
    for got, expected, flag in zip(outputs, references, ("off", "on"), strict=True):
        _assert_equal(got, expected, f"accumulate {flag}")


@pytest.mark.gpu
def test_epilogue_converts_to_bf16():
    torch = pytest.importorskip("torch")
    outputs, references = run_case(Case("bf16", 128, b_major="MN", b_swizzle=128), seed=3, out_dtype=torch.bfloat16)
    for got, expected, flag in zip(outputs, references, ("off", "on"), strict=True):
        _assert_equal(got, expected, f"bf16 output, accumulate {flag}")


K_LOOP_CASES = [Case("bf16", 128), Case("bf16", 64, b_major="MN", b_swizzle=64, a_swizzle=32), Case("e4m3", 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", K_LOOP_CASES, ids=_case_id)
def test_k_loop_through_staged_buffers(case):
    torch = pytest.importorskip("torch")
    k_tiles = 3  # both stages, and the first one again
    a, b, reference = _operands(case, k_tiles * case.k_tile, seed=7)
    c = torch.full((64, case.n), float("nan"), device="cuda")
    wgmma_k_loop(a, b, c, k_tiles, case).launch(grid=1, block=128)
    torch.cuda.synchronize()
    _assert_equal(c.cpu().double(), reference, "k loop")

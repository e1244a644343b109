"""Offsets past 2^31 elements: every view operation over a tensor of more than 2^32 elements computes the address
in 64 bits (CPU: the PTX's data flow into each global access), small static tensors keep 32-bit math, and on the GPU
(``gpu``) a kernel writes the last element of a 2^32 + 1 element tensor."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu

BIG = (1 << 33) + 1024  # elements: past 2^32, a multiple of the tiles below
COLUMNS = 1 << 33

_INSTRUCTION = re.compile(r"^\s*([a-z][\w.]*)\s+([^;]*);", re.M)
_REGISTER = re.compile(r"%[a-z]+\d+|%(?:ctaid|tid|ntid|nctaid)\.[xyz]")
_NARROW_ARITHMETIC = re.compile(r"^(?:add|sub|mul|mad|shl)\.(?:lo\.)?[sub]32$")


def _definitions(ptx: str) -> dict[str, tuple[str, list[str]]]:
    """register -> (opcode, source registers and special registers) of the instruction that writes it."""
    defined = {}
    for opcode, operands in _INSTRUCTION.findall(ptx):
        names = _REGISTER.findall(operands)
        if names and not opcode.startswith(("st.", "bra", "@")):
            defined[names[0]] = (opcode, names[1:] + ([operands.split(",")[-1].strip()] if "param" in operands else []))
    return defined


def _sources(register: str, defined, seen=None) -> set[str]:
    """Every register, special register and parameter that ``register`` is computed from, itself included."""
    seen = set() if seen is None else seen
    if register in seen:
        return seen
    seen.add(register)
    for source in defined.get(register, ("", []))[1]:
        _sources(source, defined, seen)
    return seen


def narrow_block_arithmetic(ptx: str) -> list[str]:
    """The 32-bit add/sub/mul/mad/shl instructions that feed a global access's address and depend on the block index
    or a kernel parameter (an extent or stride): the ones that can wrap past 2^31 elements. Thread-index arithmetic
    inside a tile of static shape is bounded and may stay 32-bit."""
    defined = _definitions(ptx)
    addresses = re.findall(r"(?:ld|st)\.global[\w.]*\s+(?:[^\[;]*)\[(%rd\d+)", ptx)
    assert addresses, "no global access in the PTX"
    found = []
    for address in addresses:
        for register in sorted(_sources(address, defined)):
            opcode, operands = defined.get(register, ("", []))
            if _NARROW_ARITHMETIC.match(opcode):
                inputs = _sources(register, defined)
                if any("ctaid" in r or "param" in r for r in inputs):
                    found.append(f"{opcode} {register} <- {', '.join(operands)}")
    return found


@flyc.kernel
def tile_1d(x: fx.Tensor):
    t = fx.local_tile(x, (1024,), (gpu.block_idx.x,))
    t[gpu.thread_idx.x] = fx.Float32(1.0)


@flyc.kernel
def tile_then_partition(x: fx.Tensor):
    t = fx.local_tile(x, (1024,), (gpu.block_idx.x,))
    mine = fx.local_partition(t, fl.Layout(256), gpu.thread_idx.x)  # (4,): elements tid, tid + 256, ...
    for i in fx.range_constexpr(4):
        mine[i] = fx.Float32(2.0)


@flyc.kernel
def partition_whole(x: fx.Tensor):
    mine = fx.local_partition(x, fl.Layout(256), gpu.thread_idx.x)  # (?,):(256,)
    mine[gpu.block_idx.x] = fx.Float32(3.0)


@flyc.kernel
def slice_then_tile(x: fx.Tensor):
    row = x[(gpu.block_idx.y, None)]  # one row of 2^33 columns
    t = fx.local_tile(row, (1024,), (gpu.block_idx.x,))
    t[gpu.thread_idx.x] = fx.Float32(4.0)


@flyc.kernel
def tile_2d(x: fx.Tensor):
    t = fx.local_tile(x, (1, 1024), (gpu.block_idx.y, gpu.block_idx.x))
    t[(0, gpu.thread_idx.x)] = fx.Float32(5.0)


@flyc.kernel
def index_2d(x: fx.Tensor):
    x[(gpu.block_idx.y, gpu.block_idx.x)] = fx.Float32(6.0)


@flyc.kernel
def column_slice(x: fx.Tensor):
    column = x[(None, gpu.block_idx.x)]  # (rows,) at column ctaid.x
    column[gpu.thread_idx.x] = fx.Float32(7.0)


COPIER = fx.TiledCopy(thr_layout=fl.Layout((16, 8), (8, 1)), val_layout=fl.Layout((1, 8)))  # 128 threads x 8 fp16


@flyc.kernel
def tiled_copy_2d(src: fx.Tensor, dst: fx.Tensor):
    block = (gpu.block_idx.y, gpu.block_idx.x)
    COPIER.copy(fx.local_tile(src, (16, 64), block), fx.local_tile(dst, (16, 64), block), gpu.thread_idx.x)


@flyc.kernel
def contiguous_load(x: fx.Tensor, y: fx.Tensor):
    t = fx.local_tile(x, (1024,), (gpu.block_idx.x,))
    u = fx.local_tile(y, (1024,), (gpu.block_idx.x,))
    fx.vector.store(fx.vector.load_op(fx.vector.vector_class(fx.Float32, 4), t, [gpu.thread_idx.x * 4]), u, [0])


WIDE_CASES = {
    "local_tile": (tile_1d, [flyc.TensorSpec((BIG,), "f32")]),
    "local_tile + local_partition": (tile_then_partition, [flyc.TensorSpec((BIG,), "f32")]),
    "local_partition": (partition_whole, [flyc.TensorSpec((BIG,), "f32")]),
    "slice + local_tile": (slice_then_tile, [flyc.TensorSpec((2, COLUMNS), "f32")]),
    "2-D local_tile": (tile_2d, [flyc.TensorSpec((2, COLUMNS), "f32")]),
    "2-D indexing": (index_2d, [flyc.TensorSpec((2, COLUMNS), "f32")]),
    "column slice": (column_slice, [flyc.TensorSpec((1024, COLUMNS), "f32")]),
    "TiledCopy": (tiled_copy_2d, [flyc.TensorSpec((16, COLUMNS), "f16")] * 2),
    "vector.load_op": (contiguous_load, [flyc.TensorSpec((BIG,), "f32")] * 2),
}


@pytest.mark.parametrize("case", WIDE_CASES)
def test_views_of_more_than_2_to_the_32_elements_address_in_64_bits(case):
    kernel, specs = WIDE_CASES[case]
    ptx = kernel.lower(*specs).ptx
    assert narrow_block_arithmetic(ptx) == []


@pytest.mark.parametrize("elements, wide", [(1 << 20, False), (1 << 31, False), ((1 << 31) + 1, True), (BIG, True)])
def test_a_tensor_whose_offsets_reach_2_to_the_31_is_specialized_apart(elements, wide):
    """The last element of a tensor of 2^31 + 1 elements is at offset 2^31: its key entry is marked (a sixth element)
    and the native dispatcher leaves it to the Python path; smaller tensors keep their key and 32-bit offsets."""
    tensor = flyc.TensorSpec((elements,), "f32")
    entry = tile_1d.specialize([tensor]).key[0]
    assert entry == (("f32", 1, (1,), True, (None,), True) if wide else ("f32", 1, (1,), True))
    ptx = tile_1d.lower(tensor).ptx
    assert (narrow_block_arithmetic(ptx) == []) is wide


def test_strides_count_for_the_offsets_reach():
    """2 x 2^30 elements whose rows are 2^31 apart (a padded view): the last element is past 2^31."""
    padded = flyc.TensorSpec((2, 1 << 30), "f32", strides=(1 << 31, 1))
    assert len(slice_then_tile.specialize([padded]).key[0]) == 6
    assert narrow_block_arithmetic(slice_then_tile.lower(padded).ptx) == []


def test_the_checker_sees_the_32_bit_block_offset_of_a_small_static_tensor():
    """A static tensor of 2^20 elements keeps the block offset in 32 bits (IMAD, not the 64-bit multiply): the fast
    path where the extent proves the offset fits."""
    ptx = tile_1d.lower(flyc.mark_static(flyc.TensorSpec((1 << 20,), "f32"))).ptx
    assert [line.split()[0] for line in narrow_block_arithmetic(ptx)] == ["shl.b32"]  # ctaid.x * 1024


def test_thread_offsets_inside_a_static_tile_stay_32_bit():
    """local_partition of a 1024-element tile: the thread's offset (tid, below 1024) is 32-bit math, the tile's
    base 64-bit."""
    ptx = tile_then_partition.lower(flyc.TensorSpec((BIG,), "f32")).ptx
    assert narrow_block_arithmetic(ptx) == []
    assert re.search(r"mul\.wide\.u32\s+%rd\d+, %r\d+, 4096;", ptx)  # ctaid.x * 1024 elements * 4 bytes, widened


def test_shared_memory_views_keep_32_bit_offsets():
    @flyc.kernel
    def staged(x: fx.Tensor):
        tile = fx.SmemAllocator().allocate(fx.Float32, fl.Layout((32, 32), (32, 1)))
        row = tile[(gpu.thread_idx.x, None)]
        row[gpu.thread_idx.y] = fx.Float32(1.0)
        gpu.barrier()
        x[gpu.thread_idx.x] = tile[(gpu.thread_idx.y, gpu.thread_idx.x)]

    text = staged.trace(staged.specialize([flyc.TensorSpec((1024,), "f32")]).key)
    # the row's offset, tid.x * 32, is an i32 product (2^10 elements of shared memory cannot reach 2^31)
    assert re.search(r"arith\.muli %\d+, %c32_i32\w* : i32", text)


def test_the_vector_add_example_offsets_in_64_bits():
    path = Path(__file__).resolve().parents[2] / "examples" / "vector_add.py"
    spec = importlib.util.spec_from_file_location("wide_vector_add", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    n = (1 << 32) + 4
    tensor = flyc.TensorSpec((n,), "f32")
    assert narrow_block_arithmetic(example.vector_add.lower(tensor, tensor, tensor, n).ptx) == []


@pytest.mark.gpu
def test_a_kernel_writes_the_last_element_of_a_2_to_the_32_plus_1_element_tensor():
    """4 GiB of uint8: the last element is reached through local_tile (tile 2^22 of 1024) and through a 64-bit index;
    nothing else is written (a 32-bit offset would wrap to element 0)."""
    torch = pytest.importorskip("torch")

    @flyc.kernel
    def touch_last(x: fx.Tensor, tile: fx.Int32, last: fx.Int64):
        if gpu.thread_idx.x == 0:
            fx.local_tile(x, (1024,), (tile,))[0] = fx.Int8(5)
            x[last - 1] = fx.Int8(3)

    n = (1 << 32) + 1
    x = torch.zeros(n, dtype=torch.uint8, device="cuda")
    touch_last(x, (n - 1) // 1024, n - 1).launch(grid=1, block=32)
    torch.cuda.synchronize()
    assert x[n - 1].item() == 5 and x[n - 2].item() == 3
    assert torch.count_nonzero(x).item() == 2

"""Hopper warpgroup MMA (``wgmma.mma_async``, sm_90a): shared-memory layouts, matrix descriptors, MMA atoms.

Both operands are (MN, K) views, as in CuTe: A is (M, K), B is (N, K), whichever of the two modes is contiguous in
memory (the operand's *major*). One instruction computes ``D (64 x N, fp32) = A (64 x K) @ B^T (K x N) [+ D]`` for
a warpgroup of 128 threads, with K = 16 (bf16/f16) or 32 (e4m3/e5m2); B comes from shared memory through a 64-bit
*matrix descriptor*, A from shared memory too (SS) or from registers (RS).

Layouts::

    atom = wgmma.layout_atom(fx.BFloat16, "K", 128)       # Sw<3,3,3> o 0 o (8,64):(64,1), 8 rows of 128 bytes
    s_a = wgmma.smem_layout(fx.BFloat16, (128, 64, 3), "K", 128)   # tile_to_shape of the atom: (M, K, stages)
    buf = smem.allocate(fx.BFloat16, s_a, alignment=wgmma.smem_alignment(s_a, fx.BFloat16))

Descriptors are derived from the layout of a shared-memory Tensor (:func:`make_descriptor`): the swizzle mode from
its swizzle, the leading/stride byte offsets by evaluating the layout, and every element of the instruction's
sub-tile is checked against the canonical layout those fields describe, so a layout wgmma cannot read is reported
at trace time. The MMA::

    atom = wgmma.MmaAtom(fx.BFloat16, n=128)               # m64n128k16, f32 += bf16 * bf16
    acc = atom.make_accumulator()                          # Float32 x 64 per thread (a Vector: loop-carried)
    acc = wgmma.fence(acc)
    a, b = wgmma.make_descriptor(s_a_stage, atom.a_shape), wgmma.make_descriptor(s_b_stage, atom.b_shape)
    for ks in fx.range_constexpr(4):
        acc = atom(a.at(0, ks * 16), b.at(0, ks * 16), acc, accumulate=(ks > 0) | keep)   # runtime flag
    wgmma.commit_group()
    acc = wgmma.wait_group(0, acc)
    atom.store_accumulator(acc, c_tile)                    # c_tile: a (64, N) view; converts to its dtype

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions
"""

from __future__ import annotations

import functools
import math

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import (
    BFloat16,
    Boolean,
    Float,
    Float8E4M3FN,
    Float8E5M2,
    Float16,
    Float32,
    Int32,
    Integer,
    as_numeric,
)
from flydsl.expr.tensor import Tensor, local_tile
from flydsl.expr.vector import Vector, asm_result_type, vector_class, vector_from_asm
from flydsl.expr.vector import pin as _vector_pin
from flydsl.expr.vector import store as _vector_store
from flydsl.expr.wgmma_smem import (
    SWIZZLES,
    DescriptorFormat,
    MatrixDescriptor,
    descriptor_format,
    layout_atom,
    make_descriptor,
    smem_alignment,
    smem_layout,
)

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")
_vector = lazy_import("mlir.dialects.vector")

__all__ = [
    "SWIZZLES",
    "layout_atom",
    "smem_layout",
    "smem_alignment",
    "DescriptorFormat",
    "descriptor_format",
    "MatrixDescriptor",
    "make_descriptor",
    "MmaAtom",
    "TiledMma",
    "fence",
    "commit_group",
    "wait_group",
    "fence_operands",
]

WARPGROUP_THREADS = 128
ATOM_M = 64
_K_BYTES = 32  # every wgmma reads 32 bytes of K per row: k16 for 16-bit types, k32 for 8-bit ones

_PTX_TYPES = {BFloat16: "bf16", Float16: "f16", Float8E4M3FN: "e4m3", Float8E5M2: "e5m2"}


# --- synchronization ------------------------------------------------------------------------------------------------


def _accumulator_values(acc) -> list[ir.Value]:
    if not isinstance(acc, Vector) or acc.element is not Float32:
        raise TypeError(f"wgmma: accumulators are Float32 vectors, got {type(acc).__name__}")
    return [_vector.extract(acc.value, [], [i]) for i in range(acc.length)]


def _pass_through(acc: Vector) -> Vector:
    if not isinstance(acc, Vector) or acc.width % 32:
        raise TypeError(
            f"fence_operands: expected Float32 accumulators or a vector of whole 32-bit registers, got"
            f" {type(acc).__name__}"
        )
    return _vector_pin(acc)


def fence_operands(accumulators):
    """Pins registers at this point of the program (:func:`flydsl.expr.vector.pin`: an empty ``asm volatile`` that
    reads and writes them), so that the compiler moves no access to them across wgmma's fence / wait, and computes
    them before it. Takes and returns a Vector or a list of them: Float32 accumulators, or any vector of whole 32-bit
    registers (e.g. the epilogue's packed 16-bit values)."""
    if accumulators is None:
        return None
    if isinstance(accumulators, (list, tuple)):
        return [_pass_through(acc) for acc in accumulators]
    return _pass_through(accumulators)


def fence(accumulators=None):
    """``wgmma.fence.sync.aligned``: orders this warpgroup's earlier register writes (accumulators, A fragments)
    before the next ``wgmma.mma_async``; needed before the first MMA and whenever registers it reads were written.
    Returns ``accumulators`` pinned after the fence's predecessors (see :func:`fence_operands`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-fence
    """
    accumulators = fence_operands(accumulators)
    _nvvm.wgmma_fence_aligned()
    return accumulators


def commit_group() -> None:
    """``wgmma.commit_group.sync.aligned``: closes the group of the warpgroup's wgmma issued since the last commit.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group
    """
    _nvvm.wgmma_commit_group_sync_aligned()


def wait_group(n: int = 0, accumulators=None):
    """``wgmma.wait_group.sync.aligned n``: waits until at most ``n`` groups are pending; the accumulators of the
    completed groups (and the shared memory they read) may be used after it. Returns ``accumulators`` pinned after
    the wait, which is how the compiler learns that reading them must come later.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group
    """
    if not isinstance(n, int) or not 0 <= n <= 7:
        raise ValueError(f"wait_group: n must be an int in 0..7, got {n!r}")
    _nvvm.wgmma_wait_group_sync_aligned(n)
    return fence_operands(accumulators)


# --- the MMA atom ---------------------------------------------------------------------------------------------------


def _flag(accumulate) -> ir.Value:
    """wgmma's scale-d as an i32 (non-zero: D += A B): a Python bool, a Boolean or an integer."""
    i32 = ir.IntegerType.get_signless(32)
    if isinstance(accumulate, bool):
        return _arith.ConstantOp(i32, int(accumulate)).result
    value = as_numeric(accumulate)
    if isinstance(value, Boolean):
        return _arith.extui(i32, value.value)
    if isinstance(value, Integer) and not isinstance(value, Vector):
        return value.to(Int32).value
    raise TypeError(f"wgmma accumulate: expected a bool, a Boolean or an integer, got {type(value).__name__}")


def _thread_value_offsets(layout_tv: _fl.Layout, rows: int, threads: int, values: int):
    """(rows/cols of each value, rows/cols of each thread) of a TV layout over a column-major (rows, cols) tile,
    checked to add without carry, so that (row, col) = thread part + value part."""
    thread_mode, value_mode = layout_tv[0], layout_tv[1]
    value_rc = [divmod(value_mode(v), rows)[::-1] for v in range(values)]
    thread_rc = [divmod(thread_mode(t), rows)[::-1] for t in range(threads)]
    if max(r for r, _ in value_rc) + max(r for r, _ in thread_rc) >= rows:
        raise ValueError(f"{layout_tv}: thread and value rows overlap; cannot split the coordinates")
    return value_rc, thread_rc


class MmaAtom:
    """One ``wgmma.mma_async.sync.aligned.m64nNkK`` for a warpgroup: fp32 accumulators, A and B of ``dtype``
    (``b_dtype`` may differ for fp8: e4m3 x e5m2), K = 32 bytes (16 for bf16/f16, 32 for e4m3/e5m2), N a
    multiple of 8 in 8..256. ``a_from_registers``: A comes from registers (RS; see :meth:`load_a`) instead of a
    shared-memory descriptor (SS).

    Per thread (t = thread index in the warpgroup): the accumulator is a ``Float32 x N/2`` Vector laid out by
    :attr:`accumulator_layout`; in warp ``w = t // 32``, lane ``l``: element ``i`` is row
    ``16 w + l // 4 + 8 ((i // 2) % 2)``, column ``8 (i // 4) + 2 (l % 4) + i % 2``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async
    """

    def __init__(self, dtype, n: int, *, b_dtype=None, a_from_registers: bool = False):
        b_dtype = dtype if b_dtype is None else b_dtype
        for name, t in (("dtype", dtype), ("b_dtype", b_dtype)):
            if t not in _PTX_TYPES:
                raise TypeError(
                    f"MmaAtom {name}: expected fx.BFloat16, fx.Float16, fx.Float8E4M3FN or Float8E5M2, got {t!r}"
                )
        if (dtype.width == 16 or b_dtype.width == 16) and dtype is not b_dtype:
            raise TypeError(f"MmaAtom: 16-bit A and B must have one type, got {dtype.__name__} and {b_dtype.__name__}")
        if not isinstance(n, int) or n % 8 or not 8 <= n <= 256:
            raise ValueError(f"MmaAtom n: expected a multiple of 8 in 8..256, got {n!r}")
        self.dtype, self.b_dtype, self.n = dtype, b_dtype, n
        self.k = _K_BYTES // (dtype.width // 8)
        self.a_from_registers = bool(a_from_registers)

    def __repr__(self):
        source = "RS" if self.a_from_registers else "SS"
        return f"MmaAtom(m64n{self.n}k{self.k}.f32.{_PTX_TYPES[self.dtype]}.{_PTX_TYPES[self.b_dtype]}, {source})"

    @property
    def shape_mnk(self) -> tuple[int, int, int]:
        return ATOM_M, self.n, self.k

    @property
    def a_shape(self) -> tuple[int, int]:
        """(M, K) of the A operand."""
        return ATOM_M, self.k

    @property
    def b_shape(self) -> tuple[int, int]:
        """(N, K) of the B operand."""
        return self.n, self.k

    @property
    def accumulator_type(self) -> type[Vector]:
        return vector_class(Float32, self.n // 2)

    @property
    def accumulator_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset ``row + 64 col`` in the 64 x N tile. Threads (4, 8, 4): the lane's
        column pair, the lane's row, the warp (16 rows); values (2, 2, N/8): the column in the pair, row + 8, the
        8-column block."""
        col = ATOM_M  # offset of one column
        return _fl.Layout(((4, 8, 4), (2, 2, self.n // 8)), ((2 * col, 1, 16), (col, 8, 8 * col)))

    @property
    def a_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset in the 64 x K tile of the A register fragment (RS): as the
        accumulator of an m64nK MMA for 16-bit types (pairs of columns); for 8-bit types, runs of 4 columns."""
        col = ATOM_M
        per_register = 4 // (self.dtype.width // 8)  # elements of a 32-bit register, along K
        return _fl.Layout(
            ((4, 8, 4), (per_register, 2, 2)),
            ((per_register * col, 1, 16), (col, 8, 4 * per_register * col)),
        )

    def make_accumulator(self, value=0.0) -> Vector:
        """A ``Float32 x N/2`` accumulator filled with ``value`` (a Python number or a Float32)."""
        cls = self.accumulator_type
        if isinstance(value, (int, float)):
            return cls(float(value))
        scalar = as_numeric(value, Float32)
        if type(scalar) is not Float32:
            raise TypeError(f"make_accumulator: expected a Float32, got {type(scalar).__name__}")
        return cls(_vector.broadcast(cls.mlir_type(), scalar.value))

    # --- register fragments ---------------------------------------------------------------------------------------
    @functools.cached_property
    def _a_split(self):
        return _thread_value_offsets(self.a_layout, ATOM_M, WARPGROUP_THREADS, 4 * 32 // self.dtype.width)

    @functools.cached_property
    def _acc_split(self):
        return _thread_value_offsets(self.accumulator_layout, ATOM_M, WARPGROUP_THREADS, self.n // 2)

    @staticmethod
    def _thread_origin(layout_tv, split, thread):
        """(row, col) of this thread's value 0, known to be multiples of what every thread's are."""
        index = _warpgroup_thread(thread)
        offset = _fl.crd2idx(index, layout_tv[0].shape, layout_tv[0].stride)
        row, col = offset % ATOM_M, offset // ATOM_M
        if isinstance(row, int):
            return row, col
        _, thread_rc = split
        row_divisor = functools.reduce(math.gcd, (r for r, _ in thread_rc), 0) or 1 << 30
        col_divisor = functools.reduce(math.gcd, (c for _, c in thread_rc), 0) or 1 << 30
        return type(row)(row.value, divisibility=row_divisor), type(col)(col.value, divisibility=col_divisor)

    def load_a(self, tensor: Tensor, thread=None) -> Vector:
        """This thread's A fragment (RS) of the (64, K) view ``tensor`` (any memory; 8-bit data as Uint8 or fp8
        elements), as the ``Int32 x 4`` wgmma takes."""
        if not isinstance(tensor, Tensor) or tensor.dtype.width != self.dtype.width:
            raise TypeError(f"load_a: expected a Tensor of {self.dtype.width}-bit elements, got {tensor!r}")
        row0, col0 = self._thread_origin(self.a_layout, self._a_split, thread)
        value_rc, _ = self._a_split
        elements = [tensor[_coordinate(tensor, row0 + r, col0 + c)] for r, c in value_rc]
        storage = tensor.dtype
        cls = vector_class(storage, len(elements))
        packed = cls(_vector.from_elements(cls.mlir_type(), [x.value for x in elements]))
        return packed.bitcast(Int32)

    def store_accumulator(self, acc: Vector, tensor: Tensor, thread=None) -> None:
        """Writes this thread's part of the accumulator to the (64, N) view ``tensor`` (e.g. a ``local_tile`` of C
        in global memory), converted to the tensor's float type (Float32, BFloat16, Float16)."""
        if type(acc) is not self.accumulator_type:
            raise TypeError(f"store_accumulator: expected a {self.accumulator_type.__name__}, got {type(acc).__name__}")
        if not isinstance(tensor, Tensor) or not issubclass(tensor.dtype, Float):
            raise TypeError(f"store_accumulator: expected a Tensor of floats, got {tensor!r}")
        values = acc.to(tensor.dtype) if tensor.dtype is not Float32 else acc
        row0, col0 = self._thread_origin(self.accumulator_layout, self._acc_split, thread)
        value_rc, _ = self._acc_split
        plain = _coordinate(tensor, 0, 0) == (0, 0)
        v = 0
        while v < len(value_rc):
            r, c = value_rc[v]
            run = 2 if plain and v + 1 < len(value_rc) and value_rc[v + 1] == (r, c + 1) else 1
            if run == 1:
                tensor[_coordinate(tensor, row0 + r, col0 + c)] = values[v]
            else:  # two adjacent columns: one access as wide as the layout and the alignment allow
                pair = tensor.moved(
                    _fl.Layout(2, _fl.get(tensor.layout, 1).stride), tensor.offset_of((row0 + r, col0 + c))
                )
                two = vector_class(tensor.dtype, 2)  # (no extract_strided_slice: not lowered to LLVM here)
                _vector_store(two(_vector.from_elements(two.mlir_type(), [values[v].value, values[v + 1].value])), pair)
            v += run

    def load_accumulator(self, tensor: Tensor, thread=None) -> Vector:
        """This thread's part of the (64, N) view ``tensor`` as an accumulator (e.g. C of ``D = A B + C``)."""
        row0, col0 = self._thread_origin(self.accumulator_layout, self._acc_split, thread)
        value_rc, _ = self._acc_split
        elements = [as_numeric(tensor[_coordinate(tensor, row0 + r, col0 + c)]).to(Float32).value for r, c in value_rc]
        cls = self.accumulator_type
        return cls(_vector.from_elements(cls.mlir_type(), elements))

    # --- the instruction ------------------------------------------------------------------------------------------
    def _check_descriptor(self, desc, shape, dtype, what: str) -> DescriptorFormat:
        if not isinstance(desc, MatrixDescriptor):
            raise TypeError(f"{self!r} {what}: expected a MatrixDescriptor (wgmma.make_descriptor), got {desc!r}")
        fmt = desc.format
        if fmt.shape != shape:
            raise ValueError(
                f"{self!r} {what}: the descriptor describes a {fmt.shape} operand, this atom reads {shape}"
            )
        if fmt.element_bytes != dtype.width // 8:
            raise TypeError(
                f"{self!r} {what}: {8 * fmt.element_bytes}-bit elements in shared memory, expected {dtype.width}"
            )
        return fmt

    def _a_registers(self, a) -> list[ir.Value]:
        if isinstance(a, Vector) and a.element is not Int32 and a.width == 128:
            a = a.bitcast(Int32)
        if not isinstance(a, Vector) or a.element is not Int32 or a.length != 4:
            raise TypeError(f"{self!r} a: expected the A register fragment as an Int32x4 (load_a), got {a!r}")
        return [_vector.extract(a.value, [], [i]) for i in range(4)]

    def __call__(self, a, b, acc: Vector, accumulate=True) -> Vector:
        """Issues ``D = A B^T (+ D if accumulate)`` and returns D (valid after :func:`wait_group`). ``a``: a
        MatrixDescriptor of A (64, K) or, with ``a_from_registers``, an ``Int32x4`` fragment; ``b``: a
        MatrixDescriptor of B (N, K); ``accumulate``: a Python bool or a kernel Boolean/integer (wgmma's scale-d
        predicate, set at run time)."""
        b_fmt = self._check_descriptor(b, self.b_shape, self.b_dtype, "b")
        if type(acc) is not self.accumulator_type:
            raise TypeError(f"{self!r} acc: expected a {self.accumulator_type.__name__}, got {type(acc).__name__}")
        count = self.n // 2
        sixteen_bit = self.dtype.width == 16
        if self.a_from_registers:
            a_operands = self._a_registers(a)
            a_text = "{" + ", ".join(f"${count + i}" for i in range(4)) + "}"
            a_constraints = ["r"] * 4
            trans = f", {b_fmt.transposed}" if sixteen_bit else ""
        else:
            a_fmt = self._check_descriptor(a, self.a_shape, self.dtype, "a")
            if not sixteen_bit and (a_fmt.major, b_fmt.major) != ("K", "K"):
                raise ValueError(f"{self!r}: 8-bit operands must be K-major")
            a_operands = [a.value.value]
            a_text = f"${count}"
            a_constraints = ["l"]
            trans = f", {a_fmt.transposed}, {b_fmt.transposed}" if sixteen_bit else ""
        if not sixteen_bit and b_fmt.major != "K":
            raise ValueError(f"{self!r}: 8-bit operands must be K-major")
        b_index = count + len(a_operands)
        flag_index = b_index + 1
        d_text = "{" + ", ".join(f"${i}" for i in range(count)) + "}"
        types = f"f32.{_PTX_TYPES[self.dtype]}.{_PTX_TYPES[self.b_dtype]}"
        instruction = f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}.{types}"
        text = (
            "{\n.reg .pred p;\n"
            f"setp.ne.b32 p, ${flag_index}, 0;\n"
            f"{instruction} {d_text}, {a_text}, ${b_index}, p, 1, 1{trans};\n"
            "}"
        )
        constraints = ",".join(["=f"] * count + a_constraints + ["l", "r"] + [str(i) for i in range(count)])
        operands = a_operands + [b.value.value, _flag(accumulate)] + _accumulator_values(acc)
        result = _llvm.inline_asm(asm_result_type(count), operands, text, constraints, has_side_effects=True)
        return vector_from_asm(self.accumulator_type, result, count)


def _coordinate(tensor: Tensor, row, col):
    """(row, col) of a 2-D view as a coordinate its layout takes: a linear (column-major) index for nested modes."""
    shape = tensor.layout.shape
    if isinstance(shape, tuple) and len(shape) == 2 and not any(isinstance(s, tuple) for s in shape):
        return row, col
    return row + _fl.size(tensor.layout[0]) * col


def _warpgroup_thread(thread):
    if thread is None:
        from flydsl.expr import gpu

        thread = gpu.thread_idx.x
    return thread % WARPGROUP_THREADS if not isinstance(thread, int) else thread % WARPGROUP_THREADS


# --- tiled MMA ------------------------------------------------------------------------------------------------------


class TiledMma:
    """Atoms over a (``tile_m``, ``tile_n``) block tile: ``warpgroups_m`` warpgroups stacked along M, each repeating
    the atom ``tile_m / (64 warpgroups_m)`` times along M and ``tile_n / N`` times along N (one accumulator Vector
    per repeat, in the list order ``mi * repeats_n + ni``). A and B are shared (tile_m, K) and (tile_n, K) views;
    ``K`` is any multiple of the atom's K (one instruction per K step).

    >>> mma = TiledMma(MmaAtom(fx.BFloat16, 128), tile_m=128, warpgroups_m=2)   # 256 threads, 128 x 128
    """

    def __init__(self, atom: MmaAtom, tile_m: int = ATOM_M, tile_n: int | None = None, warpgroups_m: int = 1):
        if not isinstance(atom, MmaAtom):
            raise TypeError(f"TiledMma: expected an MmaAtom, got {atom!r}")
        tile_n = atom.n if tile_n is None else tile_n
        if warpgroups_m < 1 or tile_m % (ATOM_M * warpgroups_m) or tile_n % atom.n:
            raise ValueError(
                f"TiledMma: tile ({tile_m}, {tile_n}) must split into {warpgroups_m} warpgroup(s) of 64-row atoms"
                f" along M and {atom.n}-column atoms along N"
            )
        self.atom, self.tile_m, self.tile_n, self.warpgroups_m = atom, tile_m, tile_n, warpgroups_m
        self.rows_per_warpgroup = tile_m // warpgroups_m
        self.repeats = (self.rows_per_warpgroup // ATOM_M, tile_n // atom.n)

    def __repr__(self):
        return f"TiledMma({self.atom!r}, tile=({self.tile_m}, {self.tile_n}), warpgroups_m={self.warpgroups_m})"

    @property
    def threads(self) -> int:
        return WARPGROUP_THREADS * self.warpgroups_m

    @property
    def accumulator_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset ``row + tile_m col`` in the block tile, over all threads and all
        accumulators of a thread (values: the atom's, then the M repeats, then the N repeats)."""
        col = self.tile_m
        rm, rn = self.repeats
        thread = ((4, 8, 4, self.warpgroups_m), (2 * col, 1, 16, self.rows_per_warpgroup))
        value = ((2, 2, self.atom.n // 8, rm, rn), (col, 8, 8 * col, ATOM_M, self.atom.n * col))
        return _fl.Layout((thread[0], value[0]), (thread[1], value[1]))

    def make_accumulators(self, value=0.0) -> list[Vector]:
        return [self.atom.make_accumulator(value) for _ in range(self.repeats[0] * self.repeats[1])]

    def _warpgroup(self, warpgroup):
        if warpgroup is not None:
            return warpgroup
        if self.warpgroups_m == 1:
            return 0
        from flydsl.expr import gpu

        return gpu.thread_idx.x // WARPGROUP_THREADS

    def mma(self, a, b: Tensor, accumulators: list, accumulate=True, warpgroup=None) -> list[Vector]:
        """Every K step of the tile: ``accumulators[mi * rn + ni] (+)= A_mi B_ni^T``; ``accumulate`` applies to the
        first K step (later steps always accumulate). ``a``: the shared (tile_m, K) Tensor, or (RS) a list of
        ``Int32x4`` fragments indexed ``ks * repeats_m + mi`` for this warpgroup; ``b``: the shared (tile_n, K)
        Tensor. ``warpgroup``: this thread's warpgroup (default: thread_idx.x // 128)."""
        atom, (rm, rn) = self.atom, self.repeats
        if len(accumulators) != rm * rn:
            raise ValueError(f"{self!r}: expected {rm * rn} accumulators, got {len(accumulators)}")
        k_extent = _fl.size(b.layout[1])
        if not isinstance(k_extent, int) or k_extent % atom.k:
            raise ValueError(f"{self!r}: the K extent of B ({k_extent}) is not a multiple of {atom.k}")
        k_steps = k_extent // atom.k
        b_desc = make_descriptor(b, atom.b_shape)
        if atom.a_from_registers:
            if len(a) != k_steps * rm:
                raise ValueError(f"{self!r}: expected {k_steps * rm} A fragments (K steps x M repeats), got {len(a)}")
            a_desc = None
        else:
            rows = (self.rows_per_warpgroup, k_extent)
            a_mine = local_tile(a, rows, (self._warpgroup(warpgroup), 0)) if self.warpgroups_m > 1 else a
            a_desc = make_descriptor(a_mine, atom.a_shape)
        accumulators = list(accumulators)
        for ks in range(k_steps):
            for mi in range(rm):
                a_op = a[ks * rm + mi] if a_desc is None else a_desc.at(mi * ATOM_M, ks * atom.k)
                for ni in range(rn):
                    i = mi * rn + ni
                    flag = accumulate if ks == 0 else True
                    accumulators[i] = atom(a_op, b_desc.at(ni * atom.n, ks * atom.k), accumulators[i], flag)
        return accumulators

    def store_accumulators(self, accumulators: list, tensor: Tensor, warpgroup=None, thread=None) -> None:
        """Writes every accumulator of this thread into the (tile_m, tile_n) view ``tensor`` (converted to its
        float type)."""
        rm, rn = self.repeats
        first_block = self._warpgroup(warpgroup) * rm  # this warpgroup's first 64-row block
        for mi in range(rm):
            for ni in range(rn):
                sub = local_tile(tensor, (ATOM_M, self.atom.n), (first_block + mi, ni))  # (64, N)
                self.atom.store_accumulator(accumulators[mi * rn + ni], sub, thread)

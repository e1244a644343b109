"""Warp- and CTA-level instructions: shuffles, elections, register reallocation, dependent launch, barriers and
the matrix fragments of ``ldmatrix``/``stmatrix``/``mma.sync``."""

from __future__ import annotations

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
    Numeric,
    as_numeric,
)
from flydsl.expr.nvvm._common import _FULL_MASK, _asm, _float32, _i32, _int32, _pointer, _struct_fields
from flydsl.expr.vector import Vector, vector_class

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

# --- warp-level -------------------------------------------------------------------------------------------------

_SHFL_KINDS = {"idx": "idx", "up": "up", "down": "down", "bfly": "bfly", "xor": "bfly"}


def shfl_sync(value, lane_or_offset, kind: str = "idx", width: int = 32, mask: int = _FULL_MASK) -> Numeric:
    """The 32-bit ``value`` of another lane of the warp: ``kind`` ``"idx"`` (lane ``lane_or_offset``), ``"up"`` /
    ``"down"`` (``lane -/+ offset``), ``"bfly"``/``"xor"`` (``lane ^ offset``), within segments of ``width``
    lanes (a power of two); a lane whose source is outside its segment keeps its own value. ``mask``: the lanes
    taking part (all by default).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-shfl-sync
    """
    if kind not in _SHFL_KINDS:
        raise ValueError(f"shfl_sync kind: expected one of {sorted(_SHFL_KINDS)}, got {kind!r}")
    if width & (width - 1) or not 1 <= width <= 32:
        raise ValueError(f"shfl_sync width: expected a power of two in 1..32, got {width}")
    value = as_numeric(value)
    if value.width != 32 or isinstance(value, Vector):
        raise TypeError(f"shfl_sync moves 32-bit values, got {type(value).__name__}")
    # PTX's c operand: segment mask in bits 12..8, clamp in bits 4..0 (0 for up: the segment's first lane).
    clamp = ((32 - width) << 8) | (0 if kind == "up" else 0x1F)
    bits = _arith.bitcast(_i32(), value.value) if isinstance(value, Float) else value.value
    shuffled = _nvvm.shfl_sync(
        _i32(),
        Int32(mask).value,
        bits,
        _int32(lane_or_offset, "shfl_sync offset").value,
        Int32(clamp).value,
        getattr(_nvvm.ShflKind, _SHFL_KINDS[kind]),
    )
    if isinstance(value, Float):
        shuffled = _arith.bitcast(value.type, shuffled)
    return type(value)(shuffled)


_VOTE_KINDS = ("any", "all", "uni")


def vote_sync(predicate, kind: str = "any", mask: int = _FULL_MASK) -> Boolean:
    """Whether ``predicate`` (a kernel Boolean) holds in any (``"any"``) or every (``"all"``) lane of ``mask``, or is
    the same in all of them (``"uni"``): the same answer in every lane, so a branch on it is warp-uniform (a warp
    skips work that none of its lanes needs).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-vote-sync
    """
    if kind not in _VOTE_KINDS:
        raise ValueError(f"vote_sync kind: expected one of {_VOTE_KINDS}, got {kind!r}")
    predicate = as_numeric(predicate, Boolean)
    if type(predicate) is not Boolean:
        raise TypeError(f"vote_sync predicate: expected a kernel Boolean, got {type(predicate).__name__}")
    i1 = ir.IntegerType.get_signless(1)
    return Boolean(_nvvm.vote_sync(i1, Int32(mask).value, predicate.value, getattr(_nvvm.VoteSyncKind, kind)))


def elect_sync(mask: int = _FULL_MASK) -> Boolean:
    """True in exactly one active lane of ``mask`` (the same lane for every lane of the warp). sm_90+.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-elect-sync
    """
    membermask = None if mask == _FULL_MASK else Int32(mask).value
    return Boolean(_nvvm.elect_sync(ir.IntegerType.get_signless(1), membermask=membermask))


def setmaxnreg(count: int, increase: bool) -> None:
    """Raises (``increase=True``) or lowers this warpgroup's registers per thread to ``count`` (24..256, a multiple
    of 8): warp-specialized kernels give producer warpgroups few registers and consumers many. Every thread of the
    warpgroup executes it. ptxas ignores it (warning C7508) unless the kernel has an entry register cap:
    ``@flyc.kernel(threads=..., min_blocks_per_sm=1)`` or ``max_registers=...``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#miscellaneous-instructions-setmaxnreg
    """
    if not isinstance(count, int) or not 24 <= count <= 256 or count % 8:
        raise ValueError(f"setmaxnreg count: expected a multiple of 8 in 24..256, got {count!r}")
    action = _nvvm.SetMaxRegisterAction.increase if increase else _nvvm.SetMaxRegisterAction.decrease
    _nvvm.SetMaxRegisterOp(count, action)


def griddepcontrol_wait(after=()) -> Int32:
    """``griddepcontrol.wait``: waits until the grids this one depends on (the stream's previous kernel, where this
    kernel was launched with programmatic dependent launch: ``@flyc.kernel(dependent_launch=True)``) have completed
    and their memory is visible. Everything before it may overlap the previous kernel, so it must come before the
    first access to memory that kernel may write (or read, for this kernel's stores). Without such a launch it
    returns at once. sm_90+.

    Returns an opaque Int32 zero: ordinary loads and stores stay after the wait, but loads through inline PTX
    without side effects (:func:`ld_global_nc`) are free to move above it unless their address depends on it (add
    the zero to an index). ``after``: Int32 values (a word of each load) that the wait takes as operands, so that
    those loads are issued before it (and land before it starts): reads of memory the previous kernel does not
    write, in flight while it finishes (ptxas would otherwise schedule them after the wait).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-griddepcontrol
    """
    operands = [_int32(value, "griddepcontrol_wait after").value for value in after]
    constraints = ",".join(["=r"] + ["r"] * len(operands) + ["~{memory}"])
    return Int32(_asm(_i32(), operands, "griddepcontrol.wait;\n\tmov.u32 $0, 0;", constraints, side_effects=True))


def griddepcontrol_launch_dependents() -> None:
    """``griddepcontrol.launch_dependents``: lets the stream's next kernel, if launched with programmatic dependent
    launch, start once every CTA of this grid has executed it or exited (a hint: it says nothing about this grid's
    memory, which the next kernel sees after its ``griddepcontrol_wait``). sm_90+."""
    _nvvm.griddepcontrol(_nvvm.GridDepActionKind.launch_dependents)


def globaltimer() -> Int32:
    """The low 32 bits of ``%globaltimer``, the GPU's nanosecond clock shared by all SMs (wraps every ~4.3 s: take
    differences modulo 2^32). For timelines of a kernel's phases across CTAs: read after a barrier (or a use of the
    loaded values) so that it is ordered after the work it stamps; it is volatile, never merged or hoisted.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#special-registers-globaltimer
    """
    return Int32(_asm(_i32(), [], "mov.u32 $0, %globaltimer_lo;", "=r", side_effects=True))


def trap() -> None:
    """``trap;``: aborts the kernel (the launch's stream then reports CUDA_ERROR_LAUNCH_FAILED or
    CUDA_ERROR_ILLEGAL_INSTRUCTION, and the context is unusable). For conditions that must never hold, which would
    otherwise give wrong results or hang: ``if bad: nvvm.trap()``."""
    _asm(None, [], "trap;", "", side_effects=True)


def barrier(barrier_id=0, number_of_threads=None) -> None:
    """Named barrier ``bar.sync id, count``: waits until ``number_of_threads`` threads (a multiple of 32; default:
    the whole block) have arrived at barrier ``barrier_id`` (0..15; ``gpu.barrier()`` uses 0). Lets groups of warps
    synchronize among themselves.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-bar
    """
    if isinstance(barrier_id, int) and not 0 <= barrier_id <= 15:
        raise ValueError(f"barrier id: expected 0..15, got {barrier_id}")
    if isinstance(number_of_threads, int) and (number_of_threads <= 0 or number_of_threads % 32):
        raise ValueError(f"barrier: number_of_threads must be a positive multiple of 32, got {number_of_threads}")
    # LLVM's intrinsics, not nvvm.barrier: MLIR 22 prints nvvm.barrier in a form its parser rejects once it has a
    # location alias (`nvvm.barrier id = %c1 loc(#loc1)`: "undefined symbol alias id"), and kernels go through text.
    identifier = _int32(barrier_id, "barrier id").value
    if number_of_threads is None:
        _llvm.call_intrinsic(None, "llvm.nvvm.barrier.cta.sync.aligned.all", [identifier], [], [])
    else:
        count = _int32(number_of_threads, "number_of_threads").value
        _llvm.call_intrinsic(None, "llvm.nvvm.barrier.cta.sync.aligned.count", [identifier, count], [], [])


def barrier_arrive(barrier_id, number_of_threads) -> None:
    """Named barrier ``bar.arrive id, count``: counts this warp's threads at barrier ``barrier_id`` (1..15) without
    waiting; the barrier completes once ``number_of_threads`` (a multiple of 32) have arrived or synced
    (:func:`barrier`). A producer-consumer signal between groups of warps: one group arrives, the other waits in
    ``barrier(barrier_id, number_of_threads)``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-bar
    """
    if isinstance(barrier_id, int) and not 1 <= barrier_id <= 15:
        raise ValueError(f"barrier_arrive id: expected 1..15 (0 is the block's barrier), got {barrier_id}")
    if not isinstance(number_of_threads, int) or number_of_threads <= 0 or number_of_threads % 32:
        expected = "a positive multiple of 32"
        raise ValueError(f"barrier_arrive: number_of_threads: expected {expected}, got {number_of_threads!r}")
    identifier = _int32(barrier_id, "barrier_arrive id").value
    _asm(None, [identifier], f"bar.arrive $0, {number_of_threads};", "r,~{memory}", side_effects=True)


# --- matrix fragments -------------------------------------------------------------------------------------------


def ldmatrix(where, coord=None, num: int = 4, trans: bool = False) -> Vector:
    """``ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16``: the warp loads ``num`` 8x8 matrices of 16-bit
    elements from shared memory. Lanes ``8k .. 8k+7`` give the addresses of the 8 rows (16 contiguous bytes each,
    16-byte aligned) of matrix ``k``; each lane gets an ``Int32x{num}``: element ``k`` holds two elements of matrix
    ``k``, row ``lane // 4``, columns ``2 * (lane % 4)`` and ``+1`` (low half first) — transposed with ``trans``.
    ``where``: an ``!llvm.ptr<3>`` or a shared Tensor (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-ldmatrix
    """
    if num not in (1, 2, 4):
        raise ValueError(f"ldmatrix num: expected 1, 2 or 4, got {num}")
    pointer = _pointer(where, coord, "shared")
    result_type = _i32() if num == 1 else ir.Type.parse(f"!llvm.struct<({', '.join(['i32'] * num)})>")
    loaded = _nvvm.ldmatrix(
        result_type,
        pointer,
        num,
        _nvvm.MMALayout.col if trans else _nvvm.MMALayout.row,
        ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m = 8, n = 8>"),
        _nvvm.LdStMatrixEltType.B16,
    )
    cls = vector_class(Int32, num)
    from mlir.dialects import vector as _vector

    return cls(_vector.from_elements(cls.mlir_type(), _struct_fields(loaded, num, _i32())))


def stmatrix(where, values, coord=None, trans: bool = False) -> None:
    """``stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`` (sm_90): the inverse of :func:`ldmatrix`. ``values``
    (an ``Int32`` vector of 1, 2 or 4, or 16-bit vectors bit-cast to it) holds element ``k`` of matrix ``k`` as
    ``ldmatrix`` returns it; lanes ``8k .. 8k+7`` give the addresses of the rows of matrix ``k``. Epilogues use it
    to write accumulator fragments to shared memory 16 bytes per row.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-stmatrix
    """
    registers = _fragment(values, None, "stmatrix values")
    if len(registers) not in (1, 2, 4):
        raise ValueError(f"stmatrix values: expected 1, 2 or 4 32-bit registers, got {len(registers)}")
    _nvvm.StMatrixOp(
        _pointer(where, coord, "shared"),
        registers,
        _nvvm.MMALayout.col if trans else _nvvm.MMALayout.row,
        ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m = 8, n = 8>"),
        _nvvm.LdStMatrixEltType.B16,
    )


def movmatrix_trans(fragment) -> Int32:
    """``movmatrix.sync.aligned.m8n8.trans.b16``: the warp's 8x8 matrix of 16-bit elements transposed in registers.
    ``fragment`` (an ``Int32``: two 16-bit elements, low half first) holds row ``lane // 4``, columns ``2 * (lane %
    4)`` and ``+1`` of the matrix (the layout of :func:`ldmatrix`, and of an ``mma_sync`` accumulator's row pair
    once packed); the result holds the same elements of the transpose. Turns a C fragment of ``S^T`` into a B
    fragment of ``S`` without shared memory.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-movmatrix
    """
    word = _int32(fragment, "movmatrix_trans fragment")
    return Int32(_asm(_i32(), [word.value], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r"))


def _fragment(value, count: int | None, what: str) -> list[ir.Value]:
    """``count`` i32 values from a Vector (bit-cast to Int32 when its elements are 16-bit) or a sequence."""
    if isinstance(value, Vector):
        if value.element is not Int32:
            value = value.bitcast(Int32)
        values = [value[k].value for k in range(value.length)]
    else:
        values = [_int32(v, what).value for v in value]
    if count is not None and len(values) != count:
        raise ValueError(f"mma_sync {what}: expected {count} 32-bit registers, got {len(values)}")
    return values


def mma_sync(a, b, c, dtype=BFloat16) -> Vector:
    """``mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}.{bf16|f16}.f32``: ``D = A @ B + C`` for the warp, A 16x16
    (row-major fragments), B 16x8 (column-major fragments), C/D 16x8 float32. With an 8-bit ``dtype``
    (``fx.Float8E4M3FN``, ``fx.Float8E5M2``: ``m16n8k32...e4m3.e4m3``, sm_89+) A is 16x32 and B 32x8, each register
    holding 4 elements: the same registers, lanes and rows, columns ``4 * (l % 4) + {0..3}`` (+16 for registers 2, 3
    of A and 1 of B).

    ``a``: 4 registers (``Int32x4`` from ``ldmatrix(num=4)``, or a ``BFloat16x8``/``Float16x8``); ``b``: 2 registers;
    ``c``: a ``Float32x4`` (or 4 Float32). Lane ``l`` holds A rows ``l // 4`` (registers 0, 2) and ``l // 4 + 8``
    (1, 3), columns ``2 * (l % 4) + {0, 1}`` (+8 for registers 2, 3); B column ``l // 4``, rows ``2 * (l % 4) +
    {0, 1}`` (+8 for register 1); C/D rows ``l // 4`` (elements 0, 1) and ``+8`` (2, 3), columns ``2 * (l % 4) +
    {0, 1}``. Returns D as a ``Float32x4``. ``dtype``: ``fx.BFloat16`` or ``fx.Float16``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma"""
    fp8 = (Float8E4M3FN, Float8E5M2)
    if dtype not in (BFloat16, Float16) and dtype not in fp8:
        raise ValueError(f"mma_sync dtype: expected fx.BFloat16, fx.Float16, fx.Float8E4M3FN or Float8E5M2: {dtype!r}")
    a_values, b_values = _fragment(a, 4, "a"), _fragment(b, 2, "b")
    if dtype is Float16:  # the f16 form takes vector<2xf16> registers
        half2 = ir.VectorType.get([2], ir.F16Type.get())
        a_values = [_llvm.bitcast(half2, v) for v in a_values]
        b_values = [_llvm.bitcast(half2, v) for v in b_values]
    accumulator = vector_class(Float32, 4)
    if isinstance(c, Vector):
        if type(c) is not accumulator:
            raise TypeError(f"mma_sync c: expected a Float32x4, got {type(c).__name__}")
        c_values = [c[k].value for k in range(4)]
    else:
        c_values = [_float32(v).value for v in c]
        if len(c_values) != 4:
            raise ValueError(f"mma_sync c: expected 4 Float32, got {len(c_values)}")
    struct = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
    if dtype in fp8:  # inline PTX: MLIR 22's nvvm.mma.sync verifier refuses the fp8 shapes
        name = "e4m3" if dtype is Float8E4M3FN else "e5m2"
        text = (
            f"mma.sync.aligned.m16n8k32.row.col.f32.{name}.{name}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}},"
            " {$8, $9}, {$10, $11, $12, $13};"
        )
        constraints = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)
        result = _asm(struct, [*a_values, *b_values, *c_values], text, constraints)
    else:
        result = _nvvm.mma_sync(
            struct,
            ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 16>"),
            _nvvm.MMALayout.row,
            _nvvm.MMALayout.col,
            a_values,
            b_values,
            c_values,
            multiplicand_a_ptx_type=_nvvm.MMATypes.bf16 if dtype is BFloat16 else _nvvm.MMATypes.f16,
            multiplicand_b_ptx_type=_nvvm.MMATypes.bf16 if dtype is BFloat16 else _nvvm.MMATypes.f16,
        )
    from mlir.dialects import vector as _vector

    fields = _struct_fields(result, 4, Float32.mlir_type())
    return accumulator(_vector.from_elements(accumulator.mlir_type(), fields))

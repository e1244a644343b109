"""NVIDIA intrinsics for kernels: thin wrappers over ``mlir.dialects.nvvm`` (inline PTX only where MLIR 22 has no op).

Values in and out are FlyDSL numerics and :class:`~flydsl.expr.vector.Vector` values; fragments of warp-wide
instructions (``ldmatrix``, ``mma_sync``) are ``Int32``/``Float32`` vectors, so they can be carried through loops.
Instructions that take an address accept a raw ``!llvm.ptr`` value or a ``Tensor`` (the address of its element at
``coord``, see :func:`address`: a ``fly.element_address``, so any Fly tensor works, ``fx.SmemAllocator`` buffers
included).

Every function links its section of the PTX ISA (https://docs.nvidia.com/cuda/parallel-thread-execution/).
"""

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
    Int16,
    Int32,
    Int64,
    Numeric,
    Uint16,
    as_numeric,
)
from flydsl.expr.tensor import Tensor, _static_coord, fly_ops
from flydsl.expr.vector import Vector, vector_class

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = [
    "ex2_approx",
    "rcp_approx",
    "cvt_f32x2_to_fp8x2",
    "red_max_relaxed",
    "cvt_fp8x2_to_f32x2",
    "cvt_e4m3x4_to_f16x2",
    "unpack_e4m3x4",
    "pack_f32x2",
    "prmt",
    "shfl_sync",
    "elect_sync",
    "setmaxnreg",
    "barrier",
    "ldmatrix",
    "stmatrix",
    "cp_async",
    "cp_async_commit_group",
    "cp_async_wait_group",
    "ld_global_nc",
    "ld_global",
    "st_global",
    "create_policy",
    "atom_add_acq_rel",
    "atom_add_relaxed",
    "ld_acquire",
    "red_add_release",
    "mma_sync",
    "address",
    "fence_proxy_async",
    "griddepcontrol_wait",
    "griddepcontrol_launch_dependents",
    "trap",
]

_FULL_MASK = -1  # 0xffffffff as an i32
_SPACE_NUMBERS = {"generic": 0, "global": 1, "shared": 3, "register": 5}


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _float32(x) -> Float32:
    x = as_numeric(x, Float32)
    if type(x) is not Float32:
        raise TypeError(f"expected a Float32, got {type(x).__name__} (convert with .to(fx.Float32))")
    return x


def _int32(x, what: str) -> Int32:
    x = as_numeric(x, Int32)
    if not isinstance(x, Numeric) or x.width != 32 or isinstance(x, Float):
        raise TypeError(f"{what}: expected a 32-bit integer, got {type(x).__name__}")
    return Int32(x.value, divisibility=x.divisibility)


def _asm(result_type, operands, text: str, constraints: str, side_effects: bool = False):
    return _llvm.inline_asm(
        result_type, [v for v in operands], text, constraints, has_side_effects=side_effects or None
    )


# --- special functions ------------------------------------------------------------------------------------------


def ex2_approx(x, ftz: bool = False) -> Float32:
    """``2 ** x`` by ``ex2.approx.f32`` (max 2 ulp error; subnormal inputs kept, no ``.ftz``): an LLVM intrinsic
    (MLIR 22's nvvm dialect has no op for it), which ptxas widens with a range check and two multiplies around the
    MUFU. ``ftz=True``: ``ex2.approx.ftz.f32``, one instruction, subnormal inputs and results flushed to 0 (results
    below 2^-126: e.g. softmax terms 87 below the row's maximum).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions-ex2"""
    x = _float32(x)
    name = "llvm.nvvm.ex2.approx.ftz.f" if ftz else "llvm.nvvm.ex2.approx.f32"
    return Float32(_llvm.call_intrinsic(Float32.mlir_type(), name, [x.value], [], []))


def rcp_approx(x, ftz: bool = True) -> Float32:
    """``1 / x`` by ``rcp.approx.ftz.f32`` (``nvvm.rcp.approx.ftz.f``; max 1 ulp). ``ftz=False`` keeps subnormals
    with ``rcp.approx.f32`` (inline PTX: the dialect has only the ``.ftz`` op).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions-rcp"""
    x = _float32(x)
    if ftz:
        return Float32(_nvvm.rcp_approx_ftz_f(Float32.mlir_type(), x.value))
    return Float32(_asm(Float32.mlir_type(), [x.value], "rcp.approx.f32 $0, $1;", "=f,f"))


_FP8 = {"e4m3": "f8E4M3FN", "e5m2": "f8E5M2"}


def _fp8_type(fmt: str) -> ir.Type:
    if fmt not in _FP8:
        raise ValueError(f"fp8 format: expected one of {sorted(_FP8)}, got {fmt!r}")
    return ir.Type.parse(_FP8[fmt])


def cvt_f32x2_to_fp8x2(hi, lo, fmt: str = "e4m3", relu: bool = False) -> Uint16:
    """Two floats to two fp8 (``e4m3`` or ``e5m2``), round to nearest even, saturated to the finite range, packed
    in a ``Uint16``: ``hi`` in bits 15..8, ``lo`` in bits 7..0 (PTX's operand order; in memory, little endian,
    ``lo`` comes first). ``relu`` clamps negatives to 0. Needs sm_89+.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    hi, lo = _float32(hi), _float32(lo)
    packed = _nvvm.convert_f32x2_to_f8x2(
        ir.IntegerType.get_signless(16),
        hi.value,
        lo.value,
        _fp8_type(fmt),
        rnd=_nvvm.FPRoundingMode.RN,
        sat=_nvvm.SaturationMode.SATFINITE,
        relu=relu or None,
    )
    return Uint16(packed)


def cvt_fp8x2_to_f32x2(packed, fmt: str = "e4m3") -> tuple[Float32, Float32]:
    """The two fp8 numbers of a 16-bit value as floats: ``(hi, lo)`` (bits 15..8, bits 7..0), so that
    ``cvt_fp8x2_to_f32x2(cvt_f32x2_to_fp8x2(a, b))`` gives ``a, b`` rounded to fp8. Exact (through ``f16x2``, which
    holds every fp8 value). Needs sm_89+.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    bits = as_numeric(packed, Uint16)
    if not isinstance(bits, (Uint16, Int16)):
        raise TypeError(f"cvt_fp8x2_to_f32x2: expected a 16-bit integer, got {type(bits).__name__}")
    pair = ir.VectorType.get([2], ir.IntegerType.get_signless(8))
    halves = _nvvm.convert_f8x2_to_f16x2(
        ir.VectorType.get([2], ir.F16Type.get()), _llvm.bitcast(pair, bits.value), _fp8_type(fmt)
    )
    as_float = Vector(halves).to(Float32)
    return as_float[1], as_float[0]


def cvt_e4m3x4_to_f16x2(word) -> tuple[Int32, Int32]:
    """The four e4m3 numbers of a 32-bit word (bytes 0..3) as two ``f16x2`` words: ``(bytes 0, 1; bytes 2, 3)``, the
    lower byte in each word's low half (the register pairs of ``mma_sync``'s f16 fragments). Exact: every e4m3 value
    is an f16. Two ``cvt.rn.f16x2.e4m3x2``. Needs sm_89+.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    word = _int32(word, "cvt_e4m3x4_to_f16x2")
    text = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; " "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }"
    pair = _asm(ir.Type.parse("!llvm.struct<(i32, i32)>"), [word.value], text, "=r,=r,r")
    low, high = _struct_fields(pair, 2, _i32())
    return Int32(low), Int32(high)


def unpack_e4m3x4(word, dtype=BFloat16) -> tuple[Int32, Int32]:
    """The four e4m3 numbers of a 32-bit word (bytes 0..3) as two ``bf16x2`` (or, ``dtype`` ``fx.Float16``,
    ``f16x2``) words: ``(bytes 0, 1; bytes 2, 3)``, the lower byte in each word's low half (the register pairs of
    ``mma_sync``'s 16-bit fragments). Exact, by bits: byte ``b`` placed as the bf16 pattern ``((b & 0x7f) << 4) |
    ((b & 0x80) << 8)`` is ``e4m3(b) * 2^-120`` for every finite ``b`` (normals: the exponent bias 7 against 127;
    e4m3 subnormals land on bf16 subnormals, zeros on zeros), and one ``mul.rn.bf16x2`` by 2^120 (0x7b80, exact:
    bf16 arithmetic keeps subnormal inputs, it has no ``.ftz``) scales it back; f16 alike (``<< 7``: ``* 2^-8``,
    ``mul.rn.f16x2`` by 2^8 without ``.ftz``). Not the NaN bytes 0x7f and 0xff (e4m3fn has no infinities): they
    read as +-480 (quantizers saturate to +-448). Per output word: a ``prmt`` (the byte pair to bytes 1 and 3), a
    shift, three logic ops (ptxas: two LOP3s) and the multiply. Needs sm_90 for bf16 (``mul.bf16x2``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#half-precision-floating-point-instructions-mul
    """
    if dtype not in (BFloat16, Float16):
        raise ValueError(f"unpack_e4m3x4 dtype: expected fx.BFloat16 or fx.Float16, got {dtype!r}")
    word = _int32(word, "unpack_e4m3x4")
    # bf16: magnitude bits to 4..10 (>> 4 from byte 1), times 2^120; f16: to 7..13 (>> 1), times 2^8
    shift, mask, name, power = (
        (4, "0x07f007f0", "bf16x2", "0x7b807b80") if dtype is BFloat16 else (1, "0x3f803f80", "f16x2", "0x5c005c00")
    )
    text = (
        f"{{ .reg .b32 p, q, r, s, m; mov.b32 m, {power};"
        " prmt.b32 p, $2, 0, 0x1404; prmt.b32 q, $2, 0, 0x3424;"  # (0, b0, 0, b1), (0, b2, 0, b3)
        f" shr.b32 r, p, {shift}; and.b32 r, r, {mask}; and.b32 p, p, 0x80008000; or.b32 p, p, r;"
        f" shr.b32 s, q, {shift}; and.b32 s, s, {mask}; and.b32 q, q, 0x80008000; or.b32 q, q, s;"
        f" mul.rn.{name} $0, p, m; mul.rn.{name} $1, q, m; }}"
    )
    pair = _asm(ir.Type.parse("!llvm.struct<(i32, i32)>"), [word.value], text, "=r,=r,r")
    low, high = _struct_fields(pair, 2, _i32())
    return Int32(low), Int32(high)


def pack_f32x2(low, high, dtype=BFloat16) -> Int32:
    """Two floats rounded to ``dtype`` (``fx.BFloat16`` or ``fx.Float16``, round to nearest even) and packed in one
    32-bit word, ``low`` in bits 15..0: one ``cvt.rn.{bf16x2|f16x2}.f32`` (the register of an ``mma_sync``
    fragment).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    if dtype not in (BFloat16, Float16):
        raise ValueError(f"pack_f32x2 dtype: expected fx.BFloat16 or fx.Float16, got {dtype!r}")
    name = "bf16x2" if dtype is BFloat16 else "f16x2"
    low, high = _float32(low), _float32(high)
    return Int32(_asm(_i32(), [high.value, low.value], f"cvt.rn.{name}.f32 $0, $1, $2;", "=r,f,f"))


def prmt(a, b, selector: int) -> Int32:
    """``prmt.b32``: a word of four bytes picked from the eight of ``a`` (bytes 0..3) and ``b`` (bytes 4..7), result
    byte ``i`` being byte ``(selector >> 4 * i) & 7``: ``prmt(a, b, 0x5410)`` is the low halves of ``a`` and ``b``,
    ``0x7632`` their high halves (a 2 x 2 transpose of 16-bit pairs).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-prmt
    """
    if not isinstance(selector, int) or not 0 <= selector <= 0x7777 or any((selector >> 4 * i) & 8 for i in range(4)):
        raise ValueError(f"prmt selector: expected four byte indices 0..7 (e.g. 0x5410), got {selector!r}")
    a, b = _int32(a, "prmt a"), _int32(b, "prmt b")
    return Int32(_asm(_i32(), [a.value, b.value], f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r"))


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


def griddepcontrol_wait() -> Int32:
    """``griddepcontrol.wait``: waits until the grids this one depends on (the stream's previous kernel, where this
    kernel was launched with programmatic dependent launch: ``@flyc.kernel(dependent_launch=True)``) have completed
    and their memory is visible. Everything before it may overlap the previous kernel, so it must come before the
    first access to memory that kernel may write (or read, for this kernel's stores). Without such a launch it
    returns at once. sm_90+.

    Returns an opaque Int32 zero: ordinary loads and stores stay after the wait, but loads through inline PTX
    without side effects (:func:`ld_global_nc`) are free to move above it unless their address depends on it (add
    the zero to an index).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-griddepcontrol
    """
    return Int32(_asm(_i32(), [], "griddepcontrol.wait;\n\tmov.u32 $0, 0;", "=r,~{memory}", side_effects=True))


def griddepcontrol_launch_dependents() -> None:
    """``griddepcontrol.launch_dependents``: lets the stream's next kernel, if launched with programmatic dependent
    launch, start once every CTA of this grid has executed it or exited (a hint: it says nothing about this grid's
    memory, which the next kernel sees after its ``griddepcontrol_wait``). sm_90+."""
    _nvvm.griddepcontrol(_nvvm.GridDepActionKind.launch_dependents)


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


# --- addresses -------------------------------------------------------------------------------------------------


def address(tensor: Tensor, coord=None) -> ir.Value:
    """The ``!llvm.ptr<space>`` of ``tensor``'s element at ``coord`` (default: its first element): a
    ``fly.element_address``, lowered with the tensor's accesses, so it works for any Fly tensor, including
    ``fx.SmemAllocator`` buffers (placed by the compiler) and swizzled layouts. ``coord``: a linear index or one index
    per mode of the shape, as for ``tensor[coord]``."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"address: expected a fx.Tensor, got {type(tensor).__name__}")
    coordinates = tensor._coordinates(_static_coord(0 if coord is None else coord))
    result = ir.Type.parse(f"!llvm.ptr<{_SPACE_NUMBERS[tensor.space]}>")
    return fly_ops.ElementAddressOp(result, tensor.materialize(), coordinates).result


def _pointer(where, coord, space: str) -> ir.Value:
    value = address(where, coord) if isinstance(where, Tensor) else where
    if not isinstance(value, ir.Value) or not str(value.type).startswith("!llvm.ptr"):
        raise TypeError(f"expected a Tensor or an !llvm.ptr value, got {where!r}")
    expected = f"!llvm.ptr<{_SPACE_NUMBERS[space]}>"
    if str(value.type) != expected:
        raise TypeError(f"expected a {space} pointer ({expected}), got {value.type}")
    return value


# --- matrix fragments -------------------------------------------------------------------------------------------


def _struct_fields(value: ir.Value, count: int, element: ir.Type) -> list[ir.Value]:
    if count == 1 and not str(value.type).startswith("!llvm.struct"):
        return [value]
    return [_llvm.extractvalue(element, value, [k]) for k in range(count)]


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


# --- cache-hinted loads -----------------------------------------------------------------------------------------

_L1_EVICTION = ("evict_normal", "evict_unchanged", "evict_first", "evict_last", "no_allocate")


def ld_global_nc(where, coord=None, nbytes: int = 16, l1: str | None = None, prefetch: int | None = None) -> Vector:
    """``ld.global.nc[.L1::{l1}][.L2::{prefetch}B].v{n}.b32``: ``nbytes`` (4, 8 or 16) bytes of read-only global
    memory (aligned to ``nbytes``) through the non-coherent path, as an ``Int32`` vector (bit-cast it to the data's
    type: ``.bitcast(fx.BFloat16)``). ``l1``: an L1 eviction priority (``"no_allocate"`` streams data read once past
    L1; ``"evict_first"``, ``"evict_last"``...); ``prefetch``: an L2 prefetch size in bytes (64, 128 or 256).
    The memory must not be written while the kernel runs (the load is free to be reordered or merged: inline PTX
    without side effects). ``where``: an ``!llvm.ptr<1>`` or a global Tensor (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld-global-nc
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"ld_global_nc nbytes: expected 4, 8 or 16, got {nbytes}")
    if l1 is not None and l1 not in _L1_EVICTION:
        raise ValueError(f"ld_global_nc l1: expected one of {_L1_EVICTION} or None, got {l1!r}")
    if prefetch not in (None, 64, 128, 256):
        raise ValueError(f"ld_global_nc prefetch: expected 64, 128, 256 or None, got {prefetch!r}")
    pointer = _pointer(where, coord, "global")
    count = nbytes // 4
    suffix = (f".L1::{l1}" if l1 else "") + (f".L2::{prefetch}B" if prefetch else "")
    text = f"ld.global.nc{suffix}{_vec(count)}.b32 {_registers(0, count)}, [${count}];"
    return _words(_asm(_words_type(count), [pointer], text, ",".join(["=r"] * count + ["l"])), count)


def _registers(first: int, count: int) -> str:
    """Inline-PTX operands ``$first ..`` of ``count`` 32-bit words: one register, or a ``{...}`` vector of them."""
    names = ", ".join(f"${first + i}" for i in range(count))
    return names if count == 1 else f"{{{names}}}"


def _vec(count: int) -> str:
    return f".v{count}" if count > 1 else ""


def _words_type(count: int) -> ir.Type:
    """The LLVM result type of inline PTX that writes ``count`` 32-bit words."""
    return _i32() if count == 1 else ir.Type.parse(f"!llvm.struct<({', '.join(['i32'] * count)})>")


def _words(loaded, count: int) -> Vector:
    from mlir.dialects import vector as _vector

    cls = vector_class(Int32, count)
    return cls(_vector.from_elements(cls.mlir_type(), _struct_fields(loaded, count, _i32())))


_L2_PRIORITY = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
_CACHE_OPERATORS = {"load": ("ca", "cg", "cs", "lu", "cv"), "store": ("wb", "cg", "cs", "wt")}


def create_policy(priority: str = "evict_first", fraction: float = 1.0) -> Int64:
    """``createpolicy.fractional.L2::{priority}.b64``: an L2 cache eviction policy (an opaque 64-bit value) for the
    ``policy=`` of :func:`ld_global` / :func:`st_global`: the lines they touch are kept in L2 with ``priority``
    (``"evict_first"``: data streamed once, which then leaves room for the rest; ``"evict_last"``: data read again,
    e.g. weights every row reads), ``fraction`` (0 < f <= 1) of them, the others ``evict_unchanged``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-createpolicy
    """
    if priority not in _L2_PRIORITY:
        raise ValueError(f"create_policy priority: expected one of {_L2_PRIORITY}, got {priority!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"create_policy fraction: expected 0 < fraction <= 1, got {fraction!r}")
    text = f"createpolicy.fractional.L2::{priority}.b64 $0, {float(fraction)!r};"
    return Int64(_asm(ir.IntegerType.get_signless(64), [], text, "=l"))


def _cache_suffix(kind: str, cop, l1, policy) -> str:
    """The qualifiers of a hinted ``ld``/``st``: ``.{cop}`` or ``.L1::{l1}`` (PTX allows one of them), then
    ``.L2::cache_hint`` with a policy."""
    if cop is not None and cop not in _CACHE_OPERATORS[kind]:
        raise ValueError(f"{kind} cop: expected one of {_CACHE_OPERATORS[kind]} or None, got {cop!r}")
    if l1 is not None and l1 not in _L1_EVICTION:
        raise ValueError(f"{kind} l1: expected one of {_L1_EVICTION} or None, got {l1!r}")
    if cop is not None and l1 is not None:
        raise ValueError(
            f"{kind}: give a cache operator (cop={cop!r}) or an L1 eviction priority (l1={l1!r}), not both"
        )
    if policy is not None and not (isinstance(policy, Numeric) and policy.width == 64):
        raise TypeError(f"{kind} policy: expected a 64-bit value from create_policy, got {type(policy).__name__}")
    return (f".{cop}" if cop else "") + (f".L1::{l1}" if l1 else "") + (".L2::cache_hint" if policy is not None else "")


def _policy_operand(policy, results: int, operands: list, constraints: list) -> str:
    """Appends an L2 cache policy (if any) to inline PTX's operands; returns its text after the instruction's
    operands (``", $k"``, ``k`` counting the ``results`` first)."""
    if policy is None:
        return ""
    operands.append(policy.value)
    constraints.append("l")
    return f", ${results + len(operands) - 1}"


def _flag(predicate) -> Int32:
    """A kernel Boolean as an Int32 0/1 (inline PTX takes no i1 operands: it sets its own predicate from it)."""
    predicate = as_numeric(predicate, Boolean)
    if type(predicate) is not Boolean:
        raise TypeError(f"predicate: expected a kernel Boolean, got {type(predicate).__name__}")
    return Int32(_arith.extui(_i32(), predicate.value))


def ld_global(where, coord=None, nbytes: int = 16, *, cop=None, l1=None, policy=None, predicate=None, fill=None):
    """``ld.global[.{cop} | .L1::{l1}][.L2::cache_hint].v{n}.b32``: ``nbytes`` (4, 8 or 16) bytes of global memory
    (aligned to ``nbytes``) as an ``Int32`` vector (``.bitcast(...)`` it to the data's type), with cache hints:
    ``cop`` a cache operator (``"cs"``: streamed, evict first; ``"lu"``, ``"cg"``, ...) or ``l1`` an L1 eviction
    priority, and ``policy`` an L2 eviction policy (:func:`create_policy`). ``predicate`` (a kernel Boolean): load
    only where it holds; elsewhere the result is ``fill`` (an ``Int32`` vector of the same words; default zeros) and
    the address is not touched. The load has no side effects (the compiler may move it like a plain load of data
    that the kernel does not write meanwhile). ``where``: an ``!llvm.ptr<1>`` or a global Tensor.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"ld_global nbytes: expected 4, 8 or 16, got {nbytes}")
    if fill is not None and predicate is None:
        raise ValueError("ld_global fill: the words of predicated-off loads; give a predicate with it")
    suffix = _cache_suffix("load", cop, l1, policy)
    count = nbytes // 4
    operands, constraints = [_pointer(where, coord, "global")], ["=r"] * count + ["l"]  # $count: the address
    policy_operand = _policy_operand(policy, count, operands, constraints)
    text = f"ld.global{suffix}{_vec(count)}.b32 {_registers(0, count)}, [${count}]{policy_operand};"
    if predicate is not None:  # the words are the fill's, then loaded over where the predicate holds
        cls = vector_class(Int32, count)
        fill = cls(0) if fill is None else fill
        if type(fill) is not cls:
            raise TypeError(f"ld_global fill: expected an {cls.__name__} (the words loaded), got {type(fill).__name__}")
        flag = count + len(operands)
        operands += [_flag(predicate).value] + [fill[i].value for i in range(count)]
        constraints += ["r"] * (count + 1)
        moves = " ".join(f"mov.b32 ${i}, ${flag + 1 + i};" for i in range(count))
        text = f"{{ .reg .pred p; setp.ne.b32 p, ${flag}, 0; {moves} @p {text} }}"
    return _words(_asm(_words_type(count), operands, text, ",".join(constraints)), count)


def st_global(where, words, coord=None, *, cop=None, l1=None, policy=None, predicate=None) -> None:
    """``st.global[.{cop} | .L1::{l1}][.L2::cache_hint].v{n}.b32``: ``words`` (an ``Int32`` vector of 1, 2 or 4
    elements; ``.bitcast(fx.Int32)`` other data) to global memory aligned to their size, with the cache hints of
    :func:`ld_global` (``cop``: ``"cs"`` streamed, ``"wt"``, ...). ``predicate``: store only where it holds.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
    """
    if not isinstance(words, Vector) or words.element is not Int32 or len(words) not in (1, 2, 4):
        raise TypeError(f"st_global words: expected an Int32 vector of 1, 2 or 4 elements, got {type(words).__name__}")
    suffix = _cache_suffix("store", cop, l1, policy)
    count = len(words)
    operands = [_pointer(where, coord, "global")] + [words[i].value for i in range(count)]
    constraints = ["l"] + ["r"] * count
    policy_operand = _policy_operand(policy, 0, operands, constraints)
    text = f"st.global{suffix}{_vec(count)}.b32 [$0], {_registers(1, count)}{policy_operand};"
    if predicate is not None:
        operands.append(_flag(predicate).value)
        constraints.append("r")
        text = f"{{ .reg .pred p; setp.ne.b32 p, ${len(operands) - 1}, 0; @p {text} }}"
    _asm(None, operands, text, ",".join(constraints), side_effects=True)


# --- flags between CTAs ----------------------------------------------------------------------------------------

_SCOPES = ("cta", "cluster", "gpu", "sys")


def _scope(scope: str, what: str) -> str:
    if scope not in _SCOPES:
        raise ValueError(f"{what} scope: expected one of {_SCOPES}, got {scope!r}")
    return scope


def ld_acquire(where, coord=None, scope: str = "gpu") -> Int32:
    """``ld.acquire.{scope}.global.b32``: a 32-bit flag read with acquire semantics: this thread's later reads see
    every write the writer made visible before its release (:func:`red_add_release`). Spin on it for a flag set by
    another CTA, then ``barrier`` so the other threads of the group read after it. ``where``: an ``!llvm.ptr<1>``
    or a global Tensor of 32-bit integers (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    pointer = _pointer(where, coord, "global")
    text = f"ld.acquire.{_scope(scope, 'ld_acquire')}.global.b32 $0, [$1];"
    return Int32(_asm(_i32(), [pointer], text, "=r,l", side_effects=True))


def red_add_release(where, value, coord=None, scope: str = "gpu") -> None:
    """``red.release.{scope}.global.add.s32``: adds ``value`` to a 32-bit flag with release semantics: every
    write this thread made visible before (those of the other threads of its group included, after a ``barrier``)
    is visible to a thread that reads the new value with :func:`ld_acquire`.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-red
    """
    pointer = _pointer(where, coord, "global")
    text = f"red.release.{_scope(scope, 'red_add_release')}.global.add.s32 [$0], $1;"
    _asm(None, [pointer, _int32(value, "red_add_release value").value], text, "l,r", side_effects=True)


def red_max_relaxed(where, value, coord=None, scope: str = "gpu") -> None:
    """``red.relaxed.{scope}.global.max.u32``: raises a 32-bit word to ``value`` (unsigned) with no ordering of this
    thread's other accesses. Non-negative floats order as their bits do (NaN above inf), so a float32 maximum of
    magnitudes (an amax) is the maximum of their bits as ``Int32`` (``arith.bitcast``), with NaN kept.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-red
    """
    pointer = _pointer(where, coord, "global")
    text = f"red.relaxed.{_scope(scope, 'red_max_relaxed')}.global.max.u32 [$0], $1;"
    _asm(None, [pointer, _int32(value, "red_max_relaxed value").value], text, "l,r", side_effects=True)


def atom_add_acq_rel(where, value, coord=None, scope: str = "gpu") -> Int32:
    """``atom.acq_rel.{scope}.global.add.s32``: adds ``value`` to a 32-bit counter and returns its old value, with
    release semantics for this thread's earlier writes (its group's too, after a ``barrier``) and acquire semantics
    for its later reads: the thread that sees the last count reads what every earlier adder wrote before adding.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-atom
    """
    return _atom_add("acq_rel", where, value, coord, scope)


def atom_add_relaxed(where, value, coord=None, scope: str = "gpu") -> Int32:
    """``atom.relaxed.{scope}.global.add.s32``: adds ``value`` to a 32-bit counter and returns its old value, with no
    ordering of this thread's other accesses (it waits for nothing it wrote before): handing out work items, e.g.
    the next row of a persistent kernel (each adder gets a distinct count).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-atom
    """
    return _atom_add("relaxed", where, value, coord, scope)


def _atom_add(order: str, where, value, coord, scope: str) -> Int32:
    what = f"atom_add_{order}"
    pointer = _pointer(where, coord, "global")
    text = f"atom.{order}.{_scope(scope, what)}.global.add.s32 $0, [$1], $2;"
    operands = [pointer, _int32(value, f"{what} value").value]
    return Int32(_asm(_i32(), operands, text, "=r,l,r", side_effects=True))


# --- asynchronous copies ----------------------------------------------------------------------------------------


def cp_async(dst, src, nbytes: int = 16, dst_coord=None, src_coord=None, src_bytes=None, cache: str | None = None):
    """``cp.async.{ca|cg}.shared.global [dst], [src], nbytes[, src_bytes]``: an asynchronous copy of 4, 8 or 16
    bytes from global to shared memory (both aligned to ``nbytes``). ``src_bytes`` (an int or kernel integer <=
    ``nbytes``) reads only that many bytes and fills the rest with zeros (0: a zero fill without reading — use it for
    out-of-range tiles). ``cache``: ``"cg"`` (L2 only; 16 bytes only; the default for 16) or ``"ca"`` (the default
    otherwise). ``dst``/``src``: Tensors (with ``dst_coord``/``src_coord``) or raw pointers. Completes at
    :func:`cp_async_wait_group` of its group (:func:`cp_async_commit_group`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"cp_async nbytes: expected 4, 8 or 16, got {nbytes}")
    cache = cache or ("cg" if nbytes == 16 else "ca")
    if cache not in ("ca", "cg") or (cache == "cg" and nbytes != 16):
        raise ValueError(f"cp_async cache: 'ca', or 'cg' with 16 bytes; got {cache!r} with {nbytes}")
    dst_pointer = _pointer(dst, dst_coord, "shared")
    src_pointer = _pointer(src, src_coord, "global")
    size = None if src_bytes is None else _int32(src_bytes, "src_bytes").value
    modifier = _nvvm.LoadCacheModifierKind.CG if cache == "cg" else _nvvm.LoadCacheModifierKind.CA
    _nvvm.cp_async_shared_global(dst_pointer, src_pointer, nbytes, modifier, cp_size=size)


def cp_async_bulk(dst, src, nbytes, barrier, dst_coord=None, src_coord=None) -> None:
    """``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], nbytes, [barrier]``: one
    thread's asynchronous copy of ``nbytes`` (a kernel Int32 or int, a multiple of 16; 0 copies nothing) contiguous
    bytes from global to this CTA's shared memory, both 16-byte aligned, completing ``nbytes`` of the transaction
    count of ``barrier`` (an :class:`~flydsl.expr.mbarrier.Mbarrier` in this CTA's shared memory: raise its expected
    bytes with ``arrive_expect_tx`` in the same phase, then ``wait`` on it). ``dst``/``src``: Tensors (with
    ``dst_coord``/``src_coord``) or raw pointers. The copy writes through the async proxy: shared memory the CTA wrote
    with ordinary stores takes a :func:`fence_proxy_async` before a bulk copy writes it.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk
    """
    if isinstance(nbytes, int) and (nbytes < 0 or nbytes % 16):
        raise ValueError(f"cp_async_bulk nbytes: expected a non-negative multiple of 16, got {nbytes}")
    i64 = Int64.mlir_type()
    where = _llvm.ptrtoint(i64, _pointer(dst, dst_coord, "shared"))
    source = _pointer(src, src_coord, "global")
    bar = _llvm.ptrtoint(i64, barrier.address)
    size = _int32(nbytes if not isinstance(nbytes, int) else Int32(nbytes), "cp_async_bulk nbytes").value
    copy = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"
    text = f"{{ .reg .pred p; setp.ne.b32 p, $2, 0; @p {copy} }}"  # a size of 0: no copy issued
    _asm(None, [where, source, size, bar], text, "l,l,r,l", side_effects=True)


def cp_async_commit_group() -> None:
    """``cp.async.commit_group``: closes the group of this thread's ``cp_async`` issued since the last commit.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-commit-group
    """
    _nvvm.cp_async_commit_group()


def cp_async_wait_group(n: int = 0) -> None:
    """``cp.async.wait_group n``: waits until at most ``n`` of this thread's committed groups are pending (0: all
    done). Other threads' copies need a barrier after it to be visible.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-wait-group
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"cp_async_wait_group: n must be a non-negative int, got {n!r}")
    _nvvm.cp_async_wait_group(n)


# --- proxy fences -----------------------------------------------------------------------------------------------

_ASYNC_PROXY_SPACES = {"shared": "shared_cta", "shared::cta": "shared_cta", "shared::cluster": "shared_cluster"}


def fence_proxy_async(space: str | None = "shared") -> None:
    """``fence.proxy.async[.shared::cta | .shared::cluster | .global]``: orders this thread's generic-proxy accesses
    (ordinary loads/stores, ``stmatrix``) to ``space`` with later async-proxy accesses (wgmma operands, TMA, bulk
    copies) and the reverse. Shared memory written by threads for wgmma/TMA needs it in each writing thread, then a
    barrier. ``space``: ``"shared"`` (= ``"shared::cta"``), ``"shared::cluster"``, ``"global"``, or None (all).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    if space is None:
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_)
    elif space == "global":
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_global)
    elif space in _ASYNC_PROXY_SPACES:
        shared = getattr(_nvvm.SharedSpace, _ASYNC_PROXY_SPACES[space])
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_shared, space=shared)
    else:
        raise ValueError(
            f"fence_proxy_async space: expected 'shared', 'shared::cluster', 'global' or None, got {space!r}"
        )

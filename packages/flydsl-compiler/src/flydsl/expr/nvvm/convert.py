"""Special functions and conversions: ``ex2``/``rcp`` approximations, fp8 packing, bit permutes."""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import (
    BFloat16,
    Float16,
    Float32,
    Int16,
    Int32,
    Uint16,
    as_numeric,
)
from flydsl.expr.nvvm._common import _asm, _float32, _i32, _int32, _struct_fields
from flydsl.expr.vector import Vector

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

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

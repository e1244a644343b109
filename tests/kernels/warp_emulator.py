"""A model of one warp on torch's CPU tensors, for running kernel helpers written with ``flydsl.expr`` without a GPU:
each kernel value is a tensor over the 32 lanes, and the ``fx``, ``arith``, ``math``, ``vector`` and ``nvvm``
operations those helpers call are rebuilt from the PTX ISA (the fragment layouts of ``mma.sync`` m16n8k16 and
``movmatrix``, ``prmt``'s byte selection, ``cvt`` between e4m3, f16, bf16 and f32). Memory is a byte tensor; a
tensor argument is a base address, a shape and element strides into it.

Only what the paged decode's chunk math and loads use is here (``tests/kernels/test_decode_chunk_emulated.py``).
A branch on a per-lane value raises: the helpers may branch only on warp-uniform votes."""

from __future__ import annotations

import types

import torch

LANES = 32
LANE = torch.arange(LANES)


def _lanes(values, dtype):
    return torch.as_tensor(_value(values), dtype=dtype).expand(LANES).clone()


def _value(x):
    return x.v if isinstance(x, (_Number, Bool, Address)) else x


def _signed(bits, width=32):
    """``width``-bit patterns (int64) as two's complement values."""
    return (bits + 2 ** (width - 1)) % 2**width - 2 ** (width - 1)


class Bool:
    """Per-lane predicates."""

    def __init__(self, v):
        self.v = _lanes(v, torch.bool)

    def __and__(self, other):
        return Bool(self.v & _value(other))

    def __or__(self, other):
        return Bool(self.v | _value(other))

    def __bool__(self):
        raise TypeError("a branch on a per-lane predicate (the kernel may branch on warp-uniform votes only)")


class _Number:
    """Per-lane numbers of one torch dtype: arithmetic and comparisons lane by lane."""

    dtype = None

    def __init__(self, v):
        self.v = self._wrap(_lanes(v, self.dtype))

    @staticmethod
    def _wrap(v):
        return v

    def _op(self, other, fn, reverse=False):
        other = torch.as_tensor(_value(other), dtype=self.dtype)
        return type(self)(fn(other, self.v) if reverse else fn(self.v, other))

    def __add__(self, o):
        return self._op(o, torch.add)

    __radd__ = __add__

    def __sub__(self, o):
        return self._op(o, torch.sub)

    def __rsub__(self, o):
        return self._op(o, torch.sub, reverse=True)

    def __mul__(self, o):
        return self._op(o, torch.mul)

    __rmul__ = __mul__

    def __lt__(self, o):
        return Bool(self.v < _value(o))

    def __le__(self, o):
        return Bool(self.v <= _value(o))

    def __gt__(self, o):
        return Bool(self.v > _value(o))

    def __ge__(self, o):
        return Bool(self.v >= _value(o))


class Int(_Number):
    """Per-lane 32-bit two's complement integers (kept in int64)."""

    dtype = torch.int64
    _wrap = staticmethod(_signed)

    def __floordiv__(self, o):
        return self._op(o, lambda a, b: torch.div(a, b, rounding_mode="floor"))

    def __mod__(self, o):
        return self._op(o, torch.remainder)

    def __rshift__(self, o):
        return self._op(o, torch.bitwise_right_shift)  # arithmetic, as arith.shrsi

    def __lshift__(self, o):
        return self._op(o, torch.bitwise_left_shift)

    def __and__(self, o):
        return self._op(o, torch.bitwise_and)

    __rand__ = __and__

    def __or__(self, o):
        return self._op(o, torch.bitwise_or)

    __ror__ = __or__

    def __eq__(self, o):
        return Bool(self.v == _value(o))

    def __ne__(self, o):
        return Bool(self.v != _value(o))

    __hash__ = None

    @property
    def bits(self):
        """The unsigned patterns (int64)."""
        return self.v & 0xFFFFFFFF

    def to(self, kind):
        """To float32 (``arith.sitofp``: signed, round to nearest); the only conversion the kernels take."""
        if str(kind) != "f32":
            raise NotImplementedError(f"Int.to({kind})")
        return Float(_signed(self.v).to(torch.float32))


class Float(_Number):
    """Per-lane float32."""

    dtype = torch.float32

    def __truediv__(self, o):
        return self._op(o, torch.div)

    def __rtruediv__(self, o):
        return self._op(o, torch.div, reverse=True)

    @property
    def bits(self):
        return self.v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


class Address:
    """Per-lane byte addresses into :class:`Memory` (64-bit)."""

    def __init__(self, v):
        self.v = _lanes(v, torch.int64)


# --- 16-bit floats and e4m3 as bits (int64 tensors of the patterns) ------------------------------------------------


def f16_bits(x):
    return torch.as_tensor(x, dtype=torch.float32).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF


def bf16_bits(x):
    """float32 to bf16, round to nearest even."""
    return torch.as_tensor(x, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def half_value(bits, kind):
    dtype = torch.float16 if kind == "f16" else torch.bfloat16
    return _signed(torch.as_tensor(bits, dtype=torch.int64), 16).to(torch.int16).view(dtype).to(torch.float32)


def e4m3_value(byte):
    """e4m3fn bytes (0x7f and 0xff: NaN) as float32."""
    return _signed(torch.as_tensor(byte, dtype=torch.int64), 8).to(torch.int8).view(torch.float8_e4m3fn).float()


def e4m3_bytes(x):
    """float32 to e4m3fn bytes, round to nearest even, saturated at 448 (int64 patterns)."""
    clipped = torch.as_tensor(x, dtype=torch.float32).clamp(-448, 448)
    return clipped.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)


# --- the fake modules ------------------------------------------------------------------------------------------------


class _Type:
    def __init__(self, name):
        self.name = name

    def mlir_type(self):
        return self.name

    def __repr__(self):
        return self.name


class _Scalar(_Type):
    def __init__(self, name, make):
        super().__init__(name)
        self.make = make

    def __call__(self, value):
        return value if isinstance(value, (Int, Float)) else self.make(value)


FLOAT32 = _Scalar("f32", Float)
INT32 = _Scalar("i32", Int)
FLOAT16, BFLOAT16 = _Type("f16"), _Type("bf16")


class Vec(list):
    """A vector of per-lane values (``flydsl.expr.vector.Vector``): 32-bit words, floats, or 16-bit halves
    (``(kind, bits)`` pairs, from a bit-cast)."""

    def bitcast(self, kind):
        if kind in (FLOAT16, BFLOAT16):  # words -> halves, the low one first
            out = Vec()
            for word in self:
                out += [(kind.name, word.bits & 0xFFFF), (kind.name, word.bits >> 16)]
            return out
        if kind is INT32:  # halves -> words
            return Vec(Int(self[i][1] | (self[i + 1][1] << 16)) for i in range(0, len(self), 2))
        raise NotImplementedError(kind)

    def to(self, kind):
        if kind is FLOAT32:
            return Vec(Float(half_value(bits, name)) for name, bits in self)
        if kind is FLOAT16:
            return Vec(("f16", f16_bits(x.v)) for x in self)
        raise NotImplementedError(kind)

    def __mul__(self, other):
        return Vec(x * other for x in self)


class VecType:
    def __init__(self, element, count):
        self.element, self.count = element, count

    def __call__(self, fill):
        return Vec(self.element(fill) for _ in range(self.count))


def _select(condition, a, b):
    kind = Float if isinstance(a, Float) or isinstance(b, Float) else Int
    a, b = kind(a), kind(b)
    return kind(torch.where(torch.as_tensor(_value(condition)), a.v, b.v))


def _extremum(fn):
    def apply(a, b):
        kind = Float if isinstance(a, Float) or isinstance(b, Float) else Int
        return kind(fn(kind(a).v, kind(b).v))

    return apply


def _bitcast(kind, x):
    if kind == "f32":
        return Float(_signed(x.bits).to(torch.int32).view(torch.float32))
    return Int(x.bits)


class Memory:
    """The global memory: a byte tensor, tensors laid out in it by :meth:`tensor`."""

    def __init__(self):
        self.data = torch.zeros(0, dtype=torch.uint8)

    def tensor(self, array: torch.Tensor) -> Tensor:
        """Places ``array`` (contiguous) 16-byte aligned; returns its tensor."""
        start = -(-len(self.data) // 16) * 16
        raw = array.contiguous().view(torch.uint8).reshape(-1)
        self.data = torch.cat([self.data, torch.zeros(start - len(self.data), dtype=torch.uint8), raw])
        return Tensor(self, start, array.shape, array.stride(), array.element_size())

    def read(self, address: Address, nbytes: int, predicate) -> Vec:
        mask = torch.ones(LANES, dtype=torch.bool) if predicate is None else _value(predicate)
        words = torch.zeros((LANES, nbytes // 4), dtype=torch.int64)
        for lane in torch.nonzero(mask).flatten().tolist():
            start = int(address.v[lane])
            assert start % nbytes == 0, f"lane {lane}: a {nbytes}-byte load at {start} is misaligned"
            assert 0 <= start and start + nbytes <= len(self.data), f"lane {lane}: a load at {start} out of bounds"
            words[lane] = self.data[start : start + nbytes].clone().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return Vec(Int(words[:, i]) for i in range(nbytes // 4))


class _Extent:
    def __init__(self, n):
        self.n = n

    def to(self, _kind):
        return Int(self.n)


class Tensor:
    def __init__(self, memory, base, shape, strides, element_bytes):
        self.memory, self.base, self.element_bytes = memory, base, element_bytes
        self.shape = tuple(_Extent(n) for n in shape)
        self.stride = tuple(_Extent(s) for s in strides)

    def address(self, coord) -> Address:
        offset = sum(torch.as_tensor(_value(c)) * s.n for c, s in zip(coord, self.stride, strict=True))
        return Address(self.base + offset * self.element_bytes)


def _matrix(words, place, kind, shape):
    """The matrix (float64) a 16-bit fragment holds: ``place(register, half)`` gives each lane's (row, column)."""
    out = torch.full(shape, float("nan"), dtype=torch.float64)
    for r, word in enumerate(words):
        for h in range(2):
            row, col = place(r, h)
            out[row, col] = half_value((word.bits >> (16 * h)) & 0xFFFF, kind).double()
    assert not out.isnan().any(), "a fragment left an element unset"
    return out


def _mma_sync(a, b, c, dtype):
    """m16n8k16: A (16 x 16, row-major fragments), B (16 x 8, column-major), C/D (16 x 8) float32."""
    g, t = LANE // 4, LANE % 4
    A = _matrix(a, lambda r, h: (g + 8 * (r % 2), 2 * t + h + 8 * (r // 2)), dtype.name, (16, 16))
    B = _matrix(b, lambda r, h: (2 * t + h + 8 * r, g), dtype.name, (16, 8))
    C = torch.zeros((16, 8), dtype=torch.float64)
    for e in range(4):
        C[g + 8 * (e // 2), 2 * t + e % 2] = c[e].v.double()
    D = (A @ B + C).float()
    return Vec(Float(D[g + 8 * (e // 2), 2 * t + e % 2]) for e in range(4))


def _movmatrix_trans(word):
    g, t = LANE // 4, LANE % 4
    m = torch.zeros((8, 8), dtype=torch.int64)
    m[g, 2 * t], m[g, 2 * t + 1] = word.bits & 0xFFFF, word.bits >> 16
    m = m.t()
    return Int(m[g, 2 * t] | (m[g, 2 * t + 1] << 16))


def _prmt(a, b, selector):
    data = [(a.bits >> (8 * i)) & 0xFF for i in range(4)] + [(b.bits >> (8 * i)) & 0xFF for i in range(4)]
    out = torch.zeros(LANES, dtype=torch.int64)
    for i in range(4):
        out |= data[(selector >> (4 * i)) & 7] << (8 * i)
    return Int(out)


def _cvt_e4m3x4_to_f16x2(word):
    halves = [f16_bits(e4m3_value((word.bits >> (8 * i)) & 0xFF)) for i in range(4)]
    return Int(halves[0] | (halves[1] << 16)), Int(halves[2] | (halves[3] << 16))


def _pack_f32x2(low, high, dtype):
    bits = f16_bits if dtype is FLOAT16 else bf16_bits
    return Int(bits(low.v) | (bits(high.v) << 16))


def _shfl_sync(value, lane_or_offset, kind="idx", width=32, mask=-1):
    if kind in ("bfly", "xor"):
        source = LANE ^ lane_or_offset
    else:
        source = torch.as_tensor(_value(lane_or_offset), dtype=torch.int64).expand(LANES)
    return type(value)(value.v[source])


def _vote_sync(predicate, kind="any", mask=-1):
    v = _value(predicate)
    return bool(v.any()) if kind == "any" else bool(v.all())


class _Warp:
    """The nvvm functions that read memory need it: raw addresses point into :attr:`memory`."""

    def __init__(self, memory: Memory):
        self.memory = memory

    def ld_global(self, where, coord=None, nbytes=16, *, predicate=None, fill=None, **_hints):
        if isinstance(where, Tensor):
            return self.memory.read(where.address(coord), nbytes, predicate)
        assert coord is None, "a raw address takes no coordinate"
        return self.memory.read(where, nbytes, predicate)


def modules(memory: Memory) -> dict:
    """The fake modules, by the names the helpers import them under."""
    warp = _Warp(memory)
    fx = types.SimpleNamespace(
        Float32=FLOAT32, Int32=INT32, Float16=FLOAT16, BFloat16=BFLOAT16, range_constexpr=range, const_expr=bool
    )
    arith = types.SimpleNamespace(
        select=_select, maximum=_extremum(torch.maximum), minimum=_extremum(torch.minimum), bitcast=_bitcast
    )
    math = types.SimpleNamespace(tanh=lambda x: Float(torch.tanh(x.v)))
    vector = types.SimpleNamespace(from_elements=lambda kind, items: Vec(items))
    nvvm = types.SimpleNamespace(
        mma_sync=_mma_sync,
        movmatrix_trans=_movmatrix_trans,
        prmt=_prmt,
        cvt_e4m3x4_to_f16x2=_cvt_e4m3x4_to_f16x2,
        pack_f32x2=_pack_f32x2,
        shfl_sync=_shfl_sync,
        vote_sync=_vote_sync,
        ex2_approx=lambda x, ftz=False: Float(torch.exp2(x.v)),
        address=lambda tensor, coord=None: tensor.address(coord),
        byte_offset=lambda address, n: Address(address.v + _value(n)),
        ld_global=warp.ld_global,
    )
    vectors = {"ACC": VecType(FLOAT32, 4), "W2": VecType(INT32, 2), "W4": VecType(INT32, 4)}
    return {"fx": fx, "arith": arith, "math": math, "vector": vector, "nvvm": nvvm, **vectors}

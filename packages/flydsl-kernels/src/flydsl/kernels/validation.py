"""The zoo's one validation layer: every entry point of ``flydsl.kernels`` and of ``flydsl.torch``'s ops checks its
arguments here before anything is launched, and an error names the function, the argument and what was expected
(``flydsl.kernels.rms_norm: weight: expected shape (4096,) ...``).

A tensor is read once into a :class:`TensorInfo` (:func:`describe`: torch tensors through their own getters, the
cheap path; other frameworks through ``__cuda_array_interface__`` or DLPack), the device first, then checked for its
role: :func:`rows` (a 2-D ``(rows, N)`` tensor, unit stride on the last dim), :func:`vector` (``(N,)``: weights,
biases), :func:`stats` (``(rows,)`` float32 statistics), :func:`matrix` (a GEMM operand). The checks that need only
shapes and dtypes (:func:`check_dtype`, :func:`check_like`, :func:`trailing_shape`, :func:`nonnegative`,
:func:`one_of`) also serve ``flydsl.torch``'s fake implementations, which see tensors without data.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "TensorInfo",
    "ROW_DTYPES",
    "describe",
    "from_torch",
    "rows",
    "vector",
    "stats",
    "matrix",
    "matmul",
    "gemm_scale",
    "FP8_DTYPES",
    "torch_tensor",
    "GEMM_ACTIVATIONS",
    "same_device",
    "not_aliased",
    "tensor_addresses",
    "check_dtype",
    "check_like",
    "trailing_shape",
    "nonnegative",
    "one_of",
    "dtype_names",
    "torch_dtype",
    "is_torch",
    "element_bytes",
    "rows_aligned",
    "vectors_aligned",
]

ROW_DTYPES = ("f32", "f16", "bf16")  # element types of the row kernels' inputs and outputs
GEMM_DTYPES = ("bf16", "f16")  # the GEMMs' operands
FP8_DTYPES = ("f8E4M3FN", "f8E5M2")  # fp8_gemm's operands (MLIR's names, as the compiler's)
GEMM_OUT_DTYPES = ("bf16", "f16", "f32")
GEMM_ACTIVATIONS = (None, "relu", "gelu", "silu")  # the GEMM epilogue's (gelu with erf, as torch's default)
_TORCH_NAMES = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "f8E4M3FN",
    "torch.float8_e5m2": "f8E5M2",
}
_LONG_NAMES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "i32": "int32",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2",
}
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1}
_TORCH_TYPES: set = set()  # torch.Tensor (and subclasses) seen: later checks are one set lookup
_DTYPE_NAMES: dict = {}  # torch dtype -> our name, filled on first sight (no torch import at module import)


class TensorInfo(NamedTuple):
    """What the kernels need to know about a tensor argument (a tuple: built on every call, so built cheaply).
    ``device``: the CUDA device ordinal; ``dtype``: an MLIR element type name (``"bf16"``)."""

    obj: object
    shape: tuple
    strides: tuple
    dtype: str
    device: int
    pointer: int

    @property
    def is_torch(self) -> bool:
        return is_torch(self.obj)


_new_info = tuple.__new__  # TensorInfo(*values) without NamedTuple's Python-level __new__


def is_torch(obj) -> bool:
    kind = type(obj)
    if kind in _TORCH_TYPES:
        return True
    if kind.__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        _TORCH_TYPES.add(kind)
        return True
    return False


def torch_dtype(dtype) -> str:
    """Our name of a torch dtype (``torch.bfloat16`` -> ``"bf16"``; others by their torch name)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        text = str(dtype)
        name = _DTYPE_NAMES[dtype] = _TORCH_NAMES.get(text, text.removeprefix("torch."))
    return name


def dtype_names(dtypes, like: str | None = None) -> str:
    """``("f32", "f16", "bf16")`` as ``"float32, float16 or bfloat16"`` (for messages); ``like``: whose dtype the
    first one is (``"float16 (x's) or float32"``)."""
    names = [_long(d) for d in dtypes]
    if like:
        names[0] += f" ({like}'s)"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _long(dtype: str) -> str:
    return _LONG_NAMES.get(dtype, dtype)


def element_bytes(dtype: str) -> int:
    return _ELEMENT_BYTES[dtype]


def describe(who: str, name: str, obj) -> TensorInfo:
    """``obj`` (a CUDA torch tensor, or any array with ``__cuda_array_interface__`` or ``__dlpack__``) as a
    TensorInfo; the device is checked first."""
    if obj is None:
        raise TypeError(f"{who}: {name}: expected a tensor, got None")
    if type(obj) in _TORCH_TYPES or is_torch(obj):
        if not obj.is_cuda:
            raise ValueError(f"{who}: {name}: expected a CUDA tensor, got one on {obj.device}")
        values = (obj, obj.shape, obj.stride(), torch_dtype(obj.dtype), obj.get_device(), obj.data_ptr())
        return _new_info(TensorInfo, values)
    from flydsl.compiler.args import describe_tensor

    try:
        described = describe_tensor(obj, name)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{who}: " + str(error).replace(f"argument '{name}'", name)) from None
    return TensorInfo(obj, described.shape, described.strides, described.dtype, described.device, described.pointer)


def from_torch(t) -> TensorInfo | None:
    """The TensorInfo of a torch CUDA tensor that the caller has validated already (``None`` stays ``None``): no
    checks (``flydsl.torch``'s ops check every argument before they launch)."""
    if t is None:
        return None
    dtype = t.dtype
    name = _DTYPE_NAMES.get(dtype) or torch_dtype(dtype)
    return _new_info(TensorInfo, (t, t.shape, t.stride(), name, t.get_device(), t.data_ptr()))


def check_dtype(who: str, name: str, dtype: str, allowed, *, like: str | None = None) -> None:
    """``dtype`` (our name) is one of ``allowed``; ``like``: whose dtype the first of them is (for the message)."""
    if dtype not in allowed:
        raise TypeError(f"{who}: {name}: expected dtype {dtype_names(allowed, like)}, got {_long(dtype)}")


# The row kernels' 32-bit counters: the row index and a column offset of twice N (the backward's partial sums).
MAX_ROWS = 1 << 31
MAX_ROW_LENGTH = 1 << 30


def rows(who: str, name: str, obj, *, rows: int | None = None, n: int | None = None, dtypes=ROW_DTYPES) -> TensorInfo:
    """A 2-D ``(rows, N)`` tensor with unit stride on its last dim (any row stride, no overlapping rows); its shape
    checked against ``rows`` / ``n`` when given."""
    t = describe(who, name, obj)
    shape, strides = t.shape, t.strides
    if len(shape) != 2:
        raise ValueError(
            f"{who}: {name}: expected a 2-D tensor (rows, N), got shape {tuple(shape)} (reshape to 2-D first)"
        )
    check_dtype(who, name, t.dtype, dtypes)
    if shape[0] >= MAX_ROWS or shape[1] >= MAX_ROW_LENGTH:
        raise ValueError(
            f"{who}: {name}: expected fewer than 2^31 rows of fewer than 2^30 elements (the row kernels count rows"
            f" and columns in 32 bits), got shape {tuple(shape)}"
        )
    if shape[1] > 1 and strides[1] != 1:
        raise ValueError(
            f"{who}: {name}: expected unit stride on the last dim, got strides {tuple(strides)} (call .contiguous())"
        )
    if shape[0] > 1 and strides[0] < shape[1]:
        raise ValueError(f"{who}: {name}: rows overlap (row stride {strides[0]} < N = {shape[1]})")
    if rows is not None and shape[0] != rows:
        raise ValueError(f"{who}: {name}: expected {rows} rows, got shape {tuple(shape)}")
    if n is not None and shape[1] != n:
        raise ValueError(f"{who}: {name}: expected N = {n} (the input's last dim), got shape {tuple(shape)}")
    return t


def vector(who: str, name: str, obj, n: int, *, dtypes, optional: bool = True) -> TensorInfo | None:
    """A 1-D tensor of ``n`` contiguous elements (weights, biases, their gradients); None stays None where
    ``optional``."""
    if obj is None and optional:
        return None
    t = describe(who, name, obj)
    if len(t.shape) != 1 or t.shape[0] != n:
        raise ValueError(f"{who}: {name}: expected shape ({n},) (N, the input's last dim), got {tuple(t.shape)}")
    check_dtype(who, name, t.dtype, dtypes)
    if n > 1 and t.strides[0] != 1:
        raise ValueError(f"{who}: {name}: expected a contiguous vector, got stride {t.strides[0]}")
    return t


def stats(who: str, name: str, obj, rows: int) -> TensorInfo:
    """A float32 ``(rows,)`` tensor of per-row statistics (mean, rstd); any stride."""
    t = describe(who, name, obj)
    if len(t.shape) != 1 or t.shape[0] != rows:
        raise ValueError(f"{who}: {name}: expected shape ({rows},) (one value per row), got {tuple(t.shape)}")
    check_dtype(who, name, t.dtype, ("f32",))
    return t


def matrix(who: str, name: str, obj, dtypes) -> TensorInfo:
    """A 2-D tensor (a GEMM operand) of one of ``dtypes``, any strides."""
    t = describe(who, name, obj)
    if len(t.shape) != 2:
        raise ValueError(f"{who}: {name}: expected a 2-D matrix, got shape {tuple(t.shape)}")
    check_dtype(who, name, t.dtype, dtypes)
    return t


def torch_tensor(who: str, name: str, t):
    """``t`` if it is a torch tensor."""
    if not is_torch(t):
        raise TypeError(f"{who}: {name}: expected a torch tensor, got {type(t).__name__}")
    return t


def matmul(
    who: str, a, b, out, bias, activation, *, contiguous_bias: bool = True, fp8: bool = False
) -> tuple[int, int, int]:
    """Shapes, dtypes and strides, naming the argument: ``a`` (M, K) and ``b`` (K, N) 2-D matrices of one 16-bit
    float dtype (``fp8``: each float8_e4m3fn or float8_e5m2, K a multiple of 16), ``out`` (M, N) row-major
    bf16/fp16/fp32 sharing no memory with the inputs (None: allocated by the caller), ``bias`` (N,) in a's dtype or
    float32 (fp8: bf16, fp16 or float32; contiguous with ``contiguous_bias``), ``activation`` one of
    :data:`GEMM_ACTIVATIONS`. Torch tensors, read for their shapes only (meta tensors too). Returns ``(m, n, k)``."""
    for name, t in (("a", a), ("b", b)):
        t = torch_tensor(who, name, t)
        if t.dim() != 2:
            raise ValueError(f"{who}: {name}: expected a 2-D matrix, got shape {tuple(t.shape)}")
        check_dtype(who, name, torch_dtype(t.dtype), FP8_DTYPES if fp8 else GEMM_DTYPES)
    if not fp8:
        check_dtype(who, "b", torch_dtype(b.dtype), (torch_dtype(a.dtype),), like="a")
    elif a.shape[1] % 16:
        raise ValueError(
            f"{who}: a: K = {a.shape[1]}: expected a multiple of 16 (fp8 rows are read by TMA in 16-byte units)"
        )
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{who}: b: expected {k} rows (a's columns), got shape {tuple(b.shape)}")
    one_of(who, "activation", activation, GEMM_ACTIVATIONS)
    if bias is not None:
        bias = torch_tensor(who, "bias", bias)
        if tuple(bias.shape) != (n,) or (contiguous_bias and n > 1 and bias.stride(0) != 1):
            whole = ", contiguous" if contiguous_bias else ""
            raise ValueError(
                f"{who}: bias: expected a ({n},) vector{whole}, got shape {tuple(bias.shape)} strides"
                f" {tuple(bias.stride())}"
            )
        if fp8:
            check_dtype(who, "bias", torch_dtype(bias.dtype), GEMM_OUT_DTYPES)
        else:
            check_dtype(who, "bias", torch_dtype(bias.dtype), (torch_dtype(a.dtype), "f32"), like="a")
    if out is not None:
        out = torch_tensor(who, "out", out)
        if tuple(out.shape) != (m, n) or (n > 1 and out.stride(-1) != 1):
            raise ValueError(
                f"{who}: out: expected a row-major ({m}, {n}) tensor, got shape {tuple(out.shape)} strides"
                f" {tuple(out.stride())}"
            )
        check_dtype(who, "out", torch_dtype(out.dtype), GEMM_OUT_DTYPES)
        if out.device.type != "meta":  # fake tensors have no memory to overlap
            inputs = (("a", a), ("b", b), ("bias", bias))
            given = ((name, tensor_addresses(t)) for name, t in inputs if t is not None)
            not_aliased(who, "out", tensor_addresses(out), *given)
    return m, n, k


def gemm_scale(who: str, name: str, scale, extent: int, per: str) -> str:
    """An fp8 GEMM's float32 scale ``name`` (a torch tensor, read for its shape only): one value (0-d, or one element
    in one or two dimensions) or one per ``per`` ("row": (M,) or (M, 1), ``extent`` = M; "column": (N,) or (1, N),
    ``extent`` = N), its values one stride apart. Returns "tensor" or ``per``."""
    scale = torch_tensor(who, name, scale)
    check_dtype(who, name, torch_dtype(scale.dtype), ("f32",))
    shape = tuple(scale.shape)
    if len(shape) <= 2 and all(extent_ == 1 for extent_ in shape):
        return "tensor"
    per_shapes = ((extent,), (extent, 1)) if per == "row" else ((extent,), (1, extent))
    if shape in per_shapes:
        if scale.stride(shape.index(extent)) != 1:
            raise ValueError(f"{who}: {name}: expected contiguous scales, got strides {tuple(scale.stride())}")
        return per
    raise ValueError(
        f"{who}: {name}: expected one float32 scale (shape (), (1,) or (1, 1)) or one per {per}"
        f" {' or '.join(str(s) for s in per_shapes)}, got shape {shape}"
    )


def tensor_addresses(t) -> TensorInfo:
    """A torch tensor's addresses for the overlap check (any device: CPU tensors have them too)."""
    return TensorInfo(t, t.shape, t.stride(), torch_dtype(t.dtype), -1, t.data_ptr())


def same_device(who: str, reference: TensorInfo, *others: tuple[str, TensorInfo | None]) -> None:
    """Every ``(name, tensor)`` of ``others`` (None: absent) on ``reference``'s device."""
    device = reference.device
    for name, other in others:
        if other is not None and other.device != device:
            raise ValueError(
                f"{who}: {name}: expected a tensor on cuda:{device} (the input's), got cuda:{other.device}"
            )


def not_aliased(who: str, name: str, out: TensorInfo, *inputs: tuple[str, TensorInfo | None]) -> None:
    """``out`` shares no memory with any of ``inputs`` (a kernel that reads tiles of an input while it writes the
    output would read what it wrote): refused where their byte ranges overlap."""
    low, high = _span(out, _ELEMENT_BYTES.get(out.dtype, 2))
    for other_name, other in inputs:
        if other is None:
            continue
        other_low, other_high = _span(other, _ELEMENT_BYTES.get(other.dtype, 2))
        if low < other_high and other_low < high:
            raise ValueError(f"{who}: {name}: overlaps {other_name} in memory; pass an output of its own")


def _span(t: TensorInfo, size: int) -> tuple[int, int]:
    """The byte range ``[first, last + 1)`` a tensor's elements cover."""
    if any(extent == 0 for extent in t.shape):
        return t.pointer, t.pointer
    last = sum((extent - 1) * abs(stride) for extent, stride in zip(t.shape, t.strides, strict=True))
    return t.pointer, t.pointer + (last + 1) * size


def check_like(who: str, name: str, shape, dtype: str, like_shape, like_dtype: str, like_name: str) -> None:
    """A tensor of the shape and dtype of ``like_name``'s."""
    if tuple(shape) != tuple(like_shape):
        raise ValueError(f"{who}: {name}: expected shape {tuple(like_shape)} ({like_name}'s), got {tuple(shape)}")
    check_dtype(who, name, dtype, (like_dtype,), like=like_name)


def trailing_shape(who: str, shape, normalized_shape) -> tuple:
    """``normalized_shape`` as a tuple, checked to be the trailing dims of ``shape`` with at least one element (as
    ``torch.nn.functional.layer_norm`` takes it)."""
    ns = tuple(normalized_shape)
    if not 1 <= len(ns) <= len(shape) or tuple(shape[len(shape) - len(ns) :]) != ns:
        raise ValueError(
            f"{who}: normalized_shape: expected the trailing dims of x (shape {tuple(shape)}), got {list(ns)}"
        )
    count = 1
    for extent in ns:
        count *= extent
    if count == 0:
        raise ValueError(f"{who}: normalized_shape: expected at least one element to normalize, got {list(ns)}")
    return ns


def nonnegative(who: str, name: str, value) -> float:
    """A non-negative number (``eps``), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{who}: {name}: expected a non-negative number, got {value!r}")
    return float(value)


def one_of(who: str, name: str, value, choices: tuple):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{who}: {name}: expected one of {choices}, got {value!r}")
    return value


def rows_aligned(*tensors: TensorInfo) -> bool:
    """Every tensor's rows start at 16-byte boundaries (pointer and row stride): what the 16-byte (``cp.async``,
    hinted) accesses of the staged and looped kernels need."""
    for t in tensors:
        size = 4 if t.dtype == "f32" else 2
        if t.pointer % 16 or (t.shape[0] > 1 and (t.strides[0] * size) % 16):
            return False
    return True


def vectors_aligned(*tensors: TensorInfo) -> bool:
    """Every (contiguous) vector starts at a 16-byte boundary."""
    return all(t.pointer % 16 == 0 for t in tensors)

"""``quantize_fp8``: a tensor cast to fp8 with float32 scales, in one fused pass (amax, scale, cast), for the fp8 GEMMs
(:func:`flydsl.kernels.gemm.fp8_gemm`, the block-scaled ``blockscale_gemm``) and ``flydsl.torch.nn.Fp8Linear``. The
zoo's one quantizer vocabulary: the granularity words here are the ones ``Fp8Linear`` (and the MoE and block-scaled
GEMMs) take.

    from flydsl.kernels.quantize import quantize_fp8
    a8, scale_a = quantize_fp8(x, "token")      # x (M, K) bf16 -> e4m3 (M, K), scale_a (M, 1): x ~ a8 * scale_a
    w8, scale_w = quantize_fp8(w, "channel")    # w (N, K) nn.Linear weights -> e4m3 (N, K), scale_w (1, N)
    out = fp8_gemm(a8, w8.t(), scale_a, scale_w)

    a8, scale_a = quantize_fp8(x, "group")      # DeepSeek-V3: scale_a (M, ceil(K / 128)), M-major
    w8, scale_w = quantize_fp8(w, "block")      # scale_w (ceil(N / 128), ceil(K / 128))
    out = blockscale_gemm(a8, w8.t(), scale_a, scale_w)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from flydsl.kernels import validation as check
from flydsl.kernels.memory import torch_new_empty
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = ["GRANULARITIES", "quantize_fp8"]

GRANULARITIES = ("tensor", "token", "channel", "group", "block")
_FORMATS = {"torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2"}
_GROUP = 128  # groups (1 x 128) and blocks (128 x 128): the block-scaled GEMM's K block
_QUANTIZE = Plans("flydsl.kernels.quantize_fp8", replay=True)


@functools.cache
def _kernels():
    from flydsl.kernels.quantize import kernels

    return kernels


@functools.cache
def _groups():
    from flydsl.kernels.quantize import groups

    return groups


def quantize_fp8(
    x, granularity: str = "token", *, group: int = 128, dtype=None, out=None, scales=None, power_of_two: bool = False
):
    """``(x_fp8, scales)`` with ``x ~ x_fp8 * scales``: ``x`` a (rows, N) torch CUDA tensor (float32, float16 or
    bfloat16, unit stride on the last dim), cast to ``dtype`` (``torch.float8_e4m3fn``, the default, or
    ``torch.float8_e5m2``) after division by its float32 scale ``amax / fp8_max`` (448 for e4m3, 57344 for e5m2;
    computed as ``amax * (1 / fp8_max)``, as torch's ``amax / fp8_max`` on CUDA, and the values multiplied by
    ``fp8_max / max(amax, 1e-30)``), with saturation to the finite range, rounding to nearest even. ``granularity``:

    * "token": one scale per row, shape (rows, 1) (activations);
    * "channel": one per row of an nn.Linear weight (N, K), i.e. per output channel, shape (1, N): the ``scale_b``
      of ``fp8_gemm(a, w.t(), ...)``;
    * "tensor": one, shape ();
    * "group": one per row and ``group`` (128) columns, shape (rows, ceil(N / 128)), the last group partial where
      N is not a multiple of 128 (its amax over the columns that exist). Allocated M-major, as the block-scaled
      GEMM reads them: the transposed view ``buffer[:, :rows].t()`` of a contiguous (ceil(N / 128), rows rounded
      up to 4) buffer, strides (1, rows rounded up to 4);
    * "block": one per 128 x 128 block of a weight (N, K), shape (ceil(N / 128), ceil(K / 128)) row-major,
      partial blocks at the edges: torch ops (:func:`quantize_blocks`, the group kernel's arithmetic), as a weight
      is quantized once.

    A row, group or block of zeros gets scale 0 and zeros; NaN makes its scale NaN. ``power_of_two`` ("group" and
    "block"): each scale rounded up to a power of two (UE8M0 scales, as DeepGEMM takes them for DeepSeek-V3; at
    least 2^-126), still float32, the values divided by it exactly. Per token, channel or group one read and one
    write (one fused kernel); per tensor two reads (the amax first) and one write. ``out`` (rows, N) row-major fp8
    and ``scales`` (float32, of the granularity's shape; contiguous, but for "group" M-major or row-major: written
    through its strides): written where given (``dtype`` then is ``out``'s), else allocated."""
    key = signature(x, granularity, group, None if dtype is None else str(dtype), out, scales, power_of_two)
    plan = _QUANTIZE.get(key)
    if plan is None:
        plan = _QUANTIZE.add(key, _plan(x, granularity, group, dtype, out, scales, power_of_two))
    out, scales = plan(x, out, scales)[:2]
    return out, scales


def _plan(x, granularity: str, group: int, dtype, out, scales, power_of_two: bool):
    """The plan of a call of this signature, checked: a :class:`~flydsl.kernels.plans.ScratchPlan` of ``(x, out,
    scales)`` whose scratch starts with the outputs (allocated where not given)."""
    who = _QUANTIZE.name
    check.one_of(who, "granularity", granularity, GRANULARITIES)
    if isinstance(group, bool) or group != _GROUP:
        raise ValueError(f"{who}: group: expected {_GROUP} (the block-scaled GEMM's K block), got {group!r}")
    if power_of_two not in (False, True):
        raise TypeError(f"{who}: power_of_two: expected a bool, got {power_of_two!r}")
    if power_of_two and granularity not in ("group", "block"):
        raise ValueError(f"{who}: power_of_two: for granularity 'group' or 'block', got {granularity!r}")
    if dtype is None and out is not None:
        dtype = out.dtype
    fmt = "e4m3" if dtype is None else _FORMATS.get(str(dtype))
    if fmt is None:
        raise TypeError(f"{who}: dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    info = check.rows(who, "x", x)
    import torch

    dtype = torch.float8_e4m3fn if dtype is None else dtype
    if granularity == "group":
        return _group_plan(who, info, fmt, dtype, out, scales, power_of_two)
    if granularity == "block":
        return _block_plan(who, info, fmt, dtype, out, scales, power_of_two)
    rows, n = info.shape
    shape = {"token": (rows, 1), "channel": (1, rows), "tensor": ()}[granularity]
    _check_outputs(who, info, out, scales, (rows, n), dtype, shape)
    if rows == 0 or n == 0:
        return _empty(rows, n, dtype, shape)
    kernels = _kernels()
    cfg = kernels.quantize_row_config(n, info.dtype)
    launch = dict(grid=cfg.grid(rows), block=cfg.block, cluster=cfg.cluster_shape)
    kernel = kernels.quantize_rows_kernel
    allocate = _allocator(rows, n, dtype, lambda x: torch_new_empty(x, shape, torch.float32))
    if granularity != "tensor":
        spec = kernels.QuantizeSpec("row", fmt)

        def per_row(x, given_out, given_scales, out, scales):
            kernel(x, out.view(torch.uint8), scales.view(-1), scales, cfg, spec).launch(**launch)

        return ScratchPlan(allocate, per_row)
    amax_spec, cast_spec = kernels.QuantizeSpec("amax", fmt), kernels.QuantizeSpec("cast", fmt)

    def with_amax(x, out, scale):  # the outputs, and the amax zeroed for this call
        return (*allocate(x, out, scale), torch.zeros(1, dtype=torch.int32, device=x.device))

    def per_tensor(x, given_out, given_scale, out, scale, amax):
        kernel(x, out.view(torch.uint8), scale.view(1), amax, cfg, amax_spec).launch(**launch)
        kernel(x, out.view(torch.uint8), scale.view(1), amax, cfg, cast_spec).launch(**launch)

    return ScratchPlan(with_amax, per_tensor)


def _allocator(rows: int, n: int, dtype, allocate_scales: Callable) -> Callable:
    """A plan's scratch function: ``(out, scales)``, the (rows, N) fp8 output and the scales
    (``allocate_scales(x)``) where not given."""

    def allocate(x, out, scales):
        out = torch_new_empty(x, (rows, n), dtype) if out is None else out
        return out, allocate_scales(x) if scales is None else scales

    return allocate


def _empty(rows: int, n: int, dtype, shape: tuple, allocate_scales=None) -> ScratchPlan:
    """The plan of an input without elements: outputs allocated where not given, scales zeroed."""
    import torch

    allocate = _allocator(rows, n, dtype, allocate_scales or (lambda x: torch_new_empty(x, shape, torch.float32)))
    return ScratchPlan(allocate, lambda x, given_out, given_scales, out, scales: scales.zero_())


def _group_plan(who: str, info, fmt: str, dtype, out, scales, power_of_two: bool):
    """Per row and 128 columns: one launch of the group kernel (:mod:`.groups`), scales allocated M-major."""
    import torch

    rows, n = info.shape
    shape = (rows, -(-n // _GROUP))
    _check_outputs(who, info, out, None, (rows, n), dtype, shape)
    _check_group_scales(who, info, scales, shape)
    padded = -(-rows // 4) * 4  # 16-byte columns of the M-major buffer

    def m_major(x):
        return x.new_empty((shape[1], padded), dtype=torch.float32)[:, :rows].t()

    if rows == 0 or n == 0:
        return _empty(rows, n, dtype, shape, m_major)
    groups = _groups()
    cfg = groups.group_config(n, info.dtype, fmt, power_of_two)
    if rows * shape[1] + cfg.groups_per_cta >= 1 << 31:
        raise ValueError(f"{who}: x: expected fewer than 2^31 groups of 128 (the kernel counts them in 32 bits)")
    kernel, grid = groups.quantize_groups_kernel, cfg.grid(rows, n)

    def per_group(x, given_out, given_scales, out, scales):
        kernel(x, out.view(torch.uint8), scales, cfg).launch(grid=grid, block=cfg.block)

    return ScratchPlan(_allocator(rows, n, dtype, m_major), per_group)


def _check_group_scales(who: str, x, scales, shape: tuple) -> None:
    """Given group scales: float32 of ``shape`` (rows, groups) on x's device, M-major (unit stride on rows, the
    groups at least ``rows`` apart) or row-major (the other way round), apart from x."""
    if scales is None:
        return
    info = check.describe(who, "scales", scales)
    check.same_device(who, x, ("scales", info))
    rows, groups = shape
    got, strides = tuple(info.shape), tuple(info.strides)
    laid_out = False
    if got == shape:
        m_major = (rows == 1 or strides[0] == 1) and (groups == 1 or strides[1] >= rows)
        row_major = (groups == 1 or strides[1] == 1) and (rows == 1 or strides[0] >= groups)
        laid_out = m_major or row_major
    if not laid_out:
        raise ValueError(
            f"{who}: scales: expected a {shape} tensor, M-major (strides (1, >= {rows})) or row-major (strides"
            f" (>= {groups}, 1)), got shape {got} strides {strides}"
        )
    check.check_dtype(who, "scales", info.dtype, ("f32",))
    check.not_aliased(who, "scales", info, ("x", x))


def _block_plan(who: str, info, fmt: str, dtype, out, scales, power_of_two: bool):
    """Per 128 x 128 block: torch ops, once per weight (:func:`quantize_blocks`)."""
    rows, n = info.shape
    shape = (-(-rows // _GROUP), -(-n // _GROUP))
    _check_outputs(who, info, out, scales, (rows, n), dtype, shape)
    if rows == 0 or n == 0:
        return _empty(rows, n, dtype, shape)

    import torch

    def per_block(x, given_out, given_scales, out, scales):
        q, s = quantize_blocks(x, dtype, fmt, power_of_two)
        out.copy_(q)
        scales.copy_(s)

    return ScratchPlan(_allocator(rows, n, dtype, lambda x: torch_new_empty(x, shape, torch.float32)), per_block)


def quantize_blocks(w, dtype, fmt: str, power_of_two: bool = False):
    """``(w_fp8, scales)`` of ``w`` (N, K) per 128 x 128 block, by torch ops with the group kernel's arithmetic
    (:func:`flydsl.kernels.quantize.groups.group_scale`): zero padding to whole blocks (zeros leave an amax as it is),
    ``scale = amax * (1 / fp8_max)``, values times ``fp8_max / max(amax, TINY)`` (a true division: torch's
    ``scalar / tensor`` is a reciprocal times the scalar), or with ``power_of_two`` the scale rounded up to a power
    of two and values times its exact inverse; clamped to the finite range and cast (torch rounds to nearest even,
    as ``cvt.rn.satfinite``). ``w_fp8`` a view of the padded result."""
    import torch
    import torch.nn.functional as F

    fp8_max, tiny = _kernels().FP8_MAX[fmt], _kernels().TINY
    smallest = _groups().SMALLEST_NORMAL
    rows, n = w.shape
    blocks_r, blocks_c = -(-rows // _GROUP), -(-n // _GROUP)
    padded = F.pad(w.float(), (0, blocks_c * _GROUP - n, 0, blocks_r * _GROUP - rows))
    tiles = padded.view(blocks_r, _GROUP, blocks_c, _GROUP)  # (rb, 128, cb, 128)
    amax = tiles.abs().amax(dim=(1, 3))  # (rb, cb): NaN propagates
    scale = amax * (1.0 / fp8_max)
    if power_of_two:
        bits = (scale.view(torch.int32) + 0x7FFFFF) & -0x800000  # the exponent bumped where a mantissa bit is set
        scale = torch.where(scale.isnan(), scale, bits.view(torch.float32))
        inverse = scale.clamp(min=smallest).reciprocal()  # exact
    else:
        inverse = torch.full_like(amax, fp8_max) / amax.clamp(min=tiny)
    values = (tiles * inverse[:, None, :, None]).clamp(-fp8_max, fp8_max).to(dtype)
    return values.view(blocks_r * _GROUP, blocks_c * _GROUP)[:rows, :n], scale


def _check_outputs(who: str, x, out, scales, out_shape: tuple, dtype, scales_shape: tuple) -> None:
    """Given outputs: ``out`` a row-major fp8 (rows, N) tensor of ``dtype``, ``scales`` a contiguous float32 tensor
    of the granularity's shape, both on x's device and apart from x."""
    for name, t, shape in (("out", out, out_shape), ("scales", scales, scales_shape)):
        if t is None:
            continue
        info = check.describe(who, name, t)
        check.same_device(who, x, (name, info))
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{who}: {name}: expected a contiguous {shape} tensor, got shape {tuple(t.shape)}")
        wanted = dtype if name == "out" else "float32"
        wanted, got = str(wanted).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        if got != wanted:
            raise TypeError(f"{who}: {name}: expected dtype {wanted}, got {got}")
        check.not_aliased(who, name, info, ("x", x))

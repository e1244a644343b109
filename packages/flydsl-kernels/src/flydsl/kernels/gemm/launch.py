"""The GEMM entry points on torch tensors: check the arguments, find the call's plan (:mod:`~flydsl.kernels.gemm.plan`,
kept per call signature: :mod:`flydsl.kernels.plans`), prepare the operands it names, bind TMA descriptors and
scratch memory, launch.

    from flydsl.kernels.gemm import gemm
    c = gemm(a, b)                     # a (M, K), b (K, N): torch tensors on the GPU, bf16 or fp16
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.compiler as flyc
from flydsl.kernels import validation as check
from flydsl.kernels.device import sm_count
from flydsl.kernels.gemm.arguments import (
    check_arguments,
    check_blockscale_arguments,
    check_devices,
    check_fp8_arguments,
    check_skinny,
    zero_product,
)
from flydsl.kernels.gemm.config import GemmConfig
from flydsl.kernels.gemm.epilogue import Scale
from flydsl.kernels.gemm.operands import MatrixSpec, copy_for_tma, tma_tile
from flydsl.kernels.gemm.plan import GemmPlan, Scratch, Tensor, Tma, plan_blockscale, plan_gemm, plan_skinny
from flydsl.kernels.gemm.prepared import PreparedWeight, check_prepared
from flydsl.kernels.gemm.skinny import SkinnyConfig
from flydsl.kernels.gemm.tuning import tuned_plan
from flydsl.kernels.memory import held, torch_new_empty
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = ["blockscale_gemm", "fp8_gemm", "gemm", "launch_plan", "skinny_gemm"]


def gemm(a, b, out=None, config: GemmConfig | None = None, *, bias=None, activation: str | None = None, autotune=None):
    """``out = activation(a @ b + bias)`` for torch tensors on one GPU: a (M, K), b (K, N), bf16 or fp16 (both the
    same), each row- or column-major; ``bias`` (N,) contiguous, in a's dtype or float32; ``activation`` None,
    "relu", "gelu" (erf) or "silu", applied in float32 before the conversion to ``out``'s dtype; ``out`` (M, N)
    row-major bf16/fp16/fp32, allocated in a's dtype when not given. ``config``: the tile configuration (default:
    :func:`~flydsl.kernels.gemm.config.choose_config`; with none given, M <= 16 and nn.Linear weights ``w.t()``
    stream the weights through the skinny kernel). ``autotune``: time candidate configurations on the first call of
    a signature instead of taking the cost model's (:mod:`~flydsl.kernels.gemm.tuning`; None: as ``FLYDSL_AUTOTUNE``
    says, read when a signature is first planned; no effect with a ``config``)."""
    return _call(_GEMM, plan_gemm, check_arguments, a, b, out, config, bias, activation, autotune)


def skinny_gemm(
    a, b, out=None, config: SkinnyConfig | None = None, *, bias=None, activation: str | None = None, autotune=None
):
    """``out = activation(a @ b + bias)`` for M <= 16, as :func:`gemm`: a (M, K) and b (K, N) torch tensors on one
    GPU, bf16 or fp16 (both the same); ``b`` column-major (``w.t()`` of nn.Linear weights w (N, K)); ``a`` row- or
    column-major (the latter copied: M x K is small); ``bias`` (N,) contiguous, in a's dtype or float32;
    ``activation`` None, "relu", "gelu" (erf) or "silu", applied in float32; ``out`` (M, N) row-major
    bf16/fp16/fp32, allocated in a's dtype when not given. ``config``: default
    :func:`~flydsl.kernels.gemm.skinny.choose_skinny_config`; ``autotune`` as :func:`gemm`'s."""
    return _call(_SKINNY, plan_skinny, check_skinny, a, b, out, config, bias, activation, autotune)


def fp8_gemm(
    a,
    b,
    scale_a,
    scale_b,
    out=None,
    config: GemmConfig | None = None,
    *,
    bias=None,
    activation: str | None = None,
    out_dtype=None,
    autotune=None,
):
    """``out = activation((scale_a * a) @ (b * scale_b) + bias)`` for fp8 torch tensors on one GPU: a (M, K) and b
    (K, N) float8_e4m3fn or float8_e5m2 (each its own), K a multiple of 16, each row- or column-major (fp8 MMAs read
    K-major operands: a column-major a or a row-major b is first copied K-major; an ``nn.Linear`` weight w (N, K) is
    passed as ``w.t()`` and read in place); ``scale_a`` float32, one value (0-d or one element) or one per row of a
    ((M,) or (M, 1): per token); ``scale_b`` float32, one value or one per column of b ((N,) or (1, N): per output
    channel); both applied to the fp32 accumulators, then ``+ bias`` ((N,) bf16, fp16 or float32) and the activation
    (None, "relu", "gelu", "silu"). ``b`` may also be weights prepared once by
    :func:`~flydsl.kernels.gemm.prepared.prepare_weight` (a :class:`~flydsl.kernels.gemm.prepared.PreparedWeight`).
    ``out`` (M, N) row-major bf16/fp16/fp32, allocated in ``out_dtype`` (default bfloat16) when not given.
    ``config``: the tile configuration (default :func:`~flydsl.kernels.gemm.config.choose_fp8_config`; its ``tile_k``
    a multiple of 128); ``autotune`` as :func:`gemm`'s."""
    dtype_key = None if out_dtype is None else str(out_dtype)
    prepared = type(b) is PreparedWeight
    weights = b.data if prepared else b  # (a prepared weight's extents: in the key after the config)
    key = signature(a, weights, scale_a, scale_b, out, bias, activation, dtype_key)
    key = None if key is None else (key, config, b.shape if prepared else None, autotune)
    plan = _FP8.get(key)
    if plan is not None:
        result = _allocated(a, b, out, out_dtype)
        plan(a, weights, scale_a, scale_b, result, bias)
        return result
    who = _FP8.name
    check_devices(who, a, weights, out, bias, scale_a=scale_a, scale_b=scale_b)
    stand_in = _weights_stand_in(who, b, out) if prepared else b
    m, n, k, a_per, b_per = check_fp8_arguments(who, a, stand_in, scale_a, scale_b, out, bias, activation)
    out_dtype = _out_dtype(who, out, out_dtype)
    result = out if out is not None else torch_new_empty(a, (m, n), out_dtype)
    if m == 0 or n == 0 or k == 0:
        return zero_product(result, bias, activation)
    scales = (Scale(rows=1) if a_per == "row" else Scale(), Scale(columns=1) if b_per == "column" else Scale())
    planned = _FP8Planned(None, scale_a.dim() != 1, scale_b.dim() != 1)
    scale_tensors = planned.flat(scale_a, scale_b)
    specs = MatrixSpec.of(a, "a"), MatrixSpec.of(weights, "b"), MatrixSpec.of(result, "out")
    scale_specs = MatrixSpec.of(scale_tensors[0], "scale_a"), MatrixSpec.of(scale_tensors[1], "scale_b")
    bias_spec = None if bias is None else MatrixSpec.of(bias, "bias")
    scales = tuple(zip(scales, scale_specs, strict=True))
    options = dict(sms=sm_count(a.get_device()), bias=bias_spec, activation=activation, scales=scales)
    if config is None and flyc.autotune.enabled(autotune):
        run = lambda p: launch_plan(p, a, weights, result, bias, scale_tensors)  # noqa: E731
        gemm_plan = tuned_plan(*specs, run, device=a.get_device(), **options)
    else:
        gemm_plan = plan_gemm(*specs, config=config, **options)
    planned = planned._replace(plan=gemm_plan)
    _FP8.add(key, planned.kept())(a, weights, scale_a, scale_b, result, bias)
    return result


def blockscale_gemm(
    a,
    b,
    a_scales,
    b_scales,
    out=None,
    config: GemmConfig | None = None,
    *,
    bias=None,
    activation: str | None = None,
    out_dtype=None,
):
    """The block-scaled fp8 GEMM of DeepSeek-V3: ``out[m, n] = activation(sum over K blocks kb of (a[m, kb] . b[kb, n])
    * a_scales[m, kb] * b_scales[n // 128, kb] + bias[n])``, blocks of 128 along K (the last one partial where K is
    not a multiple of 128). ``a`` (M, K) and ``b`` (K, N) fp8 as :func:`fp8_gemm`'s (an ``nn.Linear`` weight w (N,
    K) passed as ``w.t()``, or weights prepared by :func:`~flydsl.kernels.gemm.prepared.prepare_weight`), K a
    multiple of 16; ``a_scales`` (M, ceil(K / 128)): one per token and 128 K, M-major (the transposed view of a
    (ceil(K / 128), M') buffer, M' a multiple of 4, as ``quantize_fp8(x, "group")`` writes it: read in place by TMA)
    or any other strides (copied so first, one more small kernel per call); ``b_scales`` (ceil(N / 128),
    ceil(K / 128)): one per 128 x 128 block of w. Scales float32 (powers of two, UE8M0, are float32 too; a
    ``torch.float8_e8m0fnu`` tensor is widened to float32 first). Each K block's MMAs are promoted into float32
    sums with their scales. ``out`` (M, N) row-major bf16/fp16/fp32, allocated in ``out_dtype`` (default bfloat16)
    when not given; ``config``: default :func:`~flydsl.kernels.gemm.config.choose_blockscale_config`."""
    dtype_key = None if out_dtype is None else str(out_dtype)
    prepared = type(b) is PreparedWeight
    weights = b.data if prepared else b
    key = signature(a, weights, a_scales, b_scales, out, bias, activation, dtype_key)
    key = None if key is None else (key, config, b.shape if prepared else None)
    plan = _BLOCKSCALE.get(key)
    if plan is not None:
        result = _allocated(a, b, out, out_dtype)
        plan(a, weights, a_scales, b_scales, result, bias)
        return result
    who = _BLOCKSCALE.name
    check_devices(who, a, weights, out, bias, a_scales=a_scales, b_scales=b_scales)
    stand_in = _weights_stand_in(who, b, out) if prepared else b
    m, n, k = check_blockscale_arguments(who, a, stand_in, a_scales, b_scales, out, bias, activation)
    out_dtype = _out_dtype(who, out, out_dtype)
    result = out if out is not None else torch_new_empty(a, (m, n), out_dtype)
    if m == 0 or n == 0 or k == 0:
        return zero_product(result, bias, activation)
    planned = _BlockscalePlanned(None)
    scale_tensors = planned.widened(a_scales, b_scales)
    specs = MatrixSpec.of(a, "a"), MatrixSpec.of(weights, "b"), MatrixSpec.of(result, "out")
    scale_specs = MatrixSpec.of(scale_tensors[0], "a_scales"), MatrixSpec.of(scale_tensors[1], "b_scales")
    bias_spec = None if bias is None else MatrixSpec.of(bias, "bias")
    sms = sm_count(a.get_device())
    gemm_plan = plan_blockscale(*specs, *scale_specs, sms=sms, bias=bias_spec, activation=activation, config=config)
    planned = planned._replace(plan=gemm_plan)
    _BLOCKSCALE.add(key, planned.kept(a_scales, b_scales))(a, weights, a_scales, b_scales, result, bias)
    return result


class _BlockscalePlanned(NamedTuple):
    """A kept block-scaled plan: the GEMM plan (called with the output allocated), as a ScratchPlan's two parts, or
    only the launch where the call needs no memory beyond its arguments."""

    plan: GemmPlan | None

    def kept(self, a_scales, b_scales):
        """The plan for calls of these scales' signature: its launches alone where the scales are read as they are
        (float32) and :func:`plan_memory` makes nothing (no Python between the key and the replay), else a
        ScratchPlan."""
        if a_scales.dtype.itemsize == 4 and b_scales.dtype.itemsize == 4:
            if not needs_memory(self.plan):
                return self.direct
            return ScratchPlan(self.memory, self.launch_read, made_memory(self.plan))
        return ScratchPlan(self.scratch, self.launch)

    def direct(self, a, b, a_scales, b_scales, out, bias) -> None:
        launch_with(self.plan, a, b, out, bias, (a_scales, b_scales), (), ())

    @staticmethod
    def widened(a_scales, b_scales) -> tuple:
        """The scales as the kernel reads them: float32 (UE8M0 ones widened, their layout kept)."""
        return tuple(s if s.dtype.itemsize == 4 else _widened(s) for s in (a_scales, b_scales))

    def scratch(self, a, b, a_scales, b_scales, out, bias) -> tuple:
        """The scales widened (or themselves), then :func:`plan_memory`'s."""
        widened = self.widened(a_scales, b_scales)
        return (*widened, *plan_memory(self.plan, a, b, out, bias, widened))

    def launch(self, a, b, a_scales, b_scales, out, bias, wide_a, wide_b, *memory) -> None:
        launch_with(self.plan, a, b, out, bias, (wide_a, wide_b), (), memory)

    def memory(self, a, b, a_scales, b_scales, out, bias) -> tuple:
        """Float32 scales, read as they are: only :func:`plan_memory`'s."""
        return plan_memory(self.plan, a, b, out, bias, (a_scales, b_scales))

    def launch_read(self, a, b, a_scales, b_scales, out, bias, *memory) -> None:
        launch_with(self.plan, a, b, out, bias, (a_scales, b_scales), (), memory)


def _widened(scales):
    """UE8M0 scales as float32 in the same layout (an M-major view stays M-major)."""
    import torch

    if scales.stride(0) == 1 and scales.dim() == 2 and scales.shape[1] > 1:
        return scales.t().to(torch.float32).t()
    return scales.to(torch.float32)


def _weights_stand_in(who: str, b: PreparedWeight, out):
    """Prepared weights checked (their panels' shape and a 16-byte aligned address) and the meta stand-in of the
    (K, N) matrix they hold, for the shape checks."""
    if b.data.data_ptr() % 16:
        raise ValueError(f"{who}: b: expected prepared panels at a 16-byte aligned address (as prepare_weight's)")
    return check_prepared(who, b, out)


def _allocated(a, b, out, out_dtype):
    """A kept fp8 plan's output: ``out``, else (M, N) row-major in ``out_dtype`` (default bfloat16) as the first
    call's (``b``: the (K, N) matrix or prepared weights of that shape)."""
    if out is not None:
        return out
    if out_dtype is None:
        import torch

        out_dtype = torch.bfloat16
    return torch_new_empty(a, (a.shape[0], b.shape[1]), out_dtype)


def _out_dtype(who: str, out, out_dtype):
    """The dtype of an fp8 GEMM's output: ``out``'s, or ``out_dtype`` (default bfloat16) when it is allocated."""
    if out is None:
        import torch

        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        check.check_dtype(who, "out_dtype", check.torch_dtype(out_dtype), check.GEMM_OUT_DTYPES)
    elif out_dtype is not None and out.dtype != out_dtype:
        raise ValueError(f"{who}: out_dtype: {out_dtype} differs from out's dtype {out.dtype}; give one of them")
    return out_dtype


class _FP8Planned(NamedTuple):
    """A kept fp8 plan: the GEMM plan (called with the output allocated) and whether each scale is flattened to the
    (1,), (M,) or (N,) vector the epilogue indexes; a ScratchPlan's two parts."""

    plan: GemmPlan | None
    flat_a: bool
    flat_b: bool

    def flat(self, scale_a, scale_b) -> tuple:
        return (scale_a.reshape(-1) if self.flat_a else scale_a, scale_b.reshape(-1) if self.flat_b else scale_b)

    def kept(self):
        """The plan for calls of this signature: its launches alone where :func:`plan_memory` makes nothing (no
        Python between the key and the replay), else a ScratchPlan."""
        if not needs_memory(self.plan):
            return self.direct
        return ScratchPlan(self.scratch, self.launch, made_memory(self.plan))

    def direct(self, a, b, scale_a, scale_b, out, bias) -> None:
        launch_with(self.plan, a, b, out, bias, self.flat(scale_a, scale_b), (), ())

    def scratch(self, a, b, scale_a, scale_b, out, bias) -> tuple:
        return plan_memory(self.plan, a, b, out, bias, self.flat(scale_a, scale_b))

    def launch(self, a, b, scale_a, scale_b, out, bias, *memory) -> None:
        launch_with(self.plan, a, b, out, bias, self.flat(scale_a, scale_b), (), memory)


_GEMM = Plans("flydsl.kernels.gemm", replay=True)
_SKINNY = Plans("flydsl.kernels.skinny_gemm", replay=True)
_FP8 = Plans("flydsl.kernels.fp8_gemm", replay=True)
_BLOCKSCALE = Plans("flydsl.kernels.blockscale_gemm", replay=True)


def _call(plans: Plans, planner, check, a, b, out, config, bias, activation, autotune):
    """One GEMM entry point's call: the plan of its signature (the tensors' shapes, strides, dtypes, alignment and
    devices, the epilogue, the configuration and ``autotune``: :mod:`flydsl.kernels.plans`), else the arguments
    checked and ``planner``'s plan (:func:`~flydsl.kernels.gemm.plan.plan_gemm` or ``plan_skinny``; tuned where
    autotuning is on and no configuration is given) made and kept."""
    key = signature(a, b, out, bias, activation)
    key = None if key is None else (key, config, autotune)
    plan = plans.get(key)
    if plan is not None:
        result = torch_new_empty(a, (a.shape[0], b.shape[1])) if out is None else out
        plan(a, b, result, bias)
        return result
    who = plans.name
    check_devices(who, a, b, out, bias)
    m, n, k = check(who, a, b, out, bias, activation)
    given = out
    out = torch_new_empty(a, (m, n)) if out is None else out
    if m == 0 or n == 0 or k == 0:
        return zero_product(out, bias, activation)
    bias_spec = None if bias is None else MatrixSpec.of(bias, "bias")
    specs = MatrixSpec.of(a, "a"), MatrixSpec.of(b, "b"), MatrixSpec.of(out, "out")
    options = dict(sms=sm_count(a.get_device()), bias=bias_spec, activation=activation)
    if config is None and flyc.autotune.enabled(autotune):
        run = lambda p: launch_plan(p, a, b, out, bias)  # noqa: E731
        gemm_plan = tuned_plan(*specs, run, planner=planner, device=a.get_device(), **options)
    else:
        gemm_plan = planner(*specs, config=config, **options)
    plans.add(key, _kept(gemm_plan))(a, b, out, bias)
    return given if given is not None else out


def _kept(gemm_plan: GemmPlan):
    """A kept plan as a function of ``(a, b, out, bias)``, the output allocated by the entry point where not given
    (row-major, as the first call's): its launches alone where :func:`plan_memory` makes nothing, else a ScratchPlan
    (its memory made natively by the replay where :func:`made_memory` says how); the launches replayed natively where
    they can be (:mod:`flydsl.kernels.plans`)."""
    if not needs_memory(gemm_plan):
        return lambda a, b, out, bias: launch_with(gemm_plan, a, b, out, bias, (), (), ())
    return ScratchPlan(
        lambda a, b, out, bias: plan_memory(gemm_plan, a, b, out, bias),
        lambda a, b, out, bias, *memory: launch_with(gemm_plan, a, b, out, bias, (), (), memory),
        made_memory(gemm_plan),
    )


_PLAN_TILES_LIMIT = 64  # TMA tiles a plan keeps, by address

_STEPS = {
    "transpose": lambda t: t.t(),
    "contiguous": lambda t: t.contiguous(),
    "pad_rows": lambda t: copy_for_tma(t, "rows"),
    "pad_columns": lambda t: copy_for_tma(t, "columns"),
}


_COPIES = {"contiguous", "pad_rows", "pad_columns"}  # the preparation steps that make new memory (the others view)


def launch_plan(plan: GemmPlan, a, b, out, bias=None, scales=(), groups=()):
    """Runs ``plan`` (from :func:`~flydsl.kernels.gemm.plan.plan_gemm` for tensors of this geometry) on torch tensors:
    the preparations, then each launch with its tensors, TMA descriptors (cached per address) and scratch memory
    bound. ``scales``: the epilogue's scale tensors, in the plan's order; ``groups``: a grouped GEMM's
    (``expert_of_block``, ``padded_count``). Returns ``out``."""
    launch_with(plan, a, b, out, bias, scales, groups, plan_memory(plan, a, b, out, bias, scales, groups))
    return out


def needs_memory(plan: GemmPlan) -> bool:
    """Whether :func:`plan_memory` makes anything for ``plan``'s calls (a copying preparation, a scratch buffer); a
    plan that needs none is kept as its launches alone (docs/tuning/host.md#scratch)."""
    return any(_COPIES.intersection(p.steps) for p in plan.preparations) or bool(_scratch_arguments(plan))


def plan_memory(plan: GemmPlan, a, b, out, bias=None, scales=(), groups=()) -> tuple:
    """What :func:`launch_plan`'s launches use beyond the call's tensors, made for one call: each copying
    preparation's result (in the plan's order), then each scratch buffer (in the order of first use: fresh partials,
    the stream's workspace and flags)."""
    tensors = _tensors(a, b, out, bias, scales, groups)
    made = [_prepare(tensors, p) for p in plan.preparations]
    made = [t for t, p in zip(made, plan.preparations, strict=True) if _COPIES.intersection(p.steps)]
    return (*made, *(_scratch(tensors, scratch, a) for scratch in _scratch_arguments(plan)))


def made_memory(plan: GemmPlan) -> tuple | None:
    """How a replay makes :func:`plan_memory`'s values itself (a ``ScratchPlan``'s ``made``, so that its plan has
    no Python per call and can be kept on disk): split K's partials fresh per call, its workspace and flags held per
    stream under their names (one buffer per name for every plan, zero when made); None where a preparation copies
    an operand (made in Python)."""
    import torch

    if any(_COPIES.intersection(p.steps) for p in plan.preparations):
        return None
    dtypes = {"f32": torch.float32, "i32": torch.int32}
    return tuple(
        (0, (s.shape[0],), dtypes[s.dtype], f"gemm.{s.name}") if s.per_stream else (0, tuple(s.shape), dtypes[s.dtype])
        for s in _scratch_arguments(plan)
    )


def launch_with(plan: GemmPlan, a, b, out, bias, scales, groups, memory: tuple) -> None:
    """:func:`launch_plan`'s launches with ``memory`` (:func:`plan_memory`'s) bound: the views prepared again, no
    memory made."""
    tensors = _tensors(a, b, out, bias, scales, groups)
    made = iter(memory)
    for preparation in plan.preparations:
        if _COPIES.intersection(preparation.steps):
            tensors[preparation.role] = next(made)
        else:
            _prepare(tensors, preparation)
    scratch = {argument.name: next(made) for argument in _scratch_arguments(plan)}
    tiles = plan.tiles
    for index, launch in enumerate(plan.launches):
        arguments = []
        for position, argument in enumerate(launch.arguments):
            kind = type(argument)
            if kind is Tensor:
                arguments.append(tensors[argument.role])
            elif kind is Tma:  # the plan's own cache of tiles by address: small keys, no view hashed
                t = tensors[argument.role]
                key = (index, position, t.data_ptr())
                tile = tiles.get(key)
                if tile is None:
                    if len(tiles) >= _PLAN_TILES_LIMIT:
                        tiles.clear()
                    tile = tiles[key] = tma_tile(t, argument.view)
                arguments.append(tile)
            elif kind is Scratch:
                arguments.append(scratch[argument.name])
            else:
                arguments.append(argument)
        launch.kernel(*arguments).launch(grid=launch.grid, block=launch.block)


def _tensors(a, b, out, bias, scales, groups) -> dict:
    """The call's tensors by role."""
    tensors = {"a": a, "b": b, "out": out, "bias": bias}
    if groups:
        tensors["expert_of_block"], tensors["padded_count"] = groups
    for i, scale in enumerate(scales):
        tensors[f"scale_{i}"] = scale
    return tensors


def _prepare(tensors: dict, preparation):
    """``preparation``'s tensor, made from its source and kept under its role."""
    prepared = tensors[preparation.source]
    for step in preparation.steps:
        prepared = _STEPS[step](prepared)
    tensors[preparation.role] = prepared
    return prepared


def _scratch_arguments(plan: GemmPlan) -> list:
    """The plan's scratch arguments, one per name, in the order of first use."""
    seen = {}
    for launch in plan.launches:
        for argument in launch.arguments:
            if type(argument) is Scratch and argument.name not in seen:
                seen[argument.name] = argument
    return list(seen.values())


def _scratch(tensors: dict, scratch: Scratch, like):
    """The memory of ``scratch`` on ``like``'s device: "partials" fresh for this call (kept in ``tensors`` for the
    launches after), "workspace" and "flags" (zeros: every launch leaves them zero, each reset by its reader) shared
    by the kernels of ``like``'s current stream and by the replays that name them (:func:`made_memory`,
    :func:`~flydsl.kernels.memory.held`)."""
    import torch

    dtype = torch.float32 if scratch.dtype == "f32" else torch.int32
    if not scratch.per_stream:
        made = tensors.get(scratch.name)
        if made is None:
            made = tensors[scratch.name] = torch.empty(scratch.shape, dtype=dtype, device=like.device)
        return made
    return held(like, f"gemm.{scratch.name}", scratch.shape[0], dtype)

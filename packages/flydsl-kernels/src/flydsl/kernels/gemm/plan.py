"""What a GEMM call launches, computed from its tensors' geometry and the SM count alone (no GPU, no memory):
:func:`plan_gemm` routes a call and returns a :class:`GemmPlan` (the kernel and configuration, how operands are
prepared, TMA views, epilogue, grids, scratch memory); :mod:`~flydsl.kernels.gemm.launch` runs plans on torch
tensors, and the same plan compiles without a GPU (:meth:`GemmPlan.lower`).

Routes: M <= 16 with a K-major ``b`` (an ``nn.Linear`` weight's ``W.t()``) and no configuration given streams the
weights (:func:`plan_skinny`: the skinny kernel, and ``split_k_reduce`` after it where K is split over CTAs); every
other call takes the warp-specialized kernel (:func:`plan_dense`: ``gemm_ws``, or ``gemm_ws_scaled`` with epilogue
scales).

    python -m flydsl.kernels.gemm.plan 2048 4096 4096            # the route, config and launches of one shape
    python -m flydsl.kernels.gemm.plan 16 14336 4096 --b-major K --bias f32 --activation silu
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import NamedTuple

from flydsl.kernels.gemm.block_scales import BLOCK, slot_bytes
from flydsl.kernels.gemm.block_scales_plan import check_block_scales
from flydsl.kernels.gemm.config import (
    STAGING_BOX,
    GemmConfig,
    choose_blockscale_config,
    choose_config,
    choose_fp8_config,
    staging_fits,
)
from flydsl.kernels.gemm.epilogue import Epilogue, Scale
from flydsl.kernels.gemm.operands import (
    OPERAND_BYTES,
    SWIZZLE_BYTES,
    MatrixSpec,
    TmaView,
    operand_view,
    prepared_view,
    tma_copied,
    tma_copy_kind,
)
from flydsl.kernels.gemm.partials import split_k_reduce
from flydsl.kernels.gemm.schedulers import cluster_tiles, split_plan
from flydsl.kernels.gemm.skinny import (
    MAX_M,
    SkinnyConfig,
    SkinnyVariant,
    choose_skinny_config,
    skinny_gemm_kernel,
    skinny_gemm_scaled_kernel,
)
from flydsl.kernels.gemm.warp_specialized import (
    gemm_ws,
    gemm_ws_blockscaled,
    gemm_ws_grouped,
    gemm_ws_grouped_blockscaled,
    gemm_ws_scaled,
)

__all__ = [
    "GemmPlan",
    "Launch",
    "Preparation",
    "Scratch",
    "Tensor",
    "Tma",
    "plan_blockscale",
    "plan_dense",
    "plan_gemm",
    "plan_grouped",
    "plan_skinny",
]


class Tensor(NamedTuple):
    """A kernel argument that is one of the call's tensors, by role: "a", "b", "out", "bias", "scale_0", ... or a
    prepared one ("w": the skinny kernel's (N, K) weights, b transposed); ``unread``: it only fills a parameter the
    kernel does not read for this call (a bias, scratch or scale it does not have)."""

    role: str
    unread: bool = False


class Tma(NamedTuple):
    """A kernel argument that is a TMA descriptor of the tensor ``role`` seen as ``view`` (``unread``: as
    :class:`Tensor`'s)."""

    role: str
    view: TmaView
    unread: bool = False


class Scratch(NamedTuple):
    """A kernel argument that is memory the launcher provides: ``name`` "workspace" (fp32 partial tiles), "flags"
    (int32, zero: every launch leaves them zero) or "partials" (the skinny kernel's split K, fresh per call), of at
    least ``shape``; the first two are kept per device and stream (kernels of a stream run one after another)."""

    name: str
    shape: tuple
    dtype: str

    @property
    def per_stream(self) -> bool:
        return self.name in ("workspace", "flags")


class Launch(NamedTuple):
    """One kernel launch: ``arguments`` in the kernel's order (:class:`Tensor`, :class:`Tma`, :class:`Scratch`, or
    the constexpr values themselves), ``grid`` and ``block``."""

    kernel: object
    arguments: tuple
    grid: object
    block: int


class Preparation(NamedTuple):
    """The tensor ``role`` is made from the call's ``source`` by ``steps`` ("transpose": ``t.t()``; "contiguous":
    ``t.contiguous()``; "pad_rows" / "pad_columns": a copy with rows / columns padded to 16 bytes for TMA)."""

    role: str
    source: str
    steps: tuple


@dataclass(frozen=True, eq=False)
class GemmPlan:
    """A routed GEMM call: ``route`` ("gemm_ws", "gemm_ws_scaled" or "skinny"), its configuration, the epilogue,
    the tensors' geometry as the kernels see them (``specs``, by role, after ``preparations``) and the launches, in
    order."""

    route: str
    config: GemmConfig | SkinnyConfig
    epilogue: Epilogue
    specs: dict = field(repr=False)
    preparations: tuple
    launches: tuple
    tiles: dict = field(default_factory=dict, repr=False)  # the launcher's TMA tiles of this plan, by address

    def argument_specs(self, launch: Launch) -> list:
        """``launch``'s arguments over ``flyc.TensorSpec``s of the planned geometry (for ``kernel.lower``)."""
        bound = []
        for argument in launch.arguments:
            if type(argument) is Tensor:
                bound.append(self.specs[argument.role].tensor_spec())
            elif type(argument) is Tma:
                bound.append(argument.view.spec_tile())
            elif type(argument) is Scratch:
                bound.append(MatrixSpec.dense(argument.shape, argument.dtype).tensor_spec())
            else:
                bound.append(argument)
        return bound

    def lower(self) -> list:
        """Every launch's compiled module (PTX, cubin where ptxas is found), compiled without a GPU."""
        return [launch.kernel.lower(*self.argument_specs(launch)) for launch in self.launches]

    def describe(self) -> str:
        """The route, configuration, operand views and launches, one item a line."""
        lines = [f"route: {self.route}", f"config: {self.config}", f"epilogue: {self.epilogue}"]
        lines += [
            f"prepare {p.role} = {p.source}" + "".join(f".{step}()" for step in p.steps) for p in self.preparations
        ]
        for launch in self.launches:
            lines.append(f"launch {launch.kernel.name} grid={launch.grid} block={launch.block}")
            names = [p.name for p in launch.kernel.params]
            for name, argument in zip(names, launch.arguments, strict=True):
                lines.append(f"  {name}: {_argument_text(self, argument)}")
        return "\n".join(lines)


def _argument_text(plan: GemmPlan, argument) -> str:
    if type(argument) is Tensor:
        spec = plan.specs[argument.role]
        text = f"{argument.role} {spec.dtype}{list(spec.shape)} strides {spec.strides}"
        return text + (" (unread)" if argument.unread else "")
    if type(argument) is Tma:
        view = argument.view
        text = f"TMA of {argument.role}: {view.major}-major {view.dtype}{list(view.matrix)} boxes {view.box}"
        return text + (" (unused)" if argument.unread else "")
    if type(argument) is Scratch:
        return f"scratch {argument.name} {argument.dtype}{list(argument.shape)}"
    return repr(argument)


def plan_gemm(
    a: MatrixSpec,
    b: MatrixSpec,
    out: MatrixSpec,
    *,
    sms: int,
    bias: MatrixSpec | None = None,
    activation: str | None = None,
    scales: tuple = (),
    config: GemmConfig | None = None,
) -> GemmPlan:
    """The plan of ``gemm(a, b, out, config, bias=bias, activation=activation)`` for arguments of this geometry
    (checked already: ``check_arguments``) on a GPU of ``sms`` SMs: decode-sized M with K-major weights streams them,
    every other call takes the warp-specialized kernel. ``scales``: up to two (Scale, MatrixSpec) pairs, the
    epilogue's float32 scales and their tensors' geometry (checked here). ``b`` may be the 3-D geometry of prepared
    fp8 weights (:func:`~flydsl.kernels.gemm.prepared.prepare_weight`; N is then ``out``'s)."""
    m = a.shape[0]
    weights_k_major = _prepared(b) or b.strides[0] == 1
    if config is None and m <= MAX_M and weights_k_major and _skinny_takes(a, b, scales):  # decode-sized M
        skinny = plan_skinny(a, b, out, sms=sms, bias=bias, activation=activation, scales=scales)
        if skinny is not None:
            return skinny
    return plan_dense(a, b, out, sms=sms, bias=bias, activation=activation, scales=scales, config=config)


def _skinny_takes(a: MatrixSpec, b: MatrixSpec, scales: tuple) -> bool:
    """The skinny kernels stream these operands: 16-bit ones without scales, or fp8 ones of one dtype whose rows take
    16-byte loads (memory holds no fp8 scalars to fall back on), with their scales."""
    if OPERAND_BYTES[a.dtype] == 2:
        return not scales
    k = a.shape[1]
    weights_ready = _prepared(b) or _vector_ready(b.transposed(), k, 16)
    return a.dtype == b.dtype and _vector_ready(a, k, 16) and weights_ready


def _prepared(b: MatrixSpec) -> bool:
    """``b`` is the geometry of prepared weights (their (K / 128, N, 128) panels)."""
    return len(b.shape) == 3


def plan_dense(
    a: MatrixSpec,
    b: MatrixSpec,
    out: MatrixSpec,
    *,
    sms: int,
    bias: MatrixSpec | None = None,
    activation: str | None = None,
    scales: tuple = (),
    config: GemmConfig | None = None,
    block_scales: tuple = (),
) -> GemmPlan:
    """The warp-specialized kernel's plan: the configuration (default :func:`choose_config`), operands copied into
    16-byte aligned rows where TMA cannot read them as they are, each CTA of a cluster loading its part of the
    shared tile (B's along M, A's along N), C through the TMA store where it applies, at most one CTA per SM (all of
    them with stream-K), and the partial tiles' scratch for split K and stream-K. Prepared weights are read as they
    are (a 3-D TMA view of their panels). ``block_scales``: the geometry of a block-scaled fp8 GEMM's (A scales,
    B scales) (:func:`plan_blockscale`), which the mainloop applies instead of epilogue ``scales``."""
    (m, k), n = a.shape, out.shape[1]
    operand_bytes = OPERAND_BYTES[a.dtype]
    if block_scales:
        chooser = choose_blockscale_config
    else:
        chooser = choose_config if operand_bytes == 2 else choose_fp8_config
    cfg = config or chooser(m, n, k, sms)
    if cfg.tile_k * operand_bytes % SWIZZLE_BYTES:
        raise ValueError(
            f"gemm config: {cfg} takes K steps of {cfg.tile_k} {a.dtype} elements; expected a multiple of"
            f" {SWIZZLE_BYTES // operand_bytes} (128-byte swizzled rows)"
        )
    specs = {"out": out}
    preparations = []
    views = []
    for role, matrix, mn_dim, rows in (
        ("a", a, 0, cfg.tile_m // cfg.cluster_n),
        ("b", b, 1, cfg.tile_n // cfg.cluster_m),
    ):
        if _prepared(matrix):
            specs[role] = matrix
            views.append(prepared_view(matrix, rows, role))
            continue
        if operand_bytes == 1 and matrix.strides[1 - mn_dim] != 1:  # fp8 wgmma reads K-major operands only
            steps = ("contiguous",) if mn_dim == 0 else ("transpose", "contiguous", "transpose")
            preparations.append(Preparation(role, role, steps))
            matrix = _contiguous(matrix) if mn_dim == 0 else _contiguous(matrix.transposed()).transposed()
        copy = tma_copy_kind(matrix)
        if copy is not None:
            preparations.append(Preparation(role, role, (f"pad_{copy}",)))  # (after a K-major copy: never needed)
        specs[role] = tma_copied(matrix, copy)
        views.append(operand_view(specs[role], mn_dim, rows, cfg.tile_k, role))
    a_view, b_view = views
    if b_view.major == "MN" and (cfg.tile_n // cfg.cluster_m) % 64:
        raise ValueError(
            f"gemm config: {cfg} has each CTA load {cfg.tile_n // cfg.cluster_m} columns of each B tile, but b is"
            " MN-major (row-major (K, N)), read in boxes of 64 columns: use a tile_n (divided by cluster_m) that is a"
            " multiple of 64, or b K-major (e.g. an nn.Linear weight w as w.t())"
        )
    workers = sms // cfg.cluster  # CTAs, or clusters; stream-K gives every one of them work
    split_from, units = split_plan(cluster_tiles(m, n, cfg), workers, cfg)
    grid = (workers if cfg.stream_k else min(units, workers)) * cfg.cluster
    store_view = _store_view(out, cfg, operand_bytes, slot_bytes(cfg.tile_m) if block_scales else 0)
    epilogue = Epilogue(
        bias=bias is not None,
        activation=activation,
        scales=tuple(scale for scale, _ in scales),
        store="tma" if store_view is not None else "registers",
    )
    if bias is not None:
        specs["bias"] = bias
    _check_scales(scales, m, n, specs)
    # Partial tiles (stream-K: one slot per CTA; split K: one per K part of each CTA of a cluster).
    if cfg.stream_k or cfg.split_k > 1:
        slots = grid if cfg.stream_k else (units - split_from) * cfg.cluster
        workspace = Scratch("workspace", (slots * cfg.consumers * cfg.consumer_rows * cfg.tile_n,), "f32")
        flags = Scratch("flags", (slots * cfg.consumers,), "i32")
    else:
        workspace = flags = Tensor("out", unread=True)
    c_store = Tma("out", store_view) if store_view is not None else Tma("a", a_view, unread=True)
    bias_argument = Tensor("bias") if bias is not None else Tensor("out", unread=True)
    arguments = (Tma("a", a_view), Tma("b", b_view), Tensor("out"), c_store, bias_argument)
    if block_scales:
        scales = check_block_scales(block_scales, m, n, k, cfg)
        specs["scale_0"], specs["scale_1"] = scales.a, scales.b
        preparations += [Preparation("scale_0", "scale_0", scales.a_steps)] if scales.a_steps else []
        arguments += (Tma("scale_0", scales.a_view), Tensor("scale_1"), workspace, flags, cfg)
        arguments += ((a_view.major, b_view.major),)
        launch = Launch(gemm_ws_blockscaled, arguments + (epilogue,), grid, cfg.threads)
        return GemmPlan(gemm_ws_blockscaled.name, cfg, epilogue, specs, tuple(preparations), (launch,))
    if len(scales) > 2:
        raise ValueError(f"gemm scales: the warp-specialized kernel takes at most two, got {len(scales)}")
    if scales:
        arguments += (Tensor("scale_0"), Tensor("scale_1") if len(scales) > 1 else Tensor("scale_0", unread=True))
    arguments += (workspace, flags, cfg, (a_view.major, b_view.major), epilogue)
    kernel = gemm_ws_scaled if scales else gemm_ws
    launch = Launch(kernel, arguments, grid, cfg.threads)
    return GemmPlan(kernel.name, cfg, epilogue, specs, tuple(preparations), (launch,))


def plan_grouped(
    a: MatrixSpec,
    weights: MatrixSpec,
    out: MatrixSpec,
    *,
    sms: int,
    gate: str | None = None,
    config: GemmConfig,
    scales: tuple = (),
    block_scales: tuple = (),
) -> GemmPlan:
    """The plan of a mixture of experts' grouped GEMM (``gemm_ws_grouped``): ``a`` (capacity, K) K-major rows in the
    aligned order of ``flydsl.kernels.moe.align_tokens`` (blocks of ``config.tile_m``), ``weights`` the experts'
    (E, N, K) stack (each an ``nn.Linear`` weight, K contiguous), ``out`` (capacity, N), or (capacity, N / 2) with a
    ``gate`` (N = 2I: gate rows then up rows; C = gate(x @ gate.T) * (x @ up.T)). The launch also takes the
    routing's "expert_of_block" and "padded_count" tensors: as many tiles run as they say, on at most ``sms`` CTAs.
    With ``config.cluster_m`` 2, the routing's blocks are ``2 * tile_m`` rows (one expert per cluster tile). fp8
    operands take ``scales``: up to two (Scale, MatrixSpec) pairs, ``Scale(rows=1)`` (capacity,) per row of A and
    ``Scale(columns=1, experts=True)`` (E * N,) per row of the weights; or ``block_scales``: the geometry of (A's
    (capacity, ceil(K / 128)) scales, the weights' (E * N / 128, ceil(K / 128))) of a block-scaled fp8 GEMM
    (``gemm_ws_grouped_blockscaled``: promoted per K block in the mainloop; N a multiple of 128)."""
    (capacity, k), (experts, rows, _) = a.shape, weights.shape
    operand_bytes = OPERAND_BYTES[a.dtype]
    if config.tile_k * operand_bytes % SWIZZLE_BYTES:
        raise ValueError(f"gemm_ws_grouped: {config}: K steps of {config.tile_k} {a.dtype}; expected 128-byte rows")
    if block_scales and scales:
        raise ValueError("gemm_ws_grouped: block scales replace the epilogue's scales; got both")
    store_view = _store_view(out, config, operand_bytes, slot_bytes(config.tile_m) if block_scales else 0)
    if Epilogue(gate=gate).width(config.tile_n) % STAGING_BOX[1]:
        store_view = None  # (a gated tile's half is not whole 64-column parts)
    scale_kinds = tuple(scale for scale, _ in scales)
    epilogue = Epilogue(gate=gate, scales=scale_kinds, store="tma" if store_view is not None else "registers")
    if epilogue.width(rows) != out.shape[1] or out.shape[0] != capacity or weights.shape[2] != k:
        raise ValueError(
            f"gemm_ws_grouped: a {a.shape}, weights {weights.shape} and out {out.shape} do not match (gate: {gate})"
        )
    if weights.strides != MatrixSpec.dense(weights.shape, weights.dtype).strides:
        raise ValueError(f"gemm_ws_grouped: expected contiguous (E, N, K) weights, got strides {weights.strides}")
    stacked = MatrixSpec((k, experts * rows), (1, k), weights.dtype, weights.aligned)  # (K, E * N): w.t() stacked
    sources = 2 if gate is not None else 1
    a_view = operand_view(a, 0, config.tile_m, config.tile_k, "a")
    b_view = operand_view(stacked, 1, config.tile_n // max(sources, config.cluster_m), config.tile_k, "weights")
    if a_view.major != "K" or b_view.major != "K":
        raise ValueError("gemm_ws_grouped: expected K-major a and weights")
    # Cluster tiles at most (the routing decides on the GPU), on whole clusters.
    units = capacity // (config.tile_m * config.cluster_m) * -(-rows // config.tile_n)
    c_store = Tma("out", store_view) if store_view is not None else Tma("a", a_view, unread=True)
    arguments = (Tma("a", a_view), Tma("b", b_view), Tensor("out"), c_store)
    arguments += (Tensor("expert_of_block"), Tensor("padded_count"))
    specs = {"a": a, "b": stacked, "out": out, "padded_count": MatrixSpec.dense((1,), "i32")}
    specs["expert_of_block"] = MatrixSpec.dense((capacity // (config.tile_m * config.cluster_m),), "i32")
    if block_scales:
        if rows % BLOCK:
            raise ValueError(f"gemm_ws_grouped: block scales need each expert's {rows} weight rows in whole {BLOCK}s")
        block = check_block_scales(block_scales, capacity, experts * rows, k, config, sources, grouped=True)
        specs["scale_0"], specs["scale_1"] = block.a, block.b
        arguments += (Tma("scale_0", block.a_view), Tensor("scale_1"))
    else:
        arguments += tuple(
            Tensor(f"scale_{i}") if i < len(scales) else Tensor("padded_count", unread=True) for i in range(2)
        )
    arguments += (config, epilogue)
    grid = max(1, min(units, sms // config.cluster)) * config.cluster
    kernel = gemm_ws_grouped_blockscaled if block_scales else gemm_ws_grouped
    launch = Launch(kernel, arguments, grid, config.threads)
    if block_scales:
        return GemmPlan(kernel.name, config, epilogue, specs, (), (launch,))
    for i, (scale, matrix) in enumerate(scales):
        length = experts * rows if scale.experts else capacity
        if (
            scale not in (Scale(rows=1), Scale(columns=1, experts=True))
            or matrix.shape != (length,)
            or matrix.dtype != "f32"
        ):
            raise ValueError(
                f"gemm_ws_grouped scale_{i}: expected a float32 ({length},) tensor for {scale} (per row of A, or"
                f" per row of the stacked weights), got {matrix.dtype} {matrix.shape}"
            )
        specs[f"scale_{i}"] = matrix
    return GemmPlan(kernel.name, config, epilogue, specs, (), (launch,))


def _store_view(out: MatrixSpec, cfg: GemmConfig, operand_bytes: int, slot_extra: int = 0) -> TmaView | None:
    """C's view in boxes of (64, 64) for the TMA-store epilogue, or None where it does not apply: C not 16-bit, its
    rows not 16-byte aligned or overlapping (a row stride under N, even in a one-row view: TMA's descriptor would
    refuse it), or no shared memory left beside the pipeline (``slot_extra`` more bytes per slot) for the staging
    boxes."""
    if out.dtype not in ("bf16", "f16") or not staging_fits(cfg, operand_bytes, slot_extra):
        return None
    row_stride = out.strides[0]
    if not out.aligned or row_stride % 8 or row_stride < out.shape[1]:  # 8 16-bit elements: 16 bytes
        return None
    return operand_view(out, 0, STAGING_BOX[0], STAGING_BOX[1], "out")


def plan_skinny(
    a: MatrixSpec,
    b: MatrixSpec,
    out: MatrixSpec,
    *,
    sms: int,
    bias: MatrixSpec | None = None,
    activation: str | None = None,
    config: SkinnyConfig | None = None,
    scales: tuple = (),
) -> GemmPlan | None:
    """The weight-streaming kernel's plan for M <= 16: ``a`` made K-contiguous (copied: M x K is small), the weights
    as the (N, K) ``w = b.t()`` (copied where K is not contiguous: n == 1 or k == 1 with odd strides), the
    configuration (default :func:`choose_skinny_config`), 16-byte loads where rows allow them, and with K split over
    CTAs the fp32 partials summed by ``split_k_reduce`` through the epilogue. With ``scales`` (fp8 operands: up to
    two ``(Scale, MatrixSpec)`` pairs) the scaled kernel, which does not split K: None where the configuration would
    (too few weight rows to fill the GPU: the warp-specialized kernel's split K serves them). Prepared weights are
    the kernel's ``w`` as they are."""
    (m, k), n = a.shape, out.shape[1]
    preparations = []
    if a.strides[1] != 1:
        a = _contiguous(a)
        preparations.append(Preparation("a", "a", ("contiguous",)))
    prepared = _prepared(b)
    w, w_steps = (b, ()) if prepared else (b.transposed(), ("transpose",))
    if not prepared and w.strides[1] != 1:
        w, w_steps = _contiguous(w), ("transpose", "contiguous")
    preparations.append(Preparation("w", "b", w_steps))
    element_bytes = OPERAND_BYTES[a.dtype]
    cfg = config or choose_skinny_config(m, n, k * element_bytes // 2, sms, element_bytes)  # (K in 16-bit steps)
    if scales and cfg.splits > 1:
        return None
    epilogue = Epilogue(bias=bias is not None, activation=activation, scales=tuple(scale for scale, _ in scales))
    chunk = 16 // element_bytes
    vector_loads = _vector_ready(a, k, chunk) and (prepared or _vector_ready(w, k, chunk))
    variant = SkinnyVariant(vector_loads, epilogue, m > 8, prepared)
    specs = {"a": a, "w": w, "out": out, **({"bias": bias} if bias is not None else {})}
    bias_argument = Tensor("bias") if bias is not None else Tensor("out", unread=True)
    grid = (-(-n // cfg.rows) * cfg.cluster_k, cfg.splits)
    if scales:
        _check_scales(scales, m, n, specs)
        scale_arguments = (Tensor("scale_0"), Tensor("scale_1") if len(scales) > 1 else Tensor("scale_0", unread=True))
        arguments = (Tensor("a"), Tensor("w"), Tensor("out"), bias_argument, *scale_arguments, cfg, variant)
        launch = Launch(skinny_gemm_scaled_kernel, arguments, grid, cfg.threads)
        return GemmPlan("skinny", cfg, epilogue, specs, tuple(preparations), (launch,))
    if cfg.splits == 1:
        launch = Launch(
            skinny_gemm_kernel,
            (Tensor("a"), Tensor("w"), Tensor("out"), bias_argument, cfg, variant),
            grid,
            cfg.threads,
        )
        return GemmPlan("skinny", cfg, epilogue, specs, tuple(preparations), (launch,))
    partials = Scratch("partials", (cfg.splits * m, n), "f32")
    first = Launch(skinny_gemm_kernel, (Tensor("a"), Tensor("w"), partials, partials, cfg, variant), grid, cfg.threads)
    reduce = Launch(
        split_k_reduce, (partials, Tensor("out"), bias_argument, cfg.splits, epilogue), -(-m * n // 256), 256
    )
    return GemmPlan("skinny", cfg, epilogue, specs, tuple(preparations), (first, reduce))


def _check_scales(scales: tuple, m: int, n: int, specs: dict) -> None:
    """Each ``(Scale, MatrixSpec)`` a float32 tensor of the scale's shape with a unit last stride, kept in ``specs``
    as "scale_0", "scale_1"."""
    for i, (scale, matrix) in enumerate(scales):
        if matrix.dtype != "f32" or tuple(matrix.shape) != scale.shape(m, n) or matrix.strides[-1] != 1:
            raise ValueError(
                f"gemm scale_{i}: expected a float32 {scale.shape(m, n)} tensor with a unit last stride for"
                f" {scale}, got {matrix.dtype} {tuple(matrix.shape)} strides {matrix.strides}"
            )
        specs[f"scale_{i}"] = matrix


def plan_blockscale(
    a: MatrixSpec,
    b: MatrixSpec,
    out: MatrixSpec,
    a_scales: MatrixSpec,
    b_scales: MatrixSpec,
    *,
    sms: int,
    bias: MatrixSpec | None = None,
    activation: str | None = None,
    config: GemmConfig | None = None,
) -> GemmPlan:
    """The plan of a block-scaled fp8 GEMM (``blockscale_gemm``): the warp-specialized kernel with the scales
    promoted per 128-wide K block in its mainloop (:func:`~flydsl.kernels.gemm.mainloop.promoted_steps`), the
    configuration :func:`~flydsl.kernels.gemm.config.choose_blockscale_config`'s unless given."""
    return plan_dense(
        a, b, out, sms=sms, bias=bias, activation=activation, config=config, block_scales=(a_scales, b_scales)
    )


def _contiguous(matrix: MatrixSpec) -> MatrixSpec:
    """``matrix`` after torch's ``contiguous()``: itself where torch sees it as contiguous (strides of extent-1
    dimensions do not count), else a row-major copy."""
    expected = MatrixSpec.dense(matrix.shape, matrix.dtype).strides
    if all(extent == 1 or s == e for extent, s, e in zip(matrix.shape, matrix.strides, expected, strict=True)):
        return matrix
    return MatrixSpec.dense(matrix.shape, matrix.dtype)


def _vector_ready(matrix: MatrixSpec, k: int, chunk: int = 8) -> bool:
    """16-byte loads (``chunk`` elements) work: K-contiguous rows starting 16-byte aligned."""
    return matrix.strides[1] == 1 and matrix.aligned and matrix.strides[0] % chunk == 0 and k % chunk == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("m", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    parser.add_argument("--b-major", default="K", choices=("K", "MN"), help="K: b = W.t() of (N, K) weights")
    parser.add_argument("--out-dtype", choices=("bf16", "f16", "f32"), help="default: the operands' dtype")
    parser.add_argument("--bias", choices=("same", "f32"), help="a (N,) bias in the operands' dtype or float32")
    parser.add_argument("--activation", choices=("relu", "gelu", "silu"))
    parser.add_argument("--sms", type=int, default=132, help="the GPU's SM count (default: the H200's)")
    parser.add_argument("--lower", action="store_true", help="also compile each launch and print its PTX's size")
    args = parser.parse_args(argv)
    m, n, k = args.m, args.n, args.k
    a = MatrixSpec.dense((m, k), args.dtype)
    b = (
        MatrixSpec.dense((n, k), args.dtype).transposed()
        if args.b_major == "K"
        else MatrixSpec.dense((k, n), args.dtype)
    )
    out = MatrixSpec.dense((m, n), args.out_dtype or args.dtype)
    bias = None if args.bias is None else MatrixSpec.dense((n,), args.dtype if args.bias == "same" else "f32")
    plan = plan_gemm(a, b, out, sms=args.sms, bias=bias, activation=args.activation)
    print(f"gemm {m}x{n}x{k} {args.dtype}, b {args.b_major}-major, {args.sms} SMs")
    print(plan.describe())
    if args.lower:
        for launch, module in zip(plan.launches, plan.lower(), strict=True):
            print(f"{launch.kernel.name}: {len(module.ptx)} bytes of PTX, shared {module.shared_bytes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

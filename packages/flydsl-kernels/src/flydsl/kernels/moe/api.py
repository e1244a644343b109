"""The routing half of a fused MoE layer: :func:`topk_route` (each token's experts and weights from the router's
logits, one launch) and :func:`align_tokens` (the (token, slot) pairs sorted by expert and padded to the grouped
GEMM's blocks, on the GPU).

    weights, ids = topk_route(router_logits, 8)                                  # softmax, renormalized
    weights, ids = topk_route(router_logits, 8, scoring="sigmoid", bias=correction, num_groups=8, top_groups=4)
    sorted_ids, expert_of_block, padded_count = align_tokens(ids, 256, 64)     # DeepSeek-V3's router

Both check their arguments before anything is launched (errors name the function and the argument), keep a launch
plan per call signature (:mod:`flydsl.kernels.plans`), never read a tensor's values on the host (CUDA-graph
capturable: every size follows from the shapes) and return their outputs: new torch tensors, or those given by
keyword (``topk_weights=``, ``sorted_ids=``, ...: contiguous, of the output's shape and dtype). The checks that need
only shapes, dtypes and numbers (:func:`check_route_shapes`, :func:`check_align_shapes`) import no compiler:
``torch.ops.flydsl``'s fake implementations run them on tensors without data.
"""

from __future__ import annotations

import functools

from flydsl.kernels import validation as check
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = [
    "MAX_EXPERTS",
    "MAX_TOP_K",
    "MAX_GROUPS",
    "MAX_BLOCK_M",
    "MAX_POSITIONS",
    "SCORINGS",
    "topk_route",
    "align_tokens",
    "align_capacity",
    "check_topk_route",
    "check_align_tokens",
    "check_route_shapes",
    "check_align_shapes",
    "check_experts_shapes",
    "contiguous",
    "EXPERT_DTYPES",
    "ROW_CHUNK",
    "QUANTS",
    "WEIGHT_GRANULARITIES",
    "check_granularity",
    "expert_scale_shapes",
]

MAX_EXPERTS = 512  # topk_route: at most 16 scores per lane; align_tokens: one thread per expert
MAX_TOP_K = 16
MAX_GROUPS = 32  # each group on whole lanes of one warp
MAX_BLOCK_M = 1024
MAX_POSITIONS = 1 << 30  # align_tokens' positions and indices are 32-bit
SCORINGS = ("softmax", "sigmoid")
_ID_DTYPES = ("i32", "i64", "int32", "int64")  # TensorSpec names, torch names
_SHORT_NAMES = {"int32": "i32", "int64": "i64"}  # torch's integer names as TensorSpec's
_TOPK = Plans("flydsl.kernels.moe.topk_route", replay=True)
_ALIGN = Plans("flydsl.kernels.moe.align_tokens", replay=True)


@functools.cache
def _topk():
    from flydsl.kernels.moe import topk

    return topk


@functools.cache
def _align():
    from flydsl.kernels.moe import align

    return align


def _count(who: str, name: str, value, low: int, high: int) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{who}: {name}: expected an int from {low} to {high}, got {value!r}")
    return value


# --- topk_route -----------------------------------------------------------------------------------------------------


def topk_route(
    router_logits,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    bias=None,
    num_groups: int | None = None,
    top_groups: int | None = None,
    topk_weights=None,
    topk_ids=None,
):
    """``(topk_weights, topk_ids)``, float32 and int32 ``(T, top_k)``: each token's ``top_k`` experts, best first,
    and their weights, from ``router_logits`` (T, E) float32/float16/bfloat16 (a torch CUDA tensor with unit stride
    on E, any row stride; E up to 512, ``top_k`` up to 16 and E). One launch. ``topk_weights`` / ``topk_ids``: the
    outputs to write (contiguous (T, top_k) float32 / int32 torch tensors), allocated when not given.

    * ``scoring``: "softmax" (the scores are softmax over the E logits, in float32) or "sigmoid" (each logit's
      sigmoid).
    * ``bias``: a float32 (E,) correction bias (DeepSeek-V3's ``e_score_correction_bias``), added to the scores to
      choose the experts only: the weights are the scores without it.
    * ``num_groups`` / ``top_groups`` (grouped top-k, DeepSeek-V3: 8 and 4): the experts in ``num_groups`` equal
      groups of consecutive experts (at most 32 groups of at least 2); a group's score is the sum of its two highest
      (biased) scores, the ``top_groups`` best groups are kept and the ``top_k`` experts chosen among theirs only.
      ``num_groups`` None or 1: ungrouped.
    * ``renormalize``: the weights divided by their sum over the ``top_k`` chosen.

    Ties: on equal (biased) scores the lower expert comes first, and on equal group scores the lower group; NaN
    scores rank above every number (as ``torch.topk`` ranks them), -0 equals +0. :mod:`~flydsl.kernels.moe.reference`'s
    ``topk_route_reference`` follows the same rules in float32 torch (its scores may differ from the kernel's in the
    last bit: exp and the sums are computed differently)."""
    key = signature(router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups, topk_weights, topk_ids)
    plan = _TOPK.get(key)
    if plan is None:
        plan = _TOPK.add(
            key,
            _topk_plan(
                router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups, topk_weights, topk_ids
            ),
        )
    weights, ids = plan(router_logits, bias, topk_weights, topk_ids)
    return weights, ids


def _topk_plan(router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups, topk_weights, topk_ids):
    """The launch of a call of this signature, checked: a :class:`~flydsl.kernels.plans.ScratchPlan` of
    ``(router_logits, bias, topk_weights, topk_ids)`` whose scratch is the outputs (allocated where not given)."""
    who = _TOPK.name
    cfg, tokens = check_topk_route(
        router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups, topk_weights, topk_ids
    )
    check.torch_tensor(who, "router_logits", router_logits)  # outputs are allocated with torch
    import torch

    shape = (tokens, cfg.top_k)

    def outputs(logits, bias, weights, ids):
        if weights is None:
            weights = torch.empty(shape, dtype=torch.float32, device=logits.device)
        if ids is None:
            ids = torch.empty(shape, dtype=torch.int32, device=logits.device)
        return weights, ids

    if tokens == 0:
        return ScratchPlan(outputs, lambda *args: None)
    kernel, launch = _topk().topk_route_kernel, dict(grid=cfg.grid(tokens), block=cfg.block)

    def run(logits, bias, given_weights, given_ids, weights, ids):
        kernel(logits, logits if bias is None else bias, weights, ids, cfg).launch(**launch)  # (unread without bias)

    return ScratchPlan(outputs, run)


def check_topk_route(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    bias=None,
    num_groups=None,
    top_groups=None,
    topk_weights=None,
    topk_ids=None,
):
    """``topk_route``'s arguments checked (tensors read for their shapes, dtypes, strides and devices only: torch
    tensors, other GPU arrays or ``flyc.TensorSpec``), the outputs given too; returns the kernel's configuration
    (:class:`flydsl.kernels.moe.topk.RouteConfig`) and the token count T. Errors name the argument."""
    who = _TOPK.name
    logits = check.describe(who, "router_logits", router_logits)
    offsets = None if bias is None else check.describe(who, "bias", bias)
    tokens, experts, groups, kept = check_route_shapes(
        who, logits, top_k, scoring, renormalize, offsets, num_groups, top_groups
    )
    check.rows(who, "router_logits", router_logits)  # its strides and sizes
    if offsets is not None and experts > 1 and offsets.strides[0] != 1:
        raise ValueError(f"{who}: bias: expected a contiguous vector, got stride {offsets.strides[0]}")
    check.same_device(who, logits, ("bias", offsets))
    _check_outputs(
        who,
        logits,
        (("router_logits", logits), ("bias", offsets)),
        (("topk_weights", topk_weights, (tokens, top_k), "f32"), ("topk_ids", topk_ids, (tokens, top_k), "i32")),
    )
    layout = _topk().route_layout(experts, groups)
    if layout is None:
        size = experts // groups
        raise ValueError(
            f"{who}: num_groups: {groups} groups of {size} experts cannot be laid on a warp's lanes (each group on"
            f" a power of two of lanes holding at most 16 experts each, {groups} x lanes <= 32)"
        )
    cfg = _topk().RouteConfig(
        experts=experts,
        top_k=top_k,
        scoring=scoring,
        renormalize=bool(renormalize),
        bias=offsets is not None,
        num_groups=groups,
        top_groups=kept,
        lanes=layout[0],
        per_lane=layout[1],
    )
    return cfg, tokens


def check_route_shapes(
    who: str, router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups
) -> tuple[int, int, int, int]:
    """``topk_route``'s checks that need only shapes, dtypes and numbers (tensors: anything with ``shape`` and
    ``dtype`` in :mod:`flydsl.kernels.validation`'s names; ``bias`` None where absent); returns ``(T, E, num_groups,
    top_groups)``, ``(1, 1)`` ungrouped. Not checked here: strides, devices and the grouped lane layout (the
    kernel's, :func:`check_topk_route`)."""
    shape = tuple(router_logits.shape)
    if len(shape) != 2:
        raise ValueError(
            f"{who}: router_logits: expected a 2-D tensor (rows, N), got shape {shape} (reshape to 2-D first)"
        )
    check.check_dtype(who, "router_logits", router_logits.dtype, check.ROW_DTYPES)
    tokens, experts = shape
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"{who}: router_logits: expected 1 to {MAX_EXPERTS} experts (its last dim), got shape {shape}")
    _count(who, "top_k", top_k, 1, MAX_TOP_K)
    if top_k > experts:
        raise ValueError(f"{who}: top_k: expected at most E = {experts} (router_logits' last dim), got {top_k}")
    check.one_of(who, "scoring", scoring, SCORINGS)
    if not isinstance(renormalize, bool):
        raise TypeError(f"{who}: renormalize: expected a bool, got {renormalize!r}")
    if bias is not None:
        if tuple(bias.shape) != (experts,):
            raise ValueError(
                f"{who}: bias: expected shape ({experts},) (N, the input's last dim), got {tuple(bias.shape)}"
            )
        check.check_dtype(who, "bias", bias.dtype, ("f32",))
    groups, kept = _check_groups(who, experts, top_k, num_groups, top_groups)
    return tokens, experts, groups, kept


def _check_outputs(who: str, reference, inputs, outputs) -> None:
    """The outputs given (``(name, tensor or None, shape, dtype)``; None: allocated by the plan): torch tensors of
    their shape and dtype, contiguous, on ``reference``'s device, overlapping none of ``inputs`` (``(name, info or
    None)``) nor each other."""
    seen = list(inputs)
    for name, obj, shape, dtype in outputs:
        if obj is None:
            continue
        info = check.describe(who, name, obj)
        if tuple(info.shape) != tuple(shape) or _SHORT_NAMES.get(info.dtype, info.dtype) != dtype:
            raise ValueError(
                f"{who}: {name}: expected a {check.dtype_names((dtype,))} tensor of shape {tuple(shape)}, got"
                f" {check.dtype_names((info.dtype,))} {tuple(info.shape)}"
            )
        if not contiguous(info):
            raise ValueError(f"{who}: {name}: expected a contiguous tensor, got strides {tuple(info.strides)}")
        check.same_device(who, reference, (name, info))
        check.torch_tensor(who, name, obj)  # the plans fill some with torch (nothing routed, padding)
        check.not_aliased(who, name, info, *seen)
        seen.append((name, info))


def contiguous(info) -> bool:
    """A tensor's ``TensorInfo`` (or anything with ``shape`` and ``strides``) is row-major contiguous (strides of
    extent-1 dimensions do not count)."""
    step = 1
    for extent, stride in zip(reversed(info.shape), reversed(info.strides), strict=True):
        if extent != 1 and stride != step:
            return False
        step *= extent
    return True


def _check_groups(who: str, experts: int, top_k: int, num_groups, top_groups) -> tuple[int, int]:
    """``(num_groups, top_groups)`` of grouped top-k, ``(1, 1)`` ungrouped."""
    if num_groups is not None:
        _count(who, "num_groups", num_groups, 1, MAX_GROUPS)
    if num_groups is None or num_groups == 1:
        if top_groups is not None and top_groups != 1:
            raise ValueError(f"{who}: top_groups: expected None (or 1) without num_groups, got {top_groups!r}")
        return 1, 1
    if experts % num_groups:
        raise ValueError(
            f"{who}: num_groups: expected a divisor of E = {experts} (router_logits' last dim), got {num_groups}"
        )
    size = experts // num_groups
    if size < 2:
        raise ValueError(
            f"{who}: num_groups: a group's score is the sum of its two best experts: expected groups of at least 2"
            f" experts, got E / num_groups = {experts} / {num_groups}"
        )
    if top_groups is None:
        raise ValueError(f"{who}: top_groups: expected the number of groups kept (1 to {num_groups}), got None")
    _count(who, "top_groups", top_groups, 1, num_groups)
    if top_k > top_groups * size:
        raise ValueError(
            f"{who}: top_k: expected at most top_groups * E / num_groups = {top_groups} * {size} experts to choose"
            f" from, got {top_k}"
        )
    return num_groups, top_groups


# --- align_tokens ---------------------------------------------------------------------------------------------------


def align_capacity(num_ids: int, num_experts: int, block_m: int) -> int:
    """The length of :func:`align_tokens`' ``sorted_ids`` for ``num_ids`` (T * k) ids: ``num_ids + num_experts *
    (block_m - 1)`` rounded up to a multiple of ``block_m``, what every expert's run padded to ``block_m`` can take
    (the grouped GEMM's grid bound: ``capacity // block_m`` blocks)."""
    return -(-(num_ids + num_experts * (block_m - 1)) // block_m) * block_m


def align_tokens(topk_ids, num_experts: int, block_m: int, *, sorted_ids=None, expert_of_block=None, padded_count=None):
    """``(sorted_ids, expert_of_block, padded_count)`` of ``topk_ids`` (T, k) int32/int64 (a contiguous torch CUDA
    tensor, e.g. :func:`topk_route`'s ids), for a grouped GEMM in blocks of ``block_m`` rows (outputs given by keyword:
    contiguous int32 torch tensors of these shapes, written whole; the others allocated):

    * ``sorted_ids`` int32 ``(capacity,)`` (:func:`align_capacity`): the flattened indices ``t * k + s`` grouped by
      expert, in expert order, each expert's run padded to a multiple of ``block_m`` with the sentinel ``T * k``;
      within an expert, indices in increasing order (deterministic). Experts without ids have no run; positions
      past ``padded_count`` hold the sentinel too.
    * ``expert_of_block`` int32 ``(capacity // block_m,)``: the expert of each block of ``block_m`` positions, -1
      for the blocks past ``padded_count``.
    * ``padded_count`` int32 ``(1,)``: the total padded length (a multiple of ``block_m``).

    Ids outside ``[0, num_experts)`` are dropped: not placed, not counted (expert parallelism: a negative id marks a
    token this rank does not serve). ``num_experts`` up to 512, ``block_m`` up to 1024, ``capacity`` up to 2^30.
    Computed on the GPU (a counting sort, one launch up to 8192 ids, three beyond: :mod:`flydsl.kernels.moe.align`);
    every size follows from the shapes, so calls can be captured in CUDA graphs. :mod:`~flydsl.kernels.moe.reference`'s
    ``align_tokens_reference`` is the same in torch."""
    given = (sorted_ids, expert_of_block, padded_count)
    key = signature(topk_ids, num_experts, block_m, *given)
    plan = _ALIGN.get(key)
    if plan is None:
        plan = _ALIGN.add(key, _align_plan(topk_ids, num_experts, block_m, given))
    sorted_ids, expert_of_block, padded_count = plan(topk_ids, *given)[:3]
    return sorted_ids, expert_of_block, padded_count


def _align_plan(topk_ids, num_experts, block_m, given):
    """The launches of a call of this signature, checked: a :class:`~flydsl.kernels.plans.ScratchPlan` of
    ``(topk_ids, sorted_ids, expert_of_block, padded_count)`` (outputs None where allocated) whose scratch starts with
    the three outputs."""
    who = _ALIGN.name
    cfg, ids, capacity = check_align_tokens(topk_ids, num_experts, block_m, *given)
    check.torch_tensor(who, "topk_ids", topk_ids)  # outputs are allocated with torch
    import torch

    blocks = capacity // block_m
    align = _align()

    def outputs(like, sorted_ids, expert_of_block, padded_count):
        device = like.device
        return (
            torch.empty(capacity, dtype=torch.int32, device=device) if sorted_ids is None else sorted_ids,
            torch.empty(blocks, dtype=torch.int32, device=device) if expert_of_block is None else expert_of_block,
            torch.empty(1, dtype=torch.int32, device=device) if padded_count is None else padded_count,
        )

    if ids == 0:  # nothing to sort: the sentinel (0) everywhere, no blocks

        def empty(topk_ids, *given):
            sorted_ids, expert_of_block, padded_count = outputs(topk_ids, *given)
            return sorted_ids.zero_(), expert_of_block.fill_(-1), padded_count.zero_()

        return ScratchPlan(empty, lambda *args: None)
    per_warp, chunks = align.align_plan(cfg, ids)
    if chunks == 1:
        small = align.align_small_kernel

        def one_cta(topk_ids, _s, _e, _p, sorted_ids, expert_of_block, padded_count):
            small(topk_ids.view(-1), sorted_ids, expert_of_block, padded_count, per_warp, cfg).launch(
                grid=1, block=cfg.threads
            )

        return ScratchPlan(outputs, one_cta)
    count, scan, scatter = align.count_kernel, align.scan_kernel, align.scatter_kernel
    experts = cfg.experts

    def with_counts(topk_ids, *given):  # the outputs, and each call's own counts and starts
        device = topk_ids.device
        counts = torch.empty(chunks * experts, dtype=torch.int32, device=device)
        starts = torch.empty(experts + 1, dtype=torch.int32, device=device)
        return (*outputs(topk_ids, *given), counts, starts)

    def three_kernels(topk_ids, _s, _e, _p, sorted_ids, expert_of_block, padded_count, counts, starts):
        flat = topk_ids.view(-1)
        count(flat, counts, per_warp, cfg).launch(grid=chunks, block=cfg.threads)
        scan(counts, starts, sorted_ids, padded_count, ids, cfg).launch(grid=1, block=align.SCAN_THREADS)
        scatter(flat, counts, starts, sorted_ids, expert_of_block, per_warp, cfg).launch(grid=chunks, block=cfg.threads)

    return ScratchPlan(with_counts, three_kernels)


def check_align_tokens(topk_ids, num_experts, block_m, sorted_ids=None, expert_of_block=None, padded_count=None):
    """``align_tokens``' arguments checked (``topk_ids`` read for its shape, dtype, strides and device only: a torch
    tensor, another GPU array or a ``flyc.TensorSpec``), the outputs given too; returns the kernels' configuration
    (:class:`flydsl.kernels.moe.align.AlignConfig`), the id count T * k and the capacity. Errors name the argument."""
    who = _ALIGN.name
    info = check.describe(who, "topk_ids", topk_ids)
    ids, capacity = check_align_shapes(who, info, num_experts, block_m)
    tokens, k = info.shape
    if (k > 1 and info.strides[1] != 1) or (tokens > 1 and info.strides[0] != k):
        raise ValueError(
            f"{who}: topk_ids: expected a contiguous (T, k) tensor, got strides {tuple(info.strides)} (call"
            " .contiguous())"
        )
    _check_outputs(
        who,
        info,
        (("topk_ids", info),),
        (
            ("sorted_ids", sorted_ids, (capacity,), "i32"),
            ("expert_of_block", expert_of_block, (capacity // block_m,), "i32"),
            ("padded_count", padded_count, (1,), "i32"),
        ),
    )
    return _align().AlignConfig(experts=num_experts, block_m=block_m), ids, capacity


def check_align_shapes(who: str, topk_ids, num_experts, block_m) -> tuple[int, int]:
    """``align_tokens``' checks that need only shapes, dtypes and numbers (``topk_ids``: anything with ``shape`` and
    ``dtype``, in :mod:`flydsl.kernels.validation`'s names or torch's); returns the id count T * k and the capacity
    (:func:`align_capacity`). Strides and devices are :func:`check_align_tokens`'."""
    shape = tuple(topk_ids.shape)
    if len(shape) != 2:
        raise ValueError(f"{who}: topk_ids: expected a 2-D tensor (T, k), got shape {shape}")
    if topk_ids.dtype not in _ID_DTYPES:
        raise TypeError(f"{who}: topk_ids: expected int32 or int64, got {check.dtype_names((topk_ids.dtype,))}")
    tokens, k = shape
    _count(who, "num_experts", num_experts, 1, MAX_EXPERTS)
    _count(who, "block_m", block_m, 1, MAX_BLOCK_M)
    ids = tokens * k
    capacity = align_capacity(ids, num_experts, block_m)
    if capacity > MAX_POSITIONS:
        raise ValueError(
            f"{who}: topk_ids: expected at most 2^30 padded positions (T * k + num_experts * (block_m - 1), rounded"
            f" up to block_m; 32-bit indices), got {tokens} x {k} ids: {capacity}"
        )
    return ids, capacity


EXPERT_DTYPES = ("bf16", "f16")  # fused_moe's activations (and weights, unquantized)
ROW_CHUNK = 8  # H and I in whole 16-byte rows of 16-bit elements (the gather's, the combine's and TMA's)
QUANTS = (None, "fp8")  # fused_moe's weight formats: as x, or float8_e4m3fn with float32 scales
# fp8 weights' scales: per expert and output row, per expert, or per expert and 128 x 128 block (with activations
# quantized per 1 x 128 group instead of per token)
WEIGHT_GRANULARITIES = ("channel", "tensor", "block")
BLOCK = 128  # "block" granularity: the weights' blocks are BLOCK x BLOCK, the activations' groups 1 x BLOCK


def check_experts_shapes(
    who: str, x, w1, w2, topk_weights, topk_ids, activation, quant=None, granularity=None, w1_scale=None, w2_scale=None
) -> tuple[int, int, int, int, int]:
    """``fused_moe``'s checks that need only shapes, dtypes and names (tensors: anything with ``shape`` and ``dtype``
    in :mod:`flydsl.kernels.validation`'s names; no compiler): returns ``(T, H, E, I, k)``. ``quant`` "fp8": the
    weights float8_e4m3fn, H and I multiples of 16, ``granularity`` "channel" (``w1_scale`` (E, 2I), ``w2_scale``
    (E, H)), "tensor" (both (E,)) or "block" (``w1_scale`` (E, 2I / 128, H / 128), ``w2_scale`` (E, H / 128,
    ceil(I / 128)): H a multiple of 128, I of 64), float32. Strides, devices, alignment and overlaps are
    :func:`flydsl.kernels.moe.experts.check_fused_moe`'s."""
    from flydsl.kernels.moe.reference import ACTIVATIONS

    if activation not in ACTIVATIONS:
        raise ValueError(f"{who}: activation: expected one of {ACTIVATIONS}, got {activation!r}")
    if quant not in QUANTS:
        raise ValueError(f"{who}: quant: expected one of {QUANTS}, got {quant!r}")
    if quant is None and (granularity is not None or w1_scale is not None or w2_scale is not None):
        raise ValueError(f"{who}: granularity, w1_scale and w2_scale go with quant='fp8' (got quant=None)")
    if len(x.shape) != 2:
        raise ValueError(f"{who}: x: expected a 2-D tensor (T, H), got shape {tuple(x.shape)}")
    check.check_dtype(who, "x", x.dtype, EXPERT_DTYPES)
    tokens, hidden = x.shape
    if len(w1.shape) != 3 or w1.shape[1] % 2 or w1.shape[2] != hidden:
        raise ValueError(f"{who}: w1: expected (E, 2I, H) with H = {hidden}, got shape {tuple(w1.shape)}")
    experts, inter = w1.shape[0], w1.shape[1] // 2
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"{who}: w1: expected 1 to {MAX_EXPERTS} experts E, got shape {tuple(w1.shape)}")
    if tuple(w2.shape) != (experts, hidden, inter):
        raise ValueError(f"{who}: w2: expected (E, H, I) = {(experts, hidden, inter)}, got shape {tuple(w2.shape)}")
    weight_dtype, chunk = (x.dtype, ROW_CHUNK) if quant is None else ("f8E4M3FN", 2 * ROW_CHUNK)
    for name, w in (("w1", w1), ("w2", w2)):
        check.check_dtype(who, name, w.dtype, (weight_dtype,), like=None if quant else "x")
    if hidden % chunk or inter % chunk:
        raise ValueError(f"{who}: w1: H = {hidden} and I = {inter}; expected multiples of {chunk} (16-byte rows)")
    if quant is not None:
        _check_expert_scales(who, granularity, w1_scale, w2_scale, experts, hidden, inter)
    if len(topk_ids.shape) != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(f"{who}: topk_ids: expected (T, k) with T = {tokens}, got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"{who}: topk_weights: expected topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}"
        )
    check.check_dtype(who, "topk_weights", topk_weights.dtype, ("f32", "bf16", "f16"))
    if topk_ids.dtype not in _ID_DTYPES:
        raise TypeError(f"{who}: topk_ids: expected int32 or int64, got {check.dtype_names((topk_ids.dtype,))}")
    return tokens, hidden, experts, inter, topk_ids.shape[1]


def check_granularity(who: str, granularity, hidden: int, inter: int) -> None:
    """``granularity`` one of :data:`WEIGHT_GRANULARITIES`; for "block", H and I such that each expert's w1 rows (2I)
    and w2 rows (H) are whole 128-row blocks."""
    if granularity not in WEIGHT_GRANULARITIES:
        raise ValueError(
            f"{who}: granularity: expected one of {WEIGHT_GRANULARITIES} with quant='fp8', got {granularity!r}"
        )
    if granularity == "block" and (hidden % BLOCK or inter % (BLOCK // 2)):
        raise ValueError(
            f"{who}: granularity 'block': H = {hidden} and I = {inter}; expected H a multiple of {BLOCK} and I of"
            f" {BLOCK // 2} (each expert's w1 and w2 rows in whole {BLOCK}-row blocks)"
        )


def expert_scale_shapes(granularity: str, experts: int, hidden: int, inter: int) -> tuple[tuple, tuple]:
    """``(w1_scale's shape, w2_scale's shape)`` for fp8 experts of ``granularity``: per channel (E, 2I) and (E, H),
    per tensor (E,) each, per 128 x 128 block (E, 2I / 128, H / 128) and (E, H / 128, ceil(I / 128))."""
    if granularity == "channel":
        return (experts, 2 * inter), (experts, hidden)
    if granularity == "tensor":
        return (experts,), (experts,)
    return (experts, 2 * inter // BLOCK, -(-hidden // BLOCK)), (experts, hidden // BLOCK, -(-inter // BLOCK))


def _check_expert_scales(who: str, granularity, w1_scale, w2_scale, experts: int, hidden: int, inter: int) -> None:
    check_granularity(who, granularity, hidden, inter)
    shapes = expert_scale_shapes(granularity, experts, hidden, inter)
    for name, scale, expected in zip(("w1_scale", "w2_scale"), (w1_scale, w2_scale), shapes, strict=True):
        if scale is None or tuple(scale.shape) != expected or scale.dtype != "f32":
            got = "None" if scale is None else f"{check.dtype_names((scale.dtype,))} {tuple(scale.shape)}"
            raise ValueError(f"{who}: {name}: expected a float32 {expected} tensor ({granularity} scales), got {got}")

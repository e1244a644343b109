"""The router's top-k kernel (:func:`flydsl.kernels.moe.topk_route`): each token's expert scores, the experts chosen
and their weights, in one launch.

A token belongs to a team of ``lanes`` threads of one warp (a power of two: 32 for 256 experts or more, fewer for fewer,
so that a warp serves several tokens when E is small); lane j holds the ``per_lane`` consecutive experts from expert j
times ``per_lane`` (16-byte loads where the row allows; lanes past E hold none). Each lane computes its scores (softmax:
the row's max and sum are butterflies over the team; sigmoid: elementwise), adds the bias where given, and turns each
choice score into an ``Int32`` key whose signed order is the score's (:func:`order_key`: NaN above +inf, -0 as +0), so
that ties and NaN compare exactly and cheaply. Grouped top-k (DeepSeek-V3) lays the groups on whole lanes
(``lanes_per_group`` a power of two): a group's top two keys are a butterfly over its lanes, its score their sum, each
lane ranks its group among the others (one shuffle per group), and experts of the groups not kept get the lowest key.
Then ``top_k`` rounds: each lane's best (key, expert) pair, a butterfly over the team keeping the higher key and on
equal keys the lower expert, and the winner's key lowered so that the next round passes it over. The weights are the
unbiased scores (decoded from the key without a bias; carried through the butterfly with one), renormalized by their sum
where asked; the team's first lane stores the row's weights and ids (16-byte stores where a row of k values is a
multiple of 16 bytes). Tokens past the last (the last CTA's tail) read the last token and store nothing; element offsets
are 64-bit (``logits[row, col]``), so T * E may pass 2^31.
"""

from __future__ import annotations

from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import arith, gpu, vector
from flydsl.kernels.moe.api import MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, SCORINGS
from flydsl.kernels.rows.tiles import fill_buffer

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")

__all__ = [
    "RouteConfig",
    "route_config",
    "route_layout",
    "order_key",
    "key_value",
    "topk_route_kernel",
]

_PER_LANE = (8, 16)  # the scores a lane holds: at most 8 where the layout allows, else at most 16
_LOWEST = -(1 << 31)  # the key below every score's: experts not chosen from (past E, groups not kept, taken)
_NAN_KEY = (1 << 31) - 1  # every NaN's key: above +inf (torch.topk's order)


def _power_of_two_up(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def route_layout(experts: int, num_groups: int = 1) -> tuple[int, int] | None:
    """``(lanes, per_lane)``: the team of lanes one token takes (a power of two up to 32) and the experts each holds,
    or None where grouped experts cannot be laid out so that every group is a power of two of whole lanes.
    Ungrouped: the fewest lanes holding at most 8 experts each, preferring a split in which every lane's experts are
    all in the row (E a multiple of per_lane: whole-vector loads); grouped: the fewest lanes per group (a power of
    two) holding at most 8 (else 16) experts each, the groups side by side."""
    if num_groups <= 1:
        fallback = None
        for cap in _PER_LANE:
            lanes = min(32, _power_of_two_up(-(-experts // cap)))
            while lanes <= 32:
                per_lane = -(-experts // lanes)
                if per_lane <= cap and experts % per_lane == 0:
                    return lanes, per_lane
                if per_lane <= cap and fallback is None:
                    fallback = (lanes, per_lane)
                lanes *= 2
        return fallback
    if experts % num_groups or num_groups > MAX_GROUPS:
        return None
    size = experts // num_groups
    for cap in _PER_LANE:
        per_group = 1
        while num_groups * per_group <= 32:
            if size % per_group == 0 and size // per_group <= cap:
                return _power_of_two_up(num_groups * per_group), size // per_group
            per_group *= 2
    return None


@dataclass(frozen=True, kw_only=True)
class RouteConfig:
    """The top-k kernel's compile-time choices, checked when built: ``experts`` E, ``top_k`` k, ``scoring``
    ("softmax" or "sigmoid"), ``renormalize``, ``bias`` (whether a float32 (E,) correction bias is added for the
    choice), ``num_groups`` / ``top_groups`` (grouped top-k; 1 / 1: ungrouped), the layout (``lanes`` per token,
    ``per_lane`` experts per lane: :func:`route_layout`) and ``block`` threads per CTA."""

    experts: int
    top_k: int
    scoring: str = "softmax"
    renormalize: bool = True
    bias: bool = False
    num_groups: int = 1
    top_groups: int = 1
    lanes: int
    per_lane: int
    block: int = 256

    def __post_init__(self):
        if not 1 <= self.experts <= MAX_EXPERTS or not 1 <= self.top_k <= min(MAX_TOP_K, self.experts):
            raise ValueError(f"RouteConfig: experts must be 1..{MAX_EXPERTS} and top_k 1..min(16, experts), got {self}")
        if self.scoring not in SCORINGS or self.renormalize not in (False, True) or self.bias not in (False, True):
            raise ValueError(f"RouteConfig: scoring must be softmax or sigmoid, renormalize and bias bools, got {self}")
        if (
            self.lanes not in (1, 2, 4, 8, 16, 32)
            or not 1 <= self.per_lane <= 16
            or self.lanes * self.per_lane < self.experts
        ):
            raise ValueError(f"RouteConfig: lanes must be a power of two up to 32 covering the experts, got {self}")
        if self.num_groups > 1:
            size = self.experts // self.num_groups
            if self.experts % self.num_groups or size % self.per_lane or size < 2:
                raise ValueError(f"RouteConfig: groups must be whole lanes of at least 2 experts, got {self}")
            per_group = size // self.per_lane
            if per_group & (per_group - 1) or self.num_groups * per_group > self.lanes:
                raise ValueError(f"RouteConfig: a group's lanes must be a power of two, got {self}")
            if not 1 <= self.top_groups <= self.num_groups or self.top_k > self.top_groups * size:
                raise ValueError(f"RouteConfig: top_groups must be 1..num_groups holding top_k experts, got {self}")
        elif self.top_groups != 1:
            raise ValueError(f"RouteConfig: top_groups without groups, got {self}")
        if self.block % 32 or not 32 <= self.block <= 1024:
            raise ValueError(f"RouteConfig: block must be a multiple of 32 up to 1024, got {self}")

    @property
    def teams(self) -> int:
        """Tokens per CTA."""
        return self.block // self.lanes

    @property
    def even(self) -> bool:
        """Whether every lane's experts are all in the row or none is (whole-segment loads)."""
        return self.experts % self.per_lane == 0

    @property
    def group_size(self) -> int:
        return self.experts // self.num_groups

    @property
    def lanes_per_group(self) -> int:
        return self.group_size // self.per_lane

    def grid(self, tokens: int) -> int:
        return -(-tokens // self.teams)


def route_config(
    experts: int,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = True,
    bias: bool = False,
    num_groups: int = 1,
    top_groups: int = 1,
) -> RouteConfig:
    """The configuration for these routing choices (:func:`route_layout`'s layout; ValueError where there is none)."""
    layout = route_layout(experts, num_groups)
    if layout is None:
        raise ValueError(f"route_config: no lane layout for {experts} experts in {num_groups} groups")
    lanes, per_lane = layout
    return RouteConfig(
        experts=experts,
        top_k=top_k,
        scoring=scoring,
        renormalize=renormalize,
        bias=bias,
        num_groups=num_groups,
        top_groups=top_groups,
        lanes=lanes,
        per_lane=per_lane,
    )


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def order_key(score):
    """An ``Int32`` whose signed order is the Float32 ``score``'s: non-negative floats keep their bits, negative ones
    have all but the sign bit flipped; every NaN becomes the largest key (above +inf, as torch.topk orders NaN) and
    -0 the key of +0 (they compare equal). :func:`key_value` gives the float back."""
    bits = arith.bitcast(_i32(), score)
    key = arith.select(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = arith.select(score != score, fx.Int32(_NAN_KEY), key)
    return arith.select(score == 0.0, fx.Int32(0), key)


def key_value(key):
    """The Float32 of an :func:`order_key` (NaN for the NaN key, +0 for zeros)."""
    bits = arith.select(key < 0, key ^ 0x7FFFFFFF, key)
    return arith.bitcast(ir.F32Type.get(), bits)


def _load_segment(cfg: RouteConfig, view, first):
    """A lane's ``per_lane`` elements from ``view`` (its segment of a row, from expert ``first``) as Float32, 0 past E:
    one copy where the segment is all in the row or all past it (16-byte loads where alignment allows), else one
    predicated copy per element."""
    cls = vector.vector_class(view.dtype, cfg.per_lane)
    raw, buffer = fill_buffer(cls, 0.0)
    if fx.const_expr(cfg.even):
        fx.copy(view, buffer, predicate=first < cfg.experts)
    else:
        for i in fx.range_constexpr(cfg.per_lane):
            ok = first + i < cfg.experts
            fx.copy(fx.local_tile(view, (1,), (i,)), fx.local_tile(buffer, (1,), (i,)), predicate=ok)
    loaded = cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment)).to(fx.Float32)
    return [loaded[i] for i in range(cfg.per_lane)]


def _scores(cfg: RouteConfig, values, masks):
    """Softmax over the team's experts (max and sum: butterflies over the lanes; ``exp(x - max) * (1 / sum)``) or the
    sigmoid ``1 / (1 + exp(-x))``; 0 past E."""
    if fx.const_expr(cfg.scoring == "sigmoid"):
        return [
            arith.select(ok, 1.0 / (1.0 + fx.math.exp(0.0 - x)), fx.Float32(0.0))
            for x, ok in zip(values, masks, strict=True)
        ]
    low = fx.Float32(float("-inf"))
    local = low
    for x, ok in zip(values, masks, strict=True):
        local = arith.maximum(local, arith.select(ok, x, low))
    top = gpu.warp_reduce(local, "max", width=cfg.lanes)
    exps = [arith.select(ok, fx.math.exp(x - top), fx.Float32(0.0)) for x, ok in zip(values, masks, strict=True)]
    total = exps[0]
    for e in exps[1:]:
        total = total + e
    total = gpu.warp_reduce(total, "add", width=cfg.lanes)
    inverse = 1.0 / total
    return [e * inverse for e in exps]


def _top_two(a, b):
    """The two largest of two (largest, second) pairs of keys."""
    return a[0].fly_max(b[0]), a[0].fly_min(b[0]).fly_max(a[1].fly_max(b[1]))


def _better(a, b):
    """The better of two candidates ``(key, expert, ...)``: the higher key, on equal keys the lower expert."""
    take = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
    return tuple(arith.select(take, y, x) for x, y in zip(a, b, strict=True))


def _keep_groups(cfg: RouteConfig, keys, lane):
    """``keys`` with the experts of the groups not among the ``top_groups`` best lowered: a group's score is the sum
    of its two highest choice scores; groups rank by score, on equal scores the lower group first."""
    first, second = fx.Int32(_LOWEST), fx.Int32(_LOWEST)
    for key in keys:
        second = second.fly_max(first.fly_min(key))
        first = first.fly_max(key)
    first, second = gpu.warp_reduce((first, second), _top_two, width=cfg.lanes_per_group)
    mine = order_key(key_value(first) + key_value(second))
    group = lane // cfg.lanes_per_group
    rank = fx.Int32(0)
    for g in fx.range_constexpr(cfg.num_groups):
        other = gpu.shuffle_idx(mine, g * cfg.lanes_per_group, width=cfg.lanes)
        ahead = (other > mine) | ((other == mine) & (group > g))
        rank = rank + arith.select(ahead, fx.Int32(1), fx.Int32(0))
    keep = (rank < cfg.top_groups) & (group < cfg.num_groups)
    return [arith.select(keep, key, fx.Int32(_LOWEST)) for key in keys]


def _choose(cfg: RouteConfig, keys, scores, lane):
    """``top_k`` rounds of the team's best (key, expert): the chosen experts and their weights (the unbiased scores:
    the key's value without a bias, carried with one)."""
    first = lane * cfg.per_lane
    ids, weights = [], []
    for _ in fx.range_constexpr(cfg.top_k):
        best = (keys[0], first, scores[0]) if fx.const_expr(cfg.bias) else (keys[0], first)
        for i in fx.range_constexpr(1, cfg.per_lane):
            candidate = (keys[i], first + i, scores[i]) if fx.const_expr(cfg.bias) else (keys[i], first + i)
            better = candidate[0] > best[0]  # the lane's experts in increasing order: the lower one on ties
            best = tuple(arith.select(better, y, x) for x, y in zip(best, candidate, strict=True))
        best = gpu.warp_reduce(best, _better, width=cfg.lanes)
        ids.append(best[1])
        weights.append(best[2] if fx.const_expr(cfg.bias) else key_value(best[0]))
        keys = [arith.select(first + i == best[1], fx.Int32(_LOWEST), keys[i]) for i in range(cfg.per_lane)]
    return ids, weights


def _store_row(out, row, values, ok):
    """``values`` (k kernel numerics of one type) into row ``row`` of ``out`` (T, k), where ``ok``."""
    cls = vector.vector_class(type(values[0]), len(values))
    chunk = vector.from_elements(cls.mlir_type(), values)
    _, buffer = vector.register_buffer(cls)
    vector.store(chunk, buffer)
    fx.copy(buffer, fx.local_tile(out, (1, len(values)), (row, 0))[0, None], predicate=ok)


@flyc.kernel
def topk_route_kernel(
    logits: fx.Tensor, bias: fx.Tensor, weights: fx.Tensor, ids: fx.Tensor, cfg: fx.Constexpr[RouteConfig]
):
    """``weights`` (T, k) float32 and ``ids`` (T, k) int32 (row-major) of ``logits`` (T, E) float32/f16/bf16 (unit
    stride on E) per ``cfg``; ``bias`` (E,) float32 where ``cfg.bias`` (else any tensor, unread)."""
    flyc.set_kernel_attributes(threads=cfg.block)
    tokens = logits.shape[0].to(fx.Int32)  # < 2^31: checked by topk_route
    tid = gpu.thread_idx.x
    lane = tid % cfg.lanes
    row = gpu.block_idx.x * cfg.teams + tid // cfg.lanes
    valid = row < tokens
    row = arith.select(valid, row, tokens - 1)  # the tail reads the last token (every lane joins the butterflies)
    first = lane * cfg.per_lane
    masks = [first + i < cfg.experts for i in range(cfg.per_lane)]
    values = _load_segment(cfg, fx.local_tile(logits, (1, cfg.per_lane), (row, lane))[0, None], first)
    with fx.fp_contract(False):  # each score and each biased score rounded on its own, as the reference's
        scores = _scores(cfg, values, masks)
        choice = scores
        if fx.const_expr(cfg.bias):
            offsets = _load_segment(cfg, fx.local_tile(bias, (cfg.per_lane,), (lane,)), first)
            choice = [s + b for s, b in zip(scores, offsets, strict=True)]
        keys = [arith.select(ok, order_key(c), fx.Int32(_LOWEST)) for c, ok in zip(choice, masks, strict=True)]
        if fx.const_expr(cfg.num_groups > 1):
            keys = _keep_groups(cfg, keys, lane)
        chosen, chosen_weights = _choose(cfg, keys, scores, lane)
        if fx.const_expr(cfg.renormalize):
            total = chosen_weights[0]
            for w in chosen_weights[1:]:
                total = total + w
            chosen_weights = [w / total for w in chosen_weights]
    ok = valid & (lane == 0)
    _store_row(weights, row, chosen_weights, ok)
    _store_row(ids, row, chosen, ok)

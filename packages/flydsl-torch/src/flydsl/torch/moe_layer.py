"""``flydsl.torch.nn.MoE``: a mixture-of-experts block for inference (the router and the experts' stacked weights,
bf16/fp16 or fp8, loadable from Hugging Face checkpoints: Mixtral, Qwen-MoE, DeepSeek-V3's fp8 experts), running
``torch.ops.flydsl.topk_route`` and ``fused_moe`` on the GPU and the float32 references elsewhere; with ``ep_group``,
its experts split over a ``torch.distributed`` group (:mod:`flydsl.torch.expert_parallel`). Imported through
:mod:`flydsl.torch.nn`."""

from __future__ import annotations

import math

import torch
from flydsl.kernels.moe.api import BLOCK, check_granularity, expert_scale_shapes
from flydsl.torch import expert_parallel as _ep
from flydsl.torch import moe
from flydsl.torch._fixed_dtypes import FixedDtypeBuffers
from flydsl.torch.ops import DTYPES
from torch import Tensor

__all__ = ["MoE"]

_MOE_DTYPES = (torch.bfloat16, torch.float16)  # fused_moe's
# The experts' projections in Hugging Face checkpoints, (gate, up, down) under experts.{e}.<name>.weight: Qwen2/3-MoE
# and DeepSeek's mlp, then Mixtral's block_sparse_moe.
_HF_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
_FP8 = torch.float8_e4m3fn  # fused_moe's fp8 weights
_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
)
# quantize_fp8's granularity for fused_moe's, on one expert's (N, K) weight: per output row, whole, per block
_QUANTIZER = {"channel": "token", "tensor": "tensor", "block": "block"}
_CORRECTION_BIAS = "gate.e_score_correction_bias"  # DeepSeek-V3's router: a float32 (E,) bias for the choice


class _Router(FixedDtypeBuffers, torch.nn.Linear):
    """The router: an ``nn.Linear`` whose DeepSeek-V3 correction bias (a buffer, where the layer has one) stays
    float32 under ``.to(dtype)`` (``topk_route`` takes it so, and a rounded bias would change which experts win)."""

    fixed_dtype_buffers = ("e_score_correction_bias",)


class MoE(FixedDtypeBuffers):
    """A mixture-of-experts block for inference: the router ``gate`` (``nn.Linear(hidden_size, num_experts,
    bias=False)``: ``gate.weight`` as in Hugging Face's Mixtral and Qwen3-MoE) and the experts' weights stacked,
    ``w1`` (E, 2I, H) (each expert's gate rows, then its up rows) and ``w2`` (E, H, I). ``forward(x)``, x (..., H):
    the router's logits ``gate(x)`` (in the gate's dtype: x is cast to it, so a float32 gate gives float32 logits),
    each token's ``top_k`` experts and weights by ``torch.ops.flydsl.topk_route`` (``scoring`` "softmax" or "sigmoid"
    in float32, the weights divided by their sum where ``renormalize``), then ``torch.ops.flydsl.fused_moe``
    (``w2 @ (silu(gate) * up)`` per expert, combined in float32), reshaped back to x's shape. A bf16/fp16 CUDA ``x``
    takes the kernels (``w1`` and ``w2`` in its dtype); anything else (CPU tensors, float32) the float32 torch
    references of :mod:`flydsl.kernels.moe.reference`, so that a model keeps working off the GPU. No gradients (the
    ops record none): run it under ``torch.no_grad()`` or ``torch.inference_mode()``. Works under
    ``torch.compile(fullgraph=True)`` and CUDA-graph capture.

    DeepSeek-V3's router (``topk_route``'s options): ``correction_bias=True`` gives ``gate`` a float32 (E,) buffer
    ``e_score_correction_bias`` (its checkpoint key) added to the scores to choose the experts, not to their weights;
    ``num_groups`` / ``top_groups``: the experts in groups, only the ``top_groups`` best groups (by the sum of their
    two best scores) chosen from; ``routed_scaling_factor``: the weights' factor (after renormalizing).

    ``quant="fp8"``: ``w1`` and ``w2`` are float8_e4m3fn buffers (inference only: not Parameters) with float32
    buffers ``w1_scale`` / ``w2_scale`` of ``granularity``'s shape (``fused_moe``'s): "channel" (E, 2I) and (E, H),
    one per expert and output row; "tensor" (E,) each; "block" one per 128 x 128 block, (E, 2I / 128, H / 128) and
    (E, H / 128, ceil(I / 128)) (H a multiple of 128, I of 64: DeepSeek-V3's recipe). A ``state_dict`` holds them,
    the router keeps ``dtype``; off the GPU the references run on the dequantized weights. :meth:`quantized` makes
    one of a bf16 layer; :meth:`from_hf` loads DeepSeek-V3's fp8 experts as they are, or quantizes float ones.
    ``.to(dtype)`` (and ``.half()``, ...) casts the router only: the fp8 weights and their float32 scales keep their
    dtypes (device moves apply to them).

        moe = MoE.from_hf(layer.block_sparse_moe.state_dict(), top_k=2)   # Mixtral: E, H and I from the weights
        y = moe(x)                                                        # x (..., 4096) bf16 on the GPU
        y = moe.quantized("channel")(x)                                   # the same layer on fp8 weights

    ``ep_group`` (a ``torch.distributed`` process group; None: every expert here): expert parallelism. Each of the
    group's ranks holds ``num_local_experts = E / world`` experts, rank r those from ``expert_offset = r * E /
    world`` (``w1``, ``w2`` and their scales of E / world experts), the router stays whole; ``forward`` routes this
    rank's tokens, sends each to the ranks that own its experts, runs the local ones and adds the partial rows that
    come back (:mod:`flydsl.torch.expert_parallel`: NCCL for CUDA tensors, gloo for CPU ones; every rank of the group
    must call it, each with its own tokens). The result is the whole layer's within float rounding (the partial sums
    are rounded to x's dtype on their rank, then added in float32). One device-to-host copy per forward (the count
    matrix), so no CUDA-graph capture or ``fullgraph`` compile of it. ``MoE.from_hf(..., ep_group=g)`` reads only
    the local experts' keys; :meth:`sharded` splits a whole layer. ``ep_overlap_tokens``: the exchanges go in two
    chunks, the second in flight while the first's experts run, where some rank has at least this many tokens
    (None: never).
    """

    fixed_dtype_buffers = ("w1", "w2", "w1_scale", "w2_scale")  # (fp8 layers: buffers; bf16: Parameters)

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        scoring: str = "softmax",
        renormalize: bool = True,
        activation: str = "silu",
        device=None,
        dtype=None,
        quant: str | None = None,
        granularity: str | None = "channel",
        ep_group=None,
        *,
        num_groups: int | None = None,
        top_groups: int | None = None,
        correction_bias: bool = False,
        routed_scaling_factor: float = 1.0,
    ):
        from flydsl.kernels.moe.api import SCORINGS, check_route_shapes
        from flydsl.kernels.moe.reference import ACTIVATIONS

        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoE: top_k: expected 1 to num_experts = {num_experts}, got {top_k}")
        if scoring not in SCORINGS:
            raise ValueError(f"MoE: scoring: expected one of {SCORINGS}, got {scoring!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoE: activation: expected one of {ACTIVATIONS}, got {activation!r}")
        if quant not in (None, "fp8"):
            raise ValueError(f"MoE: quant: expected None or 'fp8', got {quant!r}")
        if quant is None and granularity not in (None, "channel"):
            raise ValueError(f"MoE: granularity: goes with quant='fp8', got {granularity!r} with quant=None")
        if quant is not None:
            check_granularity("MoE", granularity, hidden_size, intermediate_size)
        check_route_shapes(  # the grouped top-k's rules (topk_route's), on a stand-in of the router's logits
            "MoE", moe._meta(torch.empty(1, num_experts, device="meta")), top_k, scoring, renormalize, None,
            num_groups, top_groups,
        )  # fmt: skip
        if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
            raise TypeError(f"MoE: routed_scaling_factor: expected a number, got {routed_scaling_factor!r}")
        self.num_groups, self.top_groups = num_groups, top_groups
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.hidden_size, self.intermediate_size, self.num_experts = hidden_size, intermediate_size, num_experts
        self.top_k, self.scoring, self.renormalize, self.activation = top_k, scoring, renormalize, activation
        self.quant, self.granularity = quant, None if quant is None else granularity
        self.ep_group, self.ep_size, self.ep_rank = ep_group, *_ep_world(ep_group)
        self.num_local_experts = _ep.experts_per_rank(num_experts, self.ep_size)
        self.expert_offset = self.ep_rank * self.num_local_experts
        self.ep_overlap_tokens = _ep.OVERLAP_TOKENS
        local = self.num_local_experts
        factory = dict(device=device, dtype=dtype)
        self.gate = _Router(hidden_size, num_experts, bias=False, **factory)
        if correction_bias:  # DeepSeek-V3's: added to the scores to choose the experts, not to their weights
            self.gate.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
        shape1 = (local, 2 * intermediate_size, hidden_size)
        shape2 = (local, hidden_size, intermediate_size)
        if quant is None:
            self.w1 = torch.nn.Parameter(torch.empty(shape1, **factory))
            self.w2 = torch.nn.Parameter(torch.empty(shape2, **factory))
            self.register_buffer("w1_scale", None)  # (None: not in a state_dict)
            self.register_buffer("w2_scale", None)
        else:
            scale1, scale2 = expert_scale_shapes(granularity, local, hidden_size, intermediate_size)
            self.register_buffer("w1", torch.empty(shape1, device=device, dtype=_FP8))
            self.register_buffer("w2", torch.empty(shape2, device=device, dtype=_FP8))
            self.register_buffer("w1_scale", torch.empty(scale1, device=device, dtype=torch.float32))
            self.register_buffer("w2_scale", torch.empty(scale2, device=device, dtype=torch.float32))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each expert's projections initialized as ``nn.Linear``'s weights are: uniform within 1 / sqrt(fan_in)
        (fp8: drawn in float32 one expert at a time, then quantized)."""
        self.gate.reset_parameters()
        if self.quant is None:
            for w in (self.w1, self.w2):
                bound = 1 / math.sqrt(w.shape[2]) if w.shape[2] else 0.0
                torch.nn.init.uniform_(w, -bound, bound)
            return
        hidden, inter, device = self.hidden_size, self.intermediate_size, self.w1.device

        def uniform(rows, cols):
            bound = 1 / math.sqrt(cols) if cols else 0.0
            return torch.empty(rows, cols, device=device).uniform_(-bound, bound)

        for e in range(self.num_local_experts):
            self._store_expert(e, uniform(inter, hidden), uniform(inter, hidden), uniform(hidden, inter))

    @classmethod
    def from_hf(
        cls,
        state_dict,
        top_k: int,
        prefix: str = "",
        *,
        scoring: str = "softmax",
        renormalize: bool = True,
        quant: str | None = None,
        granularity: str | None = None,
        device=None,
        dtype=None,
        ep_group=None,
        num_groups: int | None = None,
        top_groups: int | None = None,
        routed_scaling_factor: float = 1.0,
    ) -> MoE:
        """A MoE of a Hugging Face block's weights (:meth:`load_hf_state_dict`'s layouts): E and H from
        ``gate.weight``, I from the first expert's gate projection; on the device and in the dtype of
        ``gate.weight`` unless given (fp8 experts stay fp8). Mixtral: ``top_k=2``; Qwen3-MoE: ``top_k=8``,
        ``renormalize`` its ``norm_topk_prob``. fp8 experts (DeepSeek-V3's checkpoints) load as they are, with
        ``quant="fp8"`` and ``granularity="block"``; ``quant="fp8"`` quantizes float experts (``granularity``
        "channel" unless given) where the module is (on the GPU for ``device="cuda"``). Nothing is initialized
        before the checkpoint is written (``torch.nn.utils.skip_init``). ``ep_group``: this rank's experts only
        (their keys alone are read: a rank's ``state_dict`` may hold just those and the router). DeepSeek-V3 (its
        config's values): ``top_k=8, scoring="sigmoid", num_groups=8`` (``n_group``), ``top_groups=4``
        (``topk_group``), ``routed_scaling_factor=2.5``; its router's ``gate.e_score_correction_bias`` is loaded where
        the checkpoint has one."""
        gate = _hf_tensor(state_dict, prefix + "gate.weight", None)
        if gate.dim() != 2:
            raise ValueError(
                f"MoE.from_hf: {prefix}gate.weight: expected a 2-D (num_experts, hidden) tensor, got shape"
                f" {tuple(gate.shape)}"
            )
        experts, hidden = gate.shape
        world, rank = _ep_world(ep_group)
        offset = rank * _ep.experts_per_rank(experts, world)  # the first local expert
        gate_name = _hf_expert_names(state_dict, prefix, offset)[0]
        first = _hf_tensor(state_dict, f"{prefix}experts.{offset}.{gate_name}.weight", None)
        if first.dtype == _FP8:  # DeepSeek-V3's 128 x 128 block scales
            quant, granularity = quant or "fp8", granularity or "block"
        module = torch.nn.utils.skip_init(
            cls, hidden, first.shape[0], experts, top_k, scoring, renormalize,
            device=gate.device if device is None else device, dtype=gate.dtype if dtype is None else dtype,
            quant=quant, granularity=granularity or "channel", ep_group=ep_group, num_groups=num_groups,
            top_groups=top_groups, routed_scaling_factor=routed_scaling_factor,
            correction_bias=prefix + _CORRECTION_BIAS in state_dict,
        )  # fmt: skip
        module.load_hf_state_dict(state_dict, prefix)
        return module

    @torch.no_grad()
    def load_hf_state_dict(self, state_dict, prefix: str = "") -> None:
        """Loads a Hugging Face MoE block's weights: ``{prefix}gate.weight`` (E, H) and per expert e
        ``{prefix}experts.{e}.gate_proj.weight`` (I, H), ``up_proj`` (I, H) and ``down_proj`` (H, I) (Qwen2/3-MoE,
        DeepSeek; ``prefix`` e.g. ``"model.layers.0.mlp."``) or Mixtral's ``w1`` (gate), ``w3`` (up) and ``w2``
        (down) (``"model.layers.0.block_sparse_moe."``): ``w1[e]`` the gate rows then the up rows, ``w2[e]`` the
        down projection, converted to the module's dtype and device (``quant="fp8"``: quantized there, as
        :meth:`quantized` does). DeepSeek-V3's fp8 experts (float8_e4m3fn, each with ``..._proj.weight_scale_inv``
        float32 (ceil(N / 128), ceil(K / 128)): the block scales it is multiplied by, despite the name) are copied
        as they are into a ``quant="fp8"``, ``granularity="block"`` module, the up's scale rows after the gate's
        (I a multiple of 128, so that neither's blocks straddle the other's). Every key is checked (present, of its
        shape and dtype) before anything is written; other keys (a shared expert, its gate) are not read. With an
        ``ep_group`` the local experts' keys only (``experts.{expert_offset + e}.``)."""
        experts, hidden, inter = self.num_experts, self.hidden_size, self.intermediate_size
        offset = self.expert_offset
        names = _hf_expert_names(state_dict, prefix, offset)
        router = _hf_tensor(state_dict, prefix + "gate.weight", (experts, hidden))
        correction = None
        if hasattr(self.gate, "e_score_correction_bias") or prefix + _CORRECTION_BIAS in state_dict:
            if not hasattr(self.gate, "e_score_correction_bias"):
                raise ValueError(
                    f"MoE: {prefix}{_CORRECTION_BIAS}: the checkpoint's router has a correction bias (DeepSeek-V3's);"
                    " expected a MoE built with correction_bias=True (MoE.from_hf builds one)"
                )
            correction = _hf_tensor(state_dict, prefix + _CORRECTION_BIAS, (experts,), False)
        first = f"{prefix}experts.{offset}.{names[0]}.weight"
        fp8 = state_dict[first].dtype == _FP8
        if fp8:
            self._check_fp8_checkpoint(first)
        shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
        projections = []
        for e in range(offset, offset + self.num_local_experts):
            base = f"{prefix}experts.{e}."
            weights = [_hf_tensor(state_dict, f"{base}{n}.weight", s, fp8) for n, s in zip(names, shapes, strict=True)]
            if fp8:
                blocks = [(-(-rows // BLOCK), -(-cols // BLOCK)) for rows, cols in shapes]
                weights += [
                    _hf_tensor(state_dict, f"{base}{n}.weight_scale_inv", s, False)
                    for n, s in zip(names, blocks, strict=True)
                ]
            projections.append(weights)
        self.gate.weight.copy_(router)
        if correction is not None:
            self.gate.e_score_correction_bias.copy_(correction)
        for e, weights in enumerate(projections):
            if not fp8:
                self._store_expert(e, *weights)
                continue
            gate, up, down, gate_scale, up_scale, down_scale = weights
            rows = inter // BLOCK
            self.w1[e, :inter].copy_(gate)
            self.w1[e, inter:].copy_(up)
            self.w2[e].copy_(down)
            self.w1_scale[e, :rows].copy_(gate_scale)
            self.w1_scale[e, rows:].copy_(up_scale)
            self.w2_scale[e].copy_(down_scale)

    def _check_fp8_checkpoint(self, first: str) -> None:
        """An fp8 checkpoint's block scales fit this module's ``w1_scale`` and ``w2_scale`` as they are."""
        if self.granularity != "block":
            raise ValueError(
                f"MoE: {first}: the checkpoint's experts are float8_e4m3fn with 128 x 128 block scales"
                f" (weight_scale_inv): expected a MoE of quant='fp8', granularity='block' (MoE.from_hf builds one),"
                f" got quant={self.quant!r}, granularity={self.granularity!r}"
            )
        if self.intermediate_size % BLOCK:
            raise ValueError(
                f"MoE: intermediate_size: an fp8 checkpoint's gate and up projections each have their own {BLOCK}-row"
                f" block scales, which stack into w1_scale's 2I / {BLOCK} rows only for I a multiple of {BLOCK}; got"
                f" I = {self.intermediate_size} (H = {self.hidden_size})"
            )

    @torch.no_grad()
    def quantized(self, granularity: str = "channel") -> MoE:
        """This layer with fp8 experts, for inference (a new module; this one is left as it is): each expert's
        weights quantized to e4m3 per output row ("channel"), whole ("tensor") or per 128 x 128 block ("block"),
        each scale the amax / 448 (``flydsl.kernels.quantize.quantize_fp8`` for CUDA weights, the same arithmetic in
        torch elsewhere); the router copied, in its dtype."""
        if self.quant is not None:
            raise ValueError(
                f"MoE.quantized: the layer is already quantized (quant={self.quant!r},"
                f" granularity={self.granularity!r})"
            )
        layer = torch.nn.utils.skip_init(
            type(self), self.hidden_size, self.intermediate_size, self.num_experts, self.top_k, self.scoring,
            self.renormalize, self.activation, device=self.w1.device, dtype=self.gate.weight.dtype, quant="fp8",
            granularity=granularity, ep_group=self.ep_group, **self._routing(),
        )  # fmt: skip
        self._copy_router(layer)
        inter = self.intermediate_size
        for e in range(self.num_local_experts):
            layer._store_expert(e, self.w1[e, :inter], self.w1[e, inter:], self.w2[e])
        return layer

    @torch.no_grad()
    def sharded(self, ep_group) -> MoE:
        """This whole layer split over ``ep_group`` (a new module: the router and this rank's experts, weights and
        scales copied; this one is left as it is), to check an expert-parallel layer against the whole one or to
        split a layer built on one device."""
        if self.ep_group is not None:
            raise ValueError(f"MoE.sharded: the layer is already split over a group of {self.ep_size} ranks")
        layer = torch.nn.utils.skip_init(
            type(self), self.hidden_size, self.intermediate_size, self.num_experts, self.top_k, self.scoring,
            self.renormalize, self.activation, device=self.w1.device, dtype=self.gate.weight.dtype, quant=self.quant,
            granularity=self.granularity, ep_group=ep_group, **self._routing(),
        )  # fmt: skip
        self._copy_router(layer)
        mine = slice(layer.expert_offset, layer.expert_offset + layer.num_local_experts)
        for name in ("w1", "w2", "w1_scale", "w2_scale"):
            if getattr(self, name) is not None:
                getattr(layer, name).copy_(getattr(self, name)[mine])
        return layer

    def _routing(self) -> dict:
        """The routing's keyword arguments of this layer's constructor (a copy routes alike)."""
        return dict(
            num_groups=self.num_groups, top_groups=self.top_groups, routed_scaling_factor=self.routed_scaling_factor,
            correction_bias=hasattr(self.gate, "e_score_correction_bias"),
        )  # fmt: skip

    def _copy_router(self, layer: MoE) -> None:
        """The router's weights (and correction bias) and the overlap threshold copied into ``layer``."""
        layer.gate.weight.copy_(self.gate.weight)
        if hasattr(self.gate, "e_score_correction_bias"):
            layer.gate.e_score_correction_bias.copy_(self.gate.e_score_correction_bias)
        layer.ep_overlap_tokens = self.ep_overlap_tokens

    def _store_expert(self, e: int, gate: Tensor, up: Tensor, down: Tensor) -> None:
        """Expert e's float projections, (I, H), (I, H) and (H, I), written: converted to the module's dtype, or
        quantized on its device (the gate and up rows together: a scale may span both)."""
        inter = self.intermediate_size
        if self.quant is None:
            self.w1[e, :inter].copy_(gate)
            self.w1[e, inter:].copy_(up)
            self.w2[e].copy_(down)
            return
        device = self.w1.device
        _quantize_into(torch.cat([gate.to(device), up.to(device)]), self.granularity, self.w1[e], self.w1_scale[e])
        _quantize_into(down.to(device), self.granularity, self.w2[e], self.w2_scale[e])

    def extra_repr(self) -> str:
        quant = "" if self.quant is None else f", quant={self.quant}, granularity={self.granularity}"
        if self.ep_group is not None:
            last = self.expert_offset + self.num_local_experts
            quant += f", ep rank {self.ep_rank} of {self.ep_size}: experts [{self.expert_offset}, {last})"
        if self.num_groups is not None:
            quant += f", num_groups={self.num_groups}, top_groups={self.top_groups}"
        if hasattr(self.gate, "e_score_correction_bias"):
            quant += ", correction_bias=True"
        if self.routed_scaling_factor != 1.0:
            quant += f", routed_scaling_factor={self.routed_scaling_factor}"
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size},"
            f" num_experts={self.num_experts}, top_k={self.top_k}, scoring={self.scoring},"
            f" renormalize={self.renormalize}{quant}"
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"MoE: x: expected a last dim of {self.hidden_size}, got shape {tuple(x.shape)}")
        rows = x.reshape(-1, self.hidden_size)
        if self.ep_group is not None:
            return self._forward_expert_parallel(x, rows)
        logits = self.gate(rows.to(self.gate.weight.dtype))
        if x.is_cuda and x.dtype in _MOE_DTYPES:
            weights, ids = self._route(logits, kernels=True)
            out = moe.fused_moe.call(
                rows, self.w1, self.w2, weights, ids, self.activation, self.quant, self.granularity, self.w1_scale,
                self.w2_scale,
            )  # fmt: skip
        else:  # the same definition in float32 torch
            from flydsl.kernels.moe.reference import dequantize_experts, fused_moe_reference

            w1, w2 = self.w1, self.w2
            if self.quant is not None:  # the weights the fp8 values and their scales stand for, exactly
                w1 = dequantize_experts(w1, self.w1_scale, self.granularity)
                w2 = dequantize_experts(w2, self.w2_scale, self.granularity)
            weights, ids = self._route(logits, kernels=False)
            out = fused_moe_reference(rows, w1, w2, weights, ids, activation=self.activation).to(x.dtype)
        return out.view(x.shape)

    def _route(self, logits: Tensor, kernels: bool) -> tuple[Tensor, Tensor]:
        """(weights, ids) of the router's logits: ``topk_route`` (the kernel, or its float32 reference) with this
        layer's scoring, renormalization, correction bias and grouped top-k, the weights times
        ``routed_scaling_factor``."""
        bias = getattr(self.gate, "e_score_correction_bias", None)
        options = (self.scoring, self.renormalize, bias, self.num_groups, self.top_groups)
        if kernels:  # FlyOp.call: the op without the dispatcher where nothing traces it (flydsl.torch._registry.eager)
            weights, ids = moe.topk_route.call(logits, self.top_k, *options)
        else:
            from flydsl.kernels.moe.reference import topk_route_reference

            names = ("scoring", "renormalize", "bias", "num_groups", "top_groups")
            weights, ids = topk_route_reference(logits, self.top_k, **dict(zip(names, options, strict=True)))
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        return weights, ids

    def _forward_expert_parallel(self, x: Tensor, rows: Tensor, mark=None) -> Tensor:
        """``forward`` over ``ep_group``: the routing here, the experts where they live
        (:func:`flydsl.torch.expert_parallel.expert_parallel_moe`), the same kernels or references as ``forward``.
        ``mark(name)`` where given: called after the routing ("route") and at expert_parallel_moe's phases (the
        benchmark's CUDA events)."""
        logits = self.gate(rows.to(self.gate.weight.dtype))
        if x.is_cuda and x.dtype in _MOE_DTYPES:
            weights, ids = self._route(logits, kernels=True)

            def experts(received: Tensor, slot_weights: Tensor, local_ids: Tensor) -> Tensor:
                return moe.fused_moe.call(
                    received, self.w1, self.w2, slot_weights, local_ids, self.activation, self.quant,
                    self.granularity, self.w1_scale, self.w2_scale,
                )  # fmt: skip

            partial_dtype = x.dtype
        else:
            from flydsl.kernels.moe.reference import dequantize_experts, fused_moe_reference

            w1, w2 = self.w1, self.w2
            if self.quant is not None:
                w1 = dequantize_experts(w1, self.w1_scale, self.granularity)
                w2 = dequantize_experts(w2, self.w2_scale, self.granularity)
            weights, ids = self._route(logits, kernels=False)

            def experts(received: Tensor, slot_weights: Tensor, local_ids: Tensor) -> Tensor:
                return fused_moe_reference(received, w1, w2, slot_weights, local_ids, activation=self.activation)

            partial_dtype = torch.float32
        if mark is not None:
            mark("route")
        out = _ep.expert_parallel_moe(
            rows.contiguous(), weights, ids, experts, per_rank=self.num_local_experts, group=self.ep_group,
            partial_dtype=partial_dtype, overlap_tokens=self.ep_overlap_tokens, mark=mark,
        )  # fmt: skip
        return out.to(x.dtype).view(x.shape)


def _ep_world(group) -> tuple[int, int]:
    """(world, rank) of an expert-parallel ``group``; (1, 0) for None (every expert on this rank)."""
    if group is None:
        return 1, 0
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError("MoE: ep_group: torch.distributed is not initialized (init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


def _quantize_into(w: Tensor, granularity: str, out: Tensor, scale: Tensor) -> None:
    """One expert's (N, K) float weight quantized to e4m3 into ``out`` and ``scale`` (its slot of ``w1_scale`` or
    ``w2_scale``): by ``flydsl.kernels.quantize.quantize_fp8`` on CUDA, elsewhere by torch ops with its arithmetic
    (scale ``amax * (1 / 448)``, values times ``448 / max(amax, 1e-30)`` clamped to +-448 and rounded to nearest
    even: a zero row or block gets scale 0 and zeros; per block :func:`~flydsl.kernels.quantize.api.quantize_blocks`,
    the GPU's own)."""
    per = _QUANTIZER[granularity]
    slot = scale.view(-1, 1) if per == "token" else scale  # quantize_fp8's shapes: (N, 1), (), per block
    if w.numel() == 0:
        slot.zero_()
        return
    if w.is_cuda:
        from flydsl.kernels.quantize import quantize_fp8

        quantize_fp8(w if w.dtype in DTYPES else w.float(), per, out=out, scales=slot)
        return
    from flydsl.kernels.quantize.api import quantize_blocks
    from flydsl.kernels.quantize.kernels import FP8_MAX, TINY

    w = w.float()
    if per == "block":
        values, scales = quantize_blocks(w, _FP8, "e4m3")
    else:
        fp8_max = FP8_MAX["e4m3"]
        amax = w.abs().amax(dim=1, keepdim=True) if per == "token" else w.abs().amax()
        scales = amax * (1.0 / fp8_max)
        inverse = torch.full_like(amax, fp8_max) / amax.clamp(min=TINY)
        values = (w * inverse).clamp(-fp8_max, fp8_max).to(_FP8)
    out.copy_(values)
    slot.copy_(scales.view(slot.shape))


def _hf_expert_names(state_dict, prefix: str, expert: int = 0) -> tuple[str, str, str]:
    """The (gate, up, down) projection names of the checkpoint's experts, from ``expert``'s keys (an
    expert-parallel rank's first)."""
    for names in _HF_EXPERT_NAMES:
        if f"{prefix}experts.{expert}.{names[0]}.weight" in state_dict:
            return names
    tried = " nor ".join(f"{prefix}experts.{expert}.{names[0]}.weight" for names in _HF_EXPERT_NAMES)
    raise KeyError(
        f"MoE: found neither {tried} (the first expert's gate projection, Qwen-MoE/DeepSeek's or Mixtral's naming)"
    )


def _hf_tensor(state_dict, key: str, shape, fp8: bool | None = None) -> Tensor:
    """``state_dict[key]``, of ``shape`` where given; float8_e4m3fn where ``fp8``, of no fp8 dtype where it is
    False (fp8 values are never converted: they mean nothing without their scales)."""
    if key not in state_dict:
        expected = "" if shape is None else f" (a {tuple(shape)} tensor)"
        raise KeyError(f"MoE: missing {key}{expected}")
    t = state_dict[key]
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"MoE: {key}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if fp8 and t.dtype != _FP8:
        raise ValueError(f"MoE: {key}: expected float8_e4m3fn (the first expert's gate projection is), got {t.dtype}")
    if fp8 is False and t.dtype in _FP8_DTYPES:
        raise ValueError(f"MoE: {key}: expected a float tensor that is not fp8, got {t.dtype}")
    return t

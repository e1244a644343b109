"""The MoE kernels on small layers under compute-sanitizer (not a pytest module): from the repository root, on a GPU,

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m tests.kernels.moe_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.moe_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.moe_sanitize 0 2  # some cases

Each case routes random logits (topk_route), then runs fused_moe (align_tokens' one- and three-launch paths, the
gather, both grouped GEMM stages with 64- and 128-row tiles and 2-CTA clusters, the combine, dropped ids; bf16, fp8
per channel on both routes, block-scaled fp8) and checks the output against the float32 reference (of the
dequantized weights). Exits non-zero when a result differs.
"""

from __future__ import annotations

import sys

import torch

from flydsl.kernels.moe import fused_moe, topk_route
from flydsl.kernels.moe.reference import dequantize_experts, fused_moe_reference
from flydsl.kernels.quantize import quantize_fp8

# (tokens, experts, top_k, hidden, intermediate, drop, quant): 64-row tiles; 128-row tiles and align's three launches;
# 2-CTA clusters with I not a multiple of the tile; ids of other ranks dropped; fp8 per channel (decode route, then
# the warp-specialized stages with dropped ids); block-scaled fp8 (64-row tiles, then 2-CTA clusters)
CASES = [
    (37, 16, 4, 256, 128, False, None),
    (3000, 8, 2, 256, 256, False, None),
    (2200, 4, 2, 256, 200, False, None),
    (300, 32, 8, 512, 128, True, None),
    (8, 16, 4, 256, 128, False, "channel"),
    (300, 32, 8, 512, 128, True, "channel"),
    (37, 16, 4, 256, 128, False, "block"),
    (3000, 8, 2, 256, 256, False, "block"),
]


def _quantized(w, granularity):
    """(w8, scales) of experts' weights (E, N, K) per output channel or per 128 x 128 block."""
    if granularity == "channel":
        w8, scales = quantize_fp8(w.reshape(-1, w.shape[2]), "token")
        return w8.view(w.shape), scales.view(w.shape[:2])
    w8, scales = zip(*(quantize_fp8(w[e], "block") for e in range(w.shape[0])), strict=True)
    return torch.stack(w8), torch.stack(scales)


def main(argv=None) -> int:
    """Runs every case, or those whose indices into CASES are given."""
    torch.manual_seed(0)
    chosen = [int(i) for i in (sys.argv[1:] if argv is None else argv)]
    unknown = [i for i in chosen if not 0 <= i < len(CASES)]
    if unknown:  # running nothing would read as a clean sanitizer run
        print(f"moe_sanitize: no cases {unknown}: expected indices 0..{len(CASES) - 1}", file=sys.stderr)
        return 2
    failures = 0
    for i, (tokens, experts, top_k, hidden, inter, drop, quant) in enumerate(CASES):
        if chosen and i not in chosen:
            continue
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        w1 = (torch.randn(experts, 2 * inter, hidden, device="cuda") / hidden**0.5).bfloat16()
        w2 = (torch.randn(experts, hidden, inter, device="cuda") / inter**0.5).bfloat16()
        routed = 4 * experts if drop else experts  # dropping: this rank holds a quarter of the experts
        weights, ids = topk_route(torch.randn(tokens, routed, device="cuda"), top_k)
        if drop:
            ids = torch.where(ids < experts, ids, torch.full_like(ids, -1))
        out = torch.full_like(x, float("nan"))
        options, tolerance = {}, 2e-2
        if quant is not None:  # x and h rounded to fp8 on the way too
            (w1, s1), (w2, s2) = _quantized(w1, quant), _quantized(w2, quant)
            options = dict(quant="fp8", granularity=quant, w1_scale=s1, w2_scale=s2)
            tolerance = 8e-2
        fused_moe(x, w1, w2, weights, ids, out=out, **options)
        torch.cuda.synchronize()
        if quant is not None:
            w1, w2 = dequantize_experts(w1, s1, quant), dequantize_experts(w2, s2, quant)
        reference = fused_moe_reference(x, w1, w2, weights, ids)
        error = float((out.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-6))
        ok = error < tolerance and not torch.isnan(out).any()
        verdict = "ok" if ok else "WRONG"
        shape = f"T {tokens} E {experts} k {top_k} H {hidden} I {inter} drop={drop} quant={quant}"
        print(f"{shape}: {verdict} ({error:.1e})")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

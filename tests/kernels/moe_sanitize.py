"""The MoE kernels on small layers under compute-sanitizer (not a pytest module): from the repository root, on a GPU,

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m tests.kernels.moe_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.moe_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.moe_sanitize 0 2  # some cases

Each case routes random logits (topk_route), then runs fused_moe (align_tokens' one- and three-launch paths, the
gather, both grouped GEMM stages with 64- and 128-row tiles and 2-CTA clusters, the combine, dropped ids) and checks
the output against the float32 reference. Exits non-zero when a result differs.
"""

from __future__ import annotations

import sys

import torch

from flydsl.kernels.moe import fused_moe, topk_route
from flydsl.kernels.moe.reference import fused_moe_reference

# (tokens, experts, top_k, hidden, intermediate, drop): 64-row tiles; 128-row tiles and align's three launches; 2-CTA
# clusters with I not a multiple of the tile; ids of other ranks dropped
CASES = [
    (37, 16, 4, 256, 128, False),
    (3000, 8, 2, 256, 256, False),
    (2200, 4, 2, 256, 200, False),
    (300, 32, 8, 512, 128, True),
]


def main(argv=None) -> int:
    """Runs every case, or those whose indices into CASES are given."""
    torch.manual_seed(0)
    chosen = [int(i) for i in (sys.argv[1:] if argv is None else argv)]
    unknown = [i for i in chosen if not 0 <= i < len(CASES)]
    if unknown:  # running nothing would read as a clean sanitizer run
        print(f"moe_sanitize: no cases {unknown}: expected indices 0..{len(CASES) - 1}", file=sys.stderr)
        return 2
    failures = 0
    for i, (tokens, experts, top_k, hidden, inter, drop) in enumerate(CASES):
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
        fused_moe(x, w1, w2, weights, ids, out=out)
        torch.cuda.synchronize()
        reference = fused_moe_reference(x, w1, w2, weights, ids)
        error = float((out.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-6))
        ok = error < 2e-2 and not torch.isnan(out).any()
        verdict = "ok" if ok else "WRONG"
        print(f"T {tokens} E {experts} k {top_k} H {hidden} I {inter} drop={drop}: {verdict} ({error:.1e})")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

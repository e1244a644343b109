"""A mixture-of-experts layer, end to end, with ``flydsl.kernels.moe`` (docs/moe.md).

A Mixtral-shaped layer scaled down (8 experts, top 2, hidden 1024, intermediate 2048; ``--experts``, ``--top-k``,
``--hidden``, ``--inter`` change it): random router and expert weights in bf16, then for a prefill batch (512 tokens)
and a decode batch (4 tokens)

1. the router's logits ``x @ router.T`` and each token's experts and weights (``topk_route``: softmax, top k,
   renormalized),
2. the experts (``fused_moe``: align, the two grouped GEMMs with the gate fused into the first, the combine; a decode
   batch takes the weight-streaming route),
3. a check against the float32 definition (``flydsl.kernels.moe.reference.fused_moe_reference``) and the time of one
   call (CUDA events, median of 20).

Without a GPU the example compiles the kernels both routes launch for sm_90a and summarizes them.

    python examples/moe.py                      # CPU: compile and summarize; GPU: run both batches and check them
    python examples/moe.py --experts 64 --top-k 8 --hidden 2048 --inter 768
"""

from __future__ import annotations

import argparse
import re
import sys

import flydsl.compiler as flyc

PREFILL_TOKENS, DECODE_TOKENS = 512, 4
TOLERANCE = 2e-2  # max |out - ref| / max |ref|: bf16 inputs, a bf16 intermediate (seen: ~5e-3)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024, help="H, a multiple of 8")
    parser.add_argument("--inter", type=int, default=2048, help="I, a multiple of 8")
    return parser.parse_args(argv)


def run_on_gpu(args) -> int:
    import torch

    from flydsl.kernels.moe import fused_moe, topk_route
    from flydsl.kernels.moe.decode import decodes
    from flydsl.kernels.moe.reference import fused_moe_reference

    E, k, H, inter = args.experts, args.top_k, args.hidden, args.inter
    torch.manual_seed(0)
    router = (torch.randn(E, H, device="cuda") / H**0.5).bfloat16()
    w1 = (torch.randn(E, 2 * inter, H, device="cuda") / H**0.5).bfloat16()  # each expert's gate rows, then its up rows
    w2 = (torch.randn(E, H, inter, device="cuda") / inter**0.5).bfloat16()
    failures = 0
    for tokens in (PREFILL_TOKENS, DECODE_TOKENS):
        x = torch.randn(tokens, H, device="cuda").bfloat16()
        weights, ids = topk_route(x @ router.t(), k)
        out = fused_moe(x, w1, w2, weights, ids)
        reference = fused_moe_reference(x, w1, w2, weights, ids)
        error = float((out.float() - reference).abs().max() / reference.abs().max())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            fused_moe(x, w1, w2, weights, ids, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        route = "decode (grouped skinny GEMM)" if decodes(tokens, tokens * k, E) else "prefill (warp-specialized)"
        used = ids.unique().numel()
        ok = error <= TOLERANCE
        failures += not ok
        print(
            f"T {tokens:4d}: {route}, {used} of {E} experts, {sorted(times)[10]:.1f} us,"
            f" error {error:.1e} {'ok' if ok else 'WRONG'}"
        )
    return 1 if failures else 0


def compile_only(args) -> int:
    """The kernels of both routes, compiled for sm_90a over TensorSpecs of this layer's shapes, summarized."""
    from flydsl.kernels.gemm.epilogue import Epilogue
    from flydsl.kernels.gemm.operands import MatrixSpec
    from flydsl.kernels.gemm.plan import plan_grouped
    from flydsl.kernels.gemm.skinny import SkinnyVariant
    from flydsl.kernels.gemm.skinny_grouped import (
        GroupedMode,
        choose_grouped_skinny_config,
        skinny_gemm_grouped_kernel,
    )
    from flydsl.kernels.moe.api import align_capacity
    from flydsl.kernels.moe.experts import combine_kernel, experts_config, gather_kernel

    E, k, H, inter = args.experts, args.top_k, args.hidden, args.inter
    S = flyc.TensorSpec
    modules = []
    cfg = experts_config(PREFILL_TOKENS * k, E)
    capacity = align_capacity(PREFILL_TOKENS * k, E, cfg.block_m)
    for name, a, weights, out, gate in (
        ("stage 1", (capacity, H), (E, 2 * inter, H), (capacity, inter), "silu"),
        ("stage 2", (capacity, inter), (E, H, inter), (capacity, H), None),
    ):
        specs = [MatrixSpec.dense(shape, "bf16") for shape in (a, weights, out)]
        (module,) = plan_grouped(*specs, sms=132, gate=gate, config=cfg.stage1).lower()
        modules.append((f"prefill {name}: gemm_ws_grouped {cfg.stage1.tile_m}x{cfg.stage1.tile_n}", module))
    ids = PREFILL_TOKENS * k
    modules.append(
        (
            "prefill gather",
            gather_kernel.lower(S((PREFILL_TOKENS, H), "bf16"), S((capacity,), "i32"), S((1,), "i32"),
                                S((capacity, H), "bf16"), S((ids,), "i32"), S((1,), "f32"), S((1,), "f32"), k, False),
        )
    )  # fmt: skip
    decode_capacity = align_capacity(DECODE_TOKENS * k, E, 16)
    routing = (S((decode_capacity,), "i32"), S((decode_capacity // 16,), "i32"), S((1,), "i32"))
    for name, a, rows, out, gated, top_k in (
        ("stage 1", (DECODE_TOKENS, H), E * 2 * inter, (decode_capacity, inter), True, k),
        ("stage 2", (decode_capacity, inter), E * H, (decode_capacity, H), False, 0),
    ):
        skinny = choose_grouped_skinny_config(a[1], gated)
        variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
        module = skinny_gemm_grouped_kernel.lower(
            S(a, "bf16"), S((rows, a[1]), "bf16"), S(out, "bf16"), *routing, S((DECODE_TOKENS * k,), "i32"), top_k,
            skinny, variant, GroupedMode(),
        )  # fmt: skip
        modules.append((f"decode {name}: skinny_gemm_grouped_kernel", module))
    modules.append(
        (
            "combine",
            combine_kernel.lower(S((capacity, H), "bf16"), S((ids,), "i32"), S((PREFILL_TOKENS, k), "f32"),
                                 S((PREFILL_TOKENS, k), "i32"), S((PREFILL_TOKENS, H), "bf16"), E, k),
        )
    )  # fmt: skip
    ptxas = flyc.toolchain.find_ptxas()
    for name, module in modules:
        counts = {op: len(re.findall(pattern, module.ptx)) for op, pattern in _OPS.items()}
        shown = ", ".join(f"{op} {n}" for op, n in counts.items() if n)
        assembled = ", assembled for sm_90a" if ptxas is not None and module.cubin else ""
        print(f"{name}: compiled, {len(module.ptx)} bytes of PTX ({shown}){assembled}")
    print("compiled only (run on a GPU machine to run both batches and check them)")
    return 0


_OPS = {  # instructions worth counting in the summary
    "wgmma": r"wgmma\.mma_async",
    "mma.sync": r"mma\.sync\.aligned",
    "TMA loads": r"cp\.async\.bulk\.tensor\.\dd\.shared",
    "16-byte loads": r"ld\.global(\.nc)?(\.L1::no_allocate)?(\.L2::\d+B)?\.v4",
}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.hidden % 8 or args.inter % 8:
        print("moe example: --hidden and --inter must be multiples of 8", file=sys.stderr)
        return 2
    return run_on_gpu(args) if flyc.runtime.is_available() else compile_only(args)


if __name__ == "__main__":
    sys.exit(main())

"""A/B of SkinnyConfig.slice_prefetch (tried 2026-12-05, removed after measuring): fp8 skinny GEMMs (M 1, 16) and
interleaved, next to same-bytes copies (N*K/2 into as many, as the benches; and N*K)."""

import dataclasses
import functools
import statistics
import sys

sys.path.insert(0, "benchmarks")
import fp8_gemm_bench as fb  # noqa: E402
import torch  # noqa: E402
from moe_torch import format_weights  # noqa: E402
from record import cold_timer  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from flydsl.kernels import plans  # noqa: E402
from flydsl.kernels.gemm import Scale, choose_skinny_config, launch_plan  # noqa: E402
from flydsl.kernels.gemm.operands import MatrixSpec  # noqa: E402
from flydsl.kernels.gemm.plan import plan_skinny  # noqa: E402

REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def interleaved(calls: dict, bench) -> dict:
    times = {name: [] for name in calls}
    for _ in range(REPEATS):
        for name, fn in calls.items():
            times[name].append(bench(fn) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def gemm_part():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bench = functools.partial(fb._bench, do_bench=do_bench)
    print(
        f"{'M':>3} {'N':>6} {'K':>6} {'half':>6} {'full':>6} {'base':>6} {'pf':>6}  {'b/half':>6} {'pf/half':>7} {'speedup':>7}"
    )
    for m in (1, 16):
        for n, k in fb.SWEEP_NK:
            a, b = fb._fp8(torch, m, k), fb._fp8(torch, n, k).t()
            sa, sb = torch.rand(m, device="cuda") / 64, torch.rand(n, device="cuda") / 64
            out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
            scales = ((Scale(rows=1), MatrixSpec.of(sa)), (Scale(columns=1), MatrixSpec.of(sb)))
            specs = MatrixSpec.of(a), MatrixSpec.of(b), MatrixSpec.of(out)
            cfg = choose_skinny_config(m, n, k // 2, sms, 1)
            calls = {}
            half = torch.empty(n * k // 2, dtype=torch.uint8, device="cuda"), torch.empty(
                n * k // 2, dtype=torch.uint8, device="cuda"
            )
            full = torch.empty(n * k, dtype=torch.uint8, device="cuda"), torch.empty(
                n * k, dtype=torch.uint8, device="cuda"
            )
            calls["half"] = lambda: half[1].copy_(half[0])
            calls["full"] = lambda: full[1].copy_(full[0])
            outs = {}
            for name, c in (("base", cfg), ("pf", dataclasses.replace(cfg, slice_prefetch=True))):
                plan = plan_skinny(*specs, sms=sms, scales=scales, config=c)
                calls[name] = functools.partial(launch_plan, plan, a, b, out, None, (sa, sb))
                out.fill_(float("nan"))
                calls[name]()
                outs[name] = out.clone()
            assert torch.equal(outs["base"], outs["pf"]), (m, n, k)
            t = interleaved(calls, bench)
            print(
                f"{m:>3} {n:>6} {k:>6} {t['half']:6.1f} {t['full']:6.1f} {t['base']:6.1f} {t['pf']:6.1f}  "
                f"{t['half'] / t['base']:6.3f} {t['half'] / t['pf']:7.3f} {t['base'] / t['pf']:7.3f}",
                flush=True,
            )


MODELS = {"qwen3": (128, 8, 2048, 768), "dsv3-tp8": (256, 8, 7168, 256), "mixtral": (8, 2, 4096, 14336)}


def moe_part():
    import flydsl.kernels.moe.experts as ex
    from flydsl.kernels.moe import fused_moe, topk_route

    base_g, base_c = ex.choose_grouped_skinny_config, ex.choose_combined_config
    variants = {
        "base": (base_g, base_c),
        "pf": (
            lambda *a: dataclasses.replace(base_g(*a), slice_prefetch=True),
            lambda *a: dataclasses.replace(base_c(*a), slice_prefetch=True),
        ),
    }
    timer = cold_timer("dirty")
    for model, (e, k, h, i) in MODELS.items():
        torch.manual_seed(0)
        w1 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16).mul_(h**-0.5)
        w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16).mul_(i**-0.5)
        for fmt in ("fp8", "block", "bf16"):
            wt = format_weights(w1, w2, fmt)
            opts = (
                {}
                if fmt == "bf16"
                else dict(
                    quant="fp8",
                    granularity="channel" if fmt == "fp8" else "block",
                    w1_scale=wt.w1_scale,
                    w2_scale=wt.w2_scale,
                )
            )
            for tokens in (1, 16, 64):
                x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
                tw, ids = topk_route(torch.randn(tokens, e, device="cuda"), k)
                touched = ids.unique().numel()
                nbytes = touched * 3 * h * i * wt.w1.element_size()
                src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
                dst = torch.empty_like(src)
                outs = {}
                for name, (g, c) in variants.items():
                    ex.choose_grouped_skinny_config, ex.choose_combined_config = g, c
                    plans.clear_all()
                    outs[name] = fused_moe(x, wt.w1, wt.w2, tw, ids, **opts).clone()
                # plans are per signature: time each variant in its own block, repeated, alternating
                times = {"copy": [], "base": [], "pf": []}
                for _ in range(REPEATS):
                    times["copy"].append(timer(lambda: dst.copy_(src)) * 1e3)
                    for name, (g, c) in variants.items():
                        ex.choose_grouped_skinny_config, ex.choose_combined_config = g, c
                        plans.clear_all()
                        fused_moe(x, wt.w1, wt.w2, tw, ids, **opts)
                        times[name].append(timer(lambda: fused_moe(x, wt.w1, wt.w2, tw, ids, **opts)) * 1e3)
                t = {n: statistics.median(v) for n, v in times.items()}
                same = torch.equal(outs["base"], outs["pf"])
                print(
                    f"{model:<9} T={tokens:<3} {fmt:<5} copy {t['copy']:6.1f} base {t['base']:6.1f} ({t['copy'] / t['base']:.3f})"
                    f" pf {t['pf']:6.1f} ({t['copy'] / t['pf']:.3f}) speedup {t['base'] / t['pf']:.3f} same={same}",
                    flush=True,
                )
        ex.choose_grouped_skinny_config, ex.choose_combined_config = base_g, base_c


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    if which in ("gemm", "both"):
        gemm_part()
    if which in ("moe", "both"):
        moe_part()

"""The block-scaled GEMM's mainloop variants side by side (docs/tuning/blockscale.md): each variant in a process of its
own (its own kernel cache: the variants differ in module constants the cache key does not see), each shape timed
there next to our rowwise ``fp8_gemm`` and cuBLAS's blockwise ``_scaled_mm``, so that variants compare through those
ratios as well as in TFLOP/s.

    python benchmarks/blockscale_variants.py --variants 128,192,128-serial --json OUT --commit C
    python benchmarks/blockscale_variants.py --variants chosen,128 --m 8192 --json OUT --commit C

Variants: ``chosen`` (``choose_blockscale_config``), ``128`` (its configuration 128 wide, 128 rows in 2-CTA clusters
along M where it chose 256 rows: K steps promoted in pairs), ``192`` (192 wide: one step at a time, the consumers a step
apart), ``256`` (256 x 128 tiles in 2-CTA clusters along N sharing A, as DeepGEMM takes them: each consumer's two 64-row
blocks in turn, the consumers a block apart; ``256-m``: clusters along M; ``256-staged``: 3 stages and four staging
boxes per consumer, its output tile staged whole as DeepGEMM's, instead of 4 stages and one box; ``-unroll`` after
either: two K steps per loop iteration, the default since 7057334, ``-unroll4``: four; without either, one),
``192-unroll`` and ``192-unroll4`` (192 wide, two or four K steps per iteration), ``128-serial`` (128 wide one step at a
time), ``narrow64``, ``narrow32`` and ``narrow16`` (DeepGEMM's tiles at M <= 128: 64 rows and that many columns, one
consumer, no split K, up to 16 stages: one wave of tiles where they fit), and ``-lockstep`` after a step-by-step
variant: without the consumers' offset start. Shapes: issue 33's (N, K) at ``--m`` (default 512 and 4096) and 4096 x
7168 x 16384. Medians of ``--repeats`` do_bench medians (L2 flushed).

A bound (wrong results, the cost of the scales' path): ``/constant`` after a variant (the consumers promote with
factors of 1/2 and read no scales; until f7d447c also ``/nocopy``: the producer's lanes stored the scales instead
of copying them, docs/tuning/blockscale.md#scales-by-tma). DeepGEMM is timed beside where ``deep_gemm`` imports
(``tools/deepgemm-env.sh --env``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

import deepgemm_peer
from blockscale_gemm_bench import shape_arg
from record import geomean, write_record

NK = [(2112, 7168), (24576, 1536), (7168, 2048), (18432, 7168), (4096, 7168), (32768, 512), (7168, 16384)]
VARIANTS = (
    "chosen",
    "128",
    "192",
    "256",
    "256-m",
    "256-staged",
    "256-unroll",
    "256-unroll4",
    "256-staged-unroll",
    "256-staged-unroll4",
    "192-unroll",
    "192-unroll4",
    "narrow64",
    "narrow32",
    "narrow16",
    "128-serial",
    "128-serial-lockstep",
    "192-lockstep",
    "256-lockstep",
)
BOUNDS = ("constant",)  # modifiers after "/": parts of the scales' path left out (wrong results)


def _known(variant: str) -> bool:
    base, *bounds = variant.split("/")
    return base in VARIANTS and all(bound in BOUNDS for bound in bounds)


def _config(variant: str, m: int, n: int, k: int, sms: int):
    from flydsl.kernels.gemm.block_scales import slot_bytes
    from flydsl.kernels.gemm.config import choose_blockscale_config, deepest_pipeline, max_stages

    cfg = choose_blockscale_config(m, n, k, sms)
    variant = variant.split("/")[0]
    width = variant.split("-")[0]
    if width == "256":  # 256 x 128 tiles, each consumer's two 64-row blocks in turn, 2-CTA clusters along N or M
        along = dict(cluster_m=2, cluster_n=1) if variant.endswith("-m") else dict(cluster_m=1, cluster_n=2)
        pipeline = deepest_pipeline(256, 128, slot_bytes(256))
        if "staged" in variant:  # the consumer tile staged whole: four boxes, the stages that fit beside them
            pipeline = dict(stages=max_stages(256, 128, store_boxes=4, slot_extra=slot_bytes(256)), store_boxes=4)
        return dataclasses.replace(
            cfg, tile_m=256, tile_n=128, consumers=2, split_k=1, split_tail=False, stream_k=False, **along, **pipeline
        )
    if width.startswith("narrow"):  # DeepGEMM's tiles at M <= 128: 64 rows, one consumer, no split, deep pipelines
        tile_n = int(width.removeprefix("narrow"))
        stages = max_stages(64, tile_n, store_boxes=1, slot_extra=slot_bytes(64), most=16)
        return dataclasses.replace(
            cfg, tile_m=64, tile_n=tile_n, consumers=1, split_k=1, split_tail=False, stream_k=False, cluster_m=1,
            cluster_n=1, stages=stages, store_boxes=1,
        )  # fmt: skip
    if width != "chosen" and cfg.tile_m == 256:  # 128 rows in 2-CTA clusters along M, as chosen before 256 rows
        cfg = dataclasses.replace(
            cfg, tile_m=128, cluster_m=2, cluster_n=1, **deepest_pipeline(128, 128, slot_bytes(128))
        )
    if width != "chosen" and cfg.tile_n != int(width) and cfg.tile_n >= 128:
        cfg = dataclasses.replace(
            cfg, tile_n=int(width), **deepest_pipeline(cfg.tile_m, int(width), slot_bytes(cfg.tile_m))
        )
    return cfg


def run_variant(variant: str, shapes, repeats: int) -> list:
    """Times ``variant`` on ``shapes`` in this process (its module constants set first)."""
    import torch

    import flydsl.expr as fx
    from flydsl.kernels.gemm import mainloop

    base, *bounds = variant.split("/")
    if "serial" in base:
        mainloop.PAIRED_ACCUMULATORS = 0
    if base.endswith("-lockstep"):
        mainloop.OFFSET_CONSUMERS = False
    if base != "chosen":  # K steps per loop iteration: one, or as the suffix says (chosen: the defaults)
        unroll = {"-unroll": 2, "-unroll4": 4}.get(base[base.rfind("-") :], 1)
        mainloop.WAVES_UNROLL = mainloop.WIDE_UNROLL = unroll
    if "constant" in bounds:  # factors of 1/2 (FFMAs as with scales), no reads (a 192-wide tile takes three per row)
        mainloop.step_factors = lambda scales, stage, rows, sources=1, straddle=None: [
            [fx.Float32(0.5)] * (sources if straddle is None else 3) for _ in rows
        ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in shapes:
        row = _time_shape(torch, variant, _config(variant, m, n, k, sms), m, n, k, repeats)
        rows.append(row)
        print(
            f"{variant:>20} {m}x{n}x{k}: {row['tflops']:7.1f} TFLOP/s, {row['ratio_vs_rowwise']:.3f}x rowwise"
            + (f", {row['ratio_vs_deepgemm']:.3f}x DeepGEMM" if "ratio_vs_deepgemm" in row else ""),
            flush=True,
        )
    return rows


def _time_shape(torch, variant, cfg, m, n, k, repeats) -> dict:
    from blockscale_gemm_bench import _cublas_blockwise, _error, _m_major, operands
    from triton.testing import do_bench

    from flydsl.kernels.gemm import blockscale_gemm, fp8_gemm

    a, w, a_scales, w_scales, reference = operands(torch, m, n, k)
    a_scales_m = _m_major(torch, a_scales)
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    blockscale_gemm(a, w.t(), a_scales_m, w_scales, ours, cfg)
    error = _error(ours, reference)
    cublas, _ = _cublas_blockwise(torch, a, w.t(), a_scales, w_scales, reference)
    scale_a, scale_b = torch.rand(m, 1, device="cuda") / 64, torch.rand(1, n, device="cuda") / 64
    rowwise_out = torch.empty_like(ours)
    timed = {
        "ours": lambda: blockscale_gemm(a, w.t(), a_scales_m, w_scales, ours, cfg),
        "rowwise": lambda: fp8_gemm(a, w.t(), scale_a, scale_b, rowwise_out),
    }
    if cublas is not None:
        timed["cublas_blockwise"] = cublas
    dg, _ = deepgemm_peer.load()
    deepgemm_fields = {}
    if dg is not None:
        deepgemm, deepgemm_fields = deepgemm_peer.check(torch, dg, a, w, a_scales, w_scales, reference, _error)
        if deepgemm is not None:
            timed["deepgemm"] = deepgemm
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for name, fn in timed.items():
            runs[name].append(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    del reference
    ms = {name: statistics.median(values) for name, values in runs.items()}
    row = {"m": m, "n": n, "k": k, "variant": variant, "config": str(cfg), "rel_error_vs_f32": error}
    row.update(deepgemm_fields)  # its error against the reference, or why it did not run
    row.update({f"{name}_ms": t for name, t in ms.items()})
    row["tflops"] = 2.0 * m * n * k / ms["ours"] / 1e9
    row["ratio_vs_rowwise"] = ms["rowwise"] / ms["ours"]
    if "cublas_blockwise" in ms:
        row["ratio_vs_cublas"] = ms["cublas_blockwise"] / ms["ours"]
    if "deepgemm" in ms:
        row["ratio_vs_deepgemm"] = ms["deepgemm"] / ms["ours"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="chosen,128,192", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--m", type=int, nargs="*", default=[512, 4096])
    parser.add_argument("--shapes", type=shape_arg, nargs="+", metavar="MxNxK", help="these in place of --m's sweep")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one variant, its rows as JSON on the last line
    args = parser.parse_args(argv)
    shapes = sorted({(m, n, k) for m in args.m for n, k in NK} | {(4096, 7168, 16384)})
    if args.shapes:
        shapes = args.shapes
    if args.one:
        print(json.dumps(run_variant(args.one, shapes, args.repeats)))
        return 0
    variants = args.variants.split(",")
    unknown = [v for v in variants if not _known(v)]
    if unknown:
        parser.error(
            f"--variants: unknown {unknown}; expected some of {', '.join(VARIANTS)}, each with optional"
            f" /{' /'.join(BOUNDS)}"
        )
    rows = []
    for variant in variants:
        command = [sys.executable, __file__, "--one", variant, "--repeats", str(args.repeats), "--m", *map(str, args.m)]
        command += ["--shapes", *("x".join(map(str, shape)) for shape in args.shapes)] if args.shapes else []
        with tempfile.TemporaryDirectory() as cache:
            child = subprocess.run(
                command, env={**os.environ, "FLYDSL_CACHE_DIR": cache}, capture_output=True, text=True
            )
        if child.returncode:
            print(child.stdout + child.stderr, file=sys.stderr)
            return child.returncode
        print(child.stdout.rsplit("\n", 2)[0])
        rows += json.loads(child.stdout.strip().splitlines()[-1])
    summary = {
        variant: {
            "geomean_ratio_vs_rowwise": geomean([r["ratio_vs_rowwise"] for r in rows if r["variant"] == variant]),
            "geomean_ratio_vs_cublas": geomean([r["ratio_vs_cublas"] for r in rows if r["variant"] == variant]),
            "geomean_ratio_vs_deepgemm": geomean(
                [r["ratio_vs_deepgemm"] for r in rows if r["variant"] == variant and "ratio_vs_deepgemm" in r]
            ),
        }
        for variant in variants
    }
    print(json.dumps(summary))
    if args.json:
        method = (
            "each variant in its own process and kernel cache; per shape ours, our rowwise fp8_gemm and cuBLAS's"
            " blockwise _scaled_mm, triton do_bench medians (L2 flushed), median of the repeats"
        )
        write_record(args.json, "blockscale_variants", argv, rows, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

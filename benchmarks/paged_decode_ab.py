"""A/B of paged-decode kernel sources in one process, on the same caches: the working tree's
``flydsl.kernels.attention.decode`` against other versions of ``decode.py`` given as files (an older commit's, ``git
show REV:packages/flydsl-kernels/src/flydsl/kernels/attention/decode.py > exp/decode_REV.py``, carried to the GPU
machine), next to the half copy and a read of the same bytes. Cold (dirty L2 flush), 3 interleaved rounds, medians;
each variant's output is compared with the first's. Run from the repository root on the GPU machine:

    python3 benchmarks/paged_decode_ab.py --variant main=exp/decode_d3d92bc.py@2,4 --json $OUT/ab.json --commit REV

A file variant runs with its own ``DecodeConfig`` (the plan's fields it knows) at the CTAs per SM after its ``@``
(bf16, fp8), else ``--old-ctas`` (main's table at d3d92bc: 4 for fp8, 2 for bf16, D 128); the working tree runs at
its plan's choice and, for fp8, at each of ``--ctas`` as well, with splits sized for ``--fills`` of the resident
CTAs (fewer splits: less to merge, fewer CTAs streaming), and at the load depths of ``--prefetch`` (``"2@2,3"``: two
chunks ahead, bf16 at 2 and fp8 at 3 CTAs per SM) and with a floor under each split's K+V bytes (``--split-bytes``:
``decode_plan_config``'s ``min_split_bytes``). ``--grid MODEL[,MODEL]`` (with ``--batches``) takes
``paged_attention_bench.py``'s sweep, pages of 16, in place of the 8 fixed caches. The record's summary: each
variant's geomean speedup over the first, per cache kind (all caches, the long ones of B * context >= 64K tokens,
the short ones, the worst), each variant's least fraction of a read over the long caches, and per fp8 variant issue
35's fp8-over-bf16 speedup over the long caches (against bf16 as the plan runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import statistics
import sys

import torch
from cold_l2 import bench_cold
from paged_attention_bench import BATCHES, CONTEXTS, LONG_TOKENS, Shape, kv_bytes, quantize_fp8, shapes
from read_roofline import reader
from record import geomean, write_record

from flydsl.kernels.attention import api, decode
from flydsl.kernels.plans import ScratchPlan

CASES = [("llama3-70b-tp8", 8, 8192, 16), ("llama3-70b-tp8", 1, 131072, 16), ("llama3-70b-tp8", 32, 32768, 16),
         ("llama3-8b", 8, 8192, 16), ("llama3-8b", 32, 8192, 16), ("llama3-8b", 128, 512, 16),
         ("llama3-8b", 32, 8192, 64), ("llama3-70b-tp8", 8, 8192, 64)]  # fmt: skip


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"decode_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the kernel decorator reads its module's globals
    spec.loader.exec_module(module)
    return module


class _PlanWith(api._Plan):
    """The plan's launch with another decode module in place of the package's."""

    module = None

    def launch(self, *args):
        saved = api._decode
        api._decode = lambda: self.module
        try:
            super().launch(*args)
        finally:
            api._decode = saved


def runner(module, args, scales, out, context, ctas_per_sm, fill=1.0, prefetch=None, split_bytes=None):
    q, k, v, tables, lens = args
    fp8 = k.dtype == torch.float8_e4m3fn
    kind = None if not fp8 else ("token" if scales["k_scale"].numel() > 1 else "tensor")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = None
    if fill != 1.0:  # the splits sized for this fraction of the resident CTAs
        table = api._CTAS_PER_SM.get((q.shape[-1], fp8, q.shape[-2] // k.shape[2] <= 8), 2)
        ctas = max(1, round(sms * (ctas_per_sm or table) * fill))
    cfg, splits, split_tokens = api.decode_plan_config(
        batch=q.shape[0], heads=q.shape[-2], kv_heads=k.shape[2], dim=q.shape[-1], queries=1, q_dtype="bf16",
        kv_dtype="e4m3" if fp8 else "bf16", k_scale=kind, v_scale=kind, sliding_window=None, soft_cap=False,
        max_context=context, sms=sms, block_size=k.shape[1], ctas_per_sm=ctas_per_sm, ctas=ctas, prefetch=prefetch,
        min_split_bytes=split_bytes,
    )  # fmt: skip
    if module is not decode:
        cfg = module.DecodeConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(module.DecodeConfig)})
    plan = _PlanWith(cfg, splits, split_tokens, q.shape[-1] ** -0.5, 0.0, 0, fp8, 0, None, None)
    plan.module = module
    scratch = ScratchPlan(plan.scratch, plan.launch)
    return (lambda: scratch(q, k, v, tables, lens, scales["k_scale"], scales["v_scale"], out)), splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", default=[], help="NAME=PATH[@BF16_CTAS,FP8_CTAS] of a decode.py")
    parser.add_argument("--kinds", default="bf16,fp8,fp8-token")
    parser.add_argument("--ctas", default="3,4", help="fp8: CTAs per SM the working tree also runs at")
    parser.add_argument("--old-ctas", default="2,4", help="bf16,fp8 CTAs per SM of the file variants")
    parser.add_argument(
        "--prefetch", default="", help="the working tree also at these load depths, DEPTH[@BF16_CTAS,FP8_CTAS];..."
    )
    parser.add_argument("--fills", default="0.5", help="the working tree also with splits for these fractions")
    parser.add_argument(
        "--split-bytes", default="", help="the working tree also with splits of at least these K+V bytes (comma list)"
    )
    parser.add_argument(
        "--grid", help="instead of the fixed cases: paged_attention_bench's sweep of these models (pages of 16)"
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="the grid's batch sizes")
    parser.add_argument("--json")
    parser.add_argument("--commit", help="the commit measured (the GPU machine has no git)")
    options = parser.parse_args()
    files, file_ctas = {}, {}
    for variant in options.variant:  # NAME=PATH[@BF16_CTAS,FP8_CTAS]
        name, path = variant.split("=", 1)
        path, _, ctas = path.partition("@")
        files[name] = load(name, path)
        file_ctas[name] = [int(n) for n in (ctas or options.old_ctas).split(",")]
    rows = []
    cases = (
        CASES
        if not options.grid
        else [(*s, 16) for s in shapes(options.grid.split(","), [int(b) for b in options.batches.split(",")], CONTEXTS)]
    )
    for model, batch, context, block_size in cases:
        shape = Shape(model, batch, context, block_size, False, 0)
        for kv in options.kinds.split(","):
            if kv == "bf16":
                k, v, scales = shape.k, shape.v, {"k_scale": None, "v_scale": None}
            else:
                k, ks = quantize_fp8(shape.k, per_token=kv == "fp8-token")
                v, vs = quantize_fp8(shape.v, per_token=kv == "fp8-token")
                scales = {"k_scale": ks, "v_scale": vs}
            variants = {name: (module, file_ctas[name][kv != "bf16"], 1.0, None) for name, module in files.items()}
            variants["tree"] = (decode, None, 1.0, None)
            if kv != "bf16":
                variants |= {f"tree_c{n}": (decode, int(n), 1.0, None) for n in options.ctas.split(",") if n}
            variants |= {f"tree_sb{n}": (decode, None, 1.0, None, int(n)) for n in options.split_bytes.split(",") if n}
            for depth in (d for d in options.prefetch.split(";") if d):  # "DEPTH@BF16_CTAS,FP8_CTAS"
                n, _, ctas = depth.partition("@")
                at = int(ctas.split(",")[kv != "bf16"]) if ctas else None
                variants[f"tree_p{n}" + (f"_c{at}" if at else "")] = (decode, at, 1.0, int(n))
            variants |= {f"tree_fill{f}": (decode, None, float(f), None) for f in options.fills.split(",") if f}
            args = (shape.q, k, v, shape.block_tables, shape.context_lens)
            outs, timed, splits = {}, {}, {}
            for name, (module, *how) in variants.items():
                outs[name] = torch.full_like(shape.q, float("nan"))
                timed[name], splits[name] = runner(module, args, scales, outs[name], context, *how)
                timed[name]()
            torch.cuda.synchronize()
            first = next(iter(outs.values())).float()
            diff = max(float((o.float() - first).abs().max()) for o in outs.values())
            nbytes = kv_bytes(shape.tokens, shape.hkv, shape.d, kv)
            source = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            target = torch.empty_like(source)
            timed |= {"copy": functools.partial(target.copy_, source), "read": reader(nbytes)}
            runs = {name: [] for name in timed}
            for _ in range(3):
                for name, fn in timed.items():
                    runs[name].append(bench_cold(fn, warmup=5, rep=30, queued=True) * 1e3)
            row = {"model": model, "batch": batch, "context": context, "block_size": block_size, "kv": kv,
                   "MB": round(nbytes / 1e6, 1), "splits": splits, "max_abs_diff": diff}  # fmt: skip
            row |= {f"{name}_us": round(statistics.median(r), 2) for name, r in runs.items()}
            reference = row[f"{next(iter(variants))}_us"]
            row |= {f"{name}_speedup": round(reference / row[f"{name}_us"], 3) for name in variants}
            row |= {f"{name}_of_read": round(row["read_us"] / row[f"{name}_us"], 3) for name in variants}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del k, v, source, target
        del shape
        torch.cuda.empty_cache()
    # Each variant against the first, geomean per cache kind (the variants' names may differ by kind), over all
    # caches and, apart, over the long ones (B * context >= 64K tokens, issue 35's bars) and the short ones; the worst
    # case; each variant's least fraction of a read over the long caches.
    summary = {}
    for kv in options.kinds.split(","):
        of_kind = [r for r in rows if r["kv"] == kv]
        names = [key.removesuffix("_speedup") for key in of_kind[0] if key.endswith("_speedup")] if of_kind else []
        long = [r for r in of_kind if r["batch"] * r["context"] >= LONG_TOKENS]
        short = [r for r in of_kind if r["batch"] * r["context"] < LONG_TOKENS]
        for name in names[1:]:
            summary[f"geomean_speedup_{name}_{kv}"] = geomean([r[f"{name}_speedup"] for r in of_kind])
            summary[f"min_speedup_{name}_{kv}"] = min(r[f"{name}_speedup"] for r in of_kind)
            for part, part_rows in (("long", long), ("short", short)):
                if part_rows:
                    summary[f"geomean_speedup_{name}_{kv}_{part}"] = geomean([r[f"{name}_speedup"] for r in part_rows])
        for name in names:
            if long:
                summary[f"min_of_read_long_{name}_{kv}"] = min(r[f"{name}_of_read"] for r in long)
    # issue 35's fp8 bar per variant: bf16 as the plan runs it over the variant's fp8 time, long caches
    bf16 = {(r["model"], r["batch"], r["context"], r["block_size"]): r["tree_us"] for r in rows if r["kv"] == "bf16"}
    for kv in ("fp8", "fp8-token"):
        of_kind = [r for r in rows if r["kv"] == kv and r["batch"] * r["context"] >= LONG_TOKENS]
        paired = [r for r in of_kind if (r["model"], r["batch"], r["context"], r["block_size"]) in bf16]
        variants = (
            [k.removesuffix("_us") for k in paired[0] if k.startswith("tree") and k.endswith("_us")] if paired else []
        )
        for name in variants:
            ratios = [bf16[(r["model"], r["batch"], r["context"], r["block_size"])] / r[f"{name}_us"] for r in paired]
            summary[f"{kv}_over_bf16_long_{name}"] = geomean(ratios)
    print(json.dumps(summary))
    if options.json:
        method = "cold_l2.bench_cold (dirty L2 flush, queued), 3 interleaved rounds of warmup 5 / rep 30, medians"
        write_record(
            options.json, "paged_decode_ab", None, rows, commit=options.commit, method=method, summary=summary,
            variants=options.variant,
        )  # fmt: skip


if __name__ == "__main__":
    main()

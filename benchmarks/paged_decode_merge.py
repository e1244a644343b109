"""paged_decode's two merges of a split context side by side (docs/tuning/attention.md#merge): per case the decode
kernel's partials merged by the split that finishes last (``last``) and by the dependent merge kernel (``kernel``),
each for every split count, and the default choice (the merge kernel past ``MERGE_FANIN`` splits), timed
interleaved next to a same-bytes half copy and a read of the bytes (``read_roofline.py``).

    python benchmarks/paged_decode_merge.py --json OUT --commit C
    python benchmarks/paged_decode_merge.py --cases llama3-70b-tp8:8:8192:fp8,llama3-8b:1:32768:bf16

A case is ``model:batch:context:kv`` (models and KV kinds of ``paged_attention_bench.py``, pages of 16 tokens, every
context equal). The three outputs are compared with each other (relative error; a case fails over 1e-2). Timing:
record.cold_timer (do_bench's loop, L2 flushed, queued behind a sleep), the five interleaved ``--repeats`` times,
medians. ``kernel_speedup`` = last / kernel; the summary's ``default_vs_best_geomean`` is the geomean of the faster
merge's time over the default's (1.0: the default always picks the faster).
"""

from __future__ import annotations

import argparse
import statistics

from paged_attention_bench import KV_KINDS, MODELS, Shape, caches, kv_bytes
from read_roofline import reader
from record import cold_timer, error_text, geomean, write_record

CASES = [
    f"{model}:{batch}:{context}:{kv}"
    for model, batch, context in (
        ("llama3-70b-tp8", 8, 8192),
        ("llama3-70b-tp8", 1, 131072),
        ("llama3-70b-tp8", 128, 512),
        ("llama3-70b-tp8", 32, 2048),
        ("llama3-70b-tp8", 1, 2048),
        ("llama3-8b", 8, 8192),
        ("llama3-8b", 1, 32768),
    )
    for kv in ("bf16", "fp8")
]
MERGES = {"default": None, "last": "last", "kernel": "kernel"}


def _case(text: str):
    model, batch, context, kv = text.split(":")
    if model not in MODELS or kv not in KV_KINDS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected model:batch:context:kv, model of {list(MODELS)}")
    return model, int(batch), int(context), kv


def run_case(model, batch, context, kv, *, timer, repeats) -> dict:
    import torch

    from flydsl.kernels.attention import api

    shape = Shape(model, batch, context, 16, False, 0)
    k, v, k_scale, v_scale = caches(shape, kv)
    args = (shape.q, k, v, shape.block_tables, shape.context_lens)
    row = {"model": model, "batch": batch, "context": context, "kv": kv}
    row["kv_bytes"] = kv_bytes(shape.tokens, shape.hkv, shape.d, kv)
    timed, outs = {}, {}
    for name, merge in MERGES.items():
        api._MERGE = merge  # read when a plan is made
        try:
            plan = api._make_plan(*args, None, k_scale, v_scale, None, None, None, context)
        finally:
            api._MERGE = None
        outs[name] = torch.full_like(shape.q, float("nan"))
        timed[name] = lambda plan=plan, out=outs[name]: plan(*args, k_scale, v_scale, out)
        timed[name]()
        if name == "default":
            row["splits"], row["default_merge"] = plan.launch.__self__.splits, plan.launch.__self__.cfg.merge
    torch.cuda.synchronize()
    reference = outs["last"].float()
    row["rel_error"] = max(float((o.float() - reference).norm() / reference.norm()) for o in outs.values())
    row["correct"] = row["rel_error"] <= 1e-2 and not any(bool(o.isnan().any()) for o in outs.values())
    source = torch.empty(row["kv_bytes"] // 2, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    timed["copy"] = lambda: target.copy_(source)
    timed["read"] = reader(row["kv_bytes"])
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for name, fn in timed.items():
            runs[name].append(timer(fn) * 1e3)
    for name, values in runs.items():
        row[f"{name}_us"] = statistics.median(values)
    row["kernel_speedup"] = row["last_us"] / row["kernel_us"]
    for name in MERGES:
        row[f"{name}_fraction_of_read"] = row["read_us"] / row[f"{name}_us"]
    return row


def summarize(rows) -> dict:
    ok = [r for r in rows if r.get("correct")]
    return {
        "default_vs_best_geomean": geomean(min(r["last_us"], r["kernel_us"]) / r["default_us"] for r in ok),
        "kernel_speedup_geomean": geomean(r["kernel_speedup"] for r in ok),
        "min_default_fraction_of_read": min((r["default_fraction_of_read"] for r in ok), default=None),
        "cases": len(rows),
        "cases_failed": len(rows) - len(ok),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=lambda t: [_case(c) for c in t.split(",")], default=[_case(c) for c in CASES])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flush", choices=("dirty", "clean"), default="dirty")
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--commit", help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    timer = cold_timer(args.flush)
    rows = []
    print(
        f"{'case':<34} {'splits':>6} {'merge':>6} {'default':>8} {'last':>8} {'kernel':>8} {'read':>8} {'of read':>7}"
    )
    for case in args.cases:
        try:
            row = run_case(*case, timer=timer, repeats=args.repeats)
        except Exception as error:  # noqa: BLE001 (recorded; the sweep goes on)
            row = {"case": ":".join(map(str, case)), "error": error_text(error), "correct": False}
            print(row, flush=True)
            rows.append(row)
            continue
        rows.append(row)
        label = ":".join(map(str, case))
        times = " ".join(f"{row[f'{n}_us']:>8.1f}" for n in ("default", "last", "kernel", "read"))
        print(
            f"{label:<34} {row['splits']:>6} {row['default_merge']:>6} {times} {row['default_fraction_of_read']:>7.3f}"
        )
    summary = summarize(rows)
    print(summary)
    if args.json:
        method = (
            "record.cold_timer (do_bench's loop: L2 flushed before each call, queued behind a sleep), default, last,"
            " kernel, the half copy and read_roofline's read interleaved, medians over repeats; bf16 q (B, Hq, D),"
            " pages of 16 tokens in a random permutation; kernel_speedup = last / kernel; *_fraction_of_read = read /"
            " that merge's time"
        )
        write_record(args.json, "paged_decode_merge", argv, rows, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

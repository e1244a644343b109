"""Fused mixture-of-experts on the local GPU: flydsl.kernels.moe.fused_moe against torch's ``_grouped_mm`` pipeline
(fp8: ``_scaled_grouped_mm``), a loop over experts and (decode) a same-bytes copy, in the same process (issue 34).

    python benchmarks/moe_bench.py --list                                   # the cases, no GPU needed
    python benchmarks/moe_bench.py --commit C --json benchmarks/results/moe/DATE_C.json
    python benchmarks/moe_bench.py --model qwen3-30b-a3b --tokens 1,4096 --quant fp8 --repeats 3

The sweep: Mixtral-8x7B (E 8, top 2, H 4096, I 14336), Qwen3-30B-A3B (E 128, top 8, H 2048, I 768), DeepSeek-V3
per GPU at TP8 (E 256, top 8, H 7168, I 256) and one of its EP8 shards (32 local experts, H 7168, I 2048: tokens
routed top-8 over all 256 experts, the shard's 32 renumbered 0..31, the ids of the other 224 set to -1, which
fused_moe drops), each at T tokens in 1, 16, 64, 256, 1024, 4096, 16384, each in the weight formats of ``--quant``
(default all three): bf16, fp8 (e4m3 weights, one float32 scale per output channel of each expert; x quantized per
token inside the layer) and block (e4m3 weights, one float32 scale per 128 x 128 block of each expert's w1 and w2;
x and h quantized per 1 x 128 group inside the layer: DeepSeek-V3's format). ``--model``, ``--tokens``, ``--quant``
pick a part. Per model: every T in bf16, then in fp8, then in block (the same x and routing at a T: pairs).

Each model: random bf16 weights (w1 (E, 2I, H), gate rows then up rows; w2 (E, H, I)), made once; the fp8 ones from
them by ``quantize_experts`` (per output channel: scale = amax |w| / 448, w8 = e4m3(w / scale), scale 1 for a zero
row), the block ones by ``quantize_expert_blocks`` (``quantize_fp8(w[e], "block")``), each made when its format's
cases begin; the bf16 ones are dropped after the last format is made. Each T: random bf16 x (T, H) and router
logits (T, routed experts) float32, scored by softmax (DeepSeek: sigmoid), top-k by ``torch.topk``, the k weights
renormalized to sum 1: topk_weights float32, topk_ids int32, the same for every implementation (fixed seed). Our
output is poisoned (NaN) and computed once (that first call compiles), every element checked written and up to
``--check-tokens`` tokens (spread over T) checked against ``flydsl.kernels.moe.reference.fused_moe_reference``
(float32; fp8: of the dequantized weights, w8 * scale) on those tokens: error = max |out - ref| / max |ref|, a case
fails over its format's tolerance (bf16 2e-2; fp8 6e-2: x and the hidden activations quantized to e4m3 on top of
the weights; each row records its own) or with an unwritten element and is left out of the summary. The peers are
checked the same way. Then ours, the peers and (decode, T <= 64) the copy are timed interleaved, ``--repeats``
times, each with cold_l2.bench_cold (triton.testing.do_bench's loop: CUDA events, L2 flushed before each call,
median; ``--flush``; queued behind a sleep kernel 1.5x longer than the host takes to queue the call, >= ~100 us:
the host's time stays out, its own per call recorded as ``ours_host_us``), the medians over the repeats kept.

Everything from topk_ids to the (T, H) output is inside the timed region, ours and the peers':

* ``grouped_mm``: a stable ``torch.sort`` of the flattened ids, ``offs`` (int32 cumulative rows per expert) by
  ``torch.searchsorted``, the rows of x gathered in that order, ``torch._grouped_mm(x_sorted, w1.transpose(1, 2),
  offs=offs)``, ``silu(gate) * up``, ``torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)``, then each row times
  its weight added into a float32 (T, H) by ``index_add_`` and cast to bf16. Where ids can be dropped (the EP
  shard) the kept count is read on the host (one synchronization) so that only kept rows are gathered and computed;
  elsewhere the pipeline never waits on the GPU. fp8: the same sort, but x is quantized per token first (amax of
  the row / 448, divided, cast to e4m3: the same rows and scales as quantizing the gathered rows, k times less
  work) and its e4m3 rows and scales gathered; ``torch._scaled_grouped_mm(a8, w1_8.transpose(1, 2),
  scale_a=(M,) float32, scale_b=w1_scale (E, 2I), offs=offs, out_dtype=bf16)`` (rowwise scaling: row scales of
  the 2-D operand, per-expert column scales of the 3-D one), ``silu(gate) * up`` in bf16, h quantized per row
  the same way, ``torch._scaled_grouped_mm(h8, w2_8.transpose(1, 2), scale_a, scale_b=w2_scale (E, H), offs)``,
  the same float32 combine. block: the fp8 pipeline on the same weights quantized per output channel (torch has no
  block-scaled grouped GEMM): the fp8 work torch offers, not the same numerics.
* ``loop`` (bf16 only, T <= 1024): one expert at a time, its (token, slot) pairs found by ``nonzero`` (a
  synchronization per expert), two matmuls, ``silu(gate) * up``, the weighted rows added into a float32 (T, H) by
  ``index_add_``. Skipped for fp8: it stands for the naive way, which the bf16 rows already time, and
  dequantizing the weights to run it would time the bf16 loop again.

Metrics: TFLOP/s of the layer, 2 * (kept ids) * (2I * H + H * I) FLOPs; for decode, the touched experts' weight
bytes (distinct experts routed to x ``expert_bytes``: bf16 3 * I * H x 2 bytes, fp8 3 * I * H x 1 byte plus the
float32 scales, (2I + H) x 4) over our time, as ``fraction_of_copy`` = the time of a copy moving as many bytes
(``copy_`` of half of them into as many: bytes read plus written) / ours, ``fraction_of_read_copy`` the same for a
``copy_`` of all of them, ``fraction_of_read`` for a kernel only reading them (``read_roofline.py``) (``COPIES``);
ratio_vs_X = X's time / ours (> 1: ours faster). The summary: per format the geomean ratios (prefill: T in 1024,
4096, 16384), ``fp8_speedup_over_bf16_ours`` (over those prefill cases, our bf16 time / our fp8 time, same model
and T) and the two stages' TFLOP/s at T = 16384 per format;
``block_vs_fp8_geomean`` (over the prefill cases, our fp8 time / our block time: the block scales' promotion's cost).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from typing import NamedTuple

from moe_torch import (
    Weights,
    exact_weights,
    expert_bytes,
    format_weights,
    grouped_mm_moe,
    loop_moe,
    scaled_grouped_mm_moe,
)
from read_roofline import reader
from record import Sweep, cell, cold_timer, csv_list, error_text, failure_note, geomean, new_record


class Model(NamedTuple):
    experts: int  # the experts this GPU holds: w1 and w2's E
    top_k: int
    hidden: int
    inter: int
    routed_experts: int  # the experts the router chooses among (> experts: one expert-parallel shard)
    scoring: str  # "softmax" or "sigmoid"


MODELS = {
    "mixtral-8x7b": Model(8, 2, 4096, 14336, 8, "softmax"),
    "qwen3-30b-a3b": Model(128, 8, 2048, 768, 128, "softmax"),
    "deepseek-v3-tp8": Model(256, 8, 7168, 256, 256, "sigmoid"),
    "deepseek-v3-ep8": Model(32, 8, 7168, 2048, 256, "sigmoid"),
}
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
# the weights' formats: bf16, e4m3 with float32 scales per output channel ("fp8") or per 128 x 128 block ("block")
QUANTS = ("bf16", "fp8", "block")
PEERS = ("grouped_mm", "loop")
PREFILL_TOKENS = (1024, 4096, 16384)  # the summary's prefill geomean
DECODE_TOKENS = 64  # T <= this: decode, timed against a same-bytes copy
# decode's copies, peer -> (field, touched bytes per copied byte): why a second one, docs/tuning/moe.md#decode
COPIES = {"copy": ("fraction_of_copy", 2), "copy_read": ("fraction_of_read_copy", 1), "read": ("fraction_of_read", 1)}
LOOP_TOKENS = 1024  # the loop peer at T <= this only (it is slow)
SUMMARY_TOKENS = 16384  # the summary's per-model TFLOP/s
CHECK_TOKENS = 4096  # tokens checked against the float32 reference (it is slow on Mixtral's large experts)
TOLERANCE = 2e-2  # max |out - ref| / max |ref| of a bf16 output against the float32 reference
# fp8: x and h are quantized to e4m3 (3 mantissa bits) on top of the weights, which the reference does not model
TOLERANCES = {"bf16": TOLERANCE, "fp8": 6e-2, "block": 6e-2}
EP_RANK = 0  # the expert-parallel shard measured: its experts are [rank * E, (rank + 1) * E) of the routed ones
DEVICE = "cuda"


def cases(models, tokens, quants):
    """Every case, in the order run: (model, T, quant); per model one format's T after the other's, so that only
    one format's weights need exist at a time."""
    return [(m, t, q) for m in models for q in quants for t in tokens]


def layer_flops(kept_ids: int, hidden: int, inter: int) -> int:
    """The FLOPs of the two expert GEMMs over ``kept_ids`` (token, slot) pairs: 2 * (2I * H + H * I) each."""
    return 2 * kept_ids * (2 * inter * hidden + hidden * inter)


def checked_tokens(tokens: int, count: int) -> list[int]:
    """Up to ``count`` tokens, spread over the T (the first and the last among them)."""
    if tokens <= count:
        return list(range(tokens))
    if count == 1:
        return [0]
    return sorted({round(i * (tokens - 1) / (count - 1)) for i in range(count)})


def route(model: Model, tokens: int, *, device, rank: int = EP_RANK):
    """``(topk_weights float32 (T, k), topk_ids int32 (T, k))`` of random router logits: softmax or sigmoid scores,
    ``torch.topk``, the k weights renormalized. For an expert-parallel shard (``model.experts`` <
    ``model.routed_experts``) the ids of shard ``rank``'s experts are renumbered from 0 and the others set to -1;
    the weights stay those of the full top-k (the other shards add their part)."""
    import torch

    logits = torch.randn(tokens, model.routed_experts, device=device, dtype=torch.float32)
    scores = torch.softmax(logits, dim=-1) if model.scoring == "softmax" else torch.sigmoid(logits)
    weights, ids = torch.topk(scores, model.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    if model.experts < model.routed_experts:
        local = ids - rank * model.experts
        ids = torch.where((local >= 0) & (local < model.experts), local, torch.full_like(local, -1))
    return weights.float().contiguous(), ids.to(torch.int32).contiguous()


def routing_counts(topk_ids, experts: int) -> tuple[int, int]:
    """``(kept ids, distinct experts routed to)`` of ``topk_ids``, ids outside ``[0, experts)`` not counted."""
    import torch

    kept = topk_ids[(topk_ids >= 0) & (topk_ids < experts)]
    return int(kept.numel()), int(torch.unique(kept).numel())


def summarize(results) -> dict:
    """The record's summary from the rows that ran and passed the check (None where no row qualifies); the speed
    ratios and the stages' TFLOP/s per weight format; ``fp8_speedup_over_bf16_ours`` pairs our bf16 and fp8 rows
    of the same model and T (prefill); ``layer_tflops_at_16384`` is bf16's (the earlier records' key)."""
    ok = [r for r in results if r.get("ours_us") is not None and r.get("correct")]
    quants = [q for q in QUANTS if any(r.get("quant") == q for r in results)]

    def vs(peer, rows):
        return geomean(r[f"{peer}_us"] / r["ours_us"] for r in rows if r.get(f"{peer}_us") is not None)

    def per_quant(peer, rows):
        return {q: vs(peer, [r for r in rows if r["quant"] == q]) for q in quants}

    prefill = [r for r in ok if r["tokens"] in PREFILL_TOKENS]
    tflops, stages = {}, {}
    for r in ok:
        if r["tokens"] != SUMMARY_TOKENS:
            continue
        if r["quant"] == "bf16":
            tflops[r["model"]] = {p: r.get(f"{p}_tflops") for p in ("ours", *PEERS) if f"{p}_tflops" in r}
        stage = {s: r[f"{s}_tflops"] for s in ("stage1", "stage2") if f"{s}_tflops" in r}
        stages.setdefault(r["quant"], {})[r["model"]] = stage
    bf16_us = {(r["model"], r["tokens"]): r["ours_us"] for r in prefill if r["quant"] == "bf16"}
    fp8_speedup = geomean(
        bf16_us[r["model"], r["tokens"]] / r["ours_us"]
        for r in prefill
        if r["quant"] == "fp8" and (r["model"], r["tokens"]) in bf16_us
    )
    fp8_us = {(r["model"], r["tokens"]): r["ours_us"] for r in prefill if r["quant"] == "fp8"}
    block_vs_fp8 = geomean(
        fp8_us[r["model"], r["tokens"]] / r["ours_us"]
        for r in prefill
        if r["quant"] == "block" and (r["model"], r["tokens"]) in fp8_us
    )
    return {
        "prefill_geomean_vs_grouped_mm": per_quant("grouped_mm", prefill),
        "fp8_speedup_over_bf16_ours": fp8_speedup,
        "block_vs_fp8_geomean": block_vs_fp8,
        **{
            f"decode_min_{f}": min((r[f] for r in ok if r.get(f) is not None), default=None) for f, _ in COPIES.values()
        },
        "layer_tflops_at_16384": tflops,
        "stage_tflops_at_16384": stages,
        "geomean_vs_grouped_mm": per_quant("grouped_mm", ok),
        "geomean_vs_loop": per_quant("loop", ok),
        "max_rel_error": max((r["rel_error"] for r in ok), default=None),
        "cases": len(results),
        "cases_failed": sum(1 for r in results if not r.get("correct")),
    }


def rel_errors(x, ref) -> tuple[float, float]:
    """``(max |x - ref| / max |ref|, ||x - ref|| / ||ref||)``; NaN in x gives NaN (which fails every check). A
    zero reference (a token routed to no local expert) is matched only by zeros."""
    x, ref = x.float(), ref.float()
    diff = x - ref
    tiny = 1e-30
    worst = diff.abs().max().item() / max(ref.abs().max().item(), tiny)
    return worst, diff.norm().item() / max(ref.norm().item(), tiny)


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _free():
    import torch

    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def grouped_mm_status(quants=("bf16",)):
    """What the grouped_mm peer runs on for the formats ``quants``: torch's version and ops, or why it is not
    measured (each row records its own error too)."""
    import torch

    ops = {"bf16": "_grouped_mm", "fp8": "_scaled_grouped_mm", "block": "_scaled_grouped_mm"}
    wanted = list(dict.fromkeys(ops[q] for q in quants))
    present = [op for op in wanted if hasattr(torch, op)]
    missing = [op for op in wanted if not hasattr(torch, op)]
    if not present:
        return f"not measured: torch {torch.__version__} has no {', '.join(missing)}"
    text = f"torch {torch.__version__} {', '.join(present)}"
    return text + (f" (no {', '.join(missing)}: not measured)" if missing else "")


def make_weights(model: Model, seed: int):
    """w1 (E, 2I, H) and w2 (E, H, I) bf16, random, scaled by 1 / sqrt(fan-in) so that the layer's values stay
    near 1."""
    import torch

    torch.manual_seed(seed)
    e, h, i = model.experts, model.hidden, model.inter
    w1 = torch.randn(e, 2 * i, h, device=DEVICE, dtype=torch.bfloat16).mul_(h**-0.5)
    w2 = torch.randn(e, h, i, device=DEVICE, dtype=torch.bfloat16).mul_(i**-0.5)
    return w1, w2


def _copy(torch, nbytes: int, name: str):
    """A ``copy_`` of ``nbytes`` into as many (on a GPU for ``"read"`` a read of them), named ``name``."""
    if name == "read" and DEVICE == "cuda":
        return reader(nbytes)
    source, target = (torch.empty(nbytes, dtype=torch.uint8, device=DEVICE) for _ in range(2))
    copy = functools.partial(target.copy_, source)
    copy.__name__ = name
    return copy


def run_case(name, model, weights: Weights, tokens, quant, *, seed, timer, repeats, check_tokens, peers):
    """One row: routing, the checks, then ours, the peers and (decode) the copy timed interleaved. ``weights``: the
    model's in format ``quant`` (``format_weights``)."""
    import torch

    from flydsl.kernels.moe import fused_moe
    from flydsl.kernels.moe.reference import fused_moe_reference

    if quant not in QUANTS:
        raise ValueError(f"unknown weight format {quant!r}")
    began = time.perf_counter()
    torch.manual_seed(seed)
    x = torch.randn(tokens, model.hidden, device=DEVICE, dtype=torch.bfloat16)
    topk_weights, topk_ids = route(model, tokens, device=DEVICE)
    kept, touched = routing_counts(topk_ids, model.experts)
    row = {
        "model": name,
        "experts": model.experts,
        "routed_experts": model.routed_experts,
        "top_k": model.top_k,
        "hidden": model.hidden,
        "inter": model.inter,
        "tokens": tokens,
        "quant": quant,
        "kept_ids": kept,
        "touched_experts": touched,
        "flops": layer_flops(kept, model.hidden, model.inter),
        "touched_bytes": touched * expert_bytes(model.hidden, model.inter, quant),
        "tolerance": TOLERANCES[quant],
    }
    w1, w2 = weights.w1, weights.w2
    args = (x, w1, w2, topk_weights, topk_ids)
    out = torch.full((tokens, model.hidden), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    fp8 = {}
    if quant != "bf16":
        granularity = "channel" if quant == "fp8" else "block"
        fp8 = {"quant": "fp8", "granularity": granularity, "w1_scale": weights.w1_scale, "w2_scale": weights.w2_scale}

    def ours():
        return fused_moe(*args, **fp8, out=out)

    try:
        ours()
        _sync()
    except Exception as error:  # noqa: BLE001 (recorded; the sweep goes on)
        row.update(error=error_text(error), correct=False, wall_s=time.perf_counter() - began)
        return row
    rows = checked_tokens(tokens, check_tokens)
    row["unwritten"] = int(torch.isnan(out).sum())
    row["checked_tokens"] = len(rows)  # of tokens: fewer where the reference would take long
    index = torch.tensor(rows, device=DEVICE)
    try:
        reference = fused_moe_reference(x[index], *exact_weights(weights), topk_weights[index], topk_ids[index])
        row["rel_error"], row["rel_fro_error"] = rel_errors(out[index], reference)
    except Exception as error:  # noqa: BLE001 (recorded: the case is then not counted, but still timed)
        reference, row["rel_error"], row["check_error"] = None, None, error_text(error)
    row["correct"] = row["unwritten"] == 0 and row["rel_error"] is not None and row["rel_error"] <= row["tolerance"]

    timed = {"ours": ours}
    drops = model.experts < model.routed_experts

    def grouped_mm():
        if quant != "bf16":  # block: torch's per-channel fp8 pipeline (it has no block-scaled grouped GEMM)
            peer = weights if quant == "fp8" else weights.channel
            return scaled_grouped_mm_moe(
                x, peer.w1, peer.w2, peer.w1_scale, peer.w2_scale, topk_weights, topk_ids, drops=drops
            )
        return grouped_mm_moe(*args, drops=drops)

    def loop():
        return loop_moe(*args)

    candidates = {"grouped_mm": grouped_mm, "loop": loop}
    for peer in peers:
        if peer == "loop" and (tokens > LOOP_TOKENS or quant != "bf16"):  # fp8: see the module's docstring
            continue
        try:
            result = candidates[peer]()
            if reference is not None:
                row[f"{peer}_rel_error"] = rel_errors(result[index], reference)[0]
            timed[peer] = candidates[peer]
        except Exception as error:  # noqa: BLE001 (recorded)
            row[f"{peer}_error"] = error_text(error)
    if "grouped_mm" in timed:
        row["grouped_mm_synchronizes"] = drops
    del reference
    if tokens <= DECODE_TOKENS and row["touched_bytes"]:
        for peer, (_, share) in COPIES.items():
            timed[peer] = _copy(torch, row["touched_bytes"] // share, peer)
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for peer, fn in list(timed.items()):
            if peer not in runs:
                continue
            try:
                runs[peer].append(timer(fn) * 1e3)
            except Exception as error:  # noqa: BLE001 (recorded; without ours the row has no times)
                row[f"{peer}_error" if peer != "ours" else "error"] = error_text(error)
                if peer == "ours":
                    row.update(correct=False, wall_s=time.perf_counter() - began)
                    return row
                del runs[peer]
    for peer, values in runs.items():
        row[f"{peer}_us"] = statistics.median(values)
        if peer not in COPIES:
            row[f"{peer}_tflops"] = row["flops"] / (row[f"{peer}_us"] * 1e-6) / 1e12
    for peer in PEERS:
        if f"{peer}_us" in row:
            row[f"ratio_vs_{peer}"] = row[f"{peer}_us"] / row["ours_us"]  # > 1: ours faster
    if "copy_us" in row:
        row["touched_tbps"] = row["touched_bytes"] / (row["ours_us"] * 1e-6) / 1e12
    for peer, (field, _) in COPIES.items():
        if f"{peer}_us" in row:
            row[field] = row[f"{peer}_us"] / row["ours_us"]
    row["runs_us"] = runs
    if DEVICE == "cuda":  # the host's time to queue one call (not in the GPU times above: issue 31's concern)
        from cold_l2 import host_seconds

        row["ours_host_us"] = min(host_seconds(ours) for _ in range(5)) * 1e6
    if tokens in PREFILL_TOKENS:
        row.update(stage_times(ours, row["kept_ids"], model))
    row["wall_s"] = time.perf_counter() - began
    return row


STAGE_KERNEL = "gemm_ws_grouped"  # the two stages' kernel: stage 1 then stage 2 in each call


def stage_times(fn, kept_ids: int, model: Model, calls: int = 5) -> dict:
    """The two grouped GEMMs' own times in ``calls`` calls of ``fn`` (torch.profiler's CUDA kernel durations, warm
    L2, back to back; medians) and their TFLOP/s: stage 1 2 * ids * 2I * H FLOPs, stage 2 2 * ids * I * H."""
    import torch

    if not torch.cuda.is_available():  # (the CPU tests' runs)
        return {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            fn()
        _sync()
    kernels = [
        e for e in profile.events() if STAGE_KERNEL in e.name and e.device_type == torch.autograd.DeviceType.CUDA
    ]
    kernels.sort(key=lambda e: e.time_range.start)
    if len(kernels) != 2 * calls:
        return {"stage_error": f"expected {2 * calls} {STAGE_KERNEL} kernels in the profile, found {len(kernels)}"}
    times = {}
    for stage, flops in (
        (1, 4 * kept_ids * model.inter * model.hidden),
        (2, 2 * kept_ids * model.inter * model.hidden),
    ):
        us = statistics.median(e.time_range.elapsed_us() for e in kernels[stage - 1 :: 2])
        times[f"stage{stage}_us"] = us
        times[f"stage{stage}_tflops"] = flops / (us * 1e-6) / 1e12
    return times


make_timer = cold_timer  # (a module name: the CPU tests put a fake timer in its place)

HEADER = (
    f"{'model':<16} {'T':>5} {'quant':<5} {'ours us':>9} {'TFLOP/s':>7} {'GMM us':>9} {'vs GMM':>6}"
    f" {'loop us':>9} {'vs loop':>7} {'ofcopy':>6} {'ofread':>6} {'err':>7}"
)


_COLUMNS = (  # the table's measured columns: (key, format, width)
    ("ours_us", ".1f", 9),
    ("ours_tflops", ".1f", 7),
    ("grouped_mm_us", ".1f", 9),
    ("ratio_vs_grouped_mm", ".3f", 6),
    ("loop_us", ".1f", 9),
    ("ratio_vs_loop", ".3f", 7),
    ("fraction_of_copy", ".3f", 6),
    ("fraction_of_read_copy", ".3f", 6),
    ("rel_error", ".1e", 7),
)


def _format(row) -> str:
    columns = " ".join(cell(row, *column) for column in _COLUMNS)
    text = f"{row['model']:<16} {row['tokens']:>5} {row['quant']:<5} {columns}"
    return text + failure_note(row)


def _peers(text):
    return [] if text.strip() == "none" else csv_list(text, str, PEERS)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        type=lambda t: csv_list(t, str, MODELS),
        default=list(MODELS),
        help="comma-separated, of " + ", ".join(MODELS) + " (default all)",
    )
    parser.add_argument("--tokens", type=lambda t: csv_list(t, int), default=list(TOKENS), help="comma-separated T")
    parser.add_argument(
        "--quant", type=lambda t: csv_list(t, str, QUANTS), default=list(QUANTS), help="of " + ", ".join(QUANTS)
    )
    parser.add_argument(
        "--peers", type=_peers, default=list(PEERS), help="comma-separated, of " + ", ".join(PEERS) + ", or none"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--check-tokens",
        type=lambda t: max(1, int(t)),
        default=CHECK_TOKENS,
        help=f"tokens checked against the reference (default {CHECK_TOKENS})",
    )
    parser.add_argument("--flush", choices=("dirty", "clean"), default="dirty", help="the L2 flush (cold_l2.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--json", help="write the results here (again after each case)")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    return parser.parse_args(argv)


METHOD = (
    "cold_l2.bench_cold (triton.testing.do_bench's loop: CUDA events, L2 flushed before each call, median; warmup 10 "
    "ms, rep 40 ms; each call queued behind a sleep kernel longer than the host takes to queue it: GPU time; ours' "
    "host time per call in ours_host_us), ours, the peers and the copies interleaved, median over repeats; routing "
    "from topk_ids to the (T, H) bf16 output inside the timed region; random bf16 x, w1 (E, 2I, H), w2 (E, H, I); "
    "topk_weights float32 and topk_ids int32 from torch.topk of softmax (DeepSeek: sigmoid) scores of random logits, "
    "renormalized; EP shard: ids of the other shards -1; fp8: w1, w2 float8_e4m3fn with float32 scales per output "
    "channel (amax / 448) made from the bf16 ones, fused_moe(quant='fp8', granularity='channel'), x quantized per "
    "token inside; block: float8_e4m3fn with a float32 scale per 128 x 128 block (amax / 448), granularity='block', x "
    "and h quantized per 1 x 128 group inside; its grouped_mm peer the fp8 pipeline on the per-channel weights; "
    "TFLOP/s = 2 * kept ids * 3 * I * H / time; grouped_mm: stable torch.sort of the ids, offs by searchsorted, x rows "
    "gathered, torch._grouped_mm with w.transpose(1, 2), silu(gate) * up, float32 index_add_ combine (EP shard: the "
    "kept count read on the host); fp8 grouped_mm: the same with x quantized per token (amax / 448, e4m3) before the "
    "gather, torch._scaled_grouped_mm(a8, w8.transpose(1, 2), scale_a per row, scale_b (E, N), offs, out_dtype=bf16) "
    "for both GEMMs, h quantized per row between them; loop (bf16, T <= 1024): per expert nonzero, matmuls, float32 "
    "index_add_; decode (T <= 64): touched experts' weight bytes (fp8: 1 byte each plus the scales) / time, "
    "fraction_of_copy = time of a copy_ of half those bytes into as many / ours, fraction_of_read_copy = the same for "
    "a copy_ of all of them; ratio_vs_X = X time / ours; checked: output poisoned with NaN, up to check_tokens tokens "
    "against fused_moe_reference (float32; fp8, block: of the dequantized weights), max |out - ref| / max |ref| <= "
    "2e-2 (bf16) or 6e-2 (fp8, block)"
)


def main(argv=None) -> int:
    args = parse_args(argv)
    todo = cases(args.model, args.tokens, args.quant)
    if args.list:
        for name, tokens, quant in todo:
            model = MODELS[name]
            loop = " loop" if "loop" in args.peers and tokens <= LOOP_TOKENS and quant == "bf16" else ""
            print(f"{name:<16} E={model.experts:<4} k={model.top_k} T={tokens:<6} {quant}{loop}")
        print(f"{len(todo)} cases")
        return 0

    import torch

    status = grouped_mm_status(args.quant) if "grouped_mm" in args.peers else "not measured: --peers"
    print(status, flush=True)
    timer = make_timer(args.flush)
    results = []
    record = new_record(
        "moe_bench",
        argv,
        results,
        commit=args.commit,
        method=METHOD,
        grouped_mm=status,
        peers=args.peers,
        flush=args.flush,
        repeats=args.repeats,
        check_tokens=args.check_tokens,
        tolerance={q: TOLERANCES[q] for q in args.quant},
    )
    sweep = Sweep(record, args.json, _format, summarize)
    print(HEADER, flush=True)
    for model_index, name in enumerate(args.model):
        model = MODELS[name]
        bf16 = weights = None
        try:
            bf16 = make_weights(model, args.seed)
            for quant_index, quant in enumerate(args.quant):
                weights = None  # the previous format's, before the next is made
                _free()
                try:
                    weights = format_weights(*bf16, quant)
                except torch.OutOfMemoryError as error:  # this format's cases are left out, the next may fit
                    results.append({"model": name, "tokens": None, "quant": quant, "correct": False})
                    results[-1]["error"] = error_text(error)
                    print(f"{name} {quant}: {error_text(error)}", flush=True)
                    continue
                finally:
                    if quant_index == len(args.quant) - 1:  # every format is made from bf16: not needed past the last
                        bf16 = None
                for token_index, tokens in enumerate(args.tokens):
                    try:
                        row = run_case(
                            name,
                            model,
                            weights,
                            tokens,
                            quant,
                            # per (model, T), not per case: each format sees the same x and routing at a T
                            seed=args.seed + 1 + model_index * len(args.tokens) + token_index,
                            timer=timer,
                            repeats=args.repeats,
                            check_tokens=args.check_tokens,
                            peers=args.peers,
                        )
                    except torch.OutOfMemoryError as error:
                        row = {"model": name, "tokens": tokens, "quant": quant, "correct": False}
                        row["error"] = error_text(error)
                    finally:
                        _free()
                    sweep.add(row)
        except torch.OutOfMemoryError as error:  # the weights did not fit: the model's cases are left out
            row = {"model": name, "tokens": None, "quant": None, "correct": False, "error": error_text(error)}
            results.append(row)
            print(f"{name}: {error_text(error)}", flush=True)
        finally:
            bf16 = weights = None
            _free()
    sweep.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

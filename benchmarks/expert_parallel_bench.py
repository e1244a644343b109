"""Expert-parallel MoE across GPUs (``flydsl.torch.nn.MoE(ep_group=...)``, NCCL) against one GPU holding every expert
(issue 38). Run under torchrun, one process per GPU; rank 0 prints and writes the record.

    python benchmarks/expert_parallel_bench.py --list --world 8                   # the cases, no GPU needed
    torchrun --nproc-per-node 2 benchmarks/expert_parallel_bench.py --commit C \\
        --json benchmarks/results/expert_parallel/DATE_2xh200_C.json
    torchrun --nproc-per-node 8 benchmarks/expert_parallel_bench.py --model deepseek-v3 --tokens 4096

The sweep: Mixtral-8x7B (E 8, top 2, H 4096, I 14336, softmax) and DeepSeek-V3's routed experts (E 256, top 8, H 7168,
I 2048, sigmoid; its grouped top-k, bias and shared expert left out), EP over every rank (E / world experts each;
Mixtral on 8 GPUs: one each), T tokens per rank in 256, 4096, 16384; bf16. Weights: random, expert e's drawn from
its own seed, so that a rank makes only its own and the one-GPU layer (rank 0) the same ones; random bf16 x per
rank (its own seed), routed by the layer's random router.

Each case, after two warm-up forwards (the kernels compile): correctness, every rank's output gathered to rank 0 and
compared with the one-GPU layer on all ranks' tokens (max |ep - one| / max |one| <= 2e-2: each rank's partial sums
are rounded to bf16 before the float32 sum); then ``--repeats`` forwards of each kind, each after a barrier and a
synchronize, timed by CUDA events on every rank, the slowest rank's time kept per repeat and the median over repeats:

* phases (one exchange, ``ep_overlap_tokens=None``): ``route_us`` (router GEMM and topk_route), ``counts_us`` (the
  count exchange and the one copy of the count matrix to the host: it waits for the routing and for every rank),
  ``dispatch_us`` (the send layout, the gather of x, the two all_to_all_single of rows and ids/weights),
  ``experts_us`` (fused_moe on the rows received), ``combine_us`` (the rows sent back and added in float32);
* ``ep_us``: the forward with one exchange; ``ep_chunked_us``: with two chunks (the second in flight while the first's
  experts run, ``ep_overlap_tokens=1``); ``overlap_gain`` = ep_us / ep_chunked_us (> 1: the chunks pay);
* ``one_gpu_us``: the whole layer (every expert) on rank 0 over all ranks' tokens (world * T), the others idle;
  ``speedup`` = one_gpu_us / min(ep_us, ep_chunked_us) (the same tokens, world GPUs against one), ``efficiency`` =
  speedup / world.

Also per case: the rows sent over all ranks (a token goes once to each rank owning one of its experts) against the
expectation under uniform routing (:func:`expected_destinations`), and the bytes each exchange moves. A case that runs
out of memory is recorded with its error (the one-GPU layer of DeepSeek-V3 at 8 x 16384 tokens needs ~50 GB: its
weights and 1M routed rows).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import NamedTuple

from record import Sweep, cell, csv_list, error_text, failure_note, new_record


class Model(NamedTuple):
    experts: int  # the routed experts, over every rank
    top_k: int
    hidden: int
    inter: int
    scoring: str


MODELS = {
    "mixtral-8x7b": Model(8, 2, 4096, 14336, "softmax"),
    "deepseek-v3": Model(256, 8, 7168, 2048, "sigmoid"),
}
TOKENS = (256, 4096, 16384)  # per rank
PHASES = ("route", "counts", "dispatch", "experts", "combine")
TOLERANCE = 2e-2  # max |ep - one GPU| / max |one GPU|, bf16
WORLDS = (1, 2, 4, 8)


def cases(models, tokens):
    """Every case, in the order run: (model, T per rank)."""
    return [(m, t) for m in models for t in tokens]


def local_experts(model: Model, world: int) -> int:
    """The experts each rank holds: E / world (an error where they do not divide)."""
    if model.experts % world:
        raise ValueError(f"{model.experts} experts do not split over {world} ranks")
    return model.experts // world


def expected_destinations(experts: int, top_k: int, world: int) -> float:
    """The ranks a token goes to on average under uniform routing (top_k distinct experts out of E, E / world a
    rank): world * (1 - C(E - E / world, k) / C(E, k)), the chance that a rank owns none of the k, complemented."""
    per_rank = experts // world
    return world * (1 - math.comb(experts - per_rank, top_k) / math.comb(experts, top_k))


def exchange_bytes(rows: int, model: Model, element_bytes: int = 2) -> dict:
    """The bytes one exchange moves for ``rows`` sent rows (a rank's own included: NCCL copies those locally):
    dispatch the rows of x and their ids and weights (int32 and float32 per slot), combine the partial rows."""
    return {
        "dispatch_bytes": rows * (model.hidden * element_bytes + 8 * model.top_k),
        "combine_bytes": rows * model.hidden * element_bytes,
    }


def layer_flops(kept_ids: int, hidden: int, inter: int) -> int:
    """The FLOPs of the two expert GEMMs over ``kept_ids`` (token, slot) pairs: 2 * (2I * H + H * I) each."""
    return 2 * kept_ids * (2 * inter * hidden + hidden * inter)


def phase_times(marks) -> dict:
    """Microseconds per phase from one forward's ``(name, time_us)`` marks in order: each named phase's time is from
    the mark before it to its own (the first mark is the start, the last the end; "tail": the final cast)."""
    times = {}
    for (_, before), (name, at) in zip(marks, marks[1:], strict=False):
        times[f"{name}_us"] = times.get(f"{name}_us", 0.0) + at - before
    return times


def summarize(results) -> dict:
    """Per model and T: speedup and efficiency against one GPU, the overlap gain, each phase's share of ep_us."""
    summary = {}
    for row in results:
        if not row.get("correct") or row.get("speedup") is None:
            continue
        phases = {p: row[f"{p}_us"] / row["ep_us"] for p in PHASES if row.get(f"{p}_us") is not None}
        summary[f"{row['model']}/T{row['tokens']}"] = {
            "world": row["world"],
            "speedup": row["speedup"],
            "efficiency": row["efficiency"],
            "overlap_gain": row.get("overlap_gain"),
            "phase_share": phases,
        }
    return summary


HEADER = (
    f"{'model':<13} {'W':>2} {'T':>6} {'route':>7} {'counts':>7} {'dispat':>7} {'experts':>8} {'combine':>8}"
    f" {'ep us':>9} {'chunked':>9} {'1 GPU us':>10} {'speedup':>7} {'eff':>5} {'err':>7}"
)
_COLUMNS = (
    ("route_us", ".0f", 7),
    ("counts_us", ".0f", 7),
    ("dispatch_us", ".0f", 7),
    ("experts_us", ".0f", 8),
    ("combine_us", ".0f", 8),
    ("ep_us", ".0f", 9),
    ("ep_chunked_us", ".0f", 9),
    ("one_gpu_us", ".0f", 10),
    ("speedup", ".2f", 7),
    ("efficiency", ".2f", 5),
    ("rel_error", ".1e", 7),
)


def _format(row) -> str:
    columns = " ".join(cell(row, *column) for column in _COLUMNS)
    return f"{row['model']:<13} {row['world']:>2} {row['tokens']:>6} {columns}" + failure_note(row)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        type=lambda t: csv_list(t, str, MODELS),
        default=list(MODELS),
        help="comma-separated, of " + ", ".join(MODELS) + " (default both)",
    )
    parser.add_argument("--tokens", type=lambda t: csv_list(t, int), default=list(TOKENS), help="T per rank")
    parser.add_argument("--repeats", type=int, default=10, help="forwards timed per kind (median kept)")
    parser.add_argument("--no-one-gpu", action="store_true", help="skip the one-GPU layer (its time and the check)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world", type=int, help="--list: the ranks to list for (default WORLD_SIZE, else 8)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit (no GPU, no torch.distributed)")
    parser.add_argument("--json", help="write the results here (rank 0, again after each case)")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    parser.add_argument("--cpu", action="store_true", help="gloo and float32 on the CPU (the tests' small runs)")
    return parser.parse_args(argv)


METHOD = (
    "torchrun, one process per GPU, NCCL; flydsl.torch.nn.MoE(ep_group=WORLD) bf16, E / world experts per rank"
    " (expert e's weights from its own seed), random router and x per rank; two warm-up forwards; every rank's output"
    " gathered to rank 0 and checked against the one-GPU layer (all experts) on all ranks' tokens, max |ep - one| /"
    " max |one| <= 2e-2; timed: each forward after dist.barrier and torch.cuda.synchronize, CUDA events on every"
    " rank, the slowest rank per repeat, median over repeats; phases with one exchange (ep_overlap_tokens=None):"
    " route (router GEMM + topk_route), counts (all_to_all_single of the counts + the one copy to the host),"
    " dispatch (send layout, gather, all_to_all_single of x rows and of ids/weights), experts (fused_moe on the rows"
    " received), combine (all_to_all_single back + float32 index_add_ rank by rank); ep_us one exchange,"
    " ep_chunked_us two chunks with async exchanges (ep_overlap_tokens=1); one_gpu_us: the whole layer on rank 0 over"
    " world * T tokens; speedup = one_gpu_us / min(ep_us, ep_chunked_us), efficiency = speedup / world"
)


class Clock:
    """Marks on the current CUDA stream (events, read after a synchronize) or, on the CPU, the host's clock."""

    def __init__(self, gpu: bool):
        self.gpu = gpu

    def mark(self):
        import torch

        if not self.gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def micros(self, marks) -> list:
        """``(name, mark)`` pairs as ``(name, us since the first)`` (synchronizes)."""
        import torch

        if not self.gpu:
            return [(name, (at - marks[0][1]) * 1e6) for name, at in marks]
        torch.cuda.synchronize()
        return [(name, marks[0][1].elapsed_time(at) * 1e3) for name, at in marks]


def _slowest(values: list[float], device) -> list[float]:
    """Each value's maximum over the ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _sync(gpu: bool):
    import torch
    import torch.distributed as dist

    dist.barrier()
    if gpu:
        torch.cuda.synchronize()


def make_layer(model: Model, group, device, dtype, seed: int):
    """The layer of ``group``'s experts (None: all of them), each expert's weights from its own seed: every rank
    and the one-GPU layer draw the same ones without drawing the others'."""
    import torch

    from flydsl.torch.nn import MoE

    layer = torch.nn.utils.skip_init(
        MoE, model.hidden, model.inter, model.experts, model.top_k, model.scoring, device=device, dtype=dtype,
        ep_group=group,
    )  # fmt: skip
    with torch.no_grad():
        generator = torch.Generator(device=device).manual_seed(seed)
        layer.gate.weight.copy_(torch.randn(layer.gate.weight.shape, device=device, generator=generator))
        layer.gate.weight.mul_(model.hidden**-0.5)
        for e in range(layer.num_local_experts):
            generator.manual_seed(seed * 100_003 + 1 + layer.expert_offset + e)
            w1 = torch.randn(layer.w1.shape[1:], device=device, generator=generator) * model.hidden**-0.5
            w2 = torch.randn(layer.w2.shape[1:], device=device, generator=generator) * model.inter**-0.5
            layer.w1[e].copy_(w1)
            layer.w2[e].copy_(w2)
    return layer


def timed_forward(layer, x, clock: Clock, overlap_tokens) -> dict:
    """One forward of the split layer with its phases marked: phase -> us on this rank, plus ``total_us``."""
    layer.ep_overlap_tokens = overlap_tokens
    marks = [("start", clock.mark())]
    layer._forward_expert_parallel(x, x, mark=lambda name: marks.append((name, clock.mark())))
    marks.append(("tail", clock.mark()))
    times = clock.micros(marks)
    return {**phase_times(times), "total_us": times[-1][1]}


def run_case(name, model, layer, whole, tokens, *, one_gpu, seed, repeats, clock, device, dtype) -> dict:
    """One case on every rank (each makes the same collectives); rank 0's row is the record's. ``one_gpu``: whether
    rank 0 holds the whole layer ``whole`` (the check and the one-GPU time; the same on every rank)."""
    import torch
    import torch.distributed as dist

    from flydsl.torch import expert_parallel as ep

    rank, world = dist.get_rank(), dist.get_world_size()
    row = {"model": name, "world": world, "tokens": tokens, "local_experts": layer.num_local_experts}
    generator = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, model.hidden, device=device, generator=generator).to(dtype)
    with torch.inference_mode():
        for _ in range(2):
            y = layer(x)
        # the rows sent: tokens times the ranks each goes to
        logits = layer.gate(x)
        if clock.gpu:
            _, ids = torch.ops.flydsl.topk_route(logits, model.top_k, model.scoring, True)
        else:
            from flydsl.kernels.moe.reference import topk_route_reference

            _, ids = topk_route_reference(logits, model.top_k, scoring=model.scoring)
        sent = ep.destinations(ids, layer.num_local_experts, world).sum()
        total_sent = sent.reshape(1).to(torch.int64)
        dist.all_reduce(total_sent)
        row["rows_sent"] = int(total_sent)
        row["rows_sent_expected"] = world * tokens * expected_destinations(model.experts, model.top_k, world)
        row.update(exchange_bytes(row["rows_sent"], model, x.element_size()))
        row["flops"] = layer_flops(world * tokens * model.top_k, model.hidden, model.inter)
        # correctness: every rank's output against the one-GPU layer on everyone's tokens
        if one_gpu:
            xs = [torch.empty_like(x) for _ in range(world)]
            ys = [torch.empty_like(y) for _ in range(world)]
            dist.all_gather(xs, x)
            dist.all_gather(ys, y)
            if rank == 0:
                try:
                    expected = whole(torch.cat(xs)).float()
                    error = (torch.cat(ys).float() - expected).abs().max() / expected.abs().max().clamp(min=1e-30)
                    row["rel_error"] = float(error)
                except torch.OutOfMemoryError as error:  # (rank 0 alone: the others go on to the timing)
                    row["check_error"] = error_text(error)
                expected = None
            xs = ys = None
        row["correct"] = "check_error" not in row and row.get("rel_error", 0.0) <= TOLERANCE
        # phases, one exchange
        phases = []
        for _ in range(repeats):
            _sync(clock.gpu)
            times = timed_forward(layer, x, clock, None)
            phases.append(_slowest([times.get(f"{p}_us", 0.0) for p in PHASES] + [times["total_us"]], device))
        for i, phase in enumerate(PHASES):
            row[f"{phase}_us"] = statistics.median(p[i] for p in phases)
        row["ep_us"] = statistics.median(p[-1] for p in phases)
        chunked = []
        for _ in range(repeats):
            _sync(clock.gpu)
            chunked.append(_slowest([timed_forward(layer, x, clock, 1)["total_us"]], device)[0])
        row["ep_chunked_us"] = statistics.median(chunked)
        row["overlap_gain"] = row["ep_us"] / row["ep_chunked_us"]
        layer.ep_overlap_tokens = ep.OVERLAP_TOKENS
        # the one-GPU layer on all ranks' tokens, rank 0 alone
        if one_gpu:
            everything = x.repeat(world, 1) if rank == 0 else None  # as many tokens as all ranks together
            times = []
            for _ in range(repeats):
                _sync(clock.gpu)  # (every rank, also after an error on rank 0: the collectives stay paired)
                if rank == 0 and "one_gpu_error" not in row:
                    try:
                        marks = [("start", clock.mark())]
                        whole(everything)
                        marks.append(("end", clock.mark()))
                        times.append(clock.micros(marks)[-1][1])
                    except torch.OutOfMemoryError as error:
                        row["one_gpu_error"] = error_text(error)
            _sync(clock.gpu)
            everything = None
            if rank == 0 and times:
                row["one_gpu_us"] = statistics.median(times)
                row["speedup"] = row["one_gpu_us"] / min(row["ep_us"], row["ep_chunked_us"])
                row["efficiency"] = row["speedup"] / world
    return row


def _list(args) -> int:
    world = args.world or int(os.environ.get("WORLD_SIZE", "8"))
    todo = cases(args.model, args.tokens)
    for name, tokens in todo:
        model = MODELS[name]
        try:
            local = f"{local_experts(model, world)} experts/rank"
        except ValueError as error:
            local = f"not run: {error}"
        spread = expected_destinations(model.experts, model.top_k, world) if model.experts % world == 0 else 0
        print(
            f"{name:<13} world={world} T={tokens:<6} ({world * tokens} tokens) {local},"
            f" ~{spread:.2f} ranks per token"
        )
    print(f"{len(todo)} cases")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        return _list(args)

    import torch
    import torch.distributed as dist

    from flydsl.torch.expert_parallel import init_process_group

    device = init_process_group(args.cpu)
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    record = new_record(
        "expert_parallel_bench", argv, results, commit=args.commit, method=METHOD, world=world,
        launcher=f"torchrun --nproc-per-node {world}", repeats=args.repeats, tolerance=TOLERANCE,
    )  # fmt: skip
    sweep = Sweep(record, args.json if rank == 0 else None, _format, summarize)
    clock = Clock(gpu)
    if rank == 0:
        print(HEADER, flush=True)
    try:
        for model_index, name in enumerate(args.model):
            model = MODELS[name]
            try:
                local_experts(model, world)
            except ValueError as error:
                if rank == 0:
                    sweep.add({"model": name, "world": world, "tokens": None, "correct": False, "error": str(error)})
                continue
            layer = make_layer(model, dist.group.WORLD, device, dtype, args.seed + model_index)
            whole = None
            if rank == 0 and not args.no_one_gpu:
                try:
                    whole = make_layer(model, None, device, dtype, args.seed + model_index)
                except torch.OutOfMemoryError as error:
                    print(f"{name}: the one-GPU layer: {error_text(error)}", flush=True)
            # every rank must know whether rank 0 has the one-GPU layer (the collectives of the check follow it)
            have = torch.tensor([1.0 if (whole is not None or rank != 0) else 0.0], device=device)
            dist.all_reduce(have, op=dist.ReduceOp.MIN)
            for token_index, tokens in enumerate(args.tokens):
                try:
                    row = run_case(
                        name, model, layer, whole, tokens, one_gpu=bool(have.item()), seed=args.seed + 1 + token_index,
                        repeats=args.repeats, clock=clock, device=device, dtype=dtype,
                    )  # fmt: skip
                except torch.OutOfMemoryError as error:  # (a rank out of memory mid-exchange: the others may hang)
                    row = {"model": name, "world": world, "tokens": tokens, "correct": False}
                    row["error"] = error_text(error)
                if rank == 0:
                    sweep.add(row)
            layer = whole = None
            if gpu:
                torch.cuda.empty_cache()
        if rank == 0:
            sweep.finish()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A mixture-of-experts layer split over GPUs (expert parallelism), checked against the layer on one GPU.

Expert parallelism
------------------
``flydsl.torch.nn.MoE(..., ep_group=group)`` (or ``MoE.from_hf(..., ep_group=group)``, or ``whole.sharded(group)``)
gives each of the group's ranks ``E / world`` of the experts (rank r: experts ``[r * E / world, (r + 1) * E /
world)``) and the whole router. Every rank calls the layer on its own tokens; each token goes to the ranks that own
its experts (``all_to_all_single`` over NCCL, after one exchange of the counts and one copy of the count matrix to the
host), those run ``fused_moe`` on the tokens they received, and the partial rows come back and are added in float32 in
rank order. With enough tokens (``layer.ep_overlap_tokens``) the exchanges go in two chunks, the second in flight
while the first one's experts run. docs/torch.md says more; flydsl/torch/expert_parallel.py has the bookkeeping.

This example: a Mixtral-shaped layer scaled down (8 experts, top 2, hidden 1024, intermediate 2048; ``--experts``,
``--top-k``, ``--hidden``, ``--inter``, ``--tokens`` per rank change it), the same random weights on every rank, each
rank's experts taken by ``sharded``; each rank's own tokens through the split layer and through the whole layer, the
largest relative difference over the ranks printed by rank 0 (bf16 on GPUs: the partial sums' rounding, within 2e-2;
float32 on the CPU: within 1e-5), and on GPUs the time of one forward (CUDA events, median of 10).

    torchrun --nproc-per-node 2 examples/moe_expert_parallel.py        # 1, 2, 4 or 8 GPUs (E divisible by them)
    torchrun --nproc-per-node 8 examples/moe_expert_parallel.py --experts 64 --top-k 8 --hidden 2048 --inter 768
    python examples/moe_expert_parallel.py                             # a world of one (CPU and gloo without a GPU)

Without a GPU every rank runs on the CPU over gloo (float32, the references of flydsl.kernels.moe.reference). The
demo (tools/demo.py) does not list it: it needs torch and a launcher; tests/torch/test_expert_parallel_example.py runs
it on the CPU with a world of one and of two.
"""

from __future__ import annotations

import argparse
import sys

TOLERANCES = {"cuda": 2e-2, "cpu": 1e-5}  # max |split - whole| / max |whole|: bf16 partial sums; float32


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=8, help="E, divisible by the number of ranks")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024, help="H, a multiple of 8")
    parser.add_argument("--inter", type=int, default=2048, help="I, a multiple of 8")
    parser.add_argument(
        "--tokens", type=int, help="tokens per rank, rank r tokens - r (uneven); default 2048 on GPUs, 256 on the CPU"
    )
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU even where there are GPUs")
    return parser.parse_args(argv)


def run(args, device) -> int:
    import torch
    import torch.distributed as dist

    from flydsl.torch.nn import MoE

    rank, world = dist.get_rank(), dist.get_world_size()
    gpu = device.type == "cuda"
    if args.tokens is None:
        args.tokens = 2048 if gpu else 256
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(0)  # the same whole layer on every rank
    whole = MoE(args.hidden, args.inter, args.experts, args.top_k, device=device, dtype=dtype)
    layer = whole.sharded(dist.group.WORLD)
    torch.manual_seed(1 + rank)  # each rank its own tokens, as many as it has
    x = torch.randn(max(args.tokens - rank, 0), args.hidden, device=device, dtype=dtype)
    with torch.inference_mode():
        y = layer(x)
        reference = whole(x)
        error = ((y.float() - reference.float()).abs().max() if x.numel() else torch.zeros((), device=device)).float()
        scale = reference.float().abs().max() if x.numel() else torch.zeros((), device=device)
        # the largest error relative to the largest output over the ranks
        stats = torch.stack([error, scale]).to(device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        relative = float(stats[0] / stats[1].clamp(min=1e-30))
        timing = ""
        if gpu:
            times = []
            for _ in range(12):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dist.barrier()
                start.record()
                layer(x)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            slowest = torch.tensor([sorted(times[2:])[5]], device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            timing = f", one forward {float(slowest):.0f} us (median of 10, the slowest rank)"
    ok = relative <= TOLERANCES[device.type]
    if rank == 0:
        where = f"{world} GPU(s), NCCL, bf16" if gpu else f"{world} CPU process(es), gloo, float32"
        print(
            f"E {args.experts} over {world} rank(s) ({args.experts // world} each), top {args.top_k}, H {args.hidden},"
            f" I {args.inter}, {args.tokens} tokens per rank, {where}: max |split - whole| / max |whole| ="
            f" {relative:.1e} {'ok' if ok else 'WRONG'}{timing}"
        )
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.hidden % 8 or args.inter % 8:
        print("moe_expert_parallel: --hidden and --inter must be multiples of 8", file=sys.stderr)
        return 2
    import torch.distributed as dist

    from flydsl.torch.expert_parallel import init_process_group

    device = init_process_group(args.cpu)
    try:
        if args.experts % dist.get_world_size():
            if dist.get_rank() == 0:
                print(
                    f"moe_expert_parallel: --experts {args.experts} must be divisible by the {dist.get_world_size()}"
                    " ranks",
                    file=sys.stderr,
                )
            return 2
        return run(args, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

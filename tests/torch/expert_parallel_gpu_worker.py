"""One rank of tests/torch/test_expert_parallel_gpu.py, run by torchrun (``--nproc-per-node N``, one GPU each, NCCL):
``nn.MoE(ep_group=...)`` in bf16 against the whole layer on the same weights and this rank's tokens (uneven counts, a
rank with none, skewed routing, top_k 1, one exchange and two chunks, fp8 experts per channel and per block), the same
result on every run, one synchronizing copy to the host per forward (``torch.cuda.set_sync_debug_mode``), and a
world of one equal to the plain module bit for bit. Exits non-zero on the first failure, naming it."""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist

TOLERANCE = 2e-2  # bf16: each rank's partial sums rounded to bf16 before the float32 sum (the whole layer rounds once)
FP8_TOLERANCE = 6e-2  # tests/torch/test_moe_nn_fp8_gpu.py's
H, INTER, E, K = 1024, 512, 16, 4


def relative(got, expected) -> float:
    if expected.numel() == 0:
        return 0.0
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max().clamp(min=1e-30))


def check(name, got, expected, tolerance, world):
    assert got.shape == expected.shape and got.dtype == expected.dtype, f"{name}: {got.shape} {got.dtype}"
    if world == 1:
        assert torch.equal(got, expected), f"{name}: a world of one differs from the plain module"
        return
    error = torch.tensor([relative(got, expected)], device=got.device)
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    assert float(error) <= tolerance, f"{name}: max |ep - whole| / max |whole| = {float(error):.2e} > {tolerance}"


def main() -> int:
    from flydsl.torch.nn import MoE

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    group = dist.group.WORLD
    try:
        with torch.inference_mode():
            torch.manual_seed(0)
            whole = MoE(H, INTER, E, K, device=device, dtype=torch.bfloat16)
            layer = whole.sharded(group)
            torch.manual_seed(1 + rank)
            tokens = 0 if (rank == 1 and world > 1) else 3000 + 97 * rank  # uneven, a rank with none
            x = torch.randn(tokens, H, device=device, dtype=torch.bfloat16)
            expected = whole(x)
            for overlap in (None, 1):
                layer.ep_overlap_tokens = overlap
                y = layer(x)
                check(f"overlap {overlap}", y, expected, TOLERANCE, world)
                assert torch.equal(layer(x), y), f"overlap {overlap}: not the same result twice"
            decode = torch.randn(3, H, device=device, dtype=torch.bfloat16)
            check("decode", layer(decode), whole(decode), TOLERANCE, world)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                layer(x)
            torch.cuda.set_sync_debug_mode("default")
            syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
            assert len(syncs) <= 1, f"{len(syncs)} synchronizing calls in one forward: {syncs}"
            torch.manual_seed(2)
            one = MoE(H, INTER, E, 1, device=device, dtype=torch.bfloat16)
            check("top_k 1", one.sharded(group)(x), one(x), TOLERANCE, world)
            skewed = MoE(H, INTER, E, 2, device=device, dtype=torch.bfloat16)
            skewed.gate.weight.zero_()
            skewed.gate.weight[0].fill_(1.0)
            skewed.gate.weight[1].fill_(0.5)
            positive = x.abs() + 0.1  # every token to experts 0 and 1: rank 0's; the others receive nothing
            check("skewed", skewed.sharded(group)(positive), skewed(positive), TOLERANCE, world)
            for granularity in ("channel", "block"):
                fp8 = whole.quantized(granularity)
                check(f"fp8 {granularity}", fp8.sharded(group)(x), fp8(x), FP8_TOLERANCE, world)
    except AssertionError as error:
        print(f"rank {rank}: FAILED: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"expert parallel over {world} GPU(s): ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Paged decode, end to end: a toy decode loop over a paged KV cache with ``flydsl.kernels.attention``
(docs/attention.md).

Four sequences of a model with 8 query heads, 2 KV heads (grouped-query attention: 4 query heads read each KV head)
and a head size of 128 share one paged cache of 16-token blocks, shape (num_blocks, 16, 2, 128) for the keys and
the same for the values. Blocks are handed out from a shuffled free list as the sequences grow, so each sequence's
block table points at scattered blocks. Each sequence starts from a prompt of its own length (the prompts' keys and
values written by one ``write_kv`` call), then each step of the loop

1. makes the new token's query (B, Hq, D) and its key and value (B, Hkv, D) (random: the layers around attention
   are not the point here),
2. writes the key and value into the cache at each sequence's next slot, ``block_tables[b, pos // 16] * 16 + pos %
   16`` for its position ``pos`` (``write_kv``),
3. attends the query to its sequence's cached keys and values, the new token's included (``paged_decode``), and
4. checks the result against torch's ``scaled_dot_product_attention`` over the same keys and values kept on the side
   as plain contiguous tensors (for the fp8 cache: the values the cache holds, dequantized), then prints the step's
   largest error.

``--fp8`` stores the cache as float8_e4m3fn with one float32 scale per tensor for the keys and one for the values
(the cache holds ``value / scale``). Without a GPU the example compiles the two kernels of a step for sm_90a, as the
loop would launch them, and summarizes them.

    python examples/paged_decode.py              # CPU: compile and summarize; GPU: run the loop and check each step
    python examples/paged_decode.py --fp8        # an fp8 (e4m3) cache with per-tensor scales
    python examples/paged_decode.py --steps 100 --show-ptx
"""

from __future__ import annotations

import argparse
import re
import sys

import flydsl.compiler as flyc

BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 8, 2, 128, 16
PROMPTS = (3, 16, 29, 70)  # each sequence's prompt length: contexts of different lengths, ragged block tables
SPARE_BLOCKS = 4  # blocks no sequence gets: the cache is not exactly full
FP8_MAX = 448.0  # e4m3's largest finite value
ATOL = RTOL = 1e-2  # |out - ref| <= ATOL + RTOL * |ref|: bf16 outputs and probabilities (seen: < 1e-2 |ref|)
H200_SMS = 132  # what the compile-only summary plans the split count for


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="decode steps (default 40)")
    parser.add_argument("--fp8", action="store_true", help="an fp8 e4m3 cache with one scale per tensor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-ptx", action="store_true", help="print paged_decode's PTX (compile-only path)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps: expected at least 1")
    return args


def cache_geometry(steps: int) -> tuple[int, int]:
    """``(num_blocks, max_blocks)``: the cache's blocks (every sequence's last context, plus spares) and the block
    table's width (the longest sequence's blocks)."""
    blocks = [-(-(prompt + steps) // BLOCK_SIZE) for prompt in PROMPTS]
    return sum(blocks) + SPARE_BLOCKS, max(blocks)


# --- the compile-only path (no GPU needed) ---------------------------------------------------------------------------


def lower(fp8: bool, steps: int):
    """The two kernels of a decode step compiled for sm_90a without a GPU, with the arguments the loop's calls pass
    them (``flyc.TensorSpec`` stands for each tensor): ``write_kv``'s for B new tokens, and ``paged_decode``'s with
    the split count its plan chooses on an H200 (132 SMs). Returns ``[(name, CompiledModule, launch), ...]``."""
    from flydsl.kernels.attention.api import decode_plan_config
    from flydsl.kernels.attention.cache import WriteKVConfig, write_kv_kernel
    from flydsl.kernels.attention.decode import paged_decode_kernel

    spec = flyc.TensorSpec
    num_blocks, max_blocks = cache_geometry(steps)
    slots = num_blocks * BLOCK_SIZE

    # write_kv: the configuration its checks give for these arguments (a float scale is a kernel argument: "value");
    # the caches are passed as (slots, Hkv, D) rows (fp8: as int64 words of 8 values), the slot the row index.
    kind = "value" if fp8 else None
    write_cfg = WriteKVConfig(head_dim=HEAD_DIM, cache="fp8" if fp8 else "bf16", k_scale=kind, v_scale=kind)
    rows = BATCH * KV_HEADS
    new = spec((BATCH, KV_HEADS, HEAD_DIM), "bf16")
    slot_mapping = spec((BATCH,), "i32")  # also stands for the unread scale tensors
    cache = spec((slots, KV_HEADS, HEAD_DIM // 8), "i64") if fp8 else spec((slots, KV_HEADS, HEAD_DIM), "bf16")
    scale = 0.02 if fp8 else 1.0  # any positive float: a kernel argument, not a constant
    write = write_kv_kernel.lower(new, new, cache, cache, slot_mapping, slot_mapping, slot_mapping, scale, scale,
                                  write_cfg)  # fmt: skip

    # paged_decode: the plan's configuration and split count, then the kernel's arguments as the plan passes them
    # (q and out as (B, 1, Hq, D); fp8 caches as bytes; float32 partials for the splits' merge).
    cfg, splits, split_tokens = decode_plan_config(
        batch=BATCH, heads=Q_HEADS, kv_heads=KV_HEADS, dim=HEAD_DIM, queries=1, q_dtype="bf16",
        kv_dtype="e4m3" if fp8 else "bf16", k_scale="tensor" if fp8 else None, v_scale="tensor" if fp8 else None,
        sliding_window=None, soft_cap=False, max_context=max_blocks * BLOCK_SIZE, sms=H200_SMS, block_size=BLOCK_SIZE,
    )  # fmt: skip
    q = spec((BATCH, 1, Q_HEADS, HEAD_DIM), "bf16")
    kv = spec((num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM), "u8" if fp8 else "bf16")
    partial_out = spec((BATCH, 1, Q_HEADS, splits, HEAD_DIM) if cfg.split else (1, 1, 1, 1, 1), "f32")
    partial_stats = spec((BATCH, 1, Q_HEADS, splits, 2) if cfg.split else (1, 1, 1, 1, 1), "f32")
    groups = BATCH * KV_HEADS * cfg.row_tiles
    decode = paged_decode_kernel.lower(
        q, kv, kv, spec((BATCH, max_blocks), "i32"), spec((BATCH,), "i32"), spec((1,), "f32"), spec((1,), "f32"), q,
        partial_out, partial_stats, spec((max(groups, 1024),), "i32"), HEAD_DIM**-0.5, 0.0, 0, split_tokens, cfg,
    )  # fmt: skip
    grid = (splits, KV_HEADS * cfg.row_tiles, BATCH)
    merged = f"{splits} splits of {split_tokens} tokens, merged by the last to finish" if cfg.split else "no split"
    write_launch = f"grid {write_cfg.grid(rows)} x {write_cfg.block} threads for {rows} (token, head) rows"
    return [
        ("write_kv_kernel", write, write_launch),
        ("paged_decode_kernel", decode, f"grid {grid} x {cfg.threads} threads: {merged}"),
    ]


# The instructions each kernel rests on (docs/attention.md): (label, regular expression over the PTX, fp8 only)
PATTERNS = {
    "write_kv_kernel": (
        ("16-byte loads", r"ld\.global[.\w]*\.v4", False),
        ("stores", r"st\.global", False),
        ("fp8 casts (cvt.rn.satfinite.e4m3x2)", r"cvt\.rn\.satfinite\.e4m3x2", True),
    ),
    "paged_decode_kernel": (
        ("mma.sync m16n8k16", r"mma\.sync\.aligned\.m16n8k16", False),
        ("register transposes (movmatrix)", r"movmatrix\.sync", False),
        ("16-byte loads", r"ld\.global[.\w]*\.v4", False),
        ("byte permutes (prmt)", r"prmt\.b32", False),
        ("e4m3 -> f16 (cvt.rn.f16x2.e4m3x2)", r"cvt\.rn\.f16x2\.e4m3x2", True),
        ("arrival counter (atom.add)", r"atom\.[.\w]*add", False),
    ),
}


def summarize(fp8: bool, steps: int, show_ptx: bool = False) -> None:
    """Compiles the step's kernels (:func:`lower`) and prints their sizes, launches and instruction counts."""
    for name, module, launch in lower(fp8, steps):
        assembled = f"assembled for sm_90a ({len(module.cubin)} bytes of cubin)" if module.cubin else "PTX only"
        print(f"{name}: compiled, {len(module.ptx)} bytes of PTX, {assembled}; {launch}")
        counts = [
            f"{label} {len(re.findall(pattern, module.ptx))}"
            for label, pattern, fp8_only in PATTERNS[name]
            if fp8 or not fp8_only
        ]
        print(f"  PTX instructions: {', '.join(counts)}")
        if show_ptx and name == "paged_decode_kernel":
            print(module.ptx)


# --- the decode loop (a GPU) -----------------------------------------------------------------------------------------


class Sequences:
    """The host's bookkeeping of the paged cache (vLLM's block manager, without sharing or preemption): a shuffled
    free list of blocks, each sequence's length and block table. ``tables`` and ``lengths`` are copied into the
    device's ``block_tables`` and ``context_lens`` in place, so the kernels always see the same tensors."""

    def __init__(self, torch, generator, num_blocks: int, max_blocks: int):
        self.free = torch.randperm(num_blocks, generator=generator).tolist()
        self.tables = torch.zeros(BATCH, max_blocks, dtype=torch.int32)
        self.lengths = [0] * BATCH

    def grow(self, b: int, count: int) -> list[int]:
        """The slots of sequence ``b``'s next ``count`` positions, a new block taken where one begins."""
        slots = []
        for position in range(self.lengths[b], self.lengths[b] + count):
            if position % BLOCK_SIZE == 0:
                self.tables[b, position // BLOCK_SIZE] = self.free.pop()
            slots.append(int(self.tables[b, position // BLOCK_SIZE]) * BLOCK_SIZE + position % BLOCK_SIZE)
        self.lengths[b] += count
        return slots


def decode_loop(args: argparse.Namespace, device: str = "cuda", kernels=None) -> int:
    """The loop of the module's docstring; 0 when every step matched, 1 at the first that did not. ``kernels``:
    ``(write_kv, paged_decode)``, by default flydsl's (the CPU test passes torch stand-ins on ``device="cpu"`` to
    check the loop's own bookkeeping)."""
    import torch
    import torch.nn.functional as F

    if kernels is None:
        from flydsl.kernels.attention import paged_decode, write_kv
    else:
        write_kv, paged_decode = kernels
    generator = torch.Generator().manual_seed(args.seed)

    def randn(*shape):  # drawn on the host: the same numbers on every device
        return torch.randn(*shape, generator=generator).to(device=device, dtype=torch.bfloat16)

    num_blocks, max_blocks = cache_geometry(args.steps)
    shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    sequences = Sequences(torch, generator, num_blocks, max_blocks)
    prompt_k = [randn(n, KV_HEADS, HEAD_DIM) for n in PROMPTS]
    prompt_v = [randn(n, KV_HEADS, HEAD_DIM) for n in PROMPTS]
    if args.fp8:
        # One scale per tensor, fixed before the first write (a real model calibrates them): twice the prompts'
        # largest magnitude over 448. Values beyond 448 x scale would saturate (the side copies saturate alike).
        k_scale = 2 * max(k.abs().max().item() for k in prompt_k) / FP8_MAX
        v_scale = 2 * max(v.abs().max().item() for v in prompt_v) / FP8_MAX
        k_cache = torch.zeros(shape, dtype=torch.float8_e4m3fn, device=device)
        v_cache = torch.zeros(shape, dtype=torch.float8_e4m3fn, device=device)
        scales = {"k_scale": k_scale, "v_scale": v_scale}
    else:
        k_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        v_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        scales = {}

    def held(x, scale):
        """What the cache holds for ``x``, as float32: ``x`` (bf16), or ``x / scale`` cast to e4m3 (saturated to
        +-448, a true division as write_kv's) times ``scale``."""
        if scale is None:
            return x.float()
        divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
        return (x.float() / divisor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * divisor

    # The prompts: one write_kv call for all their tokens; the side copies keep each sequence's keys and values.
    slot_mapping = torch.tensor(
        [slot for b, n in enumerate(PROMPTS) for slot in sequences.grow(b, n)], dtype=torch.int32, device=device
    )
    write_kv(torch.cat(prompt_k), torch.cat(prompt_v), k_cache, v_cache, slot_mapping, **scales)
    keys = [held(k, scales.get("k_scale")) for k in prompt_k]
    values = [held(v, scales.get("v_scale")) for v in prompt_v]
    block_tables = sequences.tables.to(device)
    context_lens = torch.tensor(sequences.lengths, dtype=torch.int32, device=device)

    worst = 0.0
    for step in range(args.steps):
        q = randn(BATCH, Q_HEADS, HEAD_DIM)
        k, v = randn(BATCH, KV_HEADS, HEAD_DIM), randn(BATCH, KV_HEADS, HEAD_DIM)
        slots = [sequences.grow(b, 1)[0] for b in range(BATCH)]
        block_tables.copy_(sequences.tables)  # a new block where a sequence crossed into one
        context_lens.copy_(torch.tensor(sequences.lengths, dtype=torch.int32))
        write_kv(k, v, k_cache, v_cache, torch.tensor(slots, dtype=torch.int32, device=device), **scales)
        out = torch.full_like(q, float("nan"))  # poisoned: an element the kernel does not write fails the check
        paged_decode(q, k_cache, v_cache, block_tables, context_lens, out=out, **scales)

        # The reference: each sequence's query over its contiguous keys and values (the 2 KV heads shared by 4
        # query heads each); one query token, the newest position, sees every key: no mask.
        reference = []
        for b in range(BATCH):
            keys[b] = torch.cat([keys[b], held(k[b : b + 1], scales.get("k_scale"))])
            values[b] = torch.cat([values[b], held(v[b : b + 1], scales.get("v_scale"))])
            attended = F.scaled_dot_product_attention(
                q[b].float()[:, None], keys[b].transpose(0, 1), values[b].transpose(0, 1), enable_gqa=True
            )  # (Hq, 1, D)
            reference.append(attended[:, 0])
        reference = torch.stack(reference)
        error = (out.float() - reference).abs()
        bad = ~(error <= ATOL + RTOL * reference.abs())  # NaN counts as bad
        largest = error.max().item()
        worst = max(worst, largest)
        print(f"step {step:3d}: contexts {sequences.lengths}, max |out - sdpa| = {largest:.2e}")
        if bad.any():
            print(
                f"FAILED at step {step}: {int(bad.sum())} of {out.numel()} outputs off by more than {ATOL} +"
                f" {RTOL} |ref| (or not written)"
            )
            return 1
    kind = "fp8 e4m3 (per-tensor scales)" if args.fp8 else "bf16"
    print(f"ok: {args.steps} steps of {BATCH} sequences over a paged {kind} cache, max error {worst:.2e}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    summarize(args.fp8, args.steps, args.show_ptx)
    if not flyc.runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only (run on a GPU machine to run the decode loop and check it)")
        return 0
    return decode_loop(args)


if __name__ == "__main__":
    sys.exit(main())

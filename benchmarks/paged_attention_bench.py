"""Paged-attention decode on the local GPU: flydsl.kernels.attention.paged_decode against a same-bytes copy, torch
SDPA and FlashInfer's BatchDecodeWithPagedKVCacheWrapper, in the same process (issue 35).

    python benchmarks/paged_attention_bench.py --list                    # the cases, no GPU needed
    python benchmarks/paged_attention_bench.py --model llama3-8b --commit C \
        --json benchmarks/results/paged_attention/DATE_C_llama3-8b.json
    python benchmarks/paged_attention_bench.py --model llama3-70b-tp8 --kv fp8,fp8-token --block-sizes 16 ...

The sweep: Llama-3-8B (Hq 32, Hkv 8, D 128) and Llama-3-70B at TP8 (Hq 8, Hkv 1, D 128), batch B x context with
B * context <= 4M tokens, pages of 16 and 64 tokens, KV caches in bf16, fp8 e4m3 with one float32 scale per tensor
(``fp8``) and with one per token and head (``fp8-token``). ``--model``, ``--kv``, ``--block-sizes``, ``--batches``
and ``--contexts`` pick a part of it, so that a sweep can be split over calls of under 10 minutes (one model per
call; with ``--json`` the record is written again after every case, so a call cut short keeps what it measured).

Each (model, B, context, block size): random bf16 q, K and V; a cache of exactly B * ceil(context / block size)
pages, the block table a random permutation of them (pages scattered); every context equal to the given one, or
with ``--ragged`` drawn uniformly from [1, context]. The fp8 caches are quantized from the same bf16 values. Per KV
dtype: our output is poisoned (NaN) and computed once, every element checked written and up to ``--check-rows``
sequences checked against ``flydsl.kernels.attention.reference.paged_decode_reference`` (float32) on a compact copy
of their pages (relative Frobenius error; a case fails over 1e-2 or with an unwritten element and is left out of the
summary). Then ours, the copy and the peers are timed interleaved, ``--repeats`` times, each with
cold_l2.bench_cold (triton.testing.do_bench's loop: CUDA events, L2 flushed before each call, median; ``--flush``;
queued behind a ~100 us sleep so that the host's time stays out), and the medians over the repeats kept.

Roofline: the bytes of K and V (and their scales) the context holds, read once; the copy moves as many bytes
(``copy_`` of half of them into as many: bytes read plus written), ``fraction_of_copy`` = copy time / ours; below
~2x the L2's size that copy's writes stay in the L2 and it reads only half the bytes from DRAM, so beside it
``fraction_of_read`` = the time of a kernel that only reads the same bytes (``read_roofline.py``) / ours. Peers
(``--skip-peers`` leaves them out): torch SDPA (``enable_gqa=True``; q (B, Hq, 1, D)) on the same KV gathered into
contiguous (B, Hkv, context, D) tensors (the gather not timed; for the fp8 caches SDPA runs on the bf16 values they
were quantized from; ragged contexts padded and masked); FlashInfer's BatchDecodeWithPagedKVCacheWrapper
(kv_layout "NHD", (k, v) caches as a tuple, indptr / indices / last_page_len from the block table, plan() outside
the timed region; fp8 with its float k_scale / v_scale; it takes no per-token scales, so fp8-token rows have none)
where ``import flashinfer`` works; its failures are recorded, not raised.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from read_roofline import reader
from record import Sweep, cell, cold_timer, csv_list, error_text, failure_note, geomean, merge, new_record

MODELS = {"llama3-8b": (32, 8, 128), "llama3-70b-tp8": (8, 1, 128)}  # name -> (Hq, Hkv, D)
BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (512, 2048, 8192, 32768, 131072)
BLOCK_SIZES = (16, 64)
KV_KINDS = ("bf16", "fp8", "fp8-token")
MAX_TOKENS = 4 << 20  # B * context, at most
LONG_TOKENS = 64 << 10  # the summary's "long" cases: B * context >= 64K tokens
FP8_MAX = 448.0
TOLERANCE = 1e-2  # relative Frobenius error of a bf16 output against the float32 reference
FLASHINFER_WORKSPACE = 256 << 20
DEVICE = "cuda"


def shapes(models, batches, contexts, max_tokens=MAX_TOKENS):
    """The (model, batch, context) triples of the sweep, with batch * context <= ``max_tokens``."""
    return [(m, b, c) for m in models for b in batches for c in contexts if b * c <= max_tokens]


def cases(models, batches, contexts, block_sizes, kv_kinds, max_tokens=MAX_TOKENS):
    """Every case, in the order run: (model, batch, context, block_size, kv)."""
    return [
        (*s, bs, kv) for s in shapes(models, batches, contexts, max_tokens) for bs in block_sizes for kv in kv_kinds
    ]


def kv_bytes(tokens: int, hkv: int, d: int, kv: str) -> int:
    """The bytes of K and V (and scales) that ``tokens`` tokens of context hold: the fewest a decode must read."""
    if kv == "bf16":
        return 2 * tokens * hkv * d * 2
    if kv == "fp8":
        return 2 * tokens * hkv * d + 2 * 4
    if kv == "fp8-token":
        return 2 * tokens * hkv * (d + 4)
    raise ValueError(f"unknown KV dtype {kv!r}")


def flashinfer_page_table(block_tables, context_lens, block_size: int):
    """FlashInfer's paged-KV description of a (B, max_blocks) block table: (indptr [B + 1], indices [total pages],
    last_page_len [B]), int32 on the block table's device; each sequence's first ceil(context / block_size) pages, in
    order, and the tokens of its last page (1..block_size)."""
    import torch

    lens = context_lens.to(torch.int64)
    pages = (lens + block_size - 1) // block_size
    used = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < pages[:, None]
    indices = block_tables[used].to(torch.int32)  # row-major: each sequence's pages in order
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=block_tables.device)
    indptr[1:] = torch.cumsum(pages, 0)
    last_page_len = (lens - (pages - 1) * block_size).to(torch.int32)
    return indptr, indices, last_page_len


def checked_rows(batch: int, count: int) -> list[int]:
    """Up to ``count`` sequences, spread over the batch (the first and the last among them)."""
    if batch <= count:
        return list(range(batch))
    if count == 1:
        return [0]
    return sorted({round(i * (batch - 1) / (count - 1)) for i in range(count)})


def compact_pages(rows, block_tables, context_lens, block_size: int, paged):
    """The pages of sequences ``rows`` only, renumbered: (block_tables, context_lens, [t[pages] for t in paged])
    where ``paged`` are tensors indexed by page first (K, V, per-token scales), so that a reference sees a small
    cache. The new table's unused entries point at page 0."""
    import torch

    lens = [int(context_lens[r]) for r in rows]
    counts = [-(-n // block_size) for n in lens]
    table = torch.zeros(len(rows), max(counts), dtype=torch.int32, device=block_tables.device)
    picked, start = [], 0
    for i, (r, n) in enumerate(zip(rows, counts, strict=True)):
        picked.append(block_tables[r, :n].to(torch.int64))
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32, device=block_tables.device)
        start += n
    pages = torch.cat(picked)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=context_lens.device)
    return table, lens_t, [t[pages] for t in paged]


def quantize_fp8(cache, per_token: bool):
    """``cache`` (pages, block_size, Hkv, D) bf16 as e4m3 and float32 scales: one (shape (1,)) for the tensor, or
    one per token and head (pages, block_size, Hkv); worked through in chunks of pages (a float32 copy of a 16 GB
    cache would not fit)."""
    import torch

    out = torch.empty(cache.shape, dtype=torch.float8_e4m3fn, device=cache.device)
    step = max(1, (1 << 26) // max(1, cache[0].numel()))
    chunks = [slice(s, s + step) for s in range(0, cache.shape[0], step)]
    if per_token:
        scale = torch.empty(cache.shape[:3], dtype=torch.float32, device=cache.device)
        for c in chunks:
            x = cache[c].float()
            scale[c] = (x.abs().amax(-1) / FP8_MAX).clamp(min=1e-12)
            out[c] = (x / scale[c][..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return out, scale
    amax = torch.stack([cache[c].abs().amax().float() for c in chunks]).amax()
    scale = (amax / FP8_MAX).clamp(min=1e-12).reshape(1)
    for c in chunks:
        out[c] = (cache[c].float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return out, scale


def caches(shape, kv: str):
    """``(k, v, k_scale, v_scale)`` of ``shape`` (a :class:`Shape`) in the KV kind ``kv``: its bf16 caches without
    scales, or quantized to e4m3 with a scale per tensor (``fp8``) or per token and head (``fp8-token``)."""
    if kv == "bf16":
        return shape.k, shape.v, None, None
    k, k_scale = quantize_fp8(shape.k, per_token=kv == "fp8-token")
    v, v_scale = quantize_fp8(shape.v, per_token=kv == "fp8-token")
    return k, v, k_scale, v_scale


def gather_contiguous(cache, block_tables, length: int):
    """The pages of each sequence as one contiguous (B, Hkv, length, D) tensor (SDPA's layout), row by row."""
    import torch

    batch, (_, _, hkv, d) = block_tables.shape[0], cache.shape
    out = torch.empty(batch, hkv, length, d, dtype=cache.dtype, device=cache.device)
    for b in range(batch):
        out[b] = cache[block_tables[b].to(torch.int64)].reshape(-1, hkv, d)[:length].transpose(0, 1)
    return out


def is_long(row) -> bool:
    return row["batch"] * row["context"] >= LONG_TOKENS


def _shape_key(row):
    return (row["model"], row["batch"], row["context"], row["block_size"], row["ragged"])


def summarize(results) -> dict:
    """The record's summary from the rows that ran and passed the check (None where no row qualifies)."""
    ok = [r for r in results if r.get("ours_us") is not None and r.get("correct")]
    long = [r for r in ok if is_long(r)]
    short = [r for r in ok if not is_long(r)]
    bf16 = {_shape_key(r): r["ours_us"] for r in long if r["kv"] == "bf16"}

    def speedup(kind):
        return geomean(bf16[_shape_key(r)] / r["ours_us"] for r in long if r["kv"] == kind and _shape_key(r) in bf16)

    def vs(rows, peer):
        return geomean(r[f"{peer}_us"] / r["ours_us"] for r in rows if r.get(f"{peer}_us") is not None)

    fractions = [r["fraction_of_copy"] for r in long if r.get("fraction_of_copy") is not None]
    reads = [r["fraction_of_read"] for r in long if r.get("fraction_of_read") is not None]
    return {
        "min_fraction_of_copy_long": min(fractions) if fractions else None,
        "min_fraction_of_read_long": min(reads) if reads else None,
        "fp8_over_bf16_speedup_long": speedup("fp8"),
        "fp8_token_over_bf16_speedup_long": speedup("fp8-token"),
        "geomean_vs_flashinfer_short": vs(short, "flashinfer"),
        "geomean_vs_flashinfer_long": vs(long, "flashinfer"),
        "geomean_vs_sdpa": vs(ok, "sdpa"),
        "max_rel_error": max((r["rel_error"] for r in ok), default=None),
        "cases": len(results),
        "cases_failed": sum(1 for r in results if not r.get("correct")),
    }


def _rel_error(x, ref) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _free():
    import torch

    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def flashinfer_status():
    """(the flashinfer module or None, what was found: its version, or why it is not measured)."""
    try:
        import flashinfer
    except Exception as error:  # noqa: BLE001 (recorded: an optional peer)
        return None, f"not measured: flashinfer does not import here ({error_text(error)})"
    return flashinfer, f"flashinfer {getattr(flashinfer, '__version__', '(version unknown)')}"


class Shape:
    """The inputs shared by a (model, batch, context, block size) group: q, the bf16 caches, the block table and the
    context lengths, and for the peers the gathered KV and FlashInfer's page table."""

    def __init__(self, model, batch, context, block_size, ragged, seed):
        import torch

        self.model, self.batch, self.context, self.block_size, self.ragged = model, batch, context, block_size, ragged
        self.hq, self.hkv, self.d = MODELS[model]
        torch.manual_seed(seed)
        blocks = -(-context // block_size)
        self.pages = batch * blocks
        dev = DEVICE
        self.block_tables = torch.randperm(self.pages, device=dev).view(batch, blocks).to(torch.int32)
        if ragged:
            self.context_lens = torch.randint(1, context + 1, (batch,), device=dev, dtype=torch.int32)
        else:
            self.context_lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
        self.tokens = int(self.context_lens.sum())
        self.q = torch.randn(batch, self.hq, self.d, device=dev, dtype=torch.bfloat16)
        cache_shape = (self.pages, block_size, self.hkv, self.d)
        self.k = torch.randn(cache_shape, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(cache_shape, device=dev, dtype=torch.bfloat16)
        self.k_dense = self.v_dense = self.mask = self.page_table = None

    def gather(self):
        """The bf16 KV as contiguous (B, Hkv, context, D) tensors for SDPA, and for ragged contexts its key mask."""
        import torch

        self.k_dense = gather_contiguous(self.k, self.block_tables, self.context)
        self.v_dense = gather_contiguous(self.v, self.block_tables, self.context)
        if self.ragged:
            positions = torch.arange(self.context, device=self.q.device)
            self.mask = (positions[None, :] < self.context_lens[:, None]).view(self.batch, 1, 1, self.context)

    def label(self) -> str:
        return f"{self.model} B={self.batch} ctx={self.context} bs={self.block_size}"


def _sdpa(q, k, v, mask):
    """SDPA on the gathered KV: (callable, form) with enable_gqa, else with the query heads of each KV head folded
    into the query length (the same product, for torch versions without enable_gqa)."""
    import torch.nn.functional as F

    batch, hq, d = q.shape
    hkv = k.shape[1]

    def gqa():
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True).view(batch, hq, d)

    def folded():
        return F.scaled_dot_product_attention(q.view(batch, hkv, hq // hkv, d), k, v, attn_mask=mask).view(batch, hq, d)

    try:
        gqa()
        return gqa, "enable_gqa"
    except Exception as error:  # noqa: BLE001 (the fallback names why)
        return folded, f"query heads folded per KV head (enable_gqa: {error_text(error)})"


def _flashinfer_call(flashinfer, shape, kv, k, v, k_scale, v_scale, tensor_cores, workspace):
    """FlashInfer's decode on the same paged cache: plan() here, the returned callable runs it."""
    import torch

    if shape.page_table is None:
        shape.page_table = flashinfer_page_table(shape.block_tables, shape.context_lens, shape.block_size)
    indptr, indices, last_page_len = shape.page_table
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    kv_dtype = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    wrapper.plan(
        indptr,
        indices,
        last_page_len,
        shape.hq,
        shape.hkv,
        shape.d,
        shape.block_size,
        q_data_type=torch.bfloat16,
        kv_data_type=kv_dtype,
    )
    out = torch.empty_like(shape.q)
    scales = {} if kv == "bf16" else {"k_scale": float(k_scale.item()), "v_scale": float(v_scale.item())}
    return lambda: wrapper.run(shape.q, (k, v), out=out, **scales)


def run_case(shape, kv, *, timer, repeats, check_rows, peers, flashinfer, tensor_cores, workspace):
    """One row: the check, then ours, the copy and the peers timed interleaved."""
    import torch

    from flydsl.kernels.attention import paged_decode
    from flydsl.kernels.attention.reference import paged_decode_reference

    began = time.perf_counter()
    row = {
        "model": shape.model,
        "hq": shape.hq,
        "hkv": shape.hkv,
        "d": shape.d,
        "batch": shape.batch,
        "context": shape.context,
        "ragged": shape.ragged,
        "block_size": shape.block_size,
        "kv": kv,
        "pages": shape.pages,
        "tokens": shape.tokens,
        "kv_bytes": kv_bytes(shape.tokens, shape.hkv, shape.d, kv),
    }
    k, v, k_scale, v_scale = caches(shape, kv)
    args = (shape.q, k, v, shape.block_tables, shape.context_lens)
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    out = torch.full_like(shape.q, float("nan"))

    def ours():
        return paged_decode(*args, **scales, out=out, max_context=shape.context)

    try:
        ours()
        _sync()
    except Exception as error:  # noqa: BLE001 (recorded; the sweep goes on)
        row.update(error=error_text(error), correct=False, wall_s=time.perf_counter() - began)
        return row
    rows = checked_rows(shape.batch, check_rows)
    per_page = [k, v] + ([k_scale, v_scale] if kv == "fp8-token" else [])
    table, lens, paged = compact_pages(rows, shape.block_tables, shape.context_lens, shape.block_size, per_page)
    ref_scales = scales if kv != "fp8-token" else {"k_scale": paged[2], "v_scale": paged[3]}
    row["unwritten"] = int(torch.isnan(out).sum())
    row["checked_rows"] = rows
    try:
        reference = paged_decode_reference(shape.q[rows], paged[0], paged[1], table, lens, **ref_scales).float()
        row["rel_error"] = _rel_error(out[rows], reference)
    except Exception as error:  # noqa: BLE001 (recorded: the case is then not counted, but still timed)
        reference, row["rel_error"], row["check_error"] = None, None, error_text(error)
    del table, paged
    row["correct"] = row["unwritten"] == 0 and row["rel_error"] is not None and row["rel_error"] <= TOLERANCE

    half = row["kv_bytes"] // 2  # the copy's halves and the read share one buffer (the largest caches are 17 GB)
    buffer = torch.empty(-(-row["kv_bytes"] // 4096) * 4096, dtype=torch.uint8, device=DEVICE)
    copy_src, copy_dst = buffer[:half], buffer[half : 2 * half]
    timed = {"ours": ours, "copy": lambda: copy_dst.copy_(copy_src)}
    timed["read"] = make_reader(row["kv_bytes"], DEVICE, buffer)
    if peers:
        try:
            timed["sdpa"], row["sdpa_form"] = _sdpa(shape.q, shape.k_dense, shape.v_dense, shape.mask)
            row["sdpa_kv"] = "bf16" if kv == "bf16" else "bf16 (the values the fp8 cache was quantized from)"
            if kv == "bf16" and reference is not None:
                row["sdpa_rel_error"] = _rel_error(timed["sdpa"]()[rows], reference)
        except Exception as error:  # noqa: BLE001 (recorded)
            timed.pop("sdpa", None)
            row["sdpa_error"] = error_text(error)
        if flashinfer is None:
            pass
        elif kv == "fp8-token":
            row["flashinfer_error"] = "not run: FlashInfer's run() takes one float k_scale and v_scale, not per token"
        else:
            try:
                call = _flashinfer_call(flashinfer, shape, kv, k, v, k_scale, v_scale, tensor_cores, workspace)
                if reference is not None:
                    row["flashinfer_rel_error"] = _rel_error(call()[rows], reference)
                row["flashinfer_tensor_cores"] = tensor_cores
                timed["flashinfer"] = call
            except Exception as error:  # noqa: BLE001 (recorded)
                row["flashinfer_error"] = error_text(error)
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for name, fn in list(timed.items()):
            if name not in runs:
                continue
            try:
                runs[name].append(timer(fn) * 1e3)
            except Exception as error:  # noqa: BLE001 (recorded; without ours or the copy the row has no times)
                row[f"{name}_error" if name != "ours" else "error"] = error_text(error)
                if name in ("ours", "copy", "read"):
                    row.update(correct=False, wall_s=time.perf_counter() - began)
                    return row
                del runs[name]
    for name, values in runs.items():
        row[f"{name}_us"] = statistics.median(values)
        row[f"{name}_tbps"] = row["kv_bytes"] / (row[f"{name}_us"] * 1e-6) / 1e12
    row["fraction_of_copy"] = row["copy_us"] / row["ours_us"]
    row["fraction_of_read"] = row["read_us"] / row["ours_us"]
    for peer in ("sdpa", "flashinfer"):
        if f"{peer}_us" in row:
            row[f"ratio_vs_{peer}"] = row[f"{peer}_us"] / row["ours_us"]  # > 1: ours faster
    row["runs_us"] = runs
    row["wall_s"] = time.perf_counter() - began
    return row


make_timer = cold_timer  # (module names: the CPU tests put a fake timer and reader in their place)
make_reader = reader

HEADER = (
    f"{'model':<14} {'B':>4} {'ctx':>6} {'bs':>3} {'kv':<9} {'ours us':>9} {'TB/s':>5} {'ofcopy':>6} {'ofread':>6}"
    f" {'SDPA us':>9} {'FI us':>9} {'vs FI':>6} {'err':>7}"
)


_COLUMNS = (  # the table's measured columns: (key, format, width)
    ("ours_us", ".1f", 9),
    ("ours_tbps", ".2f", 5),
    ("fraction_of_copy", ".3f", 6),
    ("fraction_of_read", ".3f", 6),
    ("sdpa_us", ".1f", 9),
    ("flashinfer_us", ".1f", 9),
    ("ratio_vs_flashinfer", ".3f", 6),
    ("rel_error", ".1e", 7),
)


def _format(row) -> str:
    columns = " ".join(cell(row, *column) for column in _COLUMNS)
    text = f"{row['model']:<14} {row['batch']:>4} {row['context']:>6} {row['block_size']:>3} {row['kv']:<9} {columns}"
    return text + failure_note(row)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        type=lambda t: csv_list(t, str, MODELS),
        default=list(MODELS),
        help="comma-separated, of " + ", ".join(MODELS) + " (default both)",
    )
    parser.add_argument("--batches", type=lambda t: csv_list(t, int), default=list(BATCHES))
    parser.add_argument("--contexts", type=lambda t: csv_list(t, int), default=list(CONTEXTS))
    parser.add_argument("--block-sizes", type=lambda t: csv_list(t, int), default=list(BLOCK_SIZES))
    parser.add_argument(
        "--kv", type=lambda t: csv_list(t, str, KV_KINDS), default=list(KV_KINDS), help="of " + ", ".join(KV_KINDS)
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="batch * context at most (default 4M)")
    parser.add_argument("--ragged", action="store_true", help="contexts drawn uniformly from [1, context]")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--check-rows", type=lambda t: max(1, int(t)), default=4, help="sequences checked against the reference"
    )
    parser.add_argument("--flush", choices=("dirty", "clean"), default="dirty", help="the L2 flush (cold_l2.py)")
    parser.add_argument("--skip-peers", action="store_true", help="time ours and the copy only")
    parser.add_argument(
        "--flashinfer-tensor-cores",
        choices=("auto", "on", "off"),
        default="auto",
        help="FlashInfer's use_tensor_cores (auto: Hq / Hkv > 4, as vLLM chooses)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--json", help="write the results here (again after each case)")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="instead: join these records of one commit (the sweep split by model over calls) into --json",
    )
    return parser.parse_args(argv)


METHOD = (
    "cold_l2.bench_cold (triton.testing.do_bench's loop: CUDA events, L2 flushed before each call, median; warmup"
    " 10 ms, rep 40 ms), ours, the copy and the peers interleaved, median over repeats; bf16 q (B, Hq, D), paged"
    " (pages, block_size, Hkv, D) caches, block tables a random permutation of exactly the pages needed; TB/s ="
    " bytes of K and V (and scales) of the context / time; copy: copy_ of half those bytes into as many;"
    " fraction_of_copy = copy time / ours; read: read_roofline.reader of the same bytes (a kernel that reads them"
    " once, 16-byte loads, and writes a word per warp), fraction_of_read = read time / ours; SDPA: enable_gqa on"
    " the KV gathered contiguous (gather untimed; fp8"
    " rows: on the bf16 values the cache was quantized from); FlashInfer: BatchDecodeWithPagedKVCacheWrapper NHD,"
    " plan() untimed, fp8 per-tensor k_scale/v_scale, none for per-token scales; ratio_vs_X = X time / ours;"
    " checked: output poisoned with NaN, up to check_rows sequences against paged_decode_reference (float32)"
)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        merge(args.merge, args.json, summarize)
        return 0
    todo = cases(args.model, args.batches, args.contexts, args.block_sizes, args.kv, args.max_tokens)
    if args.list:
        for model, batch, context, block_size, kv in todo:
            print(f"{model:<14} B={batch:<4} ctx={context:<7} bs={block_size:<3} {kv}")
        print(f"{len(todo)} cases")
        return 0

    import torch

    flashinfer, fi_status = (None, "not measured: --skip-peers") if args.skip_peers else flashinfer_status()
    print(fi_status, flush=True)
    timer = make_timer(args.flush)
    workspace = None
    if flashinfer is not None:
        # FlashInfer: "float_workspace_buffer ... Must be initialized to 0 for its first use."
        workspace = torch.zeros(FLASHINFER_WORKSPACE, dtype=torch.uint8, device=DEVICE)
    results = []
    record = new_record(
        "paged_attention_bench",
        argv,
        results,
        commit=args.commit,
        method=METHOD,
        flashinfer=fi_status,
        ragged=args.ragged,
        flush=args.flush,
        repeats=args.repeats,
    )
    sweep = Sweep(record, args.json, _format, summarize)
    print(HEADER, flush=True)
    for index, (model, batch, context) in enumerate(shapes(args.model, args.batches, args.contexts, args.max_tokens)):
        hq, hkv, _ = MODELS[model]
        choice = args.flashinfer_tensor_cores
        tensor_cores = choice == "on" or (choice == "auto" and hq // hkv > 4)
        for block_size in args.block_sizes:
            shape = None
            try:
                shape = Shape(model, batch, context, block_size, args.ragged, args.seed + index)
                if not args.skip_peers:
                    shape.gather()
                for kv in args.kv:
                    row = run_case(
                        shape,
                        kv,
                        timer=timer,
                        repeats=args.repeats,
                        check_rows=args.check_rows,
                        peers=not args.skip_peers,
                        flashinfer=flashinfer,
                        tensor_cores=tensor_cores,
                        workspace=workspace,
                    )
                    sweep.add(row)
            except torch.OutOfMemoryError as error:
                row = {"model": model, "batch": batch, "context": context, "block_size": block_size}
                results.append(row | {"ragged": args.ragged, "correct": False, "error": error_text(error)})
                print(f"{model} B={batch} ctx={context} bs={block_size}: {error_text(error)}", flush=True)
            finally:
                del shape
                _free()
    sweep.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

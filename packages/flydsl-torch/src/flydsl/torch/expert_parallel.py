"""Expert parallelism for :class:`flydsl.torch.nn.MoE` (``ep_group``): each rank of a ``torch.distributed`` process
group holds ``E / world`` experts, rank r the experts ``[r * E / world, (r + 1) * E / world)``, and routes its own
tokens with the full router; each token goes once to every rank that owns one of its experts, with its slots
renumbered to that rank's local experts (the other slots' ids -1, weights 0, which ``fused_moe`` drops), the rank
runs its experts on what it received (``fused_moe``'s combine sums the token's slots there), the partial rows go back,
and the token's owner adds them in float32 in rank order (each rank's rows added by its own ``index_add_``, no index
twice in one: the same sum on every run).

One forward, and its collectives (every rank makes the same calls in the same order):

1. the counts: a (world, CHUNKS + 1) int64 message, to each peer the rows it will get in each token chunk and this
   rank's token count, by ``all_to_all_single``; then ONE device-to-host copy of what was sent and received (the
   split sizes of the exchanges; nothing else reads the GPU back). Every rank then knows every rank's token count and
   makes the same choice: chunked exchanges where the largest is at least ``overlap_tokens``, one exchange otherwise.
2. per chunk, the dispatch: the rows of x and their (ids, weights), two ``all_to_all_single`` with split sizes,
   started together (``async_op``) so that chunk 1 is in flight while chunk 0's experts run;
3. per chunk, the experts on the rows received, then the partial rows sent back (``all_to_all_single``, async: the
   return of chunk 0 overlaps chunk 1's experts), then added into the owner's float32 (T, H).

The bookkeeping is pure functions of tensors (:func:`destinations`, :func:`chunk_counts`, :func:`count_message`,
:func:`decide`, :func:`plan_dispatch`, :func:`pack_meta`, :func:`combine_chunk`), which the CPU tests run without
processes; the collectives are in :func:`exchange_counts` and :func:`expert_parallel_moe`. No step waits on the GPU
but the count matrix's copy (the send layout is built by scatters from the counts, not by ``nonzero``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "CHUNKS",
    "OVERLAP_TOKENS",
    "DispatchPlan",
    "Split",
    "experts_per_rank",
    "destinations",
    "chunk_bounds",
    "chunk_counts",
    "count_message",
    "decide",
    "plan_dispatch",
    "pack_meta",
    "unpack_meta",
    "combine_chunk",
    "exchange_counts",
    "expert_parallel_moe",
    "init_process_group",
]

CHUNKS = 2  # a chunked forward's exchanges: the tokens in two halves, the second in flight while the first computes
# Chunked where some rank has at least this many tokens: below, a second round of collectives costs more than the
# overlap saves (decode). A first guess, to be set from benchmarks/expert_parallel_bench.py's runs on H200 pairs.
OVERLAP_TOKENS = 1024


def experts_per_rank(num_experts: int, world: int) -> int:
    """``num_experts / world``: every rank holds as many experts (a clear error where they do not divide)."""
    if world < 1 or num_experts % world:
        raise ValueError(
            f"MoE: ep_group: num_experts = {num_experts} must split evenly over the group's {world} ranks (each rank"
            f" holds num_experts / world experts)"
        )
    return num_experts // world


def destinations(topk_ids: Tensor, per_rank: int, world: int) -> Tensor:
    """bool (T, world): whether token t has a slot whose expert rank r owns (``id // per_rank``; ids outside
    ``[0, per_rank * world)`` go nowhere)."""
    ids = topk_ids.long()
    valid = (ids >= 0) & (ids < per_rank * world)
    ranks = torch.arange(world, device=ids.device)
    return ((ids // per_rank).unsqueeze(-1) == ranks).logical_and(valid.unsqueeze(-1)).any(dim=1)


def chunk_bounds(tokens: int, chunks: int) -> list[int]:
    """The ``chunks + 1`` token bounds of the chunks: as even as can be, the later ones the larger."""
    return [c * tokens // chunks for c in range(chunks + 1)]


def chunk_counts(mask: Tensor, chunks: int) -> Tensor:
    """int64 (chunks, world): the rows this rank sends each rank in each chunk (``mask``: :func:`destinations`)."""
    bounds = chunk_bounds(mask.shape[0], chunks)
    rows = [mask[bounds[c] : bounds[c + 1]].sum(dim=0) for c in range(chunks)]
    return torch.stack(rows).long()


def count_message(counts: Tensor, tokens: int) -> Tensor:
    """int64 (world, chunks + 1): to each rank r, ``counts[:, r]`` and this rank's token count."""
    world = counts.shape[1]
    total = torch.full((world, 1), tokens, dtype=torch.int64, device=counts.device)
    return torch.cat([counts.t(), total], dim=1).contiguous()


class Split(NamedTuple):
    """The exchanges' sizes as every rank agrees on them: ``chunks`` exchanges, ``send[c][r]`` rows to rank r and
    ``recv[c][r]`` rows from rank r in chunk c."""

    chunks: int
    send: list[list[int]]
    recv: list[list[int]]


def decide(host: Tensor, overlap_tokens: int | None) -> Split:
    """The exchanges' sizes from the count matrix on the host, (2, world, CHUNKS + 1): what this rank sent
    (:func:`count_message`) and what it received from each rank. Chunked where some rank (the received token counts:
    every rank sees the same) has at least ``overlap_tokens`` tokens (None: never), else one exchange; a world of one
    never (nothing to overlap: the plain layer's result, bit for bit)."""
    sent, received = host.tolist()
    chunks = len(sent[0]) - 1
    largest = max(row[chunks] for row in received)
    send = [[row[c] for row in sent] for c in range(chunks)]
    recv = [[row[c] for row in received] for c in range(chunks)]
    if overlap_tokens is None or largest < overlap_tokens or len(received) == 1:
        merged = [[sum(column) for column in zip(*sizes, strict=True)] for sizes in (send, recv)]
        return Split(1, [merged[0]], [merged[1]])
    return Split(chunks, send, recv)


class DispatchPlan(NamedTuple):
    """The rows this rank sends, in the exchanges' order (by chunk, then destination rank, then token)."""

    index: Tensor  # int64 (N,): each row's token
    ids: Tensor  # int32 (N, k): its slots' ids renumbered to the destination's local experts, -1 for the others'
    weights: Tensor  # float32 (N, k): its slots' weights, 0 for the others'


def plan_dispatch(
    mask: Tensor, topk_ids: Tensor, topk_weights: Tensor, per_rank: int, counts: Tensor, total: int
) -> DispatchPlan:
    """The send layout of ``mask`` (:func:`destinations`) in chunks of :func:`chunk_counts` ``counts`` (chunks,
    world), ``total`` its sum (known on the host): each (token, rank) pair's row is its chunk and rank's offset plus
    the pairs before it in that chunk, scattered without reading the GPU back."""
    tokens, world = mask.shape
    chunks = counts.shape[0]
    device = mask.device
    taken = mask.long()
    before = taken.cumsum(dim=0) - taken  # (T, world): the pairs of earlier tokens, per rank
    chunk_of = torch.zeros(tokens, dtype=torch.int64, device=device)
    for bound in chunk_bounds(tokens, chunks)[1:-1]:
        chunk_of[bound:] += 1
    starts = counts.cumsum(dim=0) - counts  # (chunks, world): the pairs of earlier chunks, per rank
    flat = counts.reshape(-1)
    offsets = (flat.cumsum(dim=0) - flat).view(chunks, world)  # (chunks, world): each segment's first row
    rows = offsets[chunk_of] + before - starts[chunk_of]
    rows = torch.where(mask, rows, total)  # pairs not sent: the spare row
    token = torch.arange(tokens, device=device).unsqueeze(1).expand(tokens, world)
    rank = torch.arange(world, device=device).unsqueeze(0).expand(tokens, world)
    index = torch.empty(total + 1, dtype=torch.int64, device=device).scatter_(0, rows.reshape(-1), token.reshape(-1))
    dest = torch.empty(total + 1, dtype=torch.int64, device=device).scatter_(0, rows.reshape(-1), rank.reshape(-1))
    index, dest = index[:total], dest[:total].unsqueeze(1)
    ids = topk_ids.long().index_select(0, index)
    local = ids - dest * per_rank
    mine = (local >= 0) & (local < per_rank)
    ids = torch.where(mine, local, -1).to(torch.int32)
    weights = torch.where(mine, topk_weights.float().index_select(0, index), 0.0)
    return DispatchPlan(index, ids, weights)


def pack_meta(ids: Tensor, weights: Tensor) -> Tensor:
    """int32 (N, 2k): the rows' ids, then their float32 weights' bits, to travel in one exchange."""
    return torch.cat([ids.to(torch.int32), weights.float().contiguous().view(torch.int32)], dim=1)


def unpack_meta(meta: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(weights float32 (N, k), ids int32 (N, k)) of :func:`pack_meta`'s rows, contiguous for ``fused_moe``."""
    return meta[:, k:].contiguous().view(torch.float32), meta[:, :k].contiguous()


def combine_chunk(out: Tensor, index: Tensor, rows: Tensor, sizes: list[int]) -> None:
    """Adds a chunk's returned rows (in its ``index``'s order, ``sizes[r]`` from rank r) into ``out`` (T, H) float32,
    rank after rank: within one rank's rows no token repeats, so each ``index_add_`` is exact and the sum's order
    fixed."""
    start = 0
    for size in sizes:
        if size:
            out.index_add_(0, index[start : start + size], rows[start : start + size].to(out.dtype))
        start += size


def exchange_counts(counts: Tensor, tokens: int, group) -> Tensor:
    """The count matrix on the host, (2, world, CHUNKS + 1) int64 (:func:`decide`'s): this rank's
    :func:`count_message` and the messages received, by one ``all_to_all_single`` and the forward's one copy to the
    host."""
    import torch.distributed as dist

    message = count_message(counts, tokens)
    received = torch.empty_like(message)
    dist.all_to_all_single(received, message, group=group)
    return torch.stack([message, received]).cpu()


def expert_parallel_moe(
    rows: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    experts: Callable[[Tensor, Tensor, Tensor], Tensor],
    *,
    per_rank: int,
    group,
    partial_dtype: torch.dtype,
    overlap_tokens: int | None = OVERLAP_TOKENS,
    mark: Callable[[str], None] | None = None,
) -> Tensor:
    """float32 (T, H): this rank's tokens ``rows`` (T, H) through the experts of the whole group, ``topk_ids`` global
    expert ids. ``experts(x, weights, ids)`` runs this rank's experts on the rows it received (N > 0, ids local or
    -1) and returns (N, H) rows of ``partial_dtype`` (a rank that receives nothing sends nothing back, so the dtype
    must be every rank's). ``mark(name)``, where given, is called as the phases end ("counts", "dispatch", "experts",
    "combine"; chunked, once per chunk and phase in the order they are issued): the benchmark records CUDA events
    there."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    tokens, hidden = rows.shape
    k = topk_ids.shape[1]
    mark = mark or (lambda name: None)
    mask = destinations(topk_ids, per_rank, world)
    counts = chunk_counts(mask, CHUNKS)
    split = decide(exchange_counts(counts, tokens, group), overlap_tokens)
    if split.chunks == 1:
        counts = counts.sum(dim=0, keepdim=True)
    mark("counts")
    plan = plan_dispatch(mask, topk_ids, topk_weights, per_rank, counts, sum(map(sum, split.send)))
    send_x = rows.index_select(0, plan.index)
    send_meta = pack_meta(plan.ids, plan.weights)

    def segments(sizes_per_chunk):
        starts = [0]
        for sizes in sizes_per_chunk:
            starts.append(starts[-1] + sum(sizes))
        return starts

    sent = segments(split.send)
    arrivals = []  # per chunk: the received rows, their meta, the two exchanges' handles
    for c in range(split.chunks):
        count = sum(split.recv[c])
        recv_x = rows.new_empty(count, hidden)
        recv_meta = send_meta.new_empty(count, 2 * k)
        chunk_x, chunk_meta = send_x[sent[c] : sent[c + 1]], send_meta[sent[c] : sent[c + 1]]
        works = [
            dist.all_to_all_single(recv_x, chunk_x, split.recv[c], split.send[c], group=group, async_op=True),
            dist.all_to_all_single(recv_meta, chunk_meta, split.recv[c], split.send[c], group=group, async_op=True),
        ]
        arrivals.append((recv_x, recv_meta, works))

    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=rows.device)
    returns = []  # per chunk: the rows coming back and the exchange's handle
    for c, (recv_x, recv_meta, works) in enumerate(arrivals):
        for work in works:
            work.wait()
        mark("dispatch")
        if recv_x.shape[0]:
            weights, ids = unpack_meta(recv_meta, k)
            partial = experts(recv_x, weights, ids).to(partial_dtype)
        else:
            partial = rows.new_empty(0, hidden, dtype=partial_dtype)
        mark("experts")
        back = rows.new_empty(sent[c + 1] - sent[c], hidden, dtype=partial_dtype)
        work = dist.all_to_all_single(back, partial, split.send[c], split.recv[c], group=group, async_op=True)
        returns.append((back, work))
        arrivals[c] = None  # the received rows are no longer needed
    for c, (back, work) in enumerate(returns):
        work.wait()
        combine_chunk(out, plan.index[sent[c] : sent[c + 1]], back, split.send[c])
        mark("combine")
    return out


def init_process_group(cpu: bool = False) -> torch.device:
    """The default process group of an expert-parallel script, and this rank's device: under ``torchrun`` (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) its ranks, else a world of one on a free local port; NCCL on the GPU of
    ``LOCAL_RANK``, or gloo on the CPU (``cpu``, or no GPU)."""
    import torch.distributed as dist

    alone = {}
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        alone = dict(init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if torch.cuda.is_available() and not cpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **alone)
        return device
    dist.init_process_group("gloo", **alone)
    return torch.device("cpu")

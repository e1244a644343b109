"""How the CTAs of a row split over several share their partial results without a barrier of all of them per row.

A cluster: each CTA pushes its pair into every peer's inbox slot for the row (``st.async`` into the peer's shared
memory, completing bytes on the peer's mbarrier of the slot); a CTA waits on its own mbarrier. A team (CTAs that are
not a cluster): each writes its pair into the row's line of an ``exchange`` tensor in global memory, each half
tagged in one 64-bit store (no fence); a CTA's first warp polls the pairs until every tag is set. Either way the
ranks are summed in a fixed order: every CTA of the row computes the same values, whatever the timing."""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import cluster, gpu
from flydsl.kernels.rows.layout import RowConfig

_llvm = lazy_import("mlir.dialects.llvm")

__all__ = [
    "Exchange",
    "exchange_setup",
    "exchange_push",
    "exchange_sums",
    "exchange_wait",
    "exchange_columns",
    "inbox_slots",
    "poll_tagged_pair",
    "team_prefetch",
    "push_word",
]


class Exchange(NamedTuple):
    """A row's exchange (:func:`exchange_setup`): the row layout, this thread's position, the team's ``exchange``
    tensor, the inbox ``slots`` (rows of pairs), and the shared memory that receives: ``inbox`` (a cluster's pushed
    pairs, or a team's combined statistics), ``means`` (a team's two rows of sums), ``bars`` (a cluster's mbarrier
    per slot)."""

    rc: RowConfig
    pos: object
    exchange: object
    slots: int
    inbox: object = None
    means: object = None
    bars: object = None


def push_pair(a, b, remote, barrier) -> None:
    """``st.async``: two Float32 into a peer's shared memory (``remote``, an ``!llvm.ptr<7>`` from
    ``cluster.map_shared``), completing 8 bytes of the transaction count of its mbarrier ``barrier`` (likewise)."""
    _st_async(remote, barrier, "v2.f32", "{$1, $2}", [a, b], "f,f")


def push_word(value, remote, barrier) -> None:
    """``st.async``: one Int32 into a peer's shared memory, completing 4 bytes of its mbarrier ``barrier``'s
    transaction count (as :func:`push_pair`)."""
    _st_async(remote, barrier, "b32", "$1", [value], "r")


def _st_async(remote, barrier, kind: str, registers: str, values, constraints: str) -> None:
    """``st.async.shared::cluster.mbarrier::complete_tx::bytes.{kind}`` of ``values`` (operands ``registers``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st-async
    """
    i64 = fx.Int64.mlir_type()  # mapa's 64-bit shared::cluster addresses, as they are
    where, bar = _llvm.ptrtoint(i64, remote), _llvm.ptrtoint(i64, barrier)
    last = len(values) + 1
    text = f"st.async.shared::cluster.mbarrier::complete_tx::bytes.{kind} [$0], {registers}, [${last}];"
    operands = [where, *(v.value for v in values), bar]
    _llvm.inline_asm(None, operands, text, f"l,{constraints},l", has_side_effects=True)


_SPIN_LIMIT = 1 << 22  # polls of a team's pair before the kernel traps (a lost peer: fail rather than hang)

_TAG = 1  # marks a team's pair as written (the exchange tensor is zeroed before each launch)


def exchange_columns(cfg) -> int:
    """Float32 columns per row of a team's ``exchange`` tensor: per CTA of the row, its pair, each half next to a
    tag: ``(sum(g * xhat), tag, sum(g), tag)``."""
    return 4 * cfg.row.cluster


def _store_tagged(pointer, value) -> None:
    """``st.relaxed.gpu.global.b64``: ``value`` (Float32) and :data:`_TAG` as one 64-bit store (single-copy atomic:
    a reader sees both or neither), no fence: nothing this thread wrote before has to be waited for."""
    text = "{ .reg .b32 lo; .reg .b64 t; mov.b32 lo, $1; mov.b64 t, {lo, $2}; st.relaxed.gpu.global.b64 [$0], t; }"
    _llvm.inline_asm(None, [pointer, value.value, fx.Int32(_TAG).value], text, "l,f,r", has_side_effects=True)


def _load_tagged_pair(pointer):
    """Both halves of a team's pair (16 bytes: value, tag, value, tag) in one ``ld.relaxed.gpu.global.v2.b64``: each
    64-bit element is single-copy atomic (a value with its own tag); (first, second, both tags set)."""
    return _tagged_pair(_load_tagged_words(pointer))


def _tagged_pair(words):
    """(first, second, both tags set) of a pair's four words (:func:`_load_tagged_words`)."""
    first, second = (fx.Float32(fx.arith.bitcast(fx.Float32.mlir_type(), words[i].value)) for i in (0, 2))
    return first, second, (words[1] == _TAG) & (words[3] == _TAG)


def _load_tagged_words(pointer, when=None):
    """The four words of a team's pair (:func:`_load_tagged_pair`), as Int32, not looked at: a load whose result
    is first used much later does not stall the warp meanwhile. ``when`` (a kernel boolean): load only where it
    holds, else zeros (tags unset)."""
    i32 = fx.Int32.mlir_type()
    struct = _llvm.StructType.get_literal([i32] * 4)
    load = "ld.relaxed.gpu.global.v2.b64 {a, b}, [$4]; mov.b64 {$0, $1}, a; mov.b64 {$2, $3}, b;"
    if when is None:
        text = f"{{ .reg .b64 a, b; {load} }}"
        words = _llvm.inline_asm(struct, [pointer], text, "=r,=r,=r,=r,l", has_side_effects=True)
    else:
        text = f"{{ .reg .pred p; .reg .b64 a, b; setp.ne.b32 p, $5, 0; mov.b64 a, 0; mov.b64 b, 0; @p {load} }}"
        flag = fx.arith.select(when, fx.Int32(1), fx.Int32(0))
        words = _llvm.inline_asm(struct, [pointer, flag.value], text, "=r,=r,=r,=r,l,r", has_side_effects=True)
    return [fx.Int32(_llvm.extractvalue(i32, words, [i])) for i in range(4)]


def inbox_slots(lag: int) -> int:
    """A cluster's inbox slots (rows of pairs) when each CTA consumes row ``k - lag`` after pushing row ``k``: a peer
    pushing row ``k + slots`` has waited for this CTA's push of row ``k + slots - 1 - lag``, made after this CTA
    consumed row ``k + slots - 2 - 2 lag``, which is row ``k``: the slot is free (simulated in the CPU tests)."""
    return 2 * lag + 2


def exchange_setup(rc: RowConfig, pos, exchange, slots: int, team_inbox: bool = False) -> Exchange:
    """The shared memory a row's CTAs receive their peers' pairs in (see the module docstring): a cluster's inbox of
    ``slots`` rows of pairs and an mbarrier per slot (initialized, then a cluster barrier so that no peer pushes
    before); a team's two rows of sums (the backward) or, with ``team_inbox`` (the forward), ``slots`` rows of the
    statistics its first warp combines from the row's tagged pairs."""
    inbox = means = bars = None
    if fx.const_expr(rc.team and team_inbox):
        inbox = fx.SmemAllocator().allocate(fx.Float32, slots * 2, alignment=16)
    elif fx.const_expr(rc.team):
        means = fx.SmemAllocator().allocate(fx.Float32, 4, alignment=16)  # two rows' sums
    else:
        inbox = fx.SmemAllocator().allocate(fx.Float32, slots * rc.cluster * 2, alignment=16)
        bars = fx.mbarrier.allocate(fx.SmemAllocator(), slots)
        if pos.tid == 0:
            for i in fx.range_constexpr(slots):
                bars[i].init(1)
            fx.mbarrier.fence_init()
        cluster.sync()  # every peer's barriers are initialized before the first push
    return Exchange(rc=rc, pos=pos, exchange=exchange, slots=slots, inbox=inbox, means=means, bars=bars)


def exchange_push(share, k, row, pair, extra_bytes: int = 0) -> None:
    """This CTA's ``pair`` of row ``row`` (its ``k``-th), to every CTA of the row (itself included). A cluster's
    ``extra_bytes``: more bytes the slot's mbarrier waits for (pushed by the caller: the staged forward's claimed
    row, :func:`flydsl.kernels.rows.staged_forward.claimed_rows`)."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid == 0:
            for v in fx.range_constexpr(2):
                _store_tagged(fx.nvvm.address(share.exchange, (row, 4 * pos.rank + 2 * v)), pair[v])
    else:
        box = k % share.slots
        if pos.tid < size:
            remote = cluster.map_shared(share.inbox, pos.tid, coord=(box * size + pos.rank) * 2)
            push_pair(pair[0], pair[1], remote, cluster.map_shared(share.bars.tensor, pos.tid, coord=box))
        if pos.tid == 0:
            share.bars[box].arrive_expect_tx(size * 8 + extra_bytes)


def exchange_sums(share, k, row, parity, early=None):
    """The two sums of row ``row`` (this CTA's ``k``-th) over the row's CTAs, once all have pushed; ``early``: a
    team's pairs of the row as :func:`team_prefetch` read them."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid < 32:
            _team_sums(share, row, parity, size, pos.tid % 32, early)
        gpu.barrier()
        return [share.means[parity * 2], share.means[parity * 2 + 1]]
    old = exchange_wait(share, k)
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for r in fx.range_constexpr(size):
        total = [total[i] + share.inbox[(old * size + r) * 2 + i] for i in range(2)]
    return total


def exchange_wait(share, k):
    """Waits until every CTA of the cluster has pushed its pair of this CTA's ``k``-th row; returns the inbox slot,
    whose pair from rank ``r`` is ``share.inbox[(slot * cluster + r) * 2 + (0, 1)]``."""
    old = k % share.slots
    share.bars[old].wait((k // share.slots) % 2)
    return old


def poll_tagged_pair(share, row, rank, ok, early=None):
    """Rank ``rank``'s whole pair of ``row`` in the team's exchange line (:func:`_load_tagged_pair`: one L2 round
    trip per poll, not one per half), polled until both tags are set (traps after :data:`_SPIN_LIMIT` polls rather
    than hang); no waiting where ``ok`` is false. ``early``: the pair's words as an earlier load found them (no load
    now when its tags are set)."""
    where = fx.nvvm.address(share.exchange, (row, 4 * rank))
    first, second, done = _tagged_pair(early) if early is not None else _load_tagged_pair(where)
    tries = fx.Int32(0)
    while ok & (~done) & (tries < _SPIN_LIMIT):
        first, second, done = _load_tagged_pair(where)
        tries = tries + 1
    if tries >= _SPIN_LIMIT:
        fx.nvvm.trap()
    return first, second


def _team_ranks(size: int, lane, i: int):
    """The rank lane ``lane`` of the first warp reads in its ``i``-th step (``lane + 32 i``; 0 past the team) and
    whether it is in the team."""
    rank = lane + 32 * i
    ok = rank < size
    return fx.arith.select(ok, rank, type(rank)(0)), ok


def team_prefetch(share, row, when):
    """The pairs of ``row`` as they are now (one load per lane of the first warp and per 32 ranks, none where
    ``when`` is false), issued before :func:`_team_sums` needs them (right after the next row's first pass): the
    peers pushed them about a row ago, so the load's L2 round trip overlaps the block reduction instead of stalling
    the CTA at the exchange (otherwise the first warp reads them while every other warp waits at the barrier)."""
    size, pos = share.rc.cluster, share.pos
    lane = pos.tid % 32
    early = []
    for i in fx.range_constexpr(-(-size // 32)):
        rank, ok = _team_ranks(size, lane, i)
        where = fx.nvvm.address(share.exchange, (fx.arith.select(when, row, type(row)(0)), 4 * rank))
        early.append(_load_tagged_words(where, when & ok & (pos.tid < 32)))
    return early


def _team_sums(share, row, parity, size: int, lane, early=None) -> None:
    """The first warp: lane ``l`` reads the pairs of ranks ``l, l + 32, ...`` of ``row`` (:func:`poll_tagged_pair`;
    from ``early``, :func:`team_prefetch`'s, where its tags were set), sums them, then the warp's fixed shuffle
    tree; the sums go to shared memory slot ``parity``."""
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for i in fx.range_constexpr(-(-size // 32)):
        rank, ok = _team_ranks(size, lane, i)
        pair = poll_tagged_pair(share, row, rank, ok, None if early is None else early[i])
        total = [t + fx.arith.select(ok, v, fx.Float32(0.0)) for t, v in zip(total, pair, strict=True)]
    total = [gpu.warp_reduce(v, "add", width=32) for v in total]
    if lane == 0:
        share.means[parity * 2] = total[0]
        share.means[parity * 2 + 1] = total[1]

"""Expert parallelism on the CPU (flydsl.torch.expert_parallel, ``nn.MoE(ep_group=...)``): the dispatch/combine
bookkeeping as pure functions, a whole exchange simulated in one process against the float32 reference, and the layer
over gloo in 2 and 4 processes (forked: no re-import, a few seconds) against the whole layer on the same weights and
tokens: uneven token counts, a rank with no tokens, ranks that receive none (skewed routing), top_k 1, the chunked
exchanges, fp8 experts, from_hf reading only the local experts' keys; a world of one equals the plain module."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from flydsl.kernels.moe.reference import fused_moe_reference, topk_route_reference  # noqa: E402
from flydsl.torch import expert_parallel as ep  # noqa: E402
from flydsl.torch.nn import MoE  # noqa: E402

H, INTER, E = 32, 24, 8


# --- the bookkeeping, no processes ------------------------------------------------------------------------------------


def test_experts_per_rank_and_destinations():
    assert ep.experts_per_rank(8, 4) == 2 and ep.experts_per_rank(256, 8) == 32 and ep.experts_per_rank(8, 1) == 8
    with pytest.raises(ValueError, match=r"ep_group: num_experts = 6 must split evenly over the group's 4 ranks"):
        ep.experts_per_rank(6, 4)
    ids = torch.tensor([[0, 1], [5, 2], [7, 6], [3, -1], [9, 0]], dtype=torch.int32)
    mask = ep.destinations(ids, 2, 4)  # experts 0-1 on rank 0, 2-3 on rank 1, ...
    expected = [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 0, 0]]  # -1 and 9 go nowhere
    assert mask.tolist() == [[bool(v) for v in row] for row in expected]
    assert (
        ep.chunk_bounds(5, 2) == [0, 2, 5] and ep.chunk_bounds(1, 2) == [0, 0, 1] and ep.chunk_bounds(0, 2) == [0, 0, 0]
    )
    assert ep.chunk_counts(mask, 2).tolist() == [[1, 1, 1, 0], [1, 1, 0, 1]]
    assert ep.chunk_counts(mask, 1).tolist() == [[2, 2, 1, 1]]
    assert ep.count_message(ep.chunk_counts(mask, 2), 5).tolist() == [[1, 1, 5], [1, 1, 5], [1, 0, 5], [0, 1, 5]]


def test_plan_dispatch_orders_rows_by_chunk_rank_token():
    ids = torch.tensor([[0, 3], [2, 3], [1, 0], [3, 2]], dtype=torch.int32)  # E 4 over 2 ranks: 0-1, 2-3
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    mask = ep.destinations(ids, 2, 2)
    counts = ep.chunk_counts(mask, 2)
    assert mask.tolist() == [[True, True], [False, True], [True, False], [False, True]]
    assert counts.tolist() == [[1, 2], [1, 1]]  # chunk 0: tokens 0, 1; chunk 1: tokens 2, 3
    plan = ep.plan_dispatch(mask, ids, weights, 2, counts, 5)
    assert plan.index.tolist() == [0, 0, 1, 2, 3]  # chunk 0 to rank 0, to rank 1; chunk 1 to rank 0, to rank 1
    assert plan.ids.dtype == torch.int32 and plan.weights.dtype == torch.float32
    assert plan.ids.tolist() == [[0, -1], [-1, 1], [0, 1], [1, 0], [1, 0]]  # local ids, -1 for the other rank's
    torch.testing.assert_close(plan.weights, torch.tensor([[0.6, 0.0], [0.0, 0.4], [0.7, 0.3], [0.5, 0.5], [0.9, 0.1]]))


def test_plan_dispatch_unchunked_and_pack():
    ids = torch.tensor([[0, 3], [2, 3], [1, 0], [3, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    mask = ep.destinations(ids, 2, 2)
    counts = ep.chunk_counts(mask, 1)
    plan = ep.plan_dispatch(mask, ids, weights, 2, counts, int(counts.sum()))
    assert plan.index.tolist() == [0, 2, 0, 1, 3]
    assert plan.ids.tolist() == [[0, -1], [1, 0], [-1, 1], [0, 1], [1, 0]]
    meta = ep.pack_meta(plan.ids, plan.weights)
    assert meta.dtype == torch.int32 and meta.shape == (5, 4)
    back_weights, back_ids = ep.unpack_meta(meta, 2)
    assert torch.equal(back_ids, plan.ids) and torch.equal(back_weights, plan.weights)
    assert back_ids.is_contiguous() and back_weights.is_contiguous()
    empty = ep.plan_dispatch(mask[:0], ids[:0], weights[:0], 2, ep.chunk_counts(mask[:0], 2), 0)
    assert empty.index.numel() == 0 and empty.ids.shape == (0, 2)


def test_decide_chunks_only_where_some_rank_has_enough_tokens():
    # rank 0's view of a 2-rank group: sent (world, CHUNKS + 1), received from each rank
    host = torch.tensor([[[3, 4, 100], [1, 2, 100]], [[3, 4, 100], [5, 6, 2000]]])
    assert ep.decide(host, 1024) == ep.Split(2, [[3, 1], [4, 2]], [[3, 5], [4, 6]])
    assert ep.decide(host, 4096) == ep.Split(1, [[7, 3]], [[7, 11]])
    assert ep.decide(host, None).chunks == 1
    assert ep.decide(host, 100).chunks == 2  # (the other rank's 2000 decides for both)
    assert ep.decide(host[:, :1, :], 1).chunks == 1  # a world of one: nothing to overlap


def test_combine_adds_rank_after_rank():
    out = torch.zeros(3, 2)
    index = torch.tensor([0, 2, 0, 1])  # rank 0 sent back tokens 0 and 2, rank 1 tokens 0 and 1
    rows = torch.tensor([[1.0, 1.0], [2.0, 2.0], [10.0, 10.0], [20.0, 20.0]])
    ep.combine_chunk(out, index, rows, [2, 2])
    assert out.tolist() == [[11.0, 11.0], [20.0, 20.0], [2.0, 2.0]]
    ep.combine_chunk(out, index[:0], rows[:0], [0, 0])
    assert out.tolist() == [[11.0, 11.0], [20.0, 20.0], [2.0, 2.0]]


def _weights(seed=0, experts=E):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(experts, 2 * INTER, H, generator=g) / H**0.5
    w2 = torch.randn(experts, H, INTER, generator=g) / INTER**0.5
    return w1, w2


def _simulate(xs, ids, weights, w1, w2, overlap_tokens):
    """The whole exchange over ``len(xs)`` ranks in one process: the pure functions, the collectives by slicing."""
    world = len(xs)
    per_rank = w1.shape[0] // world
    masks = [ep.destinations(i, per_rank, world) for i in ids]
    counts = [ep.chunk_counts(m, ep.CHUNKS) for m in masks]
    messages = [ep.count_message(c, x.shape[0]) for c, x in zip(counts, xs, strict=True)]
    splits, plans = [], []
    for r in range(world):
        received = torch.stack([messages[s][r] for s in range(world)])
        split = ep.decide(torch.stack([messages[r], received]), overlap_tokens)
        mine = counts[r].sum(0, keepdim=True) if split.chunks == 1 else counts[r]
        splits.append(split)
        plans.append(ep.plan_dispatch(masks[r], ids[r], weights[r], per_rank, mine, sum(map(sum, split.send))))
    assert len({s.chunks for s in splits}) == 1, "the ranks disagree on the chunks"
    outs = [torch.zeros(x.shape[0], H) for x in xs]
    for c in range(splits[0].chunks):
        # every rank's chunk-c rows to each destination: rows [start, start + n) of its chunk segment
        def segment(r, c):
            start = sum(map(sum, splits[r].send[:c]))
            return start, start + sum(splits[r].send[c])

        partials = []
        for d in range(world):  # destination d receives from each s in rank order
            pieces_x, pieces_meta = [], []
            for s in range(world):
                begin, _ = segment(s, c)
                begin += sum(splits[s].send[c][:d])
                rows = plans[s].index[begin : begin + splits[s].send[c][d]]
                pieces_x.append(xs[s][rows])
                pieces_meta.append(ep.pack_meta(plans[s].ids, plans[s].weights)[begin : begin + len(rows)])
            got_x, got_meta = torch.cat(pieces_x), torch.cat(pieces_meta)
            assert got_x.shape[0] == sum(splits[d].recv[c])
            w, i = ep.unpack_meta(got_meta, ids[0].shape[1])
            mine = slice(d * per_rank, (d + 1) * per_rank)
            partials.append(fused_moe_reference(got_x, w1[mine], w2[mine], w, i))
        for s in range(world):  # the rows go back: from each destination d, the part that came from s
            back = []
            for d in range(world):
                begin = sum(splits[d].recv[c][:s])
                back.append(partials[d][begin : begin + splits[d].recv[c][s]])
            begin, end = segment(s, c)
            ep.combine_chunk(outs[s], plans[s].index[begin:end], torch.cat(back), splits[s].send[c])
    return outs


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("overlap_tokens", [None, 1])
@pytest.mark.parametrize("top_k", [1, 3])
def test_a_simulated_exchange_equals_the_reference(world, overlap_tokens, top_k):
    w1, w2 = _weights()
    g = torch.Generator().manual_seed(world * 10 + top_k)
    xs, ids, weights = [], [], []
    for r in range(world):
        x = torch.randn(3 * r + (0 if r == 1 else 5), H, generator=g)  # rank 1 has no tokens
        w, i = topk_route_reference(torch.randn(x.shape[0], E, generator=g), top_k)
        xs.append(x), ids.append(i), weights.append(w)
    outs = _simulate(xs, ids, weights, w1, w2, overlap_tokens)
    for x, i, w, out in zip(xs, ids, weights, outs, strict=True):
        torch.testing.assert_close(out, fused_moe_reference(x, w1, w2, w, i), rtol=1e-5, atol=1e-5)


# --- over gloo --------------------------------------------------------------------------------------------------------


def _whole(seed, top_k=2, experts=E):
    torch.manual_seed(seed)
    return MoE(H, INTER, experts, top_k)


def _check(got, expected, what):
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    if expected.numel() == 0:
        return
    error = float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    assert error < 1e-5, f"{what}: max |ep - whole| / max |whole| = {error:.2e}"


def _hf_state(layer):
    state = {"gate.weight": layer.gate.weight.detach().clone()}
    for e in range(layer.num_experts):
        state[f"experts.{e}.w1.weight"] = layer.w1[e, :INTER].detach().clone()
        state[f"experts.{e}.w3.weight"] = layer.w1[e, INTER:].detach().clone()
        state[f"experts.{e}.w2.weight"] = layer.w2[e].detach().clone()
    return state


def _worker(rank, world, path):
    """One rank: every case against the whole layer built from the same seed on this rank's own tokens."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    group = dist.group.WORLD
    try:
        with torch.inference_mode():
            whole = _whole(0)
            layer = whole.sharded(group)
            per_rank = E // world
            assert layer.w1.shape == (per_rank, 2 * INTER, H) and layer.expert_offset == rank * per_rank
            assert torch.equal(layer.w1, whole.w1[rank * per_rank : (rank + 1) * per_rank])
            assert f"ep rank {rank} of {world}" in repr(layer)
            torch.manual_seed(100 + rank)
            tokens = 0 if rank == 1 else 7 + 5 * rank  # uneven, and a rank with none
            x = torch.randn(tokens, H)
            for overlap in (None, 1):  # one exchange; chunked
                layer.ep_overlap_tokens = overlap
                y = layer(x)
                _check(y, whole(x), f"rank {rank} overlap {overlap}")
                assert torch.equal(layer(x), y)  # the same sum every run
            x3 = torch.randn(2, 3, H)  # (..., H) in, the same shape out
            _check(layer(x3), whole(x3), "3-D x")
            # top_k 1
            whole1 = _whole(1, top_k=1)
            _check(whole1.sharded(group)(x), whole1(x), "top_k 1")
            # skewed: every token to experts 0 and 1 (rank 0's): the other ranks receive nothing
            skewed = _whole(2)
            skewed.gate.weight.zero_()
            skewed.gate.weight[0].fill_(1.0)
            skewed.gate.weight[1].fill_(0.5)
            xs = torch.randn(9, H).abs() + 0.1
            _check(skewed.sharded(group)(xs), skewed(xs), "skewed")
            # fp8 experts (per channel): the dequantized references on both sides
            fp8 = whole.quantized("channel")
            _check(fp8.sharded(group)(x), fp8(x), "fp8 sharded")
            _check(layer.quantized("channel")(x), fp8(x), "quantized EP layer")
            # from_hf: only the router and the local experts' keys
            state = _hf_state(whole)
            mine = range(layer.expert_offset, layer.expert_offset + per_rank)
            local = {k: v for k, v in state.items() if k == "gate.weight" or int(k.split(".")[1]) in mine}
            loaded = MoE.from_hf(local, top_k=2, ep_group=group)
            assert torch.equal(loaded.w1, layer.w1) and torch.equal(loaded.w2, layer.w2)
            _check(loaded(x), whole(x), "from_hf")
            # the phases, chunked: counts once, then dispatch and experts per chunk, then the combines
            marks = []
            weights, ids = topk_route_reference(whole.gate(x), 2)
            ep.expert_parallel_moe(
                x, weights, ids, lambda r, w, i: r * w.sum(1, keepdim=True), per_rank=per_rank, group=group,
                partial_dtype=torch.float32, overlap_tokens=1, mark=marks.append,
            )  # fmt: skip
            assert marks == ["counts", "dispatch", "experts", "dispatch", "experts", "combine", "combine"]
        if world == 4:
            with pytest.raises(ValueError, match="num_experts = 6 must split evenly"):
                MoE(H, INTER, 6, 2, ep_group=group)
    finally:
        dist.destroy_process_group()


def _run(world, tmp_path):
    import torch.multiprocessing as mp

    # fork: the children share the parent's imports (spawn would import torch and flydsl again in each)
    mp.start_processes(_worker, args=(world, str(tmp_path / "store")), nprocs=world, start_method="fork")


@pytest.mark.parametrize("world", [2, 4])
def test_the_layer_over_gloo_equals_the_whole_layer(world, tmp_path):
    _run(world, tmp_path)


def test_a_world_of_one_equals_the_plain_module(tmp_path, op_recorder):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with torch.inference_mode():
            whole = _whole(3, top_k=2)
            layer = whole.sharded(dist.group.WORLD)
            assert layer.num_local_experts == E and layer.expert_offset == 0
            x = torch.randn(37, H)
            for overlap in (None, 1):
                layer.ep_overlap_tokens = overlap
                assert torch.equal(layer(x), whole(x))
            bf16 = torch.randn(5, H).bfloat16()
            assert torch.equal(layer(bf16), whole(bf16))
            # nothing in the bookkeeping reads the tensors back (nonzero, item, boolean masks): only the count matrix
            weights, ids = topk_route_reference(whole.gate(x), 2)
            with op_recorder() as recorder:
                ep.expert_parallel_moe(
                    x, weights, ids, lambda r, w, i: r * w.sum(1, keepdim=True), per_rank=E, group=dist.group.WORLD,
                    partial_dtype=torch.float32, overlap_tokens=1,
                )  # fmt: skip
            syncing = {"nonzero", "_local_scalar_dense", "masked_select", "item"}
            assert not [name for name in recorder.names if name.split(".")[1] in syncing], recorder.names
        with pytest.raises(ValueError, match="already split"):
            layer.sharded(dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def test_ep_group_needs_torch_distributed():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="ep_group: torch.distributed is not initialized"):
        MoE(H, INTER, E, 2, ep_group=object())

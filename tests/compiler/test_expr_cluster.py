"""fx.cluster: special registers, cluster barriers and distributed shared memory. CPU: each compiles to its PTX
instruction and ptxas accepts it for sm_90a; GPU (``gpu``): a cluster reduction through DSMEM, checked exactly."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import cluster, gpu

from .fakes import FakeGpuTensor

THREADS = 128


@flyc.kernel
def cluster_registers(out: fx.Tensor):
    """out[block, 0..7]: cluster id x, CTAs per cluster x, position in cluster x, rank, size, clusters in the grid x,
    block id x, 0."""
    if gpu.thread_idx.x == 0:
        b = gpu.block_idx.x * 8
        out[b + 0] = cluster.cluster_idx.x
        out[b + 1] = cluster.cluster_dim.x
        out[b + 2] = cluster.block_idx_in_cluster.x
        out[b + 3] = cluster.block_rank()
        out[b + 4] = cluster.cluster_size()
        out[b + 5] = cluster.num_clusters.x
        out[b + 6] = gpu.block_idx.x
        out[b + 7] = fx.Int32(0)


@flyc.kernel
def cluster_sum(x: fx.Tensor, out: fx.Tensor, peers: fx.Constexpr[int]):
    """Each cluster of ``peers`` CTAs sums its ``peers * THREADS`` elements of x: each CTA reduces its own, writes the
    partial to its shared memory, and after a cluster barrier every CTA reads all partials through DSMEM (pull);
    every CTA also pushes its partial into slot ``rank`` of rank 0's ``pushed`` buffer. out[block] = pulled total,
    out[grid + block] = pushed total (rank 0; others write -1)."""
    tid = gpu.thread_idx.x
    smem = fx.SmemAllocator()
    scratch = smem.allocate(fx.Int32, THREADS // 32)
    partial = smem.allocate(fx.Int32, 1)
    pushed = smem.allocate(fx.Int32, peers)
    rank = cluster.block_rank()
    mine = gpu.block_reduce(x[gpu.block_idx.x * THREADS + tid], "add", scratch=scratch, num_warps=THREADS // 32)
    cluster.sync()  # every CTA of the cluster has started: its shared memory may be written by peers
    if tid == 0:
        partial[0] = mine
        cluster.store_peer(mine, pushed, 0, coord=rank)
    cluster.sync()
    total = fx.Int32(0)
    for peer in fx.range_constexpr(peers):
        total = total + cluster.load_peer(partial, peer, coord=0)
    if tid == 0:
        out[gpu.block_idx.x] = total
        pushed_total = fx.Int32(-1)
        if rank == 0:
            pushed_total = fx.Int32(0)
            for peer in fx.range_constexpr(peers):
                pushed_total = pushed_total + pushed[peer]
        out[gpu.grid_dim.x + gpu.block_idx.x] = pushed_total
    cluster.arrive(relaxed=True)  # peers may still read `partial`: nobody exits before everyone is done
    cluster.wait()


def _ptx(kernel, *args) -> str:
    module = kernel.lower(*args)
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def test_cluster_special_registers_compile():
    ptx = _ptx(cluster_registers, FakeGpuTensor((64,), "<i4"))
    for register in ("%clusterid.x", "%cluster_nctaid.x", "%cluster_ctaid.x", "%cluster_ctarank", "%nclusterid.x"):
        assert register in ptx
    assert "%cluster_nctarank" in ptx


def test_cluster_barrier_and_dsmem_compile():
    ptx = _ptx(cluster_sum, FakeGpuTensor((4 * THREADS,), "<i4"), FakeGpuTensor((8,), "<i4", pointer=1 << 21), 4)
    assert "barrier.cluster.arrive.aligned" in ptx
    assert "barrier.cluster.arrive.relaxed.aligned" in ptx
    assert "barrier.cluster.wait.aligned" in ptx
    assert "mapa.shared::cluster" in ptx
    assert "ld.shared::cluster" in ptx and "st.shared::cluster" in ptx


def test_argument_errors():
    with pytest.raises(TypeError, match="shared-memory Tensor"):
        cluster._shared_pointer(42, None)


@pytest.mark.gpu
@pytest.mark.parametrize("peers", [2, 4, 8])
def test_cluster_reduction_through_dsmem(peers):
    import torch

    clusters = 3
    blocks = peers * clusters
    x = torch.randint(-1000, 1000, (blocks * THREADS,), dtype=torch.int32, device="cuda")
    out = torch.full((2 * blocks,), 12345, dtype=torch.int32, device="cuda")
    cluster_sum(x, out, peers).launch(grid=blocks, block=THREADS, cluster=peers)
    torch.cuda.synchronize()
    expected = x.view(clusters, peers * THREADS).sum(dim=1, dtype=torch.int64).to(torch.int32)
    assert torch.equal(out[:blocks].view(clusters, peers), expected[:, None].expand(clusters, peers))
    pushed = out[blocks:].view(clusters, peers)
    assert torch.equal(pushed[:, 0], expected)
    assert bool((pushed[:, 1:] == -1).all())


@pytest.mark.gpu
def test_cluster_registers_on_gpu():
    import torch

    out = torch.full((8 * 8,), -7, dtype=torch.int32, device="cuda")
    cluster_registers(out).launch(grid=8, block=32, cluster=4)
    torch.cuda.synchronize()
    rows = out.view(8, 8).cpu()
    for block in range(8):
        assert rows[block].tolist() == [block // 4, 4, block % 4, block % 4, 4, 2, block, 0]

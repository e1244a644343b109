"""Thread block clusters (sm_90+): where a CTA sits in its cluster, the cluster barrier, and distributed shared
memory (DSMEM: reading and writing a peer CTA's shared memory).

A kernel runs in clusters when it is launched with ``.launch(grid=..., block=..., cluster=(x, y, z))`` (the grid
a multiple of the cluster shape; at most 8 CTAs per cluster portably). Inside it:

    rank = cluster.block_rank()                          # 0 .. cluster_size() - 1
    partial[0] = my_sum                                  # a shared-memory Tensor
    cluster.sync()                                       # every CTA's writes are visible to the whole cluster
    total = fx.Float32(0.0)
    for peer in fx.range_constexpr(4):                   # the peers' partials, through DSMEM
        total = total + cluster.load_peer(partial, peer, coord=0)
    cluster.sync()                                       # no CTA exits (or reuses partial) while peers read it

``sync()`` is ``barrier.cluster.arrive`` (release semantics) + ``barrier.cluster.wait`` (acquire): shared-memory
writes made before the arrive are visible to every CTA of the cluster after the wait. ``arrive(relaxed=True)`` drops
the release ordering (for a barrier that only keeps CTAs alive, e.g. the last one before exit). A CTA must not exit
while a peer may still access its shared memory: end with a cluster barrier after the last DSMEM access.

Every function links its section of the PTX ISA (https://docs.nvidia.com/cuda/parallel-thread-execution/).
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.gpu import _Dim3  # x/y/z of a special register triple, as Int32
from flydsl.expr.numeric import Float, Int32, Numeric, as_numeric
from flydsl.expr.tensor import Tensor

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = [
    "cluster_idx",
    "cluster_dim",
    "block_idx_in_cluster",
    "num_clusters",
    "block_rank",
    "cluster_size",
    "arrive",
    "wait",
    "sync",
    "map_shared",
    "load_peer",
    "store_peer",
]


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


#: The cluster's index in the grid of clusters (``%clusterid``).
cluster_idx = _Dim3("clusterid", "cluster_idx", "cluster")
#: CTAs per cluster along each axis (``%cluster_nctaid``): the launch's ``cluster=`` shape.
cluster_dim = _Dim3("cluster_nctaid", "cluster_dim", "cluster")
#: This CTA's position in its cluster (``%cluster_ctaid``).
block_idx_in_cluster = _Dim3("cluster_ctaid", "block_idx_in_cluster", "cluster")
#: Clusters in the grid along each axis (``%nclusterid``).
num_clusters = _Dim3("nclusterid", "num_clusters", "cluster")


def block_rank() -> Int32:
    """This CTA's linear rank in its cluster, ``0 .. cluster_size() - 1`` (``%cluster_ctarank``): the rank that
    :func:`map_shared` takes.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#special-registers-cluster-ctarank"""
    return Int32(_nvvm.read_ptx_sreg_cluster_ctarank(_i32()))


def cluster_size() -> Int32:
    """The number of CTAs in the cluster (``%cluster_nctarank``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#special-registers-cluster-nctarank"""
    return Int32(_nvvm.read_ptx_sreg_cluster_nctarank(_i32()))


def arrive(relaxed: bool = False, aligned: bool = True) -> None:
    """``barrier.cluster.arrive[.relaxed][.aligned]``: this thread arrives at the cluster barrier without waiting.
    Default: release semantics (its earlier memory accesses are ordered before the barrier completes); ``relaxed``
    drops that ordering. ``aligned``: every thread of the warp executes it (the fast form; keep it unless the call
    sits in divergent code).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-barrier-cluster
    """
    unit = True if aligned else None
    if relaxed:
        _nvvm.cluster_arrive_relaxed(aligned=unit)
    else:
        _nvvm.cluster_arrive(aligned=unit)


def wait(aligned: bool = True) -> None:
    """``barrier.cluster.wait[.aligned]``: waits until every non-exited thread of the cluster has arrived (acquire
    semantics: what they wrote before a non-relaxed arrive is visible after it).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-barrier-cluster
    """
    _nvvm.cluster_wait(aligned=True if aligned else None)


def sync(aligned: bool = True) -> None:
    """The whole cluster waits here: :func:`arrive` then :func:`wait` (``cluster.sync()`` in CUDA)."""
    arrive(aligned=aligned)
    wait(aligned=aligned)


def _shared_pointer(where, coord) -> ir.Value:
    if isinstance(where, Tensor):
        if where.space != "shared":
            raise TypeError(f"expected a shared-memory Tensor, got one in {where.space} memory")
        from flydsl.expr.nvvm import address

        return address(where, coord)
    if isinstance(where, ir.Value) and str(where.type) == "!llvm.ptr<3>":
        if coord is not None:
            raise ValueError("coord: only with a Tensor (offset a raw pointer yourself)")
        return where
    raise TypeError(f"expected a shared-memory Tensor or an !llvm.ptr<3>, got {where!r}")


def map_shared(where, rank, coord=None) -> ir.Value:
    """``mapa.shared::cluster``: the address in CTA ``rank``'s shared memory of the same variable as ``where`` in
    this CTA's (``where``: a shared Tensor, at ``coord``, or an ``!llvm.ptr<3>``). Returns an ``!llvm.ptr<7>``
    (the ``shared::cluster`` window), for :func:`load_peer`/:func:`store_peer` or any instruction taking such an
    address. ``rank`` may be this CTA's own rank.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-mapa
    """
    pointer = _shared_pointer(where, coord)
    rank_value = as_numeric(rank, Int32)
    if not isinstance(rank_value, Numeric) or rank_value.width != 32 or isinstance(rank_value, Float):
        raise TypeError(f"rank: expected a 32-bit integer, got {type(rank_value).__name__}")
    return _nvvm.mapa(ir.Type.parse("!llvm.ptr<7>"), pointer, rank_value.value)


def _peer_pointer(where, rank, coord) -> ir.Value:
    if isinstance(where, ir.Value) and str(where.type) == "!llvm.ptr<7>":
        if rank is not None or coord is not None:
            raise ValueError("rank/coord: not with an !llvm.ptr<7> (it already names the peer's element)")
        return where
    if rank is None:
        raise TypeError("rank: the peer CTA's rank in the cluster is required")
    return map_shared(where, rank, coord)


def load_peer(where, rank=None, coord=None, dtype=None) -> Numeric:
    """``ld.shared::cluster``: the element at ``coord`` of shared Tensor ``where`` in CTA ``rank``'s shared memory
    (its ``dtype``), or the value at an ``!llvm.ptr<7>`` from :func:`map_shared` (then give ``dtype``). Order it
    after the peer's write with a cluster barrier (:func:`sync`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    if dtype is None:
        if not isinstance(where, Tensor):
            raise TypeError("dtype: required when loading through a raw pointer")
        dtype = where.dtype
    pointer = _peer_pointer(where, rank, coord)
    return dtype(_llvm.load(dtype.mlir_type(), pointer))


def store_peer(value, where, rank=None, coord=None) -> None:
    """``st.shared::cluster``: writes ``value`` to the element at ``coord`` of shared Tensor ``where`` in CTA
    ``rank``'s shared memory (converted to the tensor's dtype like ``t[i] = v``), or to an ``!llvm.ptr<7>``. A
    cluster barrier (:func:`sync`) makes it visible to the peer. The peer must have started: pass a cluster barrier
    before the first access to another CTA's shared memory (compute-sanitizer's racecheck reports it otherwise).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
    """
    if isinstance(where, Tensor):
        value = as_numeric(value, where.dtype)
        if type(value) is not where.dtype:
            raise TypeError(f"storing a {type(value).__name__} into a tensor of {where.dtype.__name__}: convert it")
    else:
        value = as_numeric(value)
    _llvm.store(value.value, _peer_pointer(where, rank, coord))

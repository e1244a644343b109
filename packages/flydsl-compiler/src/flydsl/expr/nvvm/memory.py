"""Memory instructions: cache-hinted global loads and stores, flags between CTAs, asynchronous copies, proxy
fences."""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import (
    Boolean,
    Int32,
    Int64,
    Numeric,
    as_numeric,
)
from flydsl.expr.nvvm._common import _asm, _i32, _int32, _pointer, _struct_fields
from flydsl.expr.vector import Vector, vector_class

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

# --- cache-hinted loads -----------------------------------------------------------------------------------------

_L1_EVICTION = ("evict_normal", "evict_unchanged", "evict_first", "evict_last", "no_allocate")


def ld_global_nc(
    where, coord=None, nbytes: int = 16, l1: str | None = None, prefetch: int | None = None, policy=None
) -> Vector:
    """``ld.global.nc[.L1::{l1}][.L2::cache_hint][.L2::{prefetch}B].v{n}.b32``: ``nbytes`` (4, 8 or 16) bytes of
    read-only global memory (aligned to ``nbytes``) through the non-coherent path, as an ``Int32`` vector (bit-cast
    it to the data's type: ``.bitcast(fx.BFloat16)``). ``l1``: an L1 eviction priority (``"no_allocate"`` streams
    data read once past L1; ``"evict_first"``, ``"evict_last"``...); ``prefetch``: an L2 prefetch size in bytes (64,
    128 or 256); ``policy``: an L2 eviction policy (:func:`create_policy`). The memory must not be written while the
    kernel runs (the load is free to be reordered or merged: inline PTX without side effects). ``where``: an
    ``!llvm.ptr<1>`` or a global Tensor (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld-global-nc
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"ld_global_nc nbytes: expected 4, 8 or 16, got {nbytes}")
    if l1 is not None and l1 not in _L1_EVICTION:
        raise ValueError(f"ld_global_nc l1: expected one of {_L1_EVICTION} or None, got {l1!r}")
    if prefetch not in (None, 64, 128, 256):
        raise ValueError(f"ld_global_nc prefetch: expected 64, 128, 256 or None, got {prefetch!r}")
    if policy is not None and not (isinstance(policy, Numeric) and policy.width == 64):
        raise TypeError(f"ld_global_nc policy: expected a 64-bit value from create_policy, got {type(policy).__name__}")
    operands, constraints = [_pointer(where, coord, "global")], ["=r"] * (nbytes // 4) + ["l"]
    count = nbytes // 4
    hint = _policy_operand(policy, count, operands, constraints)
    suffix = (
        (f".L1::{l1}" if l1 else "") + (".L2::cache_hint" if hint else "") + (f".L2::{prefetch}B" if prefetch else "")
    )
    text = f"ld.global.nc{suffix}{_vec(count)}.b32 {_registers(0, count)}, [${count}]{hint};"
    return _words(_asm(_words_type(count), operands, text, ",".join(constraints)), count)


def ld_shared(where, coord=None, nbytes: int = 16) -> Vector:
    """``ld.shared.v{n}.b32``: ``nbytes`` (4, 8 or 16) bytes of this CTA's shared memory (aligned to ``nbytes``) in
    one load, as an ``Int32`` vector, whatever the tensor's element type (e.g. 16 fp8 values staged by a bulk copy).
    Kept in program order with the kernel's other side effects (an mbarrier wait before it stays before it).
    ``where``: an ``!llvm.ptr<3>`` or a shared Tensor (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"ld_shared nbytes: expected 4, 8 or 16, got {nbytes}")
    count = nbytes // 4
    address = _llvm.ptrtoint(Int64.mlir_type(), _pointer(where, coord, "shared"))
    text = f"ld.shared{_vec(count)}.b32 {_registers(0, count)}, [${count}];"
    loaded = _asm(_words_type(count), [address], text, ",".join(["=r"] * count + ["l"]), side_effects=True)
    return _words(loaded, count)


def _registers(first: int, count: int) -> str:
    """Inline-PTX operands ``$first ..`` of ``count`` 32-bit words: one register, or a ``{...}`` vector of them."""
    names = ", ".join(f"${first + i}" for i in range(count))
    return names if count == 1 else f"{{{names}}}"


def _vec(count: int) -> str:
    return f".v{count}" if count > 1 else ""


def _words_type(count: int) -> ir.Type:
    """The LLVM result type of inline PTX that writes ``count`` 32-bit words."""
    return _i32() if count == 1 else ir.Type.parse(f"!llvm.struct<({', '.join(['i32'] * count)})>")


def _words(loaded, count: int) -> Vector:
    from mlir.dialects import vector as _vector

    cls = vector_class(Int32, count)
    return cls(_vector.from_elements(cls.mlir_type(), _struct_fields(loaded, count, _i32())))


_L2_PRIORITY = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
_CACHE_OPERATORS = {"load": ("ca", "cg", "cs", "lu", "cv"), "store": ("wb", "cg", "cs", "wt")}


def create_policy(priority: str = "evict_first", fraction: float = 1.0) -> Int64:
    """``createpolicy.fractional.L2::{priority}.b64``: an L2 cache eviction policy (an opaque 64-bit value) for the
    ``policy=`` of :func:`ld_global` / :func:`st_global`: the lines they touch are kept in L2 with ``priority``
    (``"evict_first"``: data streamed once, which then leaves room for the rest; ``"evict_last"``: data read again,
    e.g. weights every row reads), ``fraction`` (0 < f <= 1) of them, the others ``evict_unchanged``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-createpolicy
    """
    if priority not in _L2_PRIORITY:
        raise ValueError(f"create_policy priority: expected one of {_L2_PRIORITY}, got {priority!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"create_policy fraction: expected 0 < fraction <= 1, got {fraction!r}")
    text = f"createpolicy.fractional.L2::{priority}.b64 $0, {float(fraction)!r};"
    return Int64(_asm(ir.IntegerType.get_signless(64), [], text, "=l"))


def _cache_suffix(kind: str, cop, l1, policy) -> str:
    """The qualifiers of a hinted ``ld``/``st``: ``.{cop}`` or ``.L1::{l1}`` (PTX allows one of them), then
    ``.L2::cache_hint`` with a policy."""
    if cop is not None and cop not in _CACHE_OPERATORS[kind]:
        raise ValueError(f"{kind} cop: expected one of {_CACHE_OPERATORS[kind]} or None, got {cop!r}")
    if l1 is not None and l1 not in _L1_EVICTION:
        raise ValueError(f"{kind} l1: expected one of {_L1_EVICTION} or None, got {l1!r}")
    if cop is not None and l1 is not None:
        raise ValueError(
            f"{kind}: give a cache operator (cop={cop!r}) or an L1 eviction priority (l1={l1!r}), not both"
        )
    if policy is not None and not (isinstance(policy, Numeric) and policy.width == 64):
        raise TypeError(f"{kind} policy: expected a 64-bit value from create_policy, got {type(policy).__name__}")
    return (f".{cop}" if cop else "") + (f".L1::{l1}" if l1 else "") + (".L2::cache_hint" if policy is not None else "")


def _policy_operand(policy, results: int, operands: list, constraints: list) -> str:
    """Appends an L2 cache policy (if any) to inline PTX's operands; returns its text after the instruction's
    operands (``", $k"``, ``k`` counting the ``results`` first)."""
    if policy is None:
        return ""
    operands.append(policy.value)
    constraints.append("l")
    return f", ${results + len(operands) - 1}"


def _flag(predicate) -> Int32:
    """A kernel Boolean as an Int32 0/1 (inline PTX takes no i1 operands: it sets its own predicate from it)."""
    predicate = as_numeric(predicate, Boolean)
    if type(predicate) is not Boolean:
        raise TypeError(f"predicate: expected a kernel Boolean, got {type(predicate).__name__}")
    return Int32(_arith.extui(_i32(), predicate.value))


def ld_global(where, coord=None, nbytes: int = 16, *, cop=None, l1=None, policy=None, predicate=None, fill=None):
    """``ld.global[.{cop} | .L1::{l1}][.L2::cache_hint].v{n}.b32``: ``nbytes`` (4, 8 or 16) bytes of global memory
    (aligned to ``nbytes``) as an ``Int32`` vector (``.bitcast(...)`` it to the data's type), with cache hints:
    ``cop`` a cache operator (``"cs"``: streamed, evict first; ``"lu"``, ``"cg"``, ...) or ``l1`` an L1 eviction
    priority, and ``policy`` an L2 eviction policy (:func:`create_policy`). ``predicate`` (a kernel Boolean): load
    only where it holds; elsewhere the result is ``fill`` (an ``Int32`` vector of the same words; default zeros) and
    the address is not touched. The load has no side effects (the compiler may move it like a plain load of data
    that the kernel does not write meanwhile). ``where``: an ``!llvm.ptr<1>`` or a global Tensor.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"ld_global nbytes: expected 4, 8 or 16, got {nbytes}")
    if fill is not None and predicate is None:
        raise ValueError("ld_global fill: the words of predicated-off loads; give a predicate with it")
    suffix = _cache_suffix("load", cop, l1, policy)
    count = nbytes // 4
    operands, constraints = [_pointer(where, coord, "global")], ["=r"] * count + ["l"]  # $count: the address
    policy_operand = _policy_operand(policy, count, operands, constraints)
    text = f"ld.global{suffix}{_vec(count)}.b32 {_registers(0, count)}, [${count}]{policy_operand};"
    if predicate is not None:  # the words are the fill's, then loaded over where the predicate holds
        cls = vector_class(Int32, count)
        fill = cls(0) if fill is None else fill
        if type(fill) is not cls:
            raise TypeError(f"ld_global fill: expected an {cls.__name__} (the words loaded), got {type(fill).__name__}")
        flag = count + len(operands)
        operands += [_flag(predicate).value] + [fill[i].value for i in range(count)]
        constraints += ["r"] * (count + 1)
        moves = " ".join(f"mov.b32 ${i}, ${flag + 1 + i};" for i in range(count))
        text = f"{{ .reg .pred p; setp.ne.b32 p, ${flag}, 0; {moves} @p {text} }}"
    return _words(_asm(_words_type(count), operands, text, ",".join(constraints)), count)


def st_global(where, words, coord=None, *, cop=None, l1=None, policy=None, predicate=None) -> None:
    """``st.global[.{cop} | .L1::{l1}][.L2::cache_hint].v{n}.b32``: ``words`` (an ``Int32`` vector of 1, 2 or 4
    elements; ``.bitcast(fx.Int32)`` other data) to global memory aligned to their size, with the cache hints of
    :func:`ld_global` (``cop``: ``"cs"`` streamed, ``"wt"``, ...). ``predicate``: store only where it holds.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
    """
    if not isinstance(words, Vector) or words.element is not Int32 or len(words) not in (1, 2, 4):
        raise TypeError(f"st_global words: expected an Int32 vector of 1, 2 or 4 elements, got {type(words).__name__}")
    suffix = _cache_suffix("store", cop, l1, policy)
    count = len(words)
    operands = [_pointer(where, coord, "global")] + [words[i].value for i in range(count)]
    constraints = ["l"] + ["r"] * count
    policy_operand = _policy_operand(policy, 0, operands, constraints)
    text = f"st.global{suffix}{_vec(count)}.b32 [$0], {_registers(1, count)}{policy_operand};"
    if predicate is not None:
        operands.append(_flag(predicate).value)
        constraints.append("r")
        text = f"{{ .reg .pred p; setp.ne.b32 p, ${len(operands) - 1}, 0; @p {text} }}"
    _asm(None, operands, text, ",".join(constraints), side_effects=True)


# --- flags between CTAs ----------------------------------------------------------------------------------------

_SCOPES = ("cta", "cluster", "gpu", "sys")


def _scope(scope: str, what: str) -> str:
    if scope not in _SCOPES:
        raise ValueError(f"{what} scope: expected one of {_SCOPES}, got {scope!r}")
    return scope


def ld_acquire(where, coord=None, scope: str = "gpu") -> Int32:
    """``ld.acquire.{scope}.global.b32``: a 32-bit flag read with acquire semantics: this thread's later reads see
    every write the writer made visible before its release (:func:`red_add_release`). Spin on it for a flag set by
    another CTA, then ``barrier`` so the other threads of the group read after it. ``where``: an ``!llvm.ptr<1>``
    or a global Tensor of 32-bit integers (``address(where, coord)``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    """
    pointer = _pointer(where, coord, "global")
    text = f"ld.acquire.{_scope(scope, 'ld_acquire')}.global.b32 $0, [$1];"
    return Int32(_asm(_i32(), [pointer], text, "=r,l", side_effects=True))


def red_add_release(where, value, coord=None, scope: str = "gpu") -> None:
    """``red.release.{scope}.global.add.s32``: adds ``value`` to a 32-bit flag with release semantics: every
    write this thread made visible before (those of the other threads of its group included, after a ``barrier``)
    is visible to a thread that reads the new value with :func:`ld_acquire`.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-red
    """
    pointer = _pointer(where, coord, "global")
    text = f"red.release.{_scope(scope, 'red_add_release')}.global.add.s32 [$0], $1;"
    _asm(None, [pointer, _int32(value, "red_add_release value").value], text, "l,r", side_effects=True)


def red_max_relaxed(where, value, coord=None, scope: str = "gpu") -> None:
    """``red.relaxed.{scope}.global.max.u32``: raises a 32-bit word to ``value`` (unsigned) with no ordering of this
    thread's other accesses. Non-negative floats order as their bits do (NaN above inf), so a float32 maximum of
    magnitudes (an amax) is the maximum of their bits as ``Int32`` (``arith.bitcast``), with NaN kept.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-red
    """
    pointer = _pointer(where, coord, "global")
    text = f"red.relaxed.{_scope(scope, 'red_max_relaxed')}.global.max.u32 [$0], $1;"
    _asm(None, [pointer, _int32(value, "red_max_relaxed value").value], text, "l,r", side_effects=True)


def atom_add_acq_rel(where, value, coord=None, scope: str = "gpu") -> Int32:
    """``atom.acq_rel.{scope}.global.add.s32``: adds ``value`` to a 32-bit counter and returns its old value, with
    release semantics for this thread's earlier writes (its group's too, after a ``barrier``) and acquire semantics
    for its later reads: the thread that sees the last count reads what every earlier adder wrote before adding.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-atom
    """
    return _atom_add("acq_rel", where, value, coord, scope)


def atom_add_relaxed(where, value, coord=None, scope: str = "gpu") -> Int32:
    """``atom.relaxed.{scope}.global.add.s32``: adds ``value`` to a 32-bit counter and returns its old value, with no
    ordering of this thread's other accesses (it waits for nothing it wrote before): handing out work items, e.g.
    the next row of a persistent kernel (each adder gets a distinct count).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-atom
    """
    return _atom_add("relaxed", where, value, coord, scope)


def _atom_add(order: str, where, value, coord, scope: str) -> Int32:
    what = f"atom_add_{order}"
    pointer = _pointer(where, coord, "global")
    text = f"atom.{order}.{_scope(scope, what)}.global.add.s32 $0, [$1], $2;"
    operands = [pointer, _int32(value, f"{what} value").value]
    return Int32(_asm(_i32(), operands, text, "=r,l,r", side_effects=True))


# --- asynchronous copies ----------------------------------------------------------------------------------------


def cp_async(dst, src, nbytes: int = 16, dst_coord=None, src_coord=None, src_bytes=None, cache: str | None = None):
    """``cp.async.{ca|cg}.shared.global [dst], [src], nbytes[, src_bytes]``: an asynchronous copy of 4, 8 or 16
    bytes from global to shared memory (both aligned to ``nbytes``). ``src_bytes`` (an int or kernel integer <=
    ``nbytes``) reads only that many bytes and fills the rest with zeros (0: a zero fill without reading — use it for
    out-of-range tiles). ``cache``: ``"cg"`` (L2 only; 16 bytes only; the default for 16) or ``"ca"`` (the default
    otherwise). ``dst``/``src``: Tensors (with ``dst_coord``/``src_coord``) or raw pointers. Completes at
    :func:`cp_async_wait_group` of its group (:func:`cp_async_commit_group`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"cp_async nbytes: expected 4, 8 or 16, got {nbytes}")
    cache = cache or ("cg" if nbytes == 16 else "ca")
    if cache not in ("ca", "cg") or (cache == "cg" and nbytes != 16):
        raise ValueError(f"cp_async cache: 'ca', or 'cg' with 16 bytes; got {cache!r} with {nbytes}")
    dst_pointer = _pointer(dst, dst_coord, "shared")
    src_pointer = _pointer(src, src_coord, "global")
    size = None if src_bytes is None else _int32(src_bytes, "src_bytes").value
    modifier = _nvvm.LoadCacheModifierKind.CG if cache == "cg" else _nvvm.LoadCacheModifierKind.CA
    _nvvm.cp_async_shared_global(dst_pointer, src_pointer, nbytes, modifier, cp_size=size)


def cp_async_bulk(dst, src, nbytes, barrier, dst_coord=None, src_coord=None) -> None:
    """``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], nbytes, [barrier]``: one
    thread's asynchronous copy of ``nbytes`` (a kernel Int32 or int, a multiple of 16; 0 copies nothing) contiguous
    bytes from global to this CTA's shared memory, both 16-byte aligned, completing ``nbytes`` of the transaction
    count of ``barrier`` (an :class:`~flydsl.expr.mbarrier.Mbarrier` in this CTA's shared memory: raise its expected
    bytes with ``arrive_expect_tx`` in the same phase, then ``wait`` on it). ``dst``/``src``: Tensors (with
    ``dst_coord``/``src_coord``) or raw pointers. The copy writes through the async proxy: shared memory the CTA wrote
    with ordinary stores takes a :func:`fence_proxy_async` before a bulk copy writes it.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk
    """
    if isinstance(nbytes, int) and (nbytes < 0 or nbytes % 16):
        raise ValueError(f"cp_async_bulk nbytes: expected a non-negative multiple of 16, got {nbytes}")
    i64 = Int64.mlir_type()
    where = _llvm.ptrtoint(i64, _pointer(dst, dst_coord, "shared"))
    source = _pointer(src, src_coord, "global")
    bar = _llvm.ptrtoint(i64, barrier.address)
    size = _int32(nbytes if not isinstance(nbytes, int) else Int32(nbytes), "cp_async_bulk nbytes").value
    copy = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"
    text = f"{{ .reg .pred p; setp.ne.b32 p, $2, 0; @p {copy} }}"  # a size of 0: no copy issued
    _asm(None, [where, source, size, bar], text, "l,l,r,l", side_effects=True)


def prefetch_l2_bulk(where, nbytes, coord=None, policy=None) -> None:
    """``cp.async.bulk.prefetch.L2.global[.L2::cache_hint] [where], nbytes``: brings ``nbytes`` (a kernel Int32 or
    int, a multiple of 16) contiguous bytes of global memory from ``where`` (16-byte aligned: an ``!llvm.ptr<1>`` or
    a global Tensor with ``coord``) into L2, asynchronously: the thread does not wait, nothing is returned, and no
    barrier tracks it. For data a later kernel reads (e.g. the next stage's weights while this one streams its own).
    ``policy``: an L2 eviction policy (:func:`create_policy`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-prefetch
    """
    if isinstance(nbytes, int) and (nbytes < 0 or nbytes % 16):
        raise ValueError(f"prefetch_l2_bulk nbytes: expected a non-negative multiple of 16, got {nbytes}")
    if policy is not None and not (isinstance(policy, Numeric) and policy.width == 64):
        raise TypeError(
            f"prefetch_l2_bulk policy: expected a 64-bit value from create_policy, got {type(policy).__name__}"
        )
    size = _int32(Int32(nbytes) if isinstance(nbytes, int) else nbytes, "prefetch_l2_bulk nbytes").value
    hint = None if policy is None else policy.value
    _nvvm.cp_async_bulk_prefetch(_pointer(where, coord, "global"), size, l2_cache_hint=hint)


def cp_async_commit_group() -> None:
    """``cp.async.commit_group``: closes the group of this thread's ``cp_async`` issued since the last commit.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-commit-group
    """
    _nvvm.cp_async_commit_group()


def cp_async_wait_group(n: int = 0) -> None:
    """``cp.async.wait_group n``: waits until at most ``n`` of this thread's committed groups are pending (0: all
    done). Other threads' copies need a barrier after it to be visible.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-wait-group
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"cp_async_wait_group: n must be a non-negative int, got {n!r}")
    _nvvm.cp_async_wait_group(n)


# --- proxy fences -----------------------------------------------------------------------------------------------

_ASYNC_PROXY_SPACES = {"shared": "shared_cta", "shared::cta": "shared_cta", "shared::cluster": "shared_cluster"}


def fence_proxy_async(space: str | None = "shared") -> None:
    """``fence.proxy.async[.shared::cta | .shared::cluster | .global]``: orders this thread's generic-proxy accesses
    (ordinary loads/stores, ``stmatrix``) to ``space`` with later async-proxy accesses (wgmma operands, TMA, bulk
    copies) and the reverse. Shared memory written by threads for wgmma/TMA needs it in each writing thread, then a
    barrier. ``space``: ``"shared"`` (= ``"shared::cta"``), ``"shared::cluster"``, ``"global"``, or None (all).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    if space is None:
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_)
    elif space == "global":
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_global)
    elif space in _ASYNC_PROXY_SPACES:
        shared = getattr(_nvvm.SharedSpace, _ASYNC_PROXY_SPACES[space])
        _nvvm.fence_proxy(_nvvm.ProxyKind.async_shared, space=shared)
    else:
        raise ValueError(
            f"fence_proxy_async space: expected 'shared', 'shared::cluster', 'global' or None, got {space!r}"
        )

"""fx.nvvm.ld_global_nc, ld_global, st_global, create_policy, prefetch_l2_bulk: cache-hinted global loads and stores,
bulk L2 prefetches. CPU: the PTX
instruction for each variant, accepted by ptxas for sm_90a; arguments checked. GPU (``gpu``): the words loaded equal
the data, predicated-off lanes get the fill and store nothing."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm


@flyc.kernel
def copy_words(x: fx.Tensor, out: fx.Tensor):
    """out[4t .. 4t+3] = x[4t ..] (16 bytes, L1 bypassed, 256-byte L2 prefetch); then 8 and 4 bytes with hints."""
    t = gpu.thread_idx.x
    words = nvvm.ld_global_nc(x, 4 * t, 16, l1="no_allocate", prefetch=256)
    pair = nvvm.ld_global_nc(x, 4 * t, 8, l1="evict_last")
    one = nvvm.ld_global_nc(x, 4 * t + 3, 4)
    for i in fx.range_constexpr(4):
        out[4 * t + i] = words[i]
    out[512 + 2 * t] = pair[0]
    out[512 + 2 * t + 1] = pair[1]
    out[768 + t] = one[0]


def test_ld_global_nc_lowers_and_assembles():
    spec = flyc.TensorSpec((1024,), "i32")
    compiled = copy_words.lower(spec, spec)
    ptx = compiled.ptx
    assert "ld.global.nc.L1::no_allocate.L2::256B.v4.b32" in ptx
    assert "ld.global.nc.L1::evict_last.v2.b32" in ptx
    assert "ld.global.nc.b32" in ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@flyc.kernel
def streamed_then_prefetched(x: fx.Tensor, follow: fx.Tensor, out: fx.Tensor, nbytes: fx.Int32):
    """out[4t ..] = x[4t ..] read with an evict_first L2 policy; thread 0 prefetches ``nbytes`` of ``follow`` into L2
    (a dynamic size, then 4096 bytes with an evict_last policy)."""
    t = gpu.thread_idx.x
    first = nvvm.create_policy("evict_first")
    words = nvvm.ld_global_nc(x, 4 * t, 16, l1="no_allocate", prefetch=256, policy=first)
    if t == 0:
        nvvm.prefetch_l2_bulk(follow, nbytes, coord=0)
        nvvm.prefetch_l2_bulk(follow, 4096, coord=1024, policy=nvvm.create_policy("evict_last"))
    for i in fx.range_constexpr(4):
        out[4 * t + i] = words[i]


def test_policy_loads_and_bulk_prefetches_lower_and_assemble():
    spec = flyc.TensorSpec((4096,), "i32")
    compiled = streamed_then_prefetched.lower(spec, spec, spec, 4096)
    ptx = compiled.ptx
    assert re.search(
        r"ld\.global\.nc\.L1::no_allocate\.L2::cache_hint\.L2::256B\.v4\.b32 \{[^}]*\}, \[%rd\d+\], %rd\d+;", ptx
    )
    assert len(re.findall(r"cp\.async\.bulk\.prefetch\.L2\.global(\.L2::cache_hint)? \[%rd\d+\], %r\d+", ptx)) == 2
    assert "cp.async.bulk.prefetch.L2.global.L2::cache_hint" in ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_prefetch_l2_bulk_checks_arguments():
    @flyc.kernel
    def ragged(x: fx.Tensor):
        nvvm.prefetch_l2_bulk(x, 24)

    with pytest.raises(ValueError, match="multiple of 16"):
        ragged.lower(flyc.TensorSpec((16,), "i32"))

    @flyc.kernel
    def bad_policy(x: fx.Tensor):
        nvvm.ld_global_nc(x, 0, policy=fx.Int32(1))

    with pytest.raises(TypeError, match="policy: expected a 64-bit value"):
        bad_policy.lower(flyc.TensorSpec((16,), "i32"))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"nbytes": 12}, "nbytes: expected 4, 8 or 16"),
        ({"l1": "bypass"}, "l1: expected one of"),
        ({"prefetch": 32}, "prefetch"),
    ],
)
def test_ld_global_nc_checks_arguments(kwargs, message):
    @flyc.kernel
    def bad(x: fx.Tensor):
        nvvm.ld_global_nc(x, 0, **kwargs)

    with pytest.raises(ValueError, match=message):
        bad.lower(flyc.TensorSpec((16,), "i32"))


@pytest.mark.gpu
def test_ld_global_nc_reads_the_data():
    import torch

    x = torch.randint(-(2**31), 2**31 - 1, (1024,), dtype=torch.int32, device="cuda")
    out = torch.zeros(1024, dtype=torch.int32, device="cuda")
    copy_words(x, out).launch(grid=1, block=128)
    torch.cuda.synchronize()
    assert torch.equal(out[:512], x[:512])
    assert torch.equal(out[512:768], x.view(-1, 4)[:128, :2].flatten())
    assert torch.equal(out[768:896], x[3:512:4])


@flyc.kernel
def hinted_copy(x: fx.Tensor, out: fx.Tensor, n: fx.Int32):
    """out[4t ..] = x[4t ..] where 4t < n (16 bytes, L2 evict_first, L1 evict_first), else -1 words stored with
    .cs; the second half: 8 then 4 bytes, evict_last policy, .cs / .lu loads, unpredicated stores."""
    t = gpu.thread_idx.x
    first = nvvm.create_policy("evict_first")
    last = nvvm.create_policy("evict_last", 0.5)
    fill = fx.vector.vector_class(fx.Int32, 4)(-1)
    words = nvvm.ld_global(x, 4 * t, 16, l1="evict_first", policy=first, predicate=4 * t < n, fill=fill)
    nvvm.st_global(out, words, 4 * t, cop="cs")
    pair = nvvm.ld_global(x, 512 + 2 * t, 8, cop="cs", policy=last)
    nvvm.st_global(out, pair, 512 + 2 * t, policy=last, predicate=t < 128)
    one = nvvm.ld_global(x, 768 + t, 4, cop="lu")
    nvvm.st_global(out, one, 768 + t, l1="no_allocate")


def test_hinted_loads_and_stores_lower_and_assemble():
    spec = flyc.TensorSpec((1024,), "i32")
    compiled = hinted_copy.lower(spec, spec, 0)
    ptx = compiled.ptx
    for instruction in (
        "createpolicy.fractional.L2::evict_first.b64",
        "createpolicy.fractional.L2::evict_last.b64",
        "ld.global.L1::evict_first.L2::cache_hint.v4.b32",
        "st.global.cs.v4.b32",
        "ld.global.cs.L2::cache_hint.v2.b32",
        "st.global.L2::cache_hint.v2.b32",
        "ld.global.lu.b32",
        "st.global.L1::no_allocate.b32",
    ):
        assert instruction in ptx, instruction
    assert ptx.count("@p ld.global") == 1 and ptx.count("@p st.global") == 1
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda x: nvvm.ld_global(x, 0, 12), ValueError, "ld_global nbytes: expected 4, 8 or 16"),
        (lambda x: nvvm.ld_global(x, 0, cop="wb"), ValueError, "load cop: expected one of"),
        (lambda x: nvvm.ld_global(x, 0, cop="cs", l1="evict_first"), ValueError, "not both"),
        (lambda x: nvvm.ld_global(x, 0, policy=fx.Int32(0)), TypeError, "policy: expected a 64-bit value"),
        (lambda x: nvvm.ld_global(x, 0, predicate=True, fill=fx.Int32(0)), TypeError, "fill: expected an Int32x4"),
        (lambda x: nvvm.ld_global(x, 0, fill=nvvm.ld_global(x, 0)), ValueError, "give a predicate with it"),
        (lambda x: nvvm.st_global(x, fx.Int32(0), 0), TypeError, "words: expected an Int32 vector"),
        (lambda x: nvvm.st_global(x, nvvm.ld_global(x, 0), 0, cop="lu"), ValueError, "store cop: expected one of"),
        (lambda x: nvvm.create_policy("evict_soon"), ValueError, "priority: expected one of"),
        (lambda x: nvvm.create_policy("evict_last", 0.0), ValueError, "fraction"),
    ],
)
def test_hinted_loads_and_stores_check_arguments(call, error, message):
    @flyc.kernel
    def bad(x: fx.Tensor):
        call(x)

    with pytest.raises(error, match=message):
        bad.lower(flyc.TensorSpec((16,), "i32"))


@pytest.mark.gpu
def test_hinted_loads_and_stores_move_the_data():
    import torch

    x = torch.randint(-(2**31), 2**31 - 1, (1024,), dtype=torch.int32, device="cuda")
    out = torch.zeros(1024, dtype=torch.int32, device="cuda")
    hinted_copy(x, out, 200).launch(grid=1, block=128)  # threads 50.. load nothing: their words are the fill
    torch.cuda.synchronize()
    assert torch.equal(out[:200], x[:200])
    assert torch.equal(out[200:512], torch.full((312,), -1, dtype=torch.int32, device="cuda"))
    assert torch.equal(out[512:896], x[512:896])
    assert torch.equal(out[896:], torch.zeros(128, dtype=torch.int32, device="cuda"))

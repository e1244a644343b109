"""fx.nvvm.ld_global_nc: cache-hinted read-only global loads. CPU: the PTX instruction for each variant, accepted
by ptxas for sm_90a; arguments checked. GPU (``gpu``): the words loaded equal the data."""

from __future__ import annotations

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

"""fx.nvvm.byte_offset, vote_sync and movmatrix_trans: addresses around one base, warp votes, fragments transposed
in registers. CPU: the PTX of each, accepted by ptxas for sm_90a; arguments checked. GPU (``gpu``): the words read
at the offsets, the votes' answers and the transposed 8x8 matrix."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm


@flyc.kernel
def fragments(x: fx.Tensor, out: fx.Tensor, threshold: fx.Int32):
    """One warp. out[0..31]: x at byte offset 64 (lane) + 16 from x[32] (a dynamic then a constant offset);
    out[32..63]: the lane's fragment of the 8x8 16-bit matrix x[0..31] transposed; out[64..65]: whether any lane /
    every lane has ``lane < threshold``; out[66]: whether that is the same in all lanes."""
    lane = gpu.thread_idx.x
    base = nvvm.address(x, 32)
    word = nvvm.ld_global(nvvm.byte_offset(nvvm.byte_offset(base, lane * 64), 16), nbytes=4)[0]
    out[lane] = word
    out[32 + lane] = nvvm.movmatrix_trans(x[lane])
    below = lane < threshold
    # Every lane votes (a vote inside `if lane == 0` would count lane 0 alone); lane 0 writes the answers.
    votes = [nvvm.vote_sync(below, kind).to(fx.Int32) for kind in ("any", "all", "uni")]
    if lane == 0:
        out[64] = votes[0]
        out[65] = votes[1]
        out[66] = votes[2]


def _compiled():
    spec = flyc.TensorSpec((4096,), "i32")
    return fragments.lower(spec, spec, 3)


def test_fragments_lower_and_assemble():
    compiled = _compiled()
    ptx = compiled.ptx
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in ptx
    for kind in ("any", "all", "uni"):
        assert f"vote.sync.{kind}.pred" in ptx
    assert re.search(r"add\.s64\s+%rd\d+, %rd\d+, 144;", ptx)  # x[32] and the 16 bytes: one constant
    assert re.search(r"ld\.global\.b32 %r\d+, \[%rd\d+\];", ptx)  # 4 bytes
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: nvvm.vote_sync(True, "most"), ValueError, "vote_sync kind"),
        (lambda: nvvm.byte_offset(3, 16), TypeError, "byte_offset pointer"),
        # ld_global(where, coord, nbytes): a size after a pointer is a coordinate, which only a Tensor takes
        (lambda: nvvm.ld_global(object(), 4), TypeError, "indexes a Tensor, not a pointer"),
    ],
)
def test_arguments_are_checked(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.gpu
def test_fragments_on_gpu():
    import torch

    x = torch.randint(-(2**31), 2**31 - 1, (4096,), dtype=torch.int32, device="cuda")
    out = torch.full((128,), -7, dtype=torch.int32, device="cuda")
    fragments(x, out, 3).launch(grid=1, block=32)
    torch.cuda.synchronize()
    lanes = torch.arange(32, device="cuda")
    assert torch.equal(out[:32], x[32 + 16 * lanes + 4])  # 64 bytes per lane, then 16: 16 words + 4
    halves = x[:32].view(torch.int16).view(8, 8)  # row lane // 4, columns 2 (lane % 4) + {0, 1}
    assert torch.equal(out[32:64].view(torch.int16).view(8, 8), halves.t().contiguous())
    assert out[64:67].tolist() == [1, 0, 0]

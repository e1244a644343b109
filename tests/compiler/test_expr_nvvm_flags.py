"""fx.nvvm.ld_acquire / red_add_release / atom_add_acq_rel / atom_add_relaxed: flags and counters between CTAs.
CPU: the PTX instructions, accepted by ptxas for sm_90a; arguments checked. GPU (``gpu``): CTA 1 waits for CTA 0's
flag, then reads the data CTA 0 wrote before it; the last of many CTAs to count sums what all of them wrote; CTAs
claiming items from a counter get each item exactly once."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm


@flyc.kernel
def hand_over(data: fx.Tensor, flags: fx.Tensor, out: fx.Tensor):
    """CTA 0 writes data[t] = t + 1 and releases flags[0]; CTA 1 acquires it and copies data into out."""
    t = gpu.thread_idx.x
    if gpu.block_idx.x == 0:
        data[t] = t + 1
        nvvm.barrier()
        if t == 0:
            nvvm.red_add_release(flags, 1, 0)
    else:
        if t == 0:
            seen = nvvm.ld_acquire(flags, 0)
            while seen == 0:
                seen = nvvm.ld_acquire(flags, 0)
        nvvm.barrier()
        out[t] = data[t]


LAST_ARRIVER_CTAS = 64


@flyc.kernel
def last_arriver_sums(data: fx.Tensor, counter: fx.Tensor, out: fx.Tensor):
    """Every CTA writes data[b, t] = b + t, then counts itself; the CTA that sees the count of all the others sums
    every CTA's row into out (no CTA waits: the order of arrival decides who sums) and resets the counter."""
    t = gpu.thread_idx.x
    b = gpu.block_idx.x
    smem = fx.SmemAllocator()
    seen = smem.allocate(fx.Int32, 1)
    data[b * 128 + t] = b + t
    nvvm.barrier()
    if t == 0:
        seen[0] = nvvm.atom_add_acq_rel(counter, 1, 0)
    nvvm.barrier()
    if seen[0] == LAST_ARRIVER_CTAS - 1:
        total = t * 0
        for other in range(LAST_ARRIVER_CTAS):
            total = total + data[other * 128 + t]
        out[t] = total
        if t == 0:
            counter[0] = 0


CLAIMED_ITEMS = 1000


@flyc.kernel
def claim_items(counter: fx.Tensor, hits: fx.Tensor):
    """Each CTA's first thread claims items from the counter until none is left, counting each claim in hits."""
    if gpu.thread_idx.x == 0:
        item = nvvm.atom_add_relaxed(counter, 1, 0)
        while item < CLAIMED_ITEMS:
            nvvm.red_add_release(hits, 1, item)
            item = nvvm.atom_add_relaxed(counter, 1, 0)


def test_flags_lower_and_assemble():
    spec = flyc.TensorSpec((128,), "i32")
    compiled = hand_over.lower(spec, spec, spec)
    assert "ld.acquire.gpu.global.b32" in compiled.ptx
    assert "red.release.gpu.global.add.s32" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_counter_lowers_and_assembles():
    compiled = last_arriver_sums.lower(
        flyc.TensorSpec((LAST_ARRIVER_CTAS * 128,), "i32"), flyc.TensorSpec((1,), "i32"), flyc.TensorSpec((128,), "i32")
    )
    assert "atom.acq_rel.gpu.global.add.s32" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_relaxed_counter_lowers_and_assembles():
    spec = flyc.TensorSpec((CLAIMED_ITEMS,), "i32")
    compiled = claim_items.lower(flyc.TensorSpec((1,), "i32"), spec)
    assert "atom.relaxed.gpu.global.add.s32" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_flag_scopes_are_checked():
    @flyc.kernel
    def bad(x: fx.Tensor):
        nvvm.red_add_release(x, 1, 0, scope="device")

    with pytest.raises(ValueError, match="scope: expected one of"):
        bad.lower(flyc.TensorSpec((16,), "i32"))


@pytest.mark.gpu
def test_data_released_before_a_flag_is_seen_after_acquiring_it():
    import torch

    data = torch.zeros(128, dtype=torch.int32, device="cuda")
    flags = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.full((128,), -1, dtype=torch.int32, device="cuda")
    hand_over(data, flags, out).launch(grid=2, block=128)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.arange(1, 129, dtype=torch.int32, device="cuda"))
    assert flags.item() == 1


@pytest.mark.gpu
def test_last_of_many_ctas_to_count_reads_what_all_wrote():
    import torch

    data = torch.full((LAST_ARRIVER_CTAS * 128,), -(1 << 20), dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    for _ in range(3):  # the counter is reset by the last CTA: every launch has exactly one summer
        out = torch.full((128,), -1, dtype=torch.int32, device="cuda")
        last_arriver_sums(data, counter, out).launch(grid=LAST_ARRIVER_CTAS, block=128)
        torch.cuda.synchronize()
        t = torch.arange(128, dtype=torch.int32, device="cuda")
        expected = LAST_ARRIVER_CTAS * t + LAST_ARRIVER_CTAS * (LAST_ARRIVER_CTAS - 1) // 2
        assert torch.equal(out, expected)
        assert counter.item() == 0


@pytest.mark.gpu
def test_ctas_claiming_from_a_counter_get_each_item_once():
    import torch

    ctas = 96
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    hits = torch.zeros(CLAIMED_ITEMS, dtype=torch.int32, device="cuda")
    claim_items(counter, hits).launch(grid=ctas, block=32)
    torch.cuda.synchronize()
    assert torch.equal(hits, torch.ones_like(hits))
    assert counter.item() == CLAIMED_ITEMS + ctas  # each CTA's last claim found nothing left

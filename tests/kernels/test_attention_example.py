"""examples/paged_decode.py (docs/attention.md). CPU: without a GPU ``main`` compiles the decode step's two kernels
(write_kv's, paged_decode's) for sm_90a and summarizes them, for a bf16 and an fp8 cache; the decode loop's own
bookkeeping (blocks from a shuffled free list, slots from the block tables, the side copies, the SDPA check) runs on
the CPU with torch stand-ins for the two kernels, and a wrong stand-in fails it. GPU (``gpu``): the loop with
flydsl's kernels."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

import flydsl.compiler as flyc

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "paged_decode.py"


def _example():
    spec = importlib.util.spec_from_file_location("flydsl_example_paged_decode", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(flyc.runtime.is_available(), reason="on a GPU main() runs the loop (the GPU test does that)")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_main_compiles_and_summarizes_without_a_gpu(fp8, capsys):
    assert _example().main(["--steps", "20"] + (["--fp8"] if fp8 else [])) == 0
    out = capsys.readouterr().out
    assert "write_kv_kernel: compiled" in out and "paged_decode_kernel: compiled" in out
    # a group of 4: per 16-token chunk 8 MMAs for S^T = K Q^T, 8 for O^T += V^T P^T (D = 128), 2 transposes of P;
    # one chunk's math in the PTX (the loop's body)
    assert "mma.sync m16n8k16 16" in out and "register transposes (movmatrix) 2" in out
    assert ("e4m3 -> f16 (cvt.rn.f16x2.e4m3x2)" in out) == fp8
    assert "merged by the last to finish" in out and "arrival counter (atom.add) 1" in out
    if flyc.toolchain.find_ptxas() is not None:
        assert out.count("assembled for sm_90a") == 2
    assert out.rstrip().endswith("compiled only (run on a GPU machine to run the decode loop and check it)")


# --- the loop on the CPU, with torch in place of the kernels -----------------------------------------------------


def _write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """write_kv by its definition, in place: row ``slot`` of the (num_blocks * block_size, Hkv, D) cache; fp8 rows
    ``value / scale`` (a true division) saturated to +-448."""
    import torch

    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rows, slots = cache.view(-1, *cache.shape[2:]), slot_mapping.long()
        if scale is None:
            rows[slots] = x.to(cache.dtype)
        else:
            divisor = torch.tensor(scale, dtype=torch.float32)
            quantized = (x.float() / divisor).clamp(-448.0, 448.0).to(cache.dtype)
            rows.view(torch.uint8)[slots] = quantized.view(torch.uint8)


def _paged_decode(q, k_cache, v_cache, block_tables, context_lens, *, out, **scales):
    """paged_decode by the float32 reference (it reads the cache through the block tables)."""
    from flydsl.kernels.attention.reference import paged_decode_reference

    out.copy_(paged_decode_reference(q, k_cache, v_cache, block_tables, context_lens, **scales))
    return out


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_the_loop_matches_sdpa_with_the_reference_in_place_of_the_kernels(fp8, capsys):
    pytest.importorskip("torch")
    example = _example()
    args = example.parse_args(["--steps", "20"] + (["--fp8"] if fp8 else []))
    assert example.decode_loop(args, device="cpu", kernels=(_write_kv, _paged_decode)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 21 and lines[0].startswith("step   0: contexts [4, 17, 30, 71], max |out - sdpa| = ")
    assert lines[-2].startswith("step  19: contexts [23, 36, 49, 90]")
    assert lines[-1].startswith("ok: 20 steps of 4 sequences over a paged " + ("fp8 e4m3" if fp8 else "bf16"))


def test_the_loop_catches_a_kernel_that_misses_the_new_token(capsys):
    pytest.importorskip("torch")
    example = _example()

    def stale(q, k_cache, v_cache, block_tables, context_lens, *, out, **scales):
        return _paged_decode(q, k_cache, v_cache, block_tables, context_lens - 1, out=out, **scales)

    args = example.parse_args(["--steps", "3"])
    assert example.decode_loop(args, device="cpu", kernels=(_write_kv, stale)) == 1
    assert "FAILED at step 0:" in capsys.readouterr().out


def test_blocks_are_scattered_and_slots_follow_the_tables():
    torch = pytest.importorskip("torch")
    example = _example()
    num_blocks, max_blocks = example.cache_geometry(10)
    sequences = example.Sequences(torch, torch.Generator().manual_seed(1), num_blocks, max_blocks)
    slots = sequences.grow(0, 40)  # blocks 0, 1, 2 of sequence 0
    table = sequences.tables[0]
    assert slots == [int(table[p // 16]) * 16 + p % 16 for p in range(40)]
    assert len(set(table[:3].tolist())) == 3 and table[:3].tolist() != [0, 1, 2]
    assert sequences.grow(0, 1) == [int(table[2]) * 16 + 8] and sequences.lengths[0] == 41


# --- GPU --------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_the_loop_on_gpu(fp8, capsys):
    pytest.importorskip("torch")
    assert _example().main(["--steps", "40"] + (["--fp8"] if fp8 else [])) == 0
    assert "ok: 40 steps of 4 sequences" in capsys.readouterr().out

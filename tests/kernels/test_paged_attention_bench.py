"""benchmarks/paged_attention_bench.py on the CPU: its sweep, FlashInfer's page table from a block table, the fp8
caches, the summary, and whole runs with stand-ins for the kernel, its reference and FlashInfer (torch on the CPU),
the timer replaced."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import paged_attention_bench

    return paged_attention_bench


def test_sweep_cases(bench):
    """22 (batch, context) pairs per model with batch * context <= 4M tokens; every block size and KV dtype each."""
    shapes = bench.shapes(list(bench.MODELS), bench.BATCHES, bench.CONTEXTS)
    assert len(shapes) == 44 and all(b * c <= 4 << 20 for _, b, c in shapes)
    assert ("llama3-8b", 32, 131072) in shapes and ("llama3-8b", 128, 32768) in shapes
    assert ("llama3-8b", 256, 32768) not in shapes and ("llama3-70b-tp8", 64, 131072) not in shapes
    cases = bench.cases(["llama3-70b-tp8"], [1, 8], [512], [16, 64], ["bf16", "fp8-token"])
    assert cases == [
        ("llama3-70b-tp8", b, 512, bs, kv) for b in (1, 8) for bs in (16, 64) for kv in ("bf16", "fp8-token")
    ]
    assert bench.kv_bytes(1000, 8, 128, "bf16") == 1000 * 8 * 128 * 4
    assert bench.kv_bytes(1000, 8, 128, "fp8") == 1000 * 8 * 128 * 2 + 8
    assert bench.kv_bytes(1000, 8, 128, "fp8-token") == 1000 * 8 * (128 + 4) * 2
    assert bench.checked_rows(3, 4) == [0, 1, 2] and bench.checked_rows(256, 4) == [0, 85, 170, 255]
    assert bench.checked_rows(256, 1) == [0]


def test_list_and_bad_options(bench, capsys):
    assert bench.main(["--list", "--model", "llama3-8b", "--kv", "fp8"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("44 cases") and "B=32   ctx=131072  bs=64  fp8" in out
    with pytest.raises(SystemExit):
        bench.main(["--list", "--kv", "fp4"])
    with pytest.raises(SystemExit):
        bench.main(["--list", "--model", "llama2"])


def test_flashinfer_page_table(bench):
    import torch

    tables = torch.tensor([[7, 2, 9, 4], [0, 5, 1, 3], [8, 6, 10, 11]], dtype=torch.int32)
    lens = torch.tensor([33, 64, 1], dtype=torch.int32)
    indptr, indices, last = bench.flashinfer_page_table(tables, lens, 16)
    assert indptr.tolist() == [0, 3, 7, 8] and indices.tolist() == [7, 2, 9, 0, 5, 1, 3, 8]
    assert last.tolist() == [1, 16, 1]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_compact_pages_and_fp8_caches(bench):
    """The compact copy holds the checked sequences' pages in order; the fp8 caches dequantize to the bf16 values
    within e4m3's rounding."""
    import torch

    torch.manual_seed(0)
    pages, bs, hkv, d = 12, 4, 2, 8
    cache = torch.randn(pages, bs, hkv, d).bfloat16()
    tables = torch.randperm(pages).view(3, 4).to(torch.int32)
    lens = torch.tensor([16, 5, 9], dtype=torch.int32)
    table, sub_lens, (sub,) = bench.compact_pages([1, 2], tables, lens, bs, [cache])
    assert sub_lens.tolist() == [5, 9] and table.tolist() == [[0, 1, 0], [2, 3, 4]]
    assert torch.equal(sub, cache[torch.cat([tables[1, :2], tables[2, :3]]).long()])
    for per_token in (False, True):
        q8, scale = bench.quantize_fp8(cache, per_token)
        assert q8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == ((pages, bs, hkv) if per_token else (1,))
        back = q8.float() * (scale[..., None] if per_token else scale)
        assert ((back - cache.float()).norm() / cache.float().norm()).item() < 0.05
        assert q8.float().abs().max().item() <= bench.FP8_MAX


def test_summary(bench):
    def row(kv, batch, context, ours, **more):
        fields = {"model": "m", "batch": batch, "context": context, "block_size": 16, "ragged": False, "kv": kv}
        measured = {"ours_us": ours, "correct": True, "rel_error": 1e-3, "fraction_of_copy": 0.5}
        measured["fraction_of_read"] = 1.0
        return fields | measured | more

    rows = [
        row("bf16", 1, 512, 10.0, flashinfer_us=20.0, sdpa_us=30.0),
        row("fp8", 1, 512, 8.0, flashinfer_us=16.0),
        row("bf16", 32, 4096, 100.0, fraction_of_copy=0.9, flashinfer_us=90.0),
        row("fp8", 32, 4096, 50.0, fraction_of_copy=0.7, fraction_of_read=0.9),
        row("fp8-token", 32, 4096, 80.0, fraction_of_copy=0.8),
        row("bf16", 128, 4096, 400.0, fraction_of_copy=0.95),
        row("fp8", 128, 4096, 250.0, fraction_of_copy=0.3, correct=False),  # failed its check: left out
        {"model": "m", "batch": 256, "context": 8192, "block_size": 16, "correct": False, "error": "OOM"},
    ]
    s = bench.summarize(rows)
    assert s["min_fraction_of_copy_long"] == 0.7 and s["min_fraction_of_read_long"] == 0.9
    assert s["fp8_over_bf16_speedup_long"] == pytest.approx(2.0)
    assert s["fp8_token_over_bf16_speedup_long"] == pytest.approx(1.25)
    assert s["geomean_vs_flashinfer_short"] == pytest.approx(2.0)  # 20 / 10 and 16 / 8
    assert s["geomean_vs_flashinfer_long"] == pytest.approx(0.9)
    assert s["geomean_vs_sdpa"] == pytest.approx(3.0)
    assert s["cases"] == 8 and s["cases_failed"] == 2
    empty = bench.summarize([])
    assert all(empty[k] is None for k in ("min_fraction_of_copy_long", "fp8_over_bf16_speedup_long"))
    assert empty["geomean_vs_flashinfer_short"] is None


# Stand-ins (torch on the CPU) for the kernel, its reference and FlashInfer.


def _attend(q, k, v, scale):
    """q (Hq, D), k and v (T, Hkv, D), all float32."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    weights = (q[:, None, :] * k.transpose(0, 1)).sum(-1).mul(scale).softmax(-1)  # (Hq, T)
    return (weights[:, :, None] * v.transpose(0, 1)).sum(1)


def _dequantize(cache, scale):
    x = cache.float()
    return x if scale is None else x * (scale if scale.numel() == 1 else scale[..., None])


def _reference(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, k_scale=None, v_scale=None, **unused):
    import torch

    bs, d = k_cache.shape[1], q.shape[-1]
    k, v = _dequantize(k_cache, k_scale), _dequantize(v_cache, v_scale)
    out = torch.empty(q.shape, dtype=torch.float32)
    for b in range(q.shape[0]):
        n = int(context_lens[b])
        pages = block_tables[b, : -(-n // bs)].long()
        kb, vb = (t[pages].reshape(-1, *t.shape[2:])[:n] for t in (k, v))
        out[b] = _attend(q[b].float(), kb, vb, scale or d**-0.5)
    return out


def _paged_decode(q, k_cache, v_cache, block_tables, context_lens, *, out=None, max_context=None, **kwargs):
    assert max_context is not None and int(context_lens.max()) <= max_context
    result = _reference(q, k_cache, v_cache, block_tables, context_lens, **kwargs)
    out = out if out is not None else q.new_empty(q.shape)
    return out.copy_(result)


class _FlashInferWrapper:
    made = []

    def __init__(self, workspace, kv_layout, use_tensor_cores=False):
        assert kv_layout == "NHD"
        self.tensor_cores = use_tensor_cores
        self.made.append(self)

    def plan(self, indptr, indices, last_page_len, hq, hkv, d, page_size, *, q_data_type, kv_data_type):
        self.table, self.page_size, self.kv_dtype = (indptr, indices, last_page_len), page_size, kv_data_type

    def run(self, q, paged_kv_cache, *, out=None, k_scale=None, v_scale=None):
        import torch

        indptr, indices, last = self.table
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dtype == self.kv_dtype
        k, v = k_cache.float() * (k_scale or 1.0), v_cache.float() * (v_scale or 1.0)
        result = torch.empty(q.shape)
        for b in range(q.shape[0]):
            pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
            n = (len(pages) - 1) * self.page_size + int(last[b])
            kb, vb = (t[pages].reshape(-1, *t.shape[2:])[:n] for t in (k, v))
            result[b] = _attend(q[b].float(), kb, vb, q.shape[-1] ** -0.5)
        return out.copy_(result)


@pytest.fixture
def on_cpu(bench, monkeypatch):
    """The benchmark on the CPU with the stand-ins; the timer calls each callable once and returns a fixed time per
    peer (ours 2 ms, copy and read 1 ms, SDPA 4 ms, FlashInfer 3 ms), so that the ratios are known."""

    attention = types.ModuleType("flydsl.kernels.attention")
    attention.paged_decode = _paged_decode
    reference = types.ModuleType("flydsl.kernels.attention.reference")
    reference.paged_decode_reference = _reference
    attention.reference = reference
    monkeypatch.setitem(sys.modules, "flydsl.kernels.attention", attention)
    monkeypatch.setitem(sys.modules, "flydsl.kernels.attention.reference", reference)
    flashinfer = types.ModuleType("flashinfer")
    flashinfer.__version__ = "0.0-stand-in"
    flashinfer.BatchDecodeWithPagedKVCacheWrapper = _FlashInferWrapper
    _FlashInferWrapper.made.clear()
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "LONG_TOKENS", 600)

    def timer(fn):
        fn()
        name = getattr(fn, "__qualname__", "")
        if "ours" in name:
            return 2.0
        if "_flashinfer_call" in name:
            return 3.0
        return 4.0 if "_sdpa" in name else 1.0

    monkeypatch.setattr(bench, "make_timer", lambda flush: timer)
    monkeypatch.setattr(bench, "make_reader", lambda nbytes, device, buffer: lambda: buffer[:nbytes].sum())
    return attention


@pytest.mark.parametrize("ragged", [False, True])
def test_run_on_cpu(bench, on_cpu, tmp_path, ragged):
    """Both models, short and long cases, every KV dtype: each row checked against the reference, SDPA's gather and
    FlashInfer's page table giving the same outputs, a record that validates, the summary from the rows."""
    from record import validate

    path = tmp_path / "paged.json"
    argv = ["--model", "llama3-70b-tp8,llama3-8b", "--batches", "1,3", "--contexts", "40,300", "--block-sizes", "16,64"]
    argv += ["--repeats", "2", "--json", str(path), "--commit", "abc1234"] + (["--ragged"] if ragged else [])
    assert bench.main(argv) == 0
    record = validate(json.loads(path.read_text()))
    rows = record["results"]
    assert len(rows) == 2 * 4 * 2 * 3 and record["flashinfer"] == "flashinfer 0.0-stand-in"
    assert record["command"].startswith("python benchmarks/paged_attention_bench.py --model")
    for r in rows:
        assert r["correct"] and r["unwritten"] == 0 and r["rel_error"] < 1e-2, r
        assert r["ours_us"] == 2000 and r["ratio_vs_sdpa"] == 2.0
        assert r["fraction_of_copy"] == r["fraction_of_read"] == 0.5
        assert len(r["runs_us"]["ours"]) == 2
        assert r["kv_bytes"] == bench.kv_bytes(r["tokens"], r["hkv"], 128, r["kv"])
        if r["kv"] == "bf16":
            assert r["sdpa_rel_error"] < 1e-2
        if r["kv"] == "fp8-token":
            assert "flashinfer_us" not in r and r["flashinfer_error"].startswith("not run")
        else:
            assert r["flashinfer_rel_error"] < 1e-2 and r["ratio_vs_flashinfer"] == 1.5
        if ragged:
            assert r["tokens"] <= r["batch"] * r["context"]
        else:
            assert r["tokens"] == r["batch"] * r["context"]
        assert r["pages"] == r["batch"] * -(-r["context"] // r["block_size"])
    assert {w.tensor_cores for w in _FlashInferWrapper.made} == {False, True}  # 70B at TP8: 8 query heads per KV head
    summary = record["summary"]
    assert summary == bench.summarize(rows)
    assert summary["min_fraction_of_copy_long"] == 0.5 and summary["geomean_vs_flashinfer_short"] == 1.5
    assert summary["fp8_over_bf16_speedup_long"] == 1.0 and summary["cases_failed"] == 0


def test_failures_are_recorded(bench, on_cpu, tmp_path, monkeypatch, capsys):
    """A kernel that raises, one that leaves an element unwritten and a FlashInfer whose plan() fails: each is
    recorded in its row, the sweep goes on, and the failed cases stay out of the summary; without flashinfer the
    record says why."""
    import torch

    def flaky(q, k_cache, v_cache, block_tables, context_lens, *, out, **kwargs):
        if k_cache.shape[1] == 64:
            raise RuntimeError("block size 64 unsupported\nsecond line")
        _paged_decode(q, k_cache, v_cache, block_tables, context_lens, out=out, **kwargs)
        if k_cache.dtype == torch.float8_e4m3fn:
            out[-1, -1, -1] = float("nan")
        return out

    monkeypatch.setattr(on_cpu, "paged_decode", flaky)
    monkeypatch.setattr(_FlashInferWrapper, "plan", lambda self, *a, **k: (_ for _ in ()).throw(ValueError("no")))
    path = tmp_path / "paged.json"
    argv = ["--model", "llama3-70b-tp8", "--batches", "2", "--contexts", "20", "--block-sizes", "16,64"]
    assert bench.main(argv + ["--repeats", "1", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    by = {(r["block_size"], r["kv"]): r for r in rows}
    assert by[(64, "bf16")]["error"] == "RuntimeError: block size 64 unsupported" and "ours_us" not in by[(64, "bf16")]
    assert by[(16, "bf16")]["correct"] and by[(16, "bf16")]["flashinfer_error"] == "ValueError: no"
    assert by[(16, "fp8")]["unwritten"] == 1 and not by[(16, "fp8")]["correct"] and "ours_us" in by[(16, "fp8")]
    summary = json.loads(path.read_text())["summary"]
    assert summary["cases"] == 6 and summary["cases_failed"] == 5 and summary["geomean_vs_flashinfer_short"] is None
    assert "FAILED (RuntimeError: block size 64 unsupported)" in capsys.readouterr().out

    monkeypatch.setitem(sys.modules, "flashinfer", None)
    assert bench.main(argv + ["--repeats", "1", "--kv", "bf16", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["flashinfer"].startswith("not measured: flashinfer does not import here")
    assert all("flashinfer_us" not in r for r in record["results"])

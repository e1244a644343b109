"""paged_decode without a GPU: every kind of decode kernel compiles for sm_90a without spills and with the
instructions its design rests on (16-byte loads, mma.sync, no shared memory in the main loop), the plan's split
choice, and the argument checks."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flydsl.compiler as flyc
from flydsl.kernels.attention import api, decode, merge
from flydsl.kernels.attention.api import decode_plan_config

from .ptxas_report import spill_bytes

torch = pytest.importorskip("torch")


def _specs(cfg, kv_heads=2, **shape):
    return decode.argument_specs(cfg, kv_heads=kv_heads, **shape)


CONFIGS = [
    decode.DecodeConfig(head_dim=128, kv="bf16", q="bf16", group=4),
    decode.DecodeConfig(head_dim=128, kv="f16", q="f16", group=8, split=True),
    decode.DecodeConfig(head_dim=128, kv="e4m3", q="bf16", group=4, k_scale="tensor", v_scale="tensor"),
    decode.DecodeConfig(head_dim=128, kv="e4m3", q="bf16", group=8, k_scale="token", v_scale="token", split=True),
    decode.DecodeConfig(head_dim=128, kv="bf16", q="bf16", group=8, split=True, merge="kernel"),
    decode.DecodeConfig(head_dim=64, kv="bf16", q="bf16", group=4, queries=4, window=True, soft_cap=True),
    decode.DecodeConfig(head_dim=256, kv="bf16", q="bf16", group=2, prefetch=0),
    decode.DecodeConfig(head_dim=256, kv="e4m3", q="f16", group=16, k_scale="tensor", v_scale="token", prefetch=0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.kv}-d{c.head_dim}-g{c.group}-q{c.queries}")
def test_decode_kernel_compiles_without_spills(cfg):
    module = decode.paged_decode_kernel.lower(*_specs(cfg))
    ptx = module.ptx
    assert module.cubin, "ptxas did not assemble the kernel"
    assert spill_bytes(ptx) == 0
    assert "mma.sync.aligned.m16n8k16" in ptx
    loads = re.findall(r"ld\.global\S*\.v4\.b32", ptx)
    assert loads, "the caches are read with 16-byte loads"
    if cfg.kv == "e4m3":
        assert "cvt.rn.f16x2.e4m3x2" in ptx and "prmt.b32" in ptx
    else:
        assert "prmt.b32" in ptx  # values paired across tokens in registers


@pytest.mark.parametrize("dim, fp8, narrow", sorted(api._CTAS_PER_SM))
def test_planned_occupancy_compiles_without_spills(dim, fp8, narrow):
    """The CTAs per SM the plan asks for fit the kernel's registers: narrow (8 rows) and wide (16 rows) groups, bf16
    or fp8 with scales per tensor and per token, split and not."""
    for scale in ("tensor", "token") if fp8 else (None,):
        cfg, _, _ = _plan(
            dim=dim, heads=8 if narrow else 16, kv_heads=1, kv_dtype="e4m3" if fp8 else "bf16", k_scale=scale,
            v_scale=scale, batch=4, max_context=8192,
        )  # fmt: skip
        assert cfg.ctas_per_sm == api._CTAS_PER_SM[(dim, fp8, narrow)]
        assert cfg.narrow == narrow
        assert spill_bytes(decode.paged_decode_kernel.lower(*_specs(cfg)).ptx) == 0, cfg


@pytest.mark.parametrize("kv, ctas", [("bf16", 2), ("e4m3", 3)])
def test_two_chunks_ahead_fit_without_spills(kv, ctas):
    """Loads two chunks ahead (``prefetch=2``, a candidate to time: docs/tuning/attention.md#left) fit the registers of
    bf16 at 2 CTAs per SM and fp8 at 3 with a group of 8; the loop rotates three chunks' registers."""
    scale = "tensor" if kv == "e4m3" else None
    cfg = decode.DecodeConfig(
        head_dim=128, kv=kv, q="bf16", group=8, k_scale=scale, v_scale=scale, split=True, merge="kernel",
        ctas_per_sm=ctas, prefetch=2,
    )  # fmt: skip
    module = decode.paged_decode_kernel.lower(*_specs(cfg))
    assert spill_bytes(module.ptx) == 0, cfg
    per_chunk = 16 if kv == "bf16" else 8  # 16-byte loads of a chunk's keys and values (D 128)
    assert module.ptx.count("ld.global.v4.b32") == 3 * per_chunk  # the prologue's 2 chunks, the loop's 1


@pytest.mark.parametrize(
    "dim, splits, tensor_scale", [(128, 32, False), (128, 256, True), (64, 20, False), (256, 64, True)]
)
def test_merge_kernel_is_a_dependent_launch(dim, splits, tensor_scale):
    """The merge kernel waits for the decode kernel's partials (griddepcontrol.wait, launched as a dependent) and
    reads them through L2 in 16-byte (or 8-byte, D = 64) loads, without spills; the decode kernel that it follows
    lets it start at once, and has no arrival counting."""
    spec = flyc.TensorSpec
    warps = merge.merge_warps(dim, splits)
    assert dim // 32 <= warps <= merge.MERGE_MAX_WARPS and (warps == merge.MERGE_MAX_WARPS or warps * 8 >= splits)
    shapes = [(2, 1, 8, splits, dim), (2, 1, 8, splits, 2), (2, 1, 8, dim), (1,)]
    specs = [spec(shape, dtype) for shape, dtype in zip(shapes, ("f32", "f32", "bf16", "f32"), strict=True)]
    module = merge.merge_splits_kernel.lower(*specs, dim, warps, tensor_scale)
    ptx = module.ptx
    assert module.cubin and spill_bytes(ptx) == 0 and merge.merge_splits_kernel.attributes.dependent_launch
    assert "griddepcontrol.wait;" in ptx and re.search(r"ld\.global\.cg\.v[24]\.b32", ptx)
    cfg = decode.DecodeConfig(head_dim=dim, kv="bf16", q="bf16", group=8, split=True, merge="kernel")
    decode_ptx = decode.paged_decode_kernel.lower(*_specs(cfg)).ptx
    assert "griddepcontrol.launch_dependents;" in decode_ptx and "atom." not in decode_ptx


def _plan(**kw):
    args = dict(
        batch=1, heads=32, kv_heads=8, dim=128, queries=1, q_dtype="bf16", kv_dtype="bf16", k_scale=None,
        v_scale=None, sliding_window=None, soft_cap=False, max_context=131072, sms=132,
    )  # fmt: skip
    args.update(kw)
    return decode_plan_config(**args)


def test_split_choice():
    cfg, splits, tokens = _plan()
    long_splits = splits
    assert cfg.split and splits > 1 and tokens % 16 == 0 and splits * tokens >= 131072
    assert (splits - 1) * tokens < 131072  # no split left without positions
    assert splits > decode.MERGE_FANIN and cfg.merge == "kernel"
    cfg, splits, _ = _plan(batch=8)  # 64 (sequence, KV head) pairs: 4 splits, which the last one merges
    assert splits == 4 and cfg.merge == "last"
    cfg, splits, _ = _plan(batch=1, kv_heads=1, heads=8)  # one (sequence, KV head): 256 splits, the merge kernel's
    assert splits == 256 and cfg.merge == "kernel"
    cfg, _, _ = _plan(batch=1, kv_heads=1, heads=8, merge="last")  # the choice, forced
    assert cfg.merge == "last"
    cfg, splits, _ = _plan(batch=256, max_context=16384)  # 2048 CTAs: enough without splitting
    assert splits == 1 and not cfg.split
    cfg, splits, tokens = _plan(max_context=16)  # one chunk: one split
    assert splits == 1 and tokens == 16
    _, splits_window, _ = _plan(sliding_window=256)  # a window bounds the span whatever the context
    assert splits_window < long_splits


@pytest.mark.parametrize(
    "kv, scales, token_bytes", [("bf16", None, 512), ("e4m3", "tensor", 256), ("e4m3", "token", 264)]
)
def test_split_bytes_floor(kv, scales, token_bytes):
    """Each split reads at least ``min_split_bytes`` of K and V (of one KV head); no floor, the resident CTAs' count."""
    args = dict(batch=8, heads=8, kv_heads=1, kv_dtype=kv, k_scale=scales, v_scale=scales, max_context=8192)
    _, unbounded, _ = _plan(**args, min_split_bytes=0)
    for floor in (32768, 65536, 1 << 20):
        _, splits, tokens = _plan(**args, min_split_bytes=floor)
        assert tokens * token_bytes >= floor or splits == 1
        assert splits <= unbounded and splits * tokens >= 8192
    assert _plan(**args, min_split_bytes=1 << 18)[1] < unbounded  # the floor binds on this small cache


def _tensors(device="cpu"):
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(10, 16, 2, 128, dtype=torch.bfloat16)
    tables = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    return q, cache, cache.clone(), tables, lens


def test_paged_decode_refuses_cpu_tensors():
    from flydsl.kernels.attention import paged_decode

    with pytest.raises(ValueError, match=r"paged_decode: q: expected a CUDA tensor"):
        paged_decode(*_tensors())


def test_decode_config_checks():
    with pytest.raises(ValueError, match="head_dim 64/128/256"):
        decode.DecodeConfig(head_dim=96, kv="bf16", q="bf16", group=1)
    with pytest.raises(ValueError, match="16-bit caches hold the queries' dtype"):
        decode.DecodeConfig(head_dim=128, kv="f16", q="bf16", group=1)
    with pytest.raises(ValueError, match="fp8 caches need k_scale and v_scale"):
        decode.DecodeConfig(head_dim=128, kv="e4m3", q="bf16", group=1)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 512),
    kv_heads=st.sampled_from([1, 2, 4, 8, 16]),
    group=st.sampled_from([1, 4, 8, 16]),
    queries=st.integers(1, 4),
    max_context=st.integers(1, 1 << 20),
    window=st.one_of(st.none(), st.integers(1, 1 << 16)),
    fp8=st.booleans(),
)
def test_split_choice_covers_the_span(batch, kv_heads, group, queries, max_context, window, fp8):
    """For any call the splits cover the positions a query can see, none is empty of them, each holds whole chunks,
    and the merge's levels and fan-in fit the count."""
    cfg, splits, tokens = _plan(
        batch=batch, kv_heads=kv_heads, heads=kv_heads * group, queries=queries, max_context=max_context,
        sliding_window=window, kv_dtype="e4m3" if fp8 else "bf16", k_scale="tensor" if fp8 else None,
        v_scale="tensor" if fp8 else None,
    )  # fmt: skip
    span = max_context if window is None else min(max_context, window + queries - 1 + 16)
    assert tokens % 16 == 0 and tokens >= 16
    assert splits * tokens >= span and (splits - 1) * tokens < span
    assert 1 <= splits <= 256 and cfg.split == (splits > 1)
    assert cfg.merge == ("kernel" if splits > decode.MERGE_FANIN else "last")


def test_plan_reads_shapes_scales_and_strides(monkeypatch):
    """paged_decode's first-call validation and planning on CPU tensors taken as if on a GPU: the decided kernel
    configuration for bf16 and fp8 caches (a float scale per tensor, a tensor per token), and the errors that only
    the real tensors' strides and addresses give."""
    from flydsl.kernels import validation
    from flydsl.kernels.attention import api

    monkeypatch.setattr(
        api.check,
        "describe",
        lambda who, name, t: validation.TensorInfo(t, t.shape, t.stride(), validation.torch_dtype(t.dtype), 0, 1 << 20),
    )
    monkeypatch.setattr(api, "_sm_count", lambda device: 132)
    made = []
    stub = lambda *args: made.append(args) or SimpleNamespace(
        scratch=None, launch=None, made=lambda *a: None
    )  # noqa: E731
    monkeypatch.setattr(api, "_Plan", stub)
    q, cache, _, tables, lens = _tensors()
    api._make_plan(q, cache, cache, tables, lens, None, None, None, None, None, None, None)
    cfg, splits, tokens, scale, cap, window, fp8, device, k_value, v_value = made[-1]
    assert (cfg.kv, cfg.group, fp8, k_value, v_value) == ("bf16", 4, False, None, None)
    assert splits * tokens >= 4 * 16 and scale == pytest.approx(128**-0.5)
    e4m3 = cache.to(torch.float8_e4m3fn)
    per_token = torch.ones(10, 16, 2)
    api._make_plan(q, e4m3, e4m3, tables, lens, 0.1, 0.5, per_token, 64, 30.0, None, 4096)
    cfg, splits, tokens, scale, cap, window, fp8, device, k_value, v_value = made[-1]
    assert (cfg.kv, cfg.k_scale, cfg.v_scale, cfg.window, cfg.soft_cap) == ("e4m3", "tensor", "token", True, True)
    assert (scale, cap, window, fp8, k_value, v_value) == (0.1, 30.0, 64, True, 0.5, None)
    with pytest.raises(ValueError, match=r"paged_decode: k_scale: expected a positive finite scale, got -1.0"):
        api._make_plan(q, e4m3, e4m3, tables, lens, None, -1.0, 0.5, None, None, None, None)
    with pytest.raises(ValueError, match=r"paged_decode: q: expected unit stride on D"):
        strided = torch.zeros(2, 8, 256, dtype=torch.bfloat16)[..., ::2]  # D 128 at stride 2
        api._make_plan(strided, cache, cache, tables, lens, None, None, None, None, None, None, None)
    with pytest.raises(ValueError, match=r"paged_decode: block_tables: expected unit stride on its last dim"):
        api._make_plan(q, cache, cache, tables.t().contiguous().t(), lens, None, None, None, None, None, None, None)


@pytest.mark.parametrize("context", [64, 1024, 4096], ids=["one CTA", "split", "merge kernel"])
def test_the_plan_launches_on_its_scratch_alone(monkeypatch, context):
    """The plan's scratch function makes the output, the split partials (the unused stand-in without splits), the
    stream's merge counters and the scales; the launches (the decode kernel, and past 16 splits the merge kernel)
    bind them in the kernels' order and touch no other memory (what a replay needs). CPU tensors taken as if on a
    GPU, the launches recorded."""
    import importlib

    from flydsl.kernels import memory, validation
    from flydsl.kernels.attention import api

    kernel_module = importlib.import_module("flydsl.compiler.kernel")
    launches = []
    monkeypatch.setattr(
        api.check,
        "describe",
        lambda who, name, t: validation.TensorInfo(t, t.shape, t.stride(), validation.torch_dtype(t.dtype), 0, 1 << 20),
    )
    monkeypatch.setattr(api, "_sm_count", lambda device: 132)
    monkeypatch.setattr(memory, "stream_key", lambda t: (-1, 0))
    monkeypatch.setattr(kernel_module.KernelCall, "launch", lambda call, **config: launches.append(call))
    monkeypatch.setattr(torch, "device", lambda kind, index=None: "cpu")  # the plan keeps its stand-ins on the CPU
    blocks = context // 16
    q = torch.randn(2, 8, 128).bfloat16()
    cache = torch.randn(2 * blocks, 16, 2, 128).bfloat16()
    tables = torch.arange(2 * blocks, dtype=torch.int32).view(2, blocks)
    lens = torch.full((2,), context, dtype=torch.int32)
    plan = api._make_plan(q, cache, cache.clone(), tables, lens, None, None, None, None, None, None, None)
    args = (q, cache, cache.clone(), tables, lens, None, None, None)
    out, partial_out, partial_stats, counters, k_scales, v_scales = scratch = plan.scratch(*args)
    assert out.shape == q.shape and counters.dtype == torch.int32 and not counters.any()
    split = partial_out.numel() > 1
    assert split == (context > 64) and (partial_stats.shape[-1] == 2 if split else partial_stats is partial_out)
    # how a replay makes the same memory itself: the output and partials fresh, the rest held per stream by name
    made = plan.made
    assert (
        len(made) == len(scratch)
        and made[0] == (0, None, None)
        and made[3][2:] == (torch.int32, "paged_decode.counters")
    )
    assert made[3][1][0] <= counters.numel() and made[4] == made[5] == (0, (1,), torch.float32, "paged_decode.unused")
    for spec, value in zip(made[1:3], (partial_out, partial_stats), strict=True):
        assert spec == ((0, tuple(value.shape), torch.float32) if split else made[4])
    plan.launch(*args, *scratch)
    call, *merged = launches
    values = call.values
    assert len(merged) == (context == 4096) and values[-1].merge == ("kernel" if merged else "last")
    assert values[0].data_ptr() == q.data_ptr() and values[7].data_ptr() == out.data_ptr() and values[10] is counters
    assert values[8].data_ptr() == partial_out.data_ptr() and values[9].data_ptr() == partial_stats.data_ptr()
    owners = [t for t in (*args, *scratch) if isinstance(t, torch.Tensor)]
    for value in values:
        if isinstance(value, torch.Tensor):
            assert any(owner.data_ptr() <= value.data_ptr() < owner.data_ptr() + owner.nbytes for owner in owners)
    if merged:  # the merge kernel: the partials into the output
        partials, stats, target = merged[0].values[:3]
        assert partials.data_ptr() == partial_out.data_ptr() and stats.data_ptr() == partial_stats.data_ptr()
        assert target.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("kv, scale, loads", [("bf16", None, 16), ("e4m3", "tensor", 8), ("e4m3", "token", 8)])
def test_the_main_loop_loads_one_chunk_ahead_in_sass(kv, scale, loads):
    """tools/decode_loop_sass.py finds the kernel's main loop in its SASS: one chunk's 16-byte loads of keys and
    values (D 128: 16 for bf16, 8 for fp8) issued among the chunk's MMAs, i.e. loads one chunk ahead (depth 1)."""
    import importlib.util
    from pathlib import Path

    import flydsl.compiler as flyc

    path = Path(__file__).resolve().parents[2] / "tools" / "decode_loop_sass.py"
    spec = importlib.util.spec_from_file_location("decode_loop_sass", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg, _, _ = _plan(
        dim=128, heads=8, kv_heads=1, kv_dtype=kv, k_scale=scale, v_scale=scale, batch=4, max_context=8192
    )
    module = decode.paged_decode_kernel.lower(*_specs(cfg, kv_heads=1))
    sass = flyc.toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs ptxas and nvdisasm (pip install nvidia-cuda-nvdisasm)")
    body = tool.main_loop(sass)
    load_at = [k for k, line in enumerate(body) if "LDG.E.128" in line]
    mma_at = [k for k, line in enumerate(body) if "HMMA" in line]
    assert len(load_at) == loads and mma_at and mma_at[0] < load_at[0] < load_at[-1] < mma_at[-1]


def test_decode_variant_writes_a_commits_kernel_with_its_chunk_module(tmp_path):
    """tools/decode_variant.py: a commit's decode.py, importing the chunk.py of the same commit from beside it, as
    benchmarks/paged_decode_ab.py loads a file variant."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    tool = root / "tools" / "decode_variant.py"
    subprocess.run([sys.executable, str(tool), "HEAD", str(tmp_path)], cwd=root, check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("decode_variant_head", tmp_path / "decode_HEAD.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.chunk_step.__module__ == "chunk_HEAD"
        committed = subprocess.run(
            ["git", "show", "HEAD:packages/flydsl-kernels/src/flydsl/kernels/attention/chunk.py"],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert (tmp_path / "chunk_HEAD.py").read_text() == committed
    finally:
        sys.modules.pop(spec.name, None)

"""benchmarks/: every script parses its arguments and imports what it needs at module level (``--help``, no GPU);
the shared JSON record (benchmarks/record.py) names the commit, the command and the environment."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
LIBRARIES = {
    "record.py",
    "cold_l2.py",
    "moe_torch.py",
    "launch_levels.py",
    "host_breakdown.py",
    "host_timeline.py",
    "host_timing.py",
    "host_cycle.py",
    "host_report.py",
    "cold_start.py",
}  # imported by the scripts, not run
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in LIBRARIES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script):
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout


def test_record_names_commit_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("FLYDSL_GIT_COMMIT", raising=False)
    from record import git_commit, write_record

    path = tmp_path / "r.json"
    results = [{"m": 1, "ratio": 1.5}]
    written = write_record(path, "gemm_bench", ["--sweep"], results, commit="abc1234", method="m", summary={"g": 1})
    record = json.loads(path.read_text())
    assert record == written
    assert record["benchmark"] == "gemm_bench" and record["command"] == "python benchmarks/gemm_bench.py --sweep"
    assert record["git_commit"] == "abc1234" and record["results"] == results and record["summary"] == {"g": 1}
    assert {"date", "python", "method"} <= set(record)
    monkeypatch.setenv("FLYDSL_GIT_COMMIT", "from-env")
    assert git_commit(None) == "from-env" and git_commit("given") == "given"
    monkeypatch.delenv("FLYDSL_GIT_COMMIT")
    monkeypatch.chdir(tmp_path)  # not a git checkout
    monkeypatch.delenv("GIT_DIR", raising=False)
    assert git_commit(None) == "unknown"


def test_record_merge_joins_a_split_sweep(tmp_path, monkeypatch):
    """record.merge: the records of one commit and GPU joined, their commands chained and the summary recomputed over
    every row; records of another commit are refused."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from record import merge, write_record

    parts = []
    for i, rows in enumerate(([{"x": 1.0}, {"x": 4.0}], [{"x": 2.0}])):
        parts.append(tmp_path / f"part{i}.json")
        write_record(parts[-1], "paged_attention_bench", [f"--model m{i}"], rows, commit="abc1234", summary={})
    summary = merge(parts, tmp_path / "all.json", lambda rows: {"min_x": min(r["x"] for r in rows), "n": len(rows)})
    joined = json.loads((tmp_path / "all.json").read_text())
    assert summary == joined["summary"] == {"min_x": 1.0, "n": 3}
    assert [r["x"] for r in joined["results"]] == [1.0, 4.0, 2.0]
    assert joined["command"].count("paged_attention_bench.py") == 2 and " && " in joined["command"]
    write_record(tmp_path / "other.json", "paged_attention_bench", [], [{"x": 0.0}], commit="fff0000", summary={})
    with pytest.raises(SystemExit, match="different benchmarks, commits or GPUs"):
        merge([parts[0], tmp_path / "other.json"], tmp_path / "bad.json", lambda rows: {})


def test_gemm_bench_config_option_builds_gemm_configs(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import argparse

    import gemm_bench

    from flydsl.kernels.gemm import max_stages

    fields = gemm_bench._config_fields("tile_m=256,tile_n=128,cluster_m=1,cluster_n=2,split_tail=false")
    assert fields == {"tile_m": 256, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "split_tail": False}
    cfg = gemm_bench._config(fields)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster, cfg.stages) == (256, 128, 2, max_stages(256, 128))
    assert gemm_bench._config({"stages": 3}).stages == 3  # given stages are kept
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        gemm_bench._config_fields("tile_m")


def test_norms_staged_shapes_option(monkeypatch):
    """``--shapes`` of norms_forward_staged.py / norms_profile.py: THREADS:CHUNKS:LAG[:STAGES[:HOLD[:KEEP[:BLOCKS]]]],
    each a shape that staged_forward_config builds (KEEP: the weight and bias kept in registers; BLOCKS: CTAs per
    SM, 1 when left out); bad ones are refused."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import norms_forward_staged

    from flydsl.kernels.rows.configs import StagedForwardShape, staged_forward_config

    errors = []
    text = "1024:4:0,1024:4:0:2:3,1024:4:0:2:0:1,512:4:0:2:0:1:2,512:8:0:1:0:0:2:1"
    shapes = norms_forward_staged.parse_shapes(text, errors.append)
    assert not errors
    assert shapes == [
        (1024, 4, 0, None, 0, False, 1, False),
        (1024, 4, 0, 2, 3, False, 1, False),
        (1024, 4, 0, 2, 0, True, 1, False),
        (512, 4, 0, 2, 0, True, 2, False),
        (512, 8, 0, 1, 0, False, 2, True),
    ]
    assert norms_forward_staged.staged_shape(shapes[4]) == StagedForwardShape(
        threads=512, chunks=8, lag=0, stages=1, hold=0, keep_weights=False, blocks_per_sm=2, claim_rows=True
    )
    assert norms_forward_staged.staged_shape((1024, 2, 1, None), team=True) == StagedForwardShape(
        threads=1024, chunks=2, lag=1, stages=None, team=True
    )  # a SHAPES entry: the rest left at their defaults

    def config(n, shape):
        return staged_forward_config(n, "bf16", norms_forward_staged.staged_shape(shape))

    cfg = config(131072, shapes[2])
    assert cfg.keep_weights and cfg.row.cluster == 4 and cfg.stages == 2
    cfg = config(131072, shapes[3])
    assert cfg.blocks_per_sm == 2 and cfg.row.cluster == 8 and cfg.row.block == 512
    cfg = config(32768, shapes[4])
    assert cfg.claim_rows and cfg.row.cluster == 1 and cfg.blocks_per_sm == 2
    for bad in ("1024:4", "1024:4:0:2:5", "1024:4:0:2:0:2", "1024:x:0", "1024:4:0:2:0:0:0", "512:8:0:1:0:0:2:2"):
        errors.clear()
        norms_forward_staged.parse_shapes(bad, errors.append)
        assert errors, bad


def test_norms_forward_staged_routes(monkeypatch):
    """norms_forward_staged.py times the staged kernel in the router's shape (None where the router has none) and
    forces the public forwards' route while it times (the register kernel, then a given Route), restoring it
    after."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import importlib

    import norms_forward_staged

    from flydsl.kernels.rows.router import Route, RowKernel, RowOp

    cfg = norms_forward_staged.routed_staged_config("layer_norm", 262144, "bf16")
    assert cfg.row.cluster == 8 and cfg.sources == 1
    assert norms_forward_staged.routed_staged_config("fused_add_rms_norm", 65536, "f32").sources == 2
    assert norms_forward_staged.routed_staged_config("rms_norm", 4096, "bf16") is None
    modules = [importlib.import_module(f"flydsl.kernels.{name}") for name in ("norms.forward", "softmax.kernels")]
    saved = [module.forward_route for module in modules]
    chosen = Route(RowOp.LAYER_NORM, RowKernel.STAGED, cfg)
    with norms_forward_staged.forced_route(chosen):
        assert modules[0].forward_route("tensors", False) is chosen and modules[1].forward_route("tensors") is chosen
    with norms_forward_staged.forced_route():
        assert [module.forward_route for module in modules] != saved
    assert [module.forward_route for module in modules] == saved


def test_norms_bench_records_the_routed_grids(monkeypatch):
    """norms_bench records each cell's routed staged shapes and persistent grids (``grids``) so that machines can be
    compared: the driver's count of co-resident clusters when it gives one (here faked), else 7/8 of the SMs' worth;
    None where the looped or register kernel runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import norms_bench

    def active(cluster, threads, blocks, device):
        return 15 if cluster == 8 else None

    grids = norms_bench.routed_grids("layer_norm", "bf16", 262144, 1024, 132, active)
    assert grids["forward"]["cluster"] == 8 and grids["forward"]["active_clusters"] == 15
    assert grids["forward"]["groups"] == 15
    assert grids["backward"]["team"] and grids["backward"]["groups"] == 4  # teams of 32 one per SM: 132 // 32
    assert norms_bench.routed_grids("softmax", "bf16", 4096, 65536, 132, active) == {"forward": None}
    cell = norms_bench.routed_grids("rms_norm", "bf16", 8192, 32768, 132, active)  # looped forward, register backward
    assert cell == {"forward": None, "backward": None}
    cell = norms_bench.routed_grids("softmax", "bf16", 65536, 4096, 132, active)  # one 1024-thread CTA per row
    assert cell["forward"]["cluster"] == 1 and cell["forward"]["active_clusters"] is None
    assert cell["forward"]["groups"] == 132


@pytest.fixture
def router_tables():
    """The router's tables and the layout's constants that norms_bench's tuning flags edit, restored after."""
    from flydsl.kernels.rows import layout, router

    tables = [
        router.LOOPED_FORWARD,
        router.FORWARD_STORE_GROUP,
        layout.FORWARD_BLOCK_VALUES,
        layout.FORWARD_CACHE_HINTS,
    ]
    saved = [dict(table) for table in tables]
    names = ("CTA_THREADS", "FORWARD_CTA_THREADS", "FORWARD_WARP_BLOCK")
    constants = {name: getattr(layout, name) for name in names}
    yield router
    for table, copy in zip(tables, saved, strict=True):
        table.clear()
        table.update(copy)
    for name, value in constants.items():
        setattr(layout, name, value)
    router.clear_cache()


def test_norms_bench_tuning_flags_edit_the_router(monkeypatch, router_tables):
    """norms_bench's tuning flags edit the router's tables (--forward-looped, --forward-store-group) and the
    layout's constants (--cta-threads, --warp-block, --forward-values, --forward-hints) in place, and the routes
    follow (router.clear_cache); bad variants are refused before anything runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import argparse

    import norms_bench

    router = router_tables
    RowOp, RowKernel, route = router.RowOp, router.RowKernel, router.route
    routed = dict(router.LOOPED_FORWARD)
    assert route(RowOp.RMS_NORM, 8192, "bf16").config.row.block == 512  # the table's 512 x 2
    norms_bench.use_looped("256:2", routed)
    found = route(RowOp.RMS_NORM, 8192, "bf16")
    assert found.kernel is RowKernel.LOOPED and (found.config.row.block, found.config.row.chunks) == (256, 2)
    assert route(RowOp.SOFTMAX, 4096, "bf16").kernel is RowKernel.REGISTER  # softmax has no looped kernel
    norms_bench.use_looped("512:4:2/rows=evict_last/rows=evict_first", routed)
    cfg = route(RowOp.LAYER_NORM, 4096, "f32").config
    assert cfg.blocks_per_sm == 2 and cfg.row.hints.rows == "evict_last" and cfg.reread.rows == "evict_first"
    norms_bench.use_looped("none", routed)
    assert route(RowOp.RMS_NORM, 8192, "bf16").kernel is RowKernel.REGISTER
    norms_bench.use_looped("routed", routed)
    assert route(RowOp.RMS_NORM, 8192, "bf16").config.row.block == 512

    assert route(RowOp.LAYER_NORM, 4096, "bf16").config.store_group == 2  # the register kernel, 128 x 4 chunks
    norms_bench.use_store_group("4")
    assert route(RowOp.LAYER_NORM, 4096, "bf16").config.store_group == 4
    norms_bench.use_hints("rows=evict_first,out=stream")
    hints = route(RowOp.LAYER_NORM, 4096, "bf16").config.hints
    assert (hints.rows, hints.out, hints.vectors) == ("evict_first", "stream", None)
    norms_bench.use_hints("none")
    assert route(RowOp.LAYER_NORM, 4096, "bf16").config.hints.rows is None

    assert route(RowOp.LAYER_NORM, 1024, "bf16").config.block == 32  # one-warp rows in one-warp CTAs
    norms_bench.set_warp_block(128)
    assert route(RowOp.LAYER_NORM, 1024, "bf16").config.block == 128
    assert route(RowOp.LAYER_NORM, 8192, "bf16").config.threads_per_row == 256
    norms_bench.set_forward_values(8)  # 8 values per thread: the row spread over 1024 threads x 1 chunk
    cfg = route(RowOp.LAYER_NORM, 8192, "bf16").config
    assert (cfg.threads_per_row, cfg.chunks) == (1024, 1)
    assert route(RowOp.SOFTMAX_BACKWARD, 4096, "f32").config.cluster == 1  # 512 threads in one CTA
    norms_bench.set_cta_threads(256)
    assert route(RowOp.SOFTMAX_BACKWARD, 4096, "f32").config.cluster == 2

    def args(**given):
        return argparse.Namespace(
            **{"forward_hints": None, "forward_looped": None, "forward_store_group": None} | given
        )

    assert norms_bench.check_variants(args(forward_looped="none;routed;256:2;512:4:3/rows=evict_last")) is None
    assert norms_bench.check_variants(args(forward_hints="rows=evict_first;none;")) is None
    assert "--forward-looped: '256'" in norms_bench.check_variants(args(forward_looped="none;256"))
    assert "--forward-hints" in norms_bench.check_variants(args(forward_hints="rows=sometimes"))
    assert "--forward-store-group" in norms_bench.check_variants(args(forward_store_group="1;two"))


def test_norms_bench_liger_peer(monkeypatch):
    """norms_bench times Liger-Kernel's forwards where liger_kernel imports (here a stand-in module recording the
    calls), and says why not where it does not."""
    import types

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import norms_bench

    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it fails
    ops, status = norms_bench.liger_ops()
    assert ops == {} and status.startswith("not measured: liger_kernel does not import here")

    calls = []
    functional = types.ModuleType("liger_kernel.transformers.functional")
    for name in ("liger_softmax", "liger_layer_norm", "liger_rms_norm", "liger_fused_add_rms_norm"):
        setattr(functional, name, lambda *args, _name=name, **kwargs: calls.append((_name, args, kwargs)))
    package = types.ModuleType("liger_kernel")
    transformers = types.ModuleType("liger_kernel.transformers")
    transformers.functional = functional
    package.transformers = transformers
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", transformers)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", functional)

    def not_installed(name):  # the stand-in has no package metadata (the real liger-kernel may be installed here)
        raise norms_bench.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(norms_bench.metadata, "version", not_installed)
    ops, status = norms_bench.liger_ops()
    assert status == "liger-kernel (version unknown)"
    monkeypatch.setattr(norms_bench.metadata, "version", {"liger-kernel": "0.8.5"}.__getitem__)
    ops, status = norms_bench.liger_ops()
    assert status == "liger-kernel 0.8.5" and set(ops) == {"softmax", "layer_norm", "rms_norm", "fused_add_rms_norm"}
    aux = {"w": "w", "b": "b", "r": "r"}
    for name in ops:
        ops[name]("x", aux)
    assert calls == [
        ("liger_softmax", ("x",), {}),
        ("liger_layer_norm", ("x", "w", "b", 1e-5), {}),
        ("liger_rms_norm", ("x", "w", 1e-6), {"in_place": False}),
        ("liger_fused_add_rms_norm", ("x", "r", "w", 1e-6), {"in_place": False}),
    ]


def test_norms_backward_configs_option(monkeypatch):
    """``--configs`` of norms_backward_staged.py: [team:]THREADS:CHUNKS:STAGES:LAG[:options], ``bulk`` among them
    (the ring filled by bulk copies), each a config the backward builds."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import norms_backward_staged

    errors = []
    specs = norms_backward_staged._parse_configs("team:512:2:6:2:keep:prefetch:fma:bulk,512:4:3:1:keep", errors.append)
    assert not errors and [norms_backward_staged._label(s) for s in specs] == [
        "team:512:2:6:2:keep:prefetch:fma:bulk",
        "512:4:3:1:keep",
    ]
    team = norms_backward_staged._explicit_config(262144, "bf16", 2, specs[0])
    assert team.row.team and team.bulk and team.prefetch_pairs and team.fma_dx
    cluster = norms_backward_staged._explicit_config(131072, "bf16", 2, specs[1])
    assert cluster.row.cluster == 8 and not cluster.bulk


def test_plot_gemm_reads_skinny_results(tmp_path):
    """plot_gemm draws skinny_gemm_bench results too (its keys differ from gemm_bench's): a PNG where matplotlib is
    installed, else the ratio table."""
    import importlib.util

    results = BENCHMARKS / "results" / "skinny_gemm" / "2026-12-01_rotate_final.json"
    out = tmp_path / "skinny.png"
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot_gemm.py"), str(results), "--tbps", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if importlib.util.find_spec("matplotlib") is not None:
        assert run.returncode == 0 and out.stat().st_size > 0, run.stderr[-2000:]
    else:
        assert run.returncode == 1 and "M=   16" in run.stdout and "geomean" in run.stdout, run.stdout + run.stderr


def test_clock_monitor_summarizes_nvidia_smi_samples(tmp_path, monkeypatch):
    """record.ClockMonitor reads nvidia-smi's CSV lines in the background (here a stand-in script on PATH, with a
    malformed line it skips) and summarizes each window; without nvidia-smi it returns None."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from record import ClockMonitor

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'garbage'\ni=0\nwhile [ $i -lt 200 ]; do\n"
        "  echo '1980, 2619, 350.5, 0x0000000000000001, 45'\n  echo '1755, 2619, 690, 0x0000000000000004, 61'\n"
        "  echo '1980, 2619, 400, 0x0000000000000001, 50'\n  i=$((i+1)); sleep 0.01\ndone\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path('/usr/bin')}:{Path('/bin')}")
    monitor = ClockMonitor(50)
    deadline = time.time() + 10
    window = None
    while window is None and time.time() < deadline:
        time.sleep(0.1)
        window = monitor.window()
    monitor.close()
    assert window is not None and window["samples"] % 3 == 0
    assert window["sm_mhz_median"] == 1980 and window["sm_mhz_min"] == 1755 and window["mem_mhz_median"] == 2619
    assert window["power_w_median"] == 400 and window["temperature_c_max"] == 61
    assert window["throttle_reasons"] == ["0x0000000000000001", "0x0000000000000004"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    absent = ClockMonitor(50)
    assert absent.window() is None
    absent.close()


@pytest.fixture
def host_overhead(monkeypatch):
    """benchmarks/host_overhead.py with torch's CUDA calls stubbed and its inputs on the CPU."""
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import host_overhead

    stream = type("Stream", (), {"query": lambda self: False, "cuda_stream": 0})()  # False: still busy
    for name, stub in {
        "is_available": lambda: True,
        "synchronize": lambda: None,
        "_sleep": lambda cycles: None,
        "current_stream": lambda: stream,
        "get_device_name": lambda device=0: "stub GPU",
    }.items():
        monkeypatch.setattr(torch.cuda, name, stub)
    monkeypatch.setattr(host_overhead, "DEVICE", "cpu")
    monkeypatch.setattr(host_overhead, "_import_flydsl", lambda: None)
    return host_overhead


def test_host_overhead_ops_table_covers_the_zoo(host_overhead):
    """One entry per op, both modes (the fp8 GEMMs and the attention ops, inference only: forward), every path but
    the functional forms of the ops that have none (the ops are user-facing; gemm's is functional.linear)."""
    ops = {op.name: op for op in host_overhead.OPS}
    assert set(ops) == {
        "softmax",
        "layer_norm",
        "rms_norm",
        "fused_add_rms_norm",
        "gemm",
        "fp8_gemm",
        "blockscale_gemm",
        "paged_decode",
        "write_kv",
        "topk_route",
        "fused_moe",
    }
    inference = ("fp8_gemm", "blockscale_gemm", "paged_decode", "write_kv", "topk_route", "fused_moe")
    trained = [op for name, op in ops.items() if name not in inference]
    assert all(op.modes == ("fwd", "fwd_bwd") and op.direct_fwd_bwd is not None for op in trained)
    assert all(ops[name].modes == ("fwd",) for name in inference)
    assert all(op.functional is not None and op.user()[0] == "functional" for op in ops.values())
    t = host_overhead.inputs(True)
    assert all(getattr(t, name).requires_grad for op in ops.values() for name in op.grads)
    assert not t.dy.requires_grad and not t.dc.requires_grad


def test_host_overhead_summary_and_record(host_overhead, monkeypatch, tmp_path):
    """With the CUDA calls stubbed and a table of CPU ops, the run times every path, reports a failing one without
    stopping the others, computes max_ratio_vs_torch from the rows and writes a record that validates."""
    import torch
    from record import validate

    def fails(t):
        raise RuntimeError("no kernel here")

    Op = host_overhead.Op
    ops = (
        Op(
            "softmax",
            functional=lambda t: torch.softmax(t.x, -1).exp(),  # twice the work of torch's path
            op=lambda t: torch.softmax(t.x, -1),
            direct=fails,
            direct_fwd_bwd=lambda t: torch.softmax(t.x, -1),
            torch=lambda t: torch.softmax(t.x, -1),
        ),
        Op("rms_norm", op=lambda t: t.x * t.w, direct=lambda t: t.x, torch=lambda t: t.x * t.w, grads=("x", "w")),
    )
    monkeypatch.setattr(host_overhead, "OPS", ops)
    path = tmp_path / "host.json"
    argv = ["--parts", "ops", "--calls", "20", "--repeats", "3", "--json", str(path), "--commit", "abc1234"]
    assert host_overhead.main(argv) == 0
    record = validate(json.loads(path.read_text()))
    rows = record["results"]["ops"]
    assert {(r["op"], r["mode"]) for r in rows} == {(o, m) for o in ("softmax", "rms_norm") for m in ("fwd", "fwd_bwd")}
    failed = [r for r in rows if "error" in r]
    assert [(r["op"], r["mode"], r["path"]) for r in failed] == [("softmax", "fwd", "direct")]
    assert failed[0]["error"] == "RuntimeError: no kernel here"
    assert all(r["gpu_busy_after"] and r["compiles"] == 0 for r in rows if "error" not in r)
    assert {r["path"] for r in rows if r["op"] == "rms_norm"} == {"op", "direct", "torch"}  # no functional form
    samples = {(r["op"], r["mode"], r["path"]): r.get("samples_us") for r in rows}
    expected = {
        f"{op}.{mode}": round(statistics.median(a / b for a, b in zip(*pair, strict=True)), 3)
        for op, user in (("softmax", "functional"), ("rms_norm", "op"))
        for mode in ("fwd", "fwd_bwd")
        for pair in [(samples[(op, mode, user)], samples[(op, mode, "torch")])]
    }
    summary = record["summary"]
    assert summary["ratios"] == expected and summary["max_ratio_vs_torch"] == max(expected.values())
    assert summary["missing"] == [] and summary["cold_start_ms"] is None
    assert record["command"].startswith("python benchmarks/host_overhead.py --parts ops")
    checked = {
        (r["op"], r["path"]): r["max_abs_difference_vs_torch"] for r in rows if r["mode"] == "fwd" and "error" not in r
    }
    assert checked[("softmax", "op")] == 0 and checked[("softmax", "functional")] > 0  # the check sees a difference


def test_host_overhead_interleaves_an_ops_paths(host_overhead):
    """Each repeat times every path's batch in turn (after each path's warm-up batch), so a host that slows down
    between repeats slows all paths alike; a path that raises is reported and the others keep their repeats."""
    order = []

    def path(name):
        return lambda: order.append(name)

    def fails():
        raise RuntimeError("no kernel")

    rows = host_overhead.host_us_interleaved({"a": path("a"), "b": path("b"), "c": fails}, calls=2, repeats=3)
    timed = order[2 * (1 + 2) :]  # after each path's first call and its idle batch of 2
    assert timed == ["a", "a", "b", "b"] * 3
    assert rows["c"] == {"error": "RuntimeError: no kernel"} and len(rows["a"]["samples_us"]) == 3
    slow = {"samples_us": [2.0, 4.0, 6.0]}
    assert host_overhead.paired_ratio(slow, {"samples_us": [1.0, 2.0, 4.0]}) == 2.0  # median of 2, 2, 1.5
    assert host_overhead.paired_ratio(slow, rows["c"]) is None


def test_host_overhead_rounds_interleave_call_by_call(host_overhead):
    """host_us_rounds: after one call of each path and an idle round trip, every round calls each path once in turn;
    a repeat's sample is the median of its calls; a path that raises is reported and the others keep their
    repeats."""
    from host_timing import host_us_rounds

    order = []

    def path(name):
        return lambda: order.append(name)

    def fails():
        raise RuntimeError("no kernel")

    rows = host_us_rounds({"a": path("a"), "b": path("b"), "c": fails}, calls=2, repeats=3)
    timed = order[2 + 2 * 2 :]  # each path's first call, then the idle rounds that size the sleep
    assert timed == ["a", "b"] * 2 * 3
    assert rows["c"] == {"error": "RuntimeError: no kernel"} and len(rows["a"]["samples_us"]) == 3
    assert rows["a"]["timing"] == "per call, interleaved"


def test_host_overhead_cycle_part(host_overhead, monkeypatch):
    """--parts cycle: per op of host_cycle.CYCLE_OPS, the six variants, ours against torch's, each row with both
    times and the paired ratio (CPU ops standing in)."""
    import torch
    from host_cycle import CYCLE_OPS, cycle_extra, measure_cycle

    Op = host_overhead.Op
    ops = {
        name: Op(name, functional=lambda t: (t.x * 2).sum(-1), op=None, direct=None, torch=lambda t: t.x.sum(-1))
        for name in CYCLE_OPS
    }
    graded = type("T", (), {"x": torch.randn(4, 8, requires_grad=True), "dy": torch.ones(4)})()
    rows = measure_cycle(ops, graded, host_overhead._first, rounds=2, repeats=3)
    variants = ("plain", "torch_first", "retain", "fwd_rec", "bwd_kept", "gc_off")
    assert [(r["op"], r["variant"]) for r in rows] == [(op, v) for op in CYCLE_OPS for v in variants]
    assert all(r["ours_us"] > 0 and r["torch_us"] > 0 and r["ratio"] > 0 for r in rows)
    extra = cycle_extra(rows)
    assert set(extra) == set(CYCLE_OPS) and all(set(e) == {"ours", "torch"} for e in extra.values())


def test_host_overhead_cold_start_medians(host_overhead):
    """The cold start runs one warming process, then ``runs`` per op, and keeps the medians; a failing op is
    reported and the others still measured."""
    calls, measured = [], []

    def child(names):
        calls.append(names)
        if names == ["gemm"]:
            raise RuntimeError("exited 1")
        k = len(calls)
        if k > 1:  # (the first, warming process is not counted)
            measured.append(10.0 + k)
        times = {"context_ms": 100.0 + k, "import_ms": 10.0 + k, "first_call_ms": {n: 40.0 + k for n in names}}
        return {**times, "import_loads_compiler": False, "first_calls_load_mlir": False}

    import cold_start

    names = [op.name for op in host_overhead.OPS]
    cold = cold_start.measure(names, 3, child)
    assert calls[0] == names and calls[1:4] == [["softmax"]] * 3
    assert cold["first_call_ms"]["softmax"] == 43.0 and cold["first_call_ms"]["layer_norm"] == 46.0
    assert cold["first_call_ms"]["gemm"] is None and cold["errors"] == {"gemm": "RuntimeError: exited 1"}
    assert cold["import_ms"] == cold_start.median(measured)
    assert cold["import_loads_compiler"] is False and cold["first_calls_load_mlir"] is False


def test_cold_first_calls_write_their_profiles(host_overhead, monkeypatch, tmp_path):
    """``--cold-profile DIR``: each first call of a cold child runs under cProfile and its costliest functions go to
    ``DIR/cold_<op>.txt``, named by the op and its time."""
    import cold_start
    import torch

    monkeypatch.setattr(torch, "zeros", lambda *args, **kwargs: None)  # the CUDA context's op
    busy = types.SimpleNamespace(user=lambda: ("functional", lambda t: sorted(range(5000), key=lambda i: -i)))
    found = cold_start.first_calls(["busy"], {"busy": busy}, lambda: None, lambda: None, str(tmp_path))
    text = (tmp_path / "cold_busy.txt").read_text()
    assert text.startswith(f"busy: first call {found['first_call_ms']['busy']:.1f} ms under cProfile")
    assert "cumulative" in text and "<lambda>" in text


def test_import_time_groups_a_fresh_import(monkeypatch):
    """import_time.one_run charges each module's self time to its group: importing the layout package alone (pure
    Python) loads no native extension and no MLIR, and its groups add up to about its cumulative time."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import import_time

    run = import_time.one_run("flydsl.layout")
    groups = run["self_ms"]
    assert groups["flydsl.layout"] > 0
    assert groups["native extension (flydsl.compiler._fly)"] == 0 and groups["MLIR Python bindings (mlir.*)"] == 0
    assert run["total_ms"] is not None and 0.5 * run["total_ms"] <= sum(groups.values()) <= 1.5 * run["total_ms"] + 1

"""benchmarks/: every script parses its arguments and imports what it needs at module level (``--help``, no GPU);
the shared JSON record (benchmarks/record.py) names the commit, the command and the environment."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
LIBRARIES = {"record.py", "cold_l2.py"}  # imported by the scripts, not run
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

    from flydsl.kernels.normalization import staged_forward_config

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

    def config(n, shape):
        threads, chunks, lag, stages, hold, keep, blocks, claim = shape
        return staged_forward_config(n, "bf16", False, chunks, stages, threads, lag, hold, keep, False, blocks, claim)

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


def test_norms_bench_records_the_routed_grids(monkeypatch):
    """norms_bench records each cell's routed staged shapes and persistent grids (``grids``) so that machines can be
    compared: the driver's count of co-resident clusters when it gives one (here faked), else 7/8 of the SMs' worth;
    None where the looped or register kernel runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import importlib

    import norms_bench

    norm = importlib.import_module("flydsl.kernels.normalization")
    monkeypatch.setattr(
        norm, "max_active_clusters", lambda cluster, threads, blocks, device: 15 if cluster == 8 else None
    )
    grids = norms_bench.routed_grids(norm, "layer_norm", "bf16", 262144, 1024, 132)
    assert grids["forward"]["cluster"] == 8 and grids["forward"]["active_clusters"] == 15
    assert grids["forward"]["groups"] == 15
    assert grids["backward"]["team"] and grids["backward"]["groups"] == 4  # teams of 32 one per SM: 132 // 32
    assert norms_bench.routed_grids(norm, "softmax", "bf16", 4096, 65536, 132) == {"forward": None}
    cell = norms_bench.routed_grids(norm, "rms_norm", "bf16", 8192, 32768, 132)  # looped forward, register backward
    assert cell == {"forward": None, "backward": None}


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
    ops, status = norms_bench.liger_ops()
    assert status == "liger-kernel (version unknown)"  # the stand-in has no package metadata
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
    import importlib

    import norms_backward_staged

    norm = importlib.import_module("flydsl.kernels.normalization")
    errors = []
    specs = norms_backward_staged._parse_configs("team:512:2:6:2:keep:prefetch:fma:bulk,512:4:3:1:keep", errors.append)
    assert not errors and [norms_backward_staged._label(s) for s in specs] == [
        "team:512:2:6:2:keep:prefetch:fma:bulk",
        "512:4:3:1:keep",
    ]
    team = norms_backward_staged._explicit_config(norm, 262144, "bf16", 2, specs[0])
    assert team.row.team and team.bulk and team.prefetch_pairs and team.fma_dx
    cluster = norms_backward_staged._explicit_config(norm, 131072, "bf16", 2, specs[1])
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

"""benchmarks/host_layer_cpu.py, the CPU measurement of flydsl.torch's host layer, runs where the adapter is installed
(tox's torch env) and records what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_host_layer_cpu_runs_without_a_gpu_and_records(tmp_path):
    """The CPU benchmark of flydsl.torch's host layer: every case timed with replays on and off, replays recorded
    (their first calls make LaunchPlans), a record with its summary."""
    path = tmp_path / "host_layer.json"
    command = [sys.executable, str(BENCHMARKS / "host_layer_cpu.py"), "--calls", "20", "--repeats", "1"]
    run = subprocess.run([*command, "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(path.read_text())
    norms = [row for row in record["results"] if not row["case"].endswith(".inference")]
    inference = [row for row in record["results"] if row["case"].endswith(".inference")]
    assert {row["case"] for row in norms} == {
        f"{op}.{mode}"
        for op in ("softmax", "layer_norm", "rms_norm", "fused_add_rms_norm")
        for mode in ("fwd", "fwd_bwd")
    }
    assert all(row["replays_us"] > 0 and row["python_plans_us"] > 0 for row in norms)
    assert all(row["replayed"] for row in norms if row["case"].endswith(".fwd"))
    inference_ops = {
        "fp8_gemm",
        "blockscale_gemm",
        "quantize_fp8",
        "paged_decode",
        "write_kv",
        "topk_route",
        "fused_moe",
    }
    assert {row["case"] for row in inference} == {f"{op}.inference" for op in inference_ops}
    assert all(row["functional_us"] > 0 and row["op_us"] > 0 for row in inference)
    summary_keys = {"max_replays_us", "geomean_ratio", "max_ratio_vs_torch_tiny", "max_floor_ratio_vs_torch_tiny"}
    summary_keys |= {"max_inference_functional_us", "geomean_inference_ratio_vs_op", "geomean_c_api_ratio"}
    assert set(record["summary"]) == summary_keys
    assert all(row["c_api_paused_us"] > 0 and row["c_api_ratio"] > 0 for row in norms + inference)
    floors = [row["python_function_floor_us"] for row in norms if row["case"].endswith(".fwd_bwd")]
    assert len(floors) == 4 and all(floor > 0 for floor in floors)  # the Python Function floor beside each fwd_bwd

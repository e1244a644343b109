"""A process that finds its kernels in the disk cache launches them without loading MLIR: neither MLIR's Python
bindings (and the MLIR/LLVM libraries under them) nor the dialect extension ``_fly`` are imported by the zoo's
modules or by a call whose kernel is cached; only tracing loads them. (The launcher is the ``_runtime`` extension,
which links neither.) This is what keeps a process's first call of an op short (issue 31's cold start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("mlir._mlir_libs._mlir", "flydsl.compiler._fly")
# The trace and compile path's own modules: imported by a compile, not by a launch from the disk cache.
COMPILE_PATH = ("flydsl.compiler.pipeline", "flydsl.compiler.ast_rewrite", "flydsl.compiler.context")

_FIRST_CALLS = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
import flydsl.kernels as zoo
import flydsl.kernels.attention, flydsl.kernels.moe, flydsl.kernels.quantize
from flydsl.kernels.gemm.operands import MatrixSpec
from flydsl.kernels.gemm.plan import plan_gemm
from tests.kernels.routed_ptx import DeviceArray, recording

after_imports = [name for name in {HEAVY!r} if name in sys.modules]
with recording() as launched:
    x = DeviceArray((64, 1024), "bf16")
    zoo.rms_norm(x, DeviceArray((1024,), "bf16"), 1e-6, out=DeviceArray((64, 1024), "bf16"))
    zoo.softmax(x, out=DeviceArray((64, 1024), "bf16"))
a, b = MatrixSpec.dense((256, 1024), "bf16"), MatrixSpec.dense((1024, 512), "bf16")
modules = plan_gemm(a, b, MatrixSpec.dense((256, 512), "bf16"), sms=132).lower()
print(json.dumps({{"after_imports": after_imports, "launches": len(launched), "gemm_modules": len(modules),
                  "loaded": [name for name in {HEAVY!r} if name in sys.modules],
                  "compile_path": sorted(name for name in {COMPILE_PATH!r} if name in sys.modules)}}))
"""


def _run(cache: Path) -> dict:
    env = dict(os.environ, FLYDSL_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_launching_cached_kernels_loads_no_mlir(tmp_path):
    first = _run(tmp_path)  # compiles: tracing loads MLIR (which shows that the check below can see it)
    assert first["after_imports"] == [] and first["loaded"] == list(HEAVY)
    assert first["compile_path"] == sorted(COMPILE_PATH)
    second = _run(tmp_path)  # everything from the disk cache
    expected = {"after_imports": [], "launches": 2, "gemm_modules": first["gemm_modules"], "loaded": []}
    assert second == expected | {"compile_path": []}

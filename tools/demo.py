"""The README's main job (``tox -e demo``; on the offline GPU machine ``bash tools/gpu-check.sh --demo``): compile
every example kernel to PTX and a cubin and, where a GPU can be used, run each one and check its result.

    python tools/demo.py                                  # torch must already be there where a GPU is present
    python tools/demo.py --install-torch "torch==2.13.0"  # tox's demo env: pip installs it, on a GPU machine only

The examples import torch only to run and check on a GPU, so a machine without one needs no torch. With a GPU, a
missing torch is installed (``--install-torch``: a pip requirement; PyPI's Linux torch 2.13.0 is the CUDA 13.0
build, which needs an NVIDIA driver >= 580), and a torch that cannot use the GPU (a CPU build, a driver too old for
its CUDA) stops the demo, saying so. Each example runs in its own process; the last line is the summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
# The README's list, in its order: each compiles, and on a GPU runs and checks against torch or flydsl.layout.
EXAMPLES = [
    "vector_add.py",
    "tiled_copy.py",
    "gemm_1_naive.py",
    "gemm_2_mma_sync.py",
    "gemm_3_tma_wgmma.py",
    "gemm_4_warp_specialized.py",
    "gemm_5_fp8.py",
    "paged_decode.py",
    "moe.py",
    "00_native_demo.py",
]


def _gpu() -> str | None:
    """The name of the GPU the examples would run on, or None where none can be used."""
    from flydsl.compiler import runtime

    return runtime.device_name(0) if runtime.is_available() else None


def _torch_problem() -> str | None:
    """Why the installed torch cannot run the examples on this GPU, or None when it can."""
    probe = (
        "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(),"
        " torch.cuda.device_count())"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        return f"import torch failed: {(found.stderr.strip().splitlines() or ['?'])[-1]}"
    version, cuda, usable, _ = found.stdout.split()
    if cuda == "None":
        return f"torch {version} is a CPU build: install a CUDA build (PyPI's Linux wheel: pip install torch==2.13.0)"
    if usable != "True":
        return f"torch {version} (CUDA {cuda}) cannot use this GPU: its CUDA needs a newer NVIDIA driver than this one"
    return None


def _ensure_torch(requirement: str | None) -> str | None:
    """Installs ``requirement`` where torch is missing; the reason the examples cannot run on the GPU, or None."""
    if importlib.util.find_spec("torch") is None:
        if requirement is None:
            return "torch is not installed: the examples need a CUDA build of torch to run on the GPU"
        print(f"demo: a GPU is present and torch is not: pip install {requirement}", flush=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", *shlex.split(requirement)]
        if subprocess.run(command).returncode != 0:
            return f"pip install {requirement} failed"
        importlib.invalidate_caches()
    return _torch_problem()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install-torch", metavar="REQUIREMENT", help="pip requirement of torch, installed on a GPU")
    args = parser.parse_args(argv)

    gpu = _gpu()
    if gpu is not None:
        problem = _ensure_torch(args.install_torch)
        if problem is not None:
            print(f"demo: FAILED before the first example: {problem}")
            return 1
    failed = []
    for name in EXAMPLES:
        print(f"\n=== {name}", flush=True)
        start = time.perf_counter()
        status = subprocess.run([sys.executable, str(EXAMPLES_DIR / name)]).returncode
        outcome = "ok" if status == 0 else f"FAILED (exit status {status})"
        print(f"=== {name}: {outcome} in {time.perf_counter() - start:.1f} s", flush=True)
        if status != 0:
            failed.append(name)
    what = f"compiled, ran and checked on {gpu}" if gpu is not None else "compiled (no usable GPU here: not run)"
    summary = f"demo: {len(EXAMPLES) - len(failed)} of {len(EXAMPLES)} examples {what}"
    print(f"\n{summary}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""FlyDSL's native path end to end: an MLIR kernel using a Fly layout op -> PTX (in process) -> cubin (ptxas)
-> loaded and launched through the native CUDA launcher, its output checked against flydsl.layout.

    python examples/00_native_demo.py            # compiles; on a machine with an NVIDIA GPU also runs and checks
    python examples/00_native_demo.py --show-ptx
"""

from __future__ import annotations

import argparse
import array
import sys
from pathlib import Path

import flydsl.compiler as flyc
from flydsl.layout import Layout

# The layout that layout_offsets.mlir hard-codes in its !fly.layout type.
LAYOUT = Layout(((4, 2), 8), ((16, 1), 2))
MLIR = Path(__file__).with_name("layout_offsets.mlir")


def run_on_gpu(compiled: flyc.CompiledModule, n: int) -> None:
    from flydsl.compiler import runtime

    module = runtime.load(compiled)
    out = runtime.DeviceBuffer(4 * n)
    out.memset(0xFF)  # poison: every element must be written
    threads = 128
    module.launch("layout_offsets", (n + threads - 1) // threads, threads, out, n)
    runtime.synchronize()
    got = array.array("i")
    got.frombytes(out.copy_to_host())
    expected = [LAYOUT(i % 64) for i in range(n)]
    wrong = [i for i in range(n) if got[i] != expected[i]]
    if wrong:
        i = wrong[0]
        raise SystemExit(
            f"FAILED: {len(wrong)} of {n} offsets wrong; first at {i}: got {got[i]}, expected {expected[i]}"
        )
    print(f"GPU {runtime.device_name(0)}: {n} offsets of layout {LAYOUT} match flydsl.layout exactly")
    print(f"first 16: {list(got[:16])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="number of threads/offsets (default 1000)")
    parser.add_argument("--show-ptx", action="store_true")
    args = parser.parse_args()

    compiled = flyc.compile_mlir(MLIR.read_text())
    print(f"compiled module '{compiled.name}' for {compiled.target.chip}: kernels {compiled.kernels}")
    print(f"  PTX: {len(compiled.ptx)} bytes (in process)")
    if compiled.cubin is not None:
        print(f"  cubin: {len(compiled.cubin)} bytes (ptxas {flyc.find_ptxas()})")
    else:
        print("  cubin: ptxas not found; the driver will JIT the PTX")
    if args.show_ptx:
        print(compiled.ptx)

    from flydsl.compiler import runtime

    if not runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only (run on a GPU machine to launch and check)")
        return 0
    run_on_gpu(compiled, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

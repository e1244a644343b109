"""One launch of a norm or softmax forward between profiler start and stop, for Nsight Compute (diagnostics, not a
benchmark): ours as routed, then each staged shape of ``--shapes`` launched directly, then torch.compile's kernel.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats python benchmarks/norms_profile.py layer_norm 131072 bf16 \\
        --shapes 1024:4:0:2:3,1024:4:0:3:0     # THREADS:CHUNKS:LAG[:STAGES[:HOLD[:KEEP[:BLOCKS[:CLAIM]]]]], see
                                               # norms_forward_staged.py

M x N = 2^28 elements, as norms_bench.py; weight and bias random, eps 1e-6 for the staged launches.
"""

from __future__ import annotations

import argparse
import sys

from norms_forward_staged import parse_shapes, staged_inputs, staged_launch, staged_shape  # this folder's sibling

KERNELS = ("softmax", "layer_norm", "rms_norm", "fused_add_rms_norm")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", choices=KERNELS)
    parser.add_argument("n", type=int)
    parser.add_argument("dtype", choices=("bf16", "f16", "f32"))
    parser.add_argument("--shapes", help="staged shapes to launch directly after the routed call")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile's kernel")
    args = parser.parse_args(argv)
    shapes = parse_shapes(args.shapes, parser.error) if args.shapes else []

    import torch

    import flydsl.kernels as norms  # the public functions
    from flydsl.kernels.bench import profile_once
    from flydsl.kernels.rows.configs import staged_forward_config

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    m = (1 << 28) // args.n
    t = staged_inputs(torch, args.kernel, m, args.n, dtype)
    x, w, b, out, residual = t["x"], t["w"], t["b"], t["out"], t["residual"]
    routed = {
        "softmax": lambda: norms.softmax(x, out),
        "layer_norm": lambda: norms.layer_norm(x, w, b, 1e-6, out),
        "rms_norm": lambda: norms.rms_norm(x, w, 1e-6, out),
        "fused_add_rms_norm": lambda: norms.fused_add_rms_norm(x, residual, w, 1e-6, out, residual_out=residual),
    }[args.kernel]
    runs = [routed]
    for spec in shapes:
        fused = args.kernel == "fused_add_rms_norm"
        cfg = staged_forward_config(args.n, args.dtype, staged_shape(spec), residual=fused)
        if cfg is None:
            threads, chunks, lag, stages, hold, keep, blocks, claim = spec
            shape = f"{threads}:{chunks}:{lag}:{stages}:{hold}:{keep:d}:{blocks}:{claim:d}"
            parser.error(f"--shapes: no staged config {shape} for N={args.n}")
        runs.append(staged_launch(args.kernel, cfg, t))
    if not args.no_compile:
        eager = {
            "softmax": lambda a: torch.softmax(a, dim=-1),
            "layer_norm": lambda a: torch.nn.functional.layer_norm(a, a.shape[-1:], w, b, 1e-6),
            "rms_norm": lambda a: torch.nn.functional.rms_norm(a, a.shape[-1:], w, 1e-6),
            "fused_add_rms_norm": lambda a: torch.nn.functional.rms_norm(a + residual, a.shape[-1:], w, 1e-6),
        }[args.kernel]
        compiled = torch.compile(eager)
        runs.append(lambda: compiled(x))
    profile_once(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

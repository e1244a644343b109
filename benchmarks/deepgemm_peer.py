"""DeepGEMM (github.com/deepseek-ai/DeepGEMM) as a peer of blockscale_gemm_bench.py, and its smoke check on the GPU
machine. tools/deepgemm-env.sh builds DeepGEMM there and runs this script, which imports no flydsl (it runs before
FlyDSL's whole runtime has travelled):

    python benchmarks/deepgemm_peer.py                      # one fp8_gemm_nt at 256 x 512 x 1024 against float32
    python benchmarks/deepgemm_peer.py --warm 4096x7168x16384 512x7168x16384   # then these (JIT-compiled, checked)

Status: 0 when every shape ran and matched, else the count of those that did not (at most 9), 10 where deep_gemm does
not import, 11 where there is no GPU.

DeepGEMM's SM90 ``fp8_gemm_nt((a, sfa), (b, sfb), d)`` computes d = a @ b.T: a (M, K) and b (N, K) e4m3, both
K-major; float32 scales sfa per 1 x 128 of a, M-major with M padded to 16 bytes (``get_mn_major_tma_aligned_tensor``),
and sfb per 128 x 128 block of b, (N/128, K/128) contiguous; d bf16 (M, N) row-major. The bench's operands are these
already: its nn.Linear weights w (N, K) are b, its 128 x 128 scales are sfb as they are, and its row-major 1 x 128
scales go through DeepGEMM's own get_mn_major_tma_aligned_tensor once, outside the timed call (they come out in the
M-major layout the bench gives blockscale_gemm, so the timed call copies nothing). The commit measured is
DEEPGEMM_COMMIT, which deepgemm-env.sh exports from the tarball tools/pack-deepgemm.sh made.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SMOKE = "256x512x1024"


def load():
    """(the deep_gemm module, its description) where it imports, else (None, the import error)."""
    try:
        import deep_gemm
    except Exception as error:  # noqa: BLE001 (recorded: not installed, or its extension or CUDA home missing)
        return None, {"available": False, "import_error": f"{type(error).__name__}: {error}"[:500]}
    return deep_gemm, {
        "available": True,
        "commit": os.environ.get("DEEPGEMM_COMMIT") or "unknown",
        "version": getattr(deep_gemm, "__version__", None),
        "path": os.path.dirname(deep_gemm.__file__),
        "jit": "nvrtc" if os.environ.get("DG_JIT_USE_NVRTC", "0") not in ("", "0") else "nvcc",
    }


def refusal(m, n, k):
    """Why DeepGEMM's SM90 fp8_gemm_nt takes no (M, N, K) in the bench's layouts, or None."""
    if k % 128:
        return f"K {k} is not a multiple of 128 (DeepGEMM's SM90 kernel steps through whole 128-wide scale blocks)"
    if n % 8:
        return f"N {n} is not a multiple of 8 (d's bf16 rows must be 16-byte aligned for TMA)"
    return None


def prepare(dg, a, w, a_scales, w_scales, out):
    """DeepGEMM's call on the bench's operands (the module's doc says how they map), and the a scales it takes."""
    sfa = dg.get_mn_major_tma_aligned_tensor(a_scales)
    return (lambda: dg.fp8_gemm_nt((a, sfa), (w, w_scales), out)), sfa


def check(torch, dg, a, w, a_scales, w_scales, reference, error, tolerance=2e-2):
    """(the call to time, the row's deepgemm_* fields): DeepGEMM run once (its JIT compile: outside any timing) and
    its output checked against ``reference`` with ``error``; (None, fields naming why in deepgemm_refused) where it
    refuses the shape, fails or misses the reference."""
    (m, k), n = a.shape, w.shape[0]
    why = refusal(m, n, k)
    if why:
        return None, {"deepgemm_refused": why}
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=a.device)
    began = time.perf_counter()
    try:
        call, sfa = prepare(dg, a, w, a_scales, w_scales, out)
        call()
        if out.is_cuda:
            torch.cuda.synchronize()
    except Exception as failure:  # noqa: BLE001 (recorded: DeepGEMM's host asserts raise RuntimeError)
        lines = str(failure).strip().splitlines() or [""]
        return None, {"deepgemm_refused": f"{type(failure).__name__}: {lines[0][:300]}"}
    err = error(out, reference)
    fields = {
        "deepgemm_rel_error_vs_f32": err,
        "deepgemm_first_call_s": time.perf_counter() - began,
        "deepgemm_sfa_strides": list(sfa.stride()),
    }
    if not err < tolerance:
        fields["deepgemm_refused"] = f"ran, rel error {err:.2e} against the reference"
        return None, fields
    return call, fields


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=SMOKE, help=f"the smoke check's M x N x K (default {SMOKE})")
    parser.add_argument("--warm", nargs="*", default=[], help="shapes MxNxK run and checked after it (JIT cache)")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds after which no --warm shape starts")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="the largest relative error that passes")
    args = parser.parse_args(argv)
    began = time.perf_counter()

    import torch
    from blockscale_gemm_bench import _error, operands, shape_arg

    shapes = [shape_arg(text) for text in [args.shape, *args.warm]]
    dg, info = load()
    print("deepgemm:", info, flush=True)
    if dg is None:
        return 10
    if not torch.cuda.is_available():
        print("deepgemm: no GPU", file=sys.stderr)
        return 11
    props = torch.cuda.get_device_properties(0)
    print(f"deepgemm: {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}", flush=True)
    failures = 0
    for i, (m, n, k) in enumerate(shapes):
        if i and time.perf_counter() - began > args.budget:
            print(f"deepgemm {m}x{n}x{k}: not run (past --budget {args.budget:.0f} s)", flush=True)
            continue
        a, w, a_scales, w_scales, reference = operands(torch, m, n, k)
        call, fields = check(torch, dg, a, w, a_scales, w_scales, reference, _error, args.tolerance)
        del a, w, a_scales, w_scales, reference
        torch.cuda.empty_cache()
        failures += call is None
        err = fields.get("deepgemm_rel_error_vs_f32", float("nan"))
        print(
            f"deepgemm {m}x{n}x{k}: {'ok' if call else 'FAILED'}, rel error {err:.2e} against float32,"
            f" first call (JIT) {fields.get('deepgemm_first_call_s', float('nan')):.1f} s"
            + (f": {fields['deepgemm_refused']}" if "deepgemm_refused" in fields else ""),
            flush=True,
        )
    print(f"deepgemm: {len(shapes)} shapes, {failures} failed, {time.perf_counter() - began:.1f} s")
    return min(failures, 9)


if __name__ == "__main__":
    sys.exit(main())

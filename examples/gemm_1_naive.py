"""GEMM tutorial, step 1 of 4: the naive kernel, one thread per output element (docs/gemm-tutorial.md).

C (M x N, float32) = A (M x K, bf16, row-major) @ B (K x N, bf16, row-major). Each thread walks the K dimension
for its one element of C: a load of A (the same for the 32 threads of a warp: a broadcast), a load of B (32
adjacent columns: one coalesced access per warp), a float32 multiply-add. No shared memory, no tensor cores: this is
the correctness baseline, and it fixes the host side every later step keeps (``matmul(a, b, c)``, the checks, the
benchmark). Any M, N, K: threads outside C do nothing.

This file also holds the harness the later steps import (``run_example``): it compiles the kernel to PTX (no GPU
needed) and prints the instructions that matter; on a GPU it checks the result against a float64 reference and
times it next to ``torch.matmul`` (cuBLAS).

    python examples/gemm_1_naive.py                          # CPU: compile and summarize; GPU: check and time
    python examples/gemm_1_naive.py --m 4096 --n 4096 --k 4096 --show-ptx
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, math

BLOCK_M, BLOCK_N = 8, 32  # a warp covers 32 adjacent columns of one row: coalesced loads of B and stores of C
THREADS = BLOCK_M * BLOCK_N


@flyc.kernel
def gemm_naive(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor):
    tid = gpu.thread_idx.x
    row = gpu.block_idx.y * BLOCK_M + tid // BLOCK_N
    col = gpu.block_idx.x * BLOCK_N + tid % BLOCK_N
    m, n = c.shape[0].to(fx.Int32), c.shape[1].to(fx.Int32)
    if (row < m) & (col < n):
        acc = fx.Float32(0.0)
        for kk in range(a.shape[1].to(fx.Int32)):
            acc = math.fma(a[row, kk].to(fx.Float32), b[kk, col].to(fx.Float32), acc)
        c[row, col] = acc


def check_operands(a, b, c, *, k_multiple: int = 1) -> tuple[int, int, int]:
    """(M, N, K) of ``c = a @ b``, after checking what every step of the tutorial needs: 2-D CUDA tensors, a and b
    row-major bf16, c row-major float32 of shape (M, N); K and N multiples of ``k_multiple`` (16-byte rows for the
    steps that copy rows in 16-byte pieces). Raised before any launch."""
    import torch

    for name, t, dtype in (("a", a, torch.bfloat16), ("b", b, torch.bfloat16), ("c", c, torch.float32)):
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.dim() != 2:
            raise ValueError(f"matmul {name}: expected a 2-D CUDA torch tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"matmul {name}: expected {dtype}, got {t.dtype}")
        if t.stride(-1) != 1 or (t.shape[0] > 1 and t.stride(0) != t.shape[1]):
            raise ValueError(f"matmul {name}: expected a contiguous row-major matrix, got strides {t.stride()}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
    if tuple(c.shape) != (m, n):
        raise ValueError(f"matmul c: expected shape ({m}, {n}), got {tuple(c.shape)}")
    if k % k_multiple or n % k_multiple:
        raise ValueError(f"matmul: K ({k}) and N ({n}) must be multiples of {k_multiple} (16-byte rows of bf16)")
    return m, n, k


def matmul(a, b, c) -> None:
    """c = a @ b: a (M, K) and b (K, N) bf16, c (M, N) float32, all row-major CUDA tensors."""
    m, n, _ = check_operands(a, b, c)
    if m and n:
        gemm_naive(a, b, c).launch(grid=(-(-n // BLOCK_N), -(-m // BLOCK_M)), block=THREADS)


def lower(m: int, n: int, k: int):
    """The kernel compiled for these shapes without a GPU (``flyc.TensorSpec`` stands for the tensors)."""
    return gemm_naive.lower(
        flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((k, n), "bf16"), flyc.TensorSpec((m, n), "f32")
    )


# --- the harness every step uses ----------------------------------------------------------------------------------


def instruction_counts(ptx: str, patterns: Sequence[str]) -> dict[str, int]:
    """How many PTX instructions start with each pattern (a regular expression matched at the opcode)."""
    opcodes = []
    for line in ptx.splitlines():
        words = line.split()
        if words and words[0].startswith("@"):  # a guard predicate (@%p1, @!%p2) comes before the opcode
            words = words[1:]
        if words and not words[0].startswith("//"):
            opcodes.append(words[0])
    return {p: sum(1 for op in opcodes if re.match(p, op)) for p in patterns}


def relative_error(torch, c, a, b) -> float:
    """||C - A B||_F / ||A B||_F against a float64 reference; NaN (an element never written) makes it NaN."""
    reference = a.double() @ b.double()
    return ((c.double() - reference).norm() / reference.norm().clamp_min(1e-300)).item()


def parse_args(doc: str, argv=None, defaults=(1000, 776, 520)) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--m", type=int, default=defaults[0])
    parser.add_argument("--n", type=int, default=defaults[1])
    parser.add_argument("--k", type=int, default=defaults[2])
    parser.add_argument("--show-ptx", action="store_true")
    parser.add_argument("--no-bench", action="store_true", help="check only, skip the timing")
    return parser.parse_args(argv)


def check_on_gpu(matmul_fn: Callable, m: int, n: int, k: int, tolerance: float = 1e-5, seed: int = 0) -> float:
    """Runs ``matmul_fn`` on fresh random data with a NaN-poisoned output; returns the relative error, raising
    AssertionError above ``tolerance`` (bf16 products are exact in float32: only the summation order differs)."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=generator).to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda", generator=generator).to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda")
    matmul_fn(a, b, c)
    torch.cuda.synchronize()
    error = relative_error(torch, c, a, b)
    if not error <= tolerance:  # NaN fails too
        raise AssertionError(f"{m}x{n}x{k}: relative Frobenius error {error:.3g} > {tolerance:.3g}")
    return error


def benchmark(matmul_fn: Callable, m: int, n: int, k: int) -> tuple[float, float]:
    """TFLOP/s of ``matmul_fn`` and of ``torch.matmul`` (bf16 in, bf16 out: cuBLAS) on the same fresh inputs, one
    ``triton.testing.do_bench`` median each (CUDA events, after warm-up)."""
    import torch
    from triton.testing import do_bench

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.empty(m, n, device="cuda")
    ours = do_bench(lambda: matmul_fn(a, b, c), warmup=25, rep=100, return_mode="median")
    cublas = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100, return_mode="median")
    flops = 2.0 * m * n * k
    return flops / ours / 1e9, flops / cublas / 1e9


def run_example(
    doc: str,
    name: str,
    lower_fn: Callable,
    matmul_fn: Callable,
    patterns: Sequence[str],
    argv=None,
    defaults=None,
    tolerance: float = 1e-5,
) -> int:
    """The ``main`` of every step: compile and summarize the PTX; on a GPU, check (``tolerance``: the relative error
    allowed) and time."""
    args = parse_args(doc, argv, defaults or (1000, 776, 520))
    compiled = lower_fn(args.m, args.n, args.k)
    counts = ", ".join(f"{p.replace(chr(92), '')}: {c}" for p, c in instruction_counts(compiled.ptx, patterns).items())
    assembled = "assembled for sm_90a" if compiled.cubin is not None else "PTX only (no ptxas here)"
    print(f"{name}: compiled, {assembled}; PTX instructions {counts}")
    if args.show_ptx:
        print(compiled.ptx)
    if not flyc.runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only (run on a GPU machine to launch, check and time)")
        return 0
    import torch

    try:
        error = check_on_gpu(matmul_fn, args.m, args.n, args.k, tolerance)
    except AssertionError as failure:
        print(f"FAILED: {failure}")
        return 1
    print(f"{args.m}x{args.n}x{args.k} on {torch.cuda.get_device_name()}: relative error {error:.2e} (vs float64)")
    if not args.no_bench:
        ours, cublas = benchmark(matmul_fn, args.m, args.n, args.k)
        print(f"{name}: {ours:.1f} TFLOP/s, torch.matmul (cuBLAS): {cublas:.1f} TFLOP/s ({ours / cublas:.3f}x)")
    return 0


PATTERNS = (r"ld\.global", r"fma\.rn\.f32", r"st\.global")


def main(argv=None) -> int:
    return run_example(__doc__, "gemm_naive", lower, matmul, PATTERNS, argv)


if __name__ == "__main__":
    sys.exit(main())

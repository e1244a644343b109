"""Which kernel and configuration run for an input, from a shell (no GPU needed):

    python -m flydsl.kernels.route layer_norm 4096 --dtype bf16
    python -m flydsl.kernels.route rms_norm_backward 262144 --dtype f32 --sums 1
    python -m flydsl.kernels.route softmax 65536 --unaligned          # rows not 16-byte aligned
    python -m flydsl.kernels.route gemm 16 4096 4096 --bias f32 --activation silu

The row ops' answer comes from :func:`flydsl.kernels.rows.router.route`, the GEMM's from
:func:`flydsl.kernels.gemm.plan.plan_gemm` (``gemm M N K``, the arguments of ``python -m flydsl.kernels.gemm.plan``):
each the one place that decides it.
"""

from __future__ import annotations

import argparse
import sys

from flydsl.kernels.rows.router import RowOp, route

__all__ = ["describe", "main"]


def describe(op: str, n: int, dtype: str = "bf16", **where) -> str:
    """The route of ``op`` on rows of ``n`` ``dtype`` elements as text: the kernel, its function and configuration
    (``where``: :func:`~flydsl.kernels.rows.router.route`'s keyword arguments)."""
    found = route(RowOp(op), n, dtype, **where)
    facts = ", ".join(f"{key}={value}" for key, value in sorted(where.items()))
    lines = [f"{found.op.value}, N = {n}, {dtype}" + (f" ({facts})" if facts else "")]
    lines.append(f"  kernel: {found.kernel.value} ({found.function})")
    lines.append(f"  config: {found.config}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gemm"]:
        from flydsl.kernels.gemm import plan

        return plan.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("op", choices=[op.value for op in RowOp] + ["gemm"], help="a row op, or gemm M N K")
    parser.add_argument("n", type=int, help="row length (the last dim)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    parser.add_argument("--unaligned", action="store_true", help="rows not 16-byte aligned (pointer or row stride)")
    parser.add_argument("--vectors-unaligned", action="store_true", help="weight or bias not 16-byte aligned")
    parser.add_argument("--sms", type=int, default=132, help="the device's SMs (H200: 132)")
    parser.add_argument("--no-scratch", action="store_true", help="a framework that allocates no scratch memory")
    parser.add_argument("--sums", type=int, default=None, help="backward column sums: 0, 1 (dweight), 2 (+ dbias)")
    parser.add_argument("--register", action="store_true", help="the register kernel only (staged=False)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"n: expected a positive row length, got {args.n}")
    op = RowOp(args.op)
    sums = args.sums
    if sums is None:  # the public functions' default: affine parameters given
        sums = {RowOp.LAYER_NORM_BACKWARD: 2, RowOp.RMS_NORM_BACKWARD: 1}.get(op, 0)
    where = dict(
        rows_aligned=not args.unaligned,
        vectors_aligned=not args.vectors_unaligned,
        sms=args.sms,
        scratch=not args.no_scratch,
        sums=sums,
        staged=not args.register,
    )
    print(describe(op.value, args.n, args.dtype, **where))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""fp8 quantization on the local GPU: flydsl.kernels.quantize.quantize_fp8 against torch eager and torch.compile of the
same function (amax, scale, cast) and a same-bytes copy, in the same process.

    python benchmarks/quantize_bench.py --json benchmarks/results/quantize/DATE_COMMIT.json --commit C

Each case: bf16 rows of mixed magnitudes (per group of 128 columns for "group"), checked against torch's result (the
same scales; values equal but for rounding ties), then timed with triton.testing.do_bench (CUDA events, L2 flushed,
median), interleaved, ``--repeats`` times (medians over repeats). The copy moves the bytes the quantizer must: per
token one read of x (2 bytes an element) and one write (1 byte), per group the same and the scales (4 bytes per 128
elements), per tensor two reads and one write; ``fraction_of_copy`` = copy time / ours (the bar: >= 0.85).
``--granularities`` picks the cases (default token, group, tensor), ``--shapes 4096x18432`` the shapes;
``--group-config block=512,unroll=2`` times the group kernel with other GroupConfig fields
(flydsl.kernels.quantize.groups) in place of quantize_fp8's, ``--row-config threads_per_row=256,chunks=9`` the per-token
kernel with other RowConfig fields (flydsl.kernels.rows.layout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from record import write_record

SHAPES = [(16, 4096), (2048, 4096), (8192, 4096), (16384, 7168), (65536, 4096), (4096, 18432)]


GRANULARITIES = ("token", "group", "tensor")


def _torch_quantize(torch, x, granularity):
    if granularity == "group":  # N a multiple of 128 (every shape here): row-major (rows, N / 128) scales
        rows, n = x.shape
        xg = x.float().view(rows, n // 128, 128)
        scale = xg.abs().amax(dim=2, keepdim=True) / 448.0
        q = (xg / scale.clamp(min=1e-30)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.view(rows, n), scale.view(rows, n // 128)
    xf = x.float()
    amax = xf.abs().amax() if granularity == "tensor" else xf.abs().amax(dim=1, keepdim=True)
    scale = amax / 448.0
    return (xf / scale.clamp(min=1e-30)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def _moved(rows, n, granularity):
    """Bytes the quantizer must read and write: x (2 an element) once (per tensor twice), the fp8 values, the
    group scales."""
    moved = rows * n * (2 + 1)
    if granularity == "tensor":
        moved += rows * n * 2
    if granularity == "group":
        moved += rows * (n // 128) * 4
    return moved


def _config_fields(text: str, option: str, names: tuple) -> dict:
    """``"block=512,unroll=2"`` as config fields (ints) of ``names``."""
    fields = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in names or not value.isdigit():
            raise ValueError(f"{option}: expected NAME=INT items with NAME one of {', '.join(names)}, got {item!r}")
        fields[name] = int(value)
    return fields


def _row_quantizer(torch, x, fields):
    """quantize_fp8(x, "token") with the row kernel's RowConfig fields replaced (allocating its outputs as it does)."""
    import dataclasses

    from flydsl.kernels.quantize import kernels

    rows, n = x.shape
    cfg = dataclasses.replace(kernels.quantize_row_config(n, "bf16"), **fields)
    if cfg.threads_per_row * cfg.chunks * cfg.vec < n:
        raise ValueError(f"--row-config: {cfg} holds fewer than N = {n} values per row")
    launch = dict(grid=cfg.grid(rows), block=cfg.block, cluster=cfg.cluster_shape)
    spec = kernels.QuantizeSpec("row")

    def quantize(x, granularity):
        out = torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=x.device)
        scales = torch.empty(rows, 1, device=x.device)
        kernels.quantize_rows_kernel(x, out.view(torch.uint8), scales.view(-1), scales, cfg, spec).launch(**launch)
        return out, scales

    return quantize


def _group_quantizer(torch, x, fields):
    """quantize_fp8(x, "group") with the group kernel's config fields replaced (allocating its outputs as it does)."""
    import dataclasses

    from flydsl.kernels.quantize import groups

    rows, n = x.shape
    cfg = dataclasses.replace(groups.group_config(n, "bf16"), **fields)
    grid, padded = cfg.grid(rows, n), -(-rows // 4) * 4

    def quantize(x, granularity):
        out = torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=x.device)
        scales = torch.empty(-(-n // 128), padded, device=x.device)[:, :rows].t()
        groups.quantize_groups_kernel(x, out.view(torch.uint8), scales, cfg).launch(grid=grid, block=cfg.block)
        return out, scales

    return quantize


def run_case(torch, do_bench, rows, n, granularity, repeats, compiled, group_fields=None, row_fields=None):
    from flydsl.kernels.quantize import quantize_fp8

    columns = n // 128 if granularity == "group" else 1
    magnitude = 2.0 ** torch.randint(-8, 9, (rows, columns), device="cuda")
    magnitude = magnitude.repeat_interleave(128, dim=1) if columns > 1 else magnitude
    x = (torch.randn(rows, n, device="cuda") * magnitude).bfloat16()
    if granularity == "group" and group_fields:
        quantize_fp8 = _group_quantizer(torch, x, group_fields)
    if granularity == "token" and row_fields:
        quantize_fp8 = _row_quantizer(torch, x, row_fields)
    q, scale = quantize_fp8(x, granularity)
    q_ref, scale_ref = _torch_quantize(torch, x, granularity)
    torch.cuda.synchronize()
    mismatched = (q.float() != q_ref.float()).float().mean().item()
    scale_error = ((scale.reshape(-1) - scale_ref.reshape(-1)).abs().max() / scale_ref.abs().max()).item()
    moved = _moved(rows, n, granularity)
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    timed = {
        "flydsl": lambda: quantize_fp8(x, granularity),
        "torch": lambda: _torch_quantize(torch, x, granularity),
        "torch_compile": lambda: compiled(torch, x, granularity),
        "copy": lambda: dst.copy_(src),
    }
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for name, fn in timed.items():
            runs[name].append(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    ms = {name: statistics.median(v) for name, v in runs.items()}
    result = {"rows": rows, "n": n, "granularity": granularity, "fraction_mismatched_vs_torch": mismatched}
    if granularity == "group" and group_fields:
        result["group_config"] = group_fields
    if granularity == "token" and row_fields:
        result["row_config"] = row_fields
    result["scale_rel_error_vs_torch"] = scale_error
    for name, t in ms.items():
        result[f"{name}_ms"] = t
        result[f"{name}_tbps"] = moved / t / 1e9
    result["fraction_of_copy"] = ms["copy"] / ms["flydsl"]
    result["ratio_vs_torch_compile"] = ms["torch_compile"] / ms["flydsl"]
    result["runs_ms"] = runs
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    parser.add_argument(
        "--granularities", default=",".join(GRANULARITIES), help="comma-separated, of " + ", ".join(GRANULARITIES)
    )
    parser.add_argument("--shapes", default="", help="comma-separated ROWSxN (default: every shape of SHAPES)")
    parser.add_argument("--group-config", default="", help="GroupConfig fields of the group kernel: block=,unroll=")
    parser.add_argument(
        "--row-config", default="", help="RowConfig fields of the per-token kernel: threads_per_row=,chunks="
    )
    args = parser.parse_args(argv)
    granularities = [g for g in args.granularities.split(",") if g]
    unknown = sorted(set(granularities) - set(GRANULARITIES))
    if unknown:
        parser.error(f"--granularities: expected some of {', '.join(GRANULARITIES)}, got {', '.join(unknown)}")
    try:
        group_fields = _config_fields(args.group_config, "--group-config", ("block", "unroll"))
        row_fields = _config_fields(args.row_config, "--row-config", ("threads_per_row", "chunks"))
        shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",") if shape] or SHAPES
    except ValueError as error:
        parser.error(str(error))

    import torch
    from triton.testing import do_bench

    torch._dynamo.config.recompile_limit = 64  # one graph per shape and granularity, none falling back to eager
    compiled = torch.compile(_torch_quantize, dynamic=False)
    results = []
    print(f"{'rows':>6} {'N':>6} {'gran':>6}  {'ours TB/s':>9} {'torch':>6} {'compile':>7} {'copy':>6}  {'of copy':>7}")
    for rows, n in shapes:
        for granularity in granularities:
            r = run_case(torch, do_bench, rows, n, granularity, args.repeats, compiled, group_fields, row_fields)
            results.append(r)
            print(
                f"{rows:>6} {n:>6} {granularity:>6}  {r['flydsl_tbps']:>9.2f} {r['torch_tbps']:>6.2f}"
                f" {r['torch_compile_tbps']:>7.2f} {r['copy_tbps']:>6.2f}  {r['fraction_of_copy']:>7.3f}"
                f"  mismatched {r['fraction_mismatched_vs_torch']:.1e}",
                flush=True,
            )
    large = [r for r in results if r["rows"] * r["n"] >= 8192 * 4096]
    summary = {
        "min_fraction_of_copy_large": min((r["fraction_of_copy"] for r in large), default=None),
        "min_fraction_of_copy": min(r["fraction_of_copy"] for r in results),
        "geomean_ratio_vs_torch_compile": statistics.geometric_mean([r["ratio_vs_torch_compile"] for r in results]),
    }
    for granularity in granularities:
        mine = [r for r in large if r["granularity"] == granularity]
        summary[f"min_fraction_of_copy_large_{granularity}"] = min((r["fraction_of_copy"] for r in mine), default=None)
    print(json.dumps(summary))
    if args.json:
        method = (
            "triton.testing.do_bench median (warmup 10 ms, rep 40 ms, L2 flushed), interleaved, median over repeats;"
            " bf16 input, e4m3 output; TB/s = bytes the quantizer must move (per token 3 a element, per group 3 and"
            " 4 per 128 elements, per tensor 5) / time; copy: copy_ of half those bytes into as many"
        )
        write_record(args.json, "quantize_bench", argv, results, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

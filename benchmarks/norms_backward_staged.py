"""LayerNorm / RMSNorm backward on the H200: the staged kernel (rows through a shared-memory ring, cp.async) against
the register kernel, per (dtype, N), kernel alone (no column-sum kernel, no host code), on M x N = 2^28 elements;
persistent-grid sizes (the driver's max active clusters, 7/8 of the SM count, all SMs) and ring depths; then the
small-N question (bf16 N = 2048/4096 through the API, repeated, interleaved with copy).

    python benchmarks/norms_backward_staged.py --commit C --out benchmarks/results/norms_backward_staged/DATE_WHAT.json
    python benchmarks/norms_backward_staged.py --commit C --out x.json --kinds rms --dtypes bf16 --sizes 32768 \
        --configs 1024:2:3:0,1024:1:4:0:hold:keep,team:512:2:6:2:keep:prefetch  # [team:]T:C:S:LAG[:options]
    ncu --profile-from-start off --section WarpStateStats ... python benchmarks/norms_backward_staged.py --profile \
        --commit C --out x.json --kinds rms --dtypes bf16 --sizes 32768 --configs ...   # one launch each (ncu)

TB/s = bytes read + written / time (dy, x, dx; kernel alone: 3 * M * N * e). Median of CUDA-event times (``--reps``),
after warm-up; copy (``dst.copy_(x)``) in the same process.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from functools import partial

from norms_bench import backward_kernel_launcher, backward_kernel_tbps
from record import new_record, save

from flydsl.kernels.bench import median_ms
from flydsl.kernels.device import max_active_clusters
from flydsl.kernels.rows.router import RowOp, route

TOTAL = 1 << 28


def _tensors(torch, n, dtype):
    m = TOTAL // n
    x, dy = torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(m, n, device="cuda", dtype=dtype)
    mean, rstd = x.float().mean(-1), torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
    return dy, x, torch.randn(n, device="cuda", dtype=dtype), mean, rstd, torch.full_like(x, float("nan"))


def _op(rms: bool) -> RowOp:
    return RowOp.RMS_NORM_BACKWARD if rms else RowOp.LAYER_NORM_BACKWARD


def _routed(n: int, dtype: str, sums: int, sms: int, staged: bool = True):
    """The backward's routed config (LayerNorm with ``sums`` 2, RMSNorm with 1) on ``sms`` SMs; ``staged=False``:
    the register kernel's."""
    return route(_op(sums == 1), n, dtype, sums=sums, sms=sms, staged=staged).config


def _small(torch, norms, n, sms, reps) -> str:
    """bf16 N = ``n`` through the API three times (each call alone, then with the GPU kept busy), with copy."""
    from flydsl.kernels.rows.launch import persistent_groups

    m = TOTAL // n
    x, dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16), torch.randn(
        m, n, device="cuda", dtype=torch.bfloat16
    )
    w, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    _, mean, rstd = norms.layer_norm(x, w, b, 1e-5, return_stats=True)
    dx, dst = torch.empty_like(x), torch.empty_like(x)
    e = x.element_size()
    ln_bytes, rms_bytes, copy_bytes = (
        3 * m * n * e + 8 * m + 3 * n * e,
        3 * m * n * e + 4 * m + 2 * n * e,
        2 * m * n * e,
    )
    ln = partial(norms.layer_norm_backward, dy, x, w, mean, rstd, dx)
    rms = partial(norms.rms_norm_backward, dy, x, w, rstd, dx)
    copy = partial(dst.copy_, x)
    cfg = _routed(n, "bf16", 2, sms)
    line = f"small bf16 N={n}:"
    for _ in range(3):
        alone = [b / median_ms(f, reps) / 1e9 for f, b in ((copy, copy_bytes), (ln, ln_bytes), (rms, rms_bytes))]
        cases = ((copy, copy_bytes), (ln, ln_bytes), (rms, rms_bytes))
        busy = [b / median_ms(f, reps, queued=True) / 1e9 for f, b in cases]
        groups = persistent_groups(cfg, m, sms)  # 7/8 of the SMs' worth for clusters
        kern = backward_kernel_tbps(torch, (dy, x, w, mean, rstd, dx), cfg, groups, reps)
        line += " [alone: copy {:.2f} ln {:.2f} rms {:.2f}".format(*alone)
        line += " | busy: copy {:.2f} ln {:.2f} rms {:.2f} | ln kernel {:.2f}]".format(*busy, kern)
    return line


# BackwardConfig.hold, .keep_weights, .prefetch_pairs, .fma_dx, .bulk
_OPTIONS = ("hold", "keep", "prefetch", "fma", "bulk")


def _parse_configs(text: str, error) -> list:
    """``[team:]THREADS:CHUNKS:STAGES:LAG[:hold][:keep][:prefetch][:fma][:bulk],...`` as (team, threads, chunks,
    stages, lag, hold, keep, prefetch, fma, bulk) tuples."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        team = parts[0] == "team"
        shape = [p for p in parts[1 if team else 0 :] if p not in _OPTIONS]
        try:
            threads, chunks, stages, lag = (int(v) for v in shape)
        except ValueError:
            error(
                f"--configs: expected [team:]THREADS:CHUNKS:STAGES:LAG[:options] ({', '.join(_OPTIONS)}), got {item!r}"
            )
        if min(threads, chunks, stages) < 1 or lag < 0:
            error(f"--configs: THREADS, CHUNKS and STAGES must be positive and LAG >= 0, got {item!r}")
        out.append((team, threads, chunks, stages, lag, *(name in parts for name in _OPTIONS)))
    return out


def _label(spec) -> str:
    team, *shape = spec[:5]
    options = [name for name, on in zip(_OPTIONS, spec[5:], strict=True) if on]
    return ":".join((["team"] if team else []) + [str(v) for v in shape] + options)


def _explicit_config(n, dtype, sums, spec):
    """A ``--configs`` spec (:func:`_parse_configs`) as a BackwardConfig for rows of ``n`` (None where it does not
    fit them)."""
    from flydsl.kernels.rows.configs import StagedBackwardShape, TeamShape, staged_backward_config, team_backward_config

    team, threads, chunks, stages, lag, hold, keep, prefetch, fma, bulk = spec
    if team:  # any team size from 2 (the routed teams start at 9 CTAs)
        shape = TeamShape(threads, chunks, stages, lag, prefetch, fma, bulk, hold=hold, keep_weights=keep)
        return team_backward_config(n, dtype, sums, shape, smallest=2)
    shape = StagedBackwardShape(threads, chunks, lag, stages, hold=hold, keep_weights=keep, fma_dx=fma)
    cfg = staged_backward_config(n, dtype, sums, shape)
    return dataclasses.replace(cfg, bulk=True) if cfg is not None and bulk else cfg


def _groups(cfg, rows, sms):
    """The persistent grid's CTA groups of ``cfg`` on device 0 (the driver's count of co-resident clusters)."""
    from flydsl.kernels.rows.launch import persistent_groups

    rc = cfg.row
    active = max_active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, 0) if rc.cluster_shape else None
    return persistent_groups(cfg, rows, sms, active)


def _long_rows(torch, sms, reps) -> list:
    """Rows of 256 KB and more: the team kernel (lag 1, 2, 3) against the default config and the register kernel,
    and the 16-bit LayerNorm clusters with a deeper ring (6 stages)."""
    from flydsl.kernels.rows.configs import StagedBackwardShape, staged_backward_config, team_backward_config
    from flydsl.kernels.rows.router import team_shape

    lines = []
    cases = [("bf16", 131072), ("bf16", 262144), ("f32", 131072), ("f32", 262144), ("bf16", 16384), ("bf16", 65536)]
    for name, n in cases:
        tensors = _tensors(torch, n, {"bf16": torch.bfloat16, "f32": torch.float32}[name])
        x = tensors[1]
        dst = torch.empty_like(x)
        copy = 2 * x.numel() * x.element_size() / median_ms(partial(dst.copy_, x), reps) / 1e9
        for rms, sums in ((False, 2), (True, 1)):
            line = f"{'rms' if rms else 'ln'} {name} N={n} copy {copy:.2f} bar {0.85 * copy:.2f}"
            configs = {"default": _routed(n, name, sums, sms), "regs": _routed(n, name, sums, sms, staged=False)}
            if n >= 131072:
                for lag in (1, 2, 3):
                    shape = team_shape(name, sums)._replace(lag=lag)
                    configs[f"team l{lag}"] = team_backward_config(n, name, sums, shape)
            else:
                for lag in (2, 3):
                    shape = StagedBackwardShape(threads=512, chunks=2, lag=lag, stages=6)
                    configs[f"s6 l{lag}"] = staged_backward_config(n, name, sums, shape)
            for label, cfg in configs.items():
                if cfg is None:
                    continue
                g = _groups(cfg, x.shape[0], sms)
                rc = cfg.row
                tbps = backward_kernel_tbps(torch, tensors, cfg, g, reps, rms)
                line += f" | {label} {rc.regime} {rc.cluster}x{rc.block} g{g} {tbps:.2f}"
            print(line, flush=True)
            lines.append(line)
        del tensors, dst, x
        torch.cuda.empty_cache()
    return lines


def _explicit(torch, sms, args, specs) -> list:
    """The routed config and each of ``specs`` per (kind, dtype, N): timed, or (``--profile``) launched once each
    between the profiler's start and stop."""
    from flydsl.kernels.bench import profile_once

    lines, runs = [], []
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    for name in args.dtypes.split(","):
        for n in map(int, args.sizes.split(",")):
            tensors = _tensors(torch, n, dtypes[name])
            x = tensors[1]
            dst = torch.empty_like(x)
            copy = 2 * x.numel() * x.element_size() / median_ms(partial(dst.copy_, x), args.reps) / 1e9
            for kind in args.kinds.split(","):
                rms, sums = kind == "rms", 1 if kind == "rms" else 2
                line = f"{kind} {name} N={n} copy {copy:.2f} bar {0.85 * copy:.2f}"
                configs = [("default", _routed(n, name, sums, sms))]
                configs += [(_label(spec), _explicit_config(n, name, sums, spec)) for spec in specs]
                for label, cfg in configs:
                    if cfg is None:
                        line += f" | {label} none"
                        continue
                    g = _groups(cfg, x.shape[0], sms)
                    rc = cfg.row
                    shape = f"{rc.regime} {rc.cluster}x{rc.block}x{rc.chunks} s{cfg.stages} l{cfg.lag} g{g}"
                    if args.profile:
                        runs.append(backward_kernel_launcher(torch, tensors, cfg, g, rms))
                        line += f" | {label} {shape}"
                    else:
                        tbps = backward_kernel_tbps(torch, tensors, cfg, g, args.reps, rms)
                        line += f" | {label} {shape} {tbps:.2f}"
                        if args.static_n and cfg.staged:  # the same with N compiled in
                            tbps = backward_kernel_tbps(torch, tensors, cfg, g, args.reps, rms, True)
                            line += f" static-N {tbps:.2f}"
                if args.api and not args.profile:
                    line += _api_against_kernel(torch, tensors, rms, args.reps)
                print(line, flush=True)
                lines.append(line)
            if not args.profile:
                del tensors, dst, x
                torch.cuda.empty_cache()
    if runs:
        profile_once(runs)
    return lines


def _api_against_kernel(torch, tensors, rms: bool, reps: int) -> str:
    """The routed kernel alone against the public call (``layer_norm_backward`` / ``rms_norm_backward``: checks,
    allocations, the kernel and the column-sum kernel), both queued behind a sleep (GPU time), three interleaved
    rounds; TB/s of the same 3 * M * N * e bytes."""
    import flydsl.kernels as norms  # the public functions

    dy, x, w, mean, rstd, dx = tensors
    rows, n = x.shape
    name = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[x.dtype]
    sums = 1 if rms else 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = _routed(n, name, sums, sms)
    kernel = backward_kernel_launcher(torch, tensors, cfg, _groups(cfg, rows, sms), rms)
    if rms:
        api = partial(norms.rms_norm_backward, dy, x, w, rstd, dx)
    else:
        api = partial(norms.layer_norm_backward, dy, x, w, mean, rstd, dx)
    moved = 3 * x.numel() * x.element_size() / 1e9
    rounds = [(moved / median_ms(kernel, reps, queued=True), moved / median_ms(api, reps, queued=True)) for _ in "123"]
    line = " | GPU time, routed kernel alone / API: " + ", ".join(f"{k:.2f} / {a:.2f}" for k, a in rounds)
    # Whether the API's host time outlasts the queued sleep: its host time per call (GPU busy), and both timed
    # behind a sleep 5x as long.
    host = []
    for _ in range(20):
        torch.cuda._sleep(2_000_000)
        start = time.perf_counter()
        api()
        host.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    longer = [moved / median_ms(f, reps, queued=True, sleep_cycles=1_000_000) for f in (kernel, api)]
    return line + f" | API host {statistics.median(host):.0f} us; behind a 5x sleep {longer[0]:.2f} / {longer[1]:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True)
    parser.add_argument("--sizes", default="16384,32768,65536,131072")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--small", default="2048,4096", help="bf16 N for the API repeat check ('' to skip)")
    parser.add_argument("--long", action="store_true", help="only the team kernel against the others, N >= 131072")
    parser.add_argument("--kinds", default="ln,rms", help="with --configs: ln, rms or both")
    parser.add_argument("--configs", help="[team:]THREADS:CHUNKS:STAGES:LAG,... timed against the default config")
    parser.add_argument("--profile", action="store_true", help="with --configs: one launch each, for ncu")
    parser.add_argument("--static-n", action="store_true", help="with --configs: also time N compiled in")
    parser.add_argument(
        "--api", action="store_true", help="with --configs: also the routed kernel alone against the public call"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if (args.profile or args.static_n or args.api or args.kinds != "ln,rms") and not args.configs:
        parser.error("--profile, --static-n, --api and --kinds go with --configs")
    if args.profile and args.static_n:
        parser.error("--static-n times; --profile does not")
    if not set(args.kinds.split(",")) <= {"ln", "rms"}:
        parser.error(f"--kinds: expected ln, rms or both, got {args.kinds!r}")

    import torch

    import flydsl.kernels as norms  # the public functions
    from flydsl.kernels.rows.configs import StagedBackwardShape, staged_backward_config
    from flydsl.kernels.rows.launch import persistent_groups

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    method = "median of CUDA-event times (--reps) after warm-up, kernel alone; copy in the same process"
    result = new_record("norms_backward_staged", None, [], commit=args.commit, method=method, reps=args.reps)
    result.update(units="TB/s (3 * M * N * e / time)", active_clusters={})  # results: the printed lines
    torch.empty(1, device="cuda")
    for cluster in (2, 4, 8):
        for threads, blocks in ((256, 3), (256, 4), (512, 1), (512, 2), (1024, 1)):
            got = max_active_clusters(cluster, threads, blocks, 0)
            result["active_clusters"][f"{cluster}x{threads}x{blocks}"] = got
    print("max active clusters:", result["active_clusters"], flush=True)
    started = time.time()
    if args.long:
        result["results"] = _long_rows(torch, sms, args.reps)
        args.sizes = args.small = ""
    if args.configs:
        specs = _parse_configs(args.configs, parser.error)
        result["results"] = _explicit(torch, sms, args, specs)
        args.sizes = args.small = ""
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    for name in args.dtypes.split(","):
        for n in map(int, args.sizes.split(",")) if args.sizes else []:
            if name == "f32" and n > 65536:
                continue
            tensors = _tensors(torch, n, dtypes[name])
            x = tensors[1]
            dst = torch.empty_like(x)
            copy = 2 * x.numel() * x.element_size() / median_ms(partial(dst.copy_, x), args.reps) / 1e9
            for rms, sums in ((False, 2), (True, 1)):
                kind = "rms" if rms else "ln"
                line = f"{kind} {name} N={n} copy {copy:.2f} bar {0.85 * copy:.2f}"
                old = _routed(n, name, sums, sms, staged=False)
                rc = old.row
                line += f" | regs {rc.cluster}x{rc.block}x{old.blocks_per_sm}:"
                counts = {"78": persistent_groups(old, x.shape[0], sms)}
                if rc.cluster > 1:
                    active = max_active_clusters(rc.cluster, rc.block, old.blocks_per_sm, 0)
                    counts["a"] = persistent_groups(old, x.shape[0], sms, active)
                for label, g in counts.items():
                    line += f" {label}{g} {backward_kernel_tbps(torch, tensors, old, g, args.reps, rms):.2f}"
                variants = [
                    (512, 2, None, 1),
                    (512, 2, None, 2),
                    (1024, 1, 6, 2),
                    (1024, 2, None, 1),
                    (512, 4, None, 1),
                ]
                if name == "f32":
                    variants = [(1024, 2, None, 1), (512, 4, None, 1), (1024, 1, 6, 2), (512, 2, 6, 2)]
                for threads, chunks, stages, lag in variants:
                    shape = StagedBackwardShape(threads=threads, chunks=chunks, lag=lag, stages=stages)
                    cfg = staged_backward_config(n, name, sums, shape)
                    if cfg is None or (cfg.row.cluster == 1 and lag > 1):
                        continue
                    rc = cfg.row
                    active = max_active_clusters(rc.cluster, rc.block, 1, 0) if rc.cluster > 1 else None
                    g = persistent_groups(cfg, x.shape[0], sms, active)
                    tbps = backward_kernel_tbps(torch, tensors, cfg, g, args.reps, rms)
                    line += f" | t{threads} c{chunks} s{cfg.stages} l{lag} {rc.cluster}x g{g} {tbps:.2f}"
                print(line, flush=True)
                result["results"].append(line)
            del tensors, dst, x
            torch.cuda.empty_cache()
    for n in map(int, args.small.split(",")) if args.small else []:
        line = _small(torch, norms, n, sms, args.reps)
        print(line, flush=True)
        result["results"].append(line)
        torch.cuda.empty_cache()
    result["wall_s"] = round(time.time() - started, 1)
    save(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GEMM kernels on small shapes under compute-sanitizer (not a pytest module): from the repository root, on a GPU,

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m tests.kernels.gemm_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.gemm_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.gemm_sanitize 1 14  # some cases

Covers every tile shape ``candidate_configs`` offers (64/128-row tiles, 64..256 columns, clusters, split K), the
pingpong schedule, a bias + activation epilogue and the skinny (M <= 16) kernel, on shapes with tails in M, N and K;
then fp8_gemm (FP8_CASES: both kernels, plain and prepared weights, per-token and per-channel scales), then
blockscale_gemm (BLOCKSCALE_CASES: 2-CTA clusters, split K, a partial last K block).
Exits non-zero when a result differs from the float64 reference.
"""

from __future__ import annotations

import sys

import torch

from flydsl.kernels.gemm import GemmConfig, blockscale_gemm, fp8_config, fp8_gemm, gemm, max_stages, prepare_weight


def _config(
    tile_m,
    tile_n,
    cluster_m=1,
    split_k=1,
    schedule="cooperative",
    stream_k=False,
    split_tail=False,
    cluster_n=1,
    store_boxes=2,
):
    return GemmConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        stages=max_stages(tile_m, tile_n, store_boxes=store_boxes),
        store_boxes=store_boxes,
        consumers=2 if schedule == "pingpong" else min(2, tile_m // 64),
        cluster_m=cluster_m,
        cluster_n=cluster_n,
        split_k=split_k,
        schedule=schedule,
        stream_k=stream_k,
        split_tail=split_tail,
    )


CASES = [  # (m, n, k, config or None for gemm()'s own choice, bias, activation)
    (264, 392, 200, _config(128, 256, cluster_m=2), False, None),
    (264, 392, 200, _config(128, 192, store_boxes=1), False, None),  # candidate_configs: 5 stages, one box
    (1000, 392, 264, _config(256, 128, cluster_m=2), True, "silu"),
    (136, 200, 136, _config(128, 128, split_k=2), False, None),
    (56, 392, 264, _config(64, 64, split_k=3), False, None),
    (520, 392, 1032, _config(128, 128, cluster_m=2, split_k=4), True, "relu"),
    (1100, 2100, 520, _config(128, 128, split_k=2, split_tail=True), False, None),  # 153 tiles: the last 21 split
    (1000, 1800, 264, _config(256, 128, cluster_n=2), True, "silu"),  # clusters along N sharing A
    (56, 392, 264, _config(64, 256), True, "gelu"),
    (520, 392, 264, _config(128, 128, cluster_m=2, schedule="pingpong"), True, "silu"),
    (392, 264, 136, _config(128, 128, schedule="pingpong"), False, None),
    (1000, 776, 520, _config(128, 256, cluster_m=2, stream_k=True), True, "gelu"),
    (2056, 1032, 264, _config(128, 128, stream_k=True), False, None),
    (13, 520, 264, None, True, "relu"),  # the skinny kernel (b column-major, as nn.Linear weights)
    (264, 776, 520, _config(128, 192, cluster_m=2, store_boxes=1), True, "relu"),  # 96-column B parts, 5 stages
    (264, 392, 200, _config(64, 96, cluster_m=2), False, None),  # 48-column B parts, C stored from registers
]


FP8_CASES = [  # (m, n, k, config or None, prepared weights): indices continue CASES'
    (13, 1004, 2064, None, False),  # the skinny fp8 kernel
    (13, 1004, 2064, None, True),
    (520, 392, 272, fp8_config(_config(128, 256, cluster_m=2)), False),
    (520, 392, 272, fp8_config(_config(128, 256, cluster_m=2)), True),
    (136, 200, 528, fp8_config(_config(128, 128, split_k=2)), True),
]


BLOCKSCALE_CASES = [  # (m, n, k, config or None): indices continue FP8_CASES'
    (520, 392, 272, None),  # the chosen 128 x 128 tiles, 2-CTA clusters; K = 2 blocks and 16
    (136, 200, 528, fp8_config(_config(128, 128, split_k=2))),
]


def _blockscale_case(m, n, k, config) -> float:
    """One block-scaled case's relative error against the float64 reference of the dequantized operands."""
    blocks = -(-k // 128)
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    a_scales = torch.rand(m, blocks, device="cuda") + 0.5
    w_scales = torch.rand(-(-n // 128), blocks, device="cuda") + 0.5
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    blockscale_gemm(a, w.t(), a_scales, w_scales, out, config)
    torch.cuda.synchronize()
    sa = a_scales.double().repeat_interleave(128, dim=1)[:, :k]
    sw = w_scales.double().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    reference = (a.double() * sa) @ (w.double() * sw).t()
    return float((out.double() - reference).norm() / reference.norm())


def _fp8_case(m, n, k, config, prepared) -> float:
    """One fp8 case's relative error against the float64 reference (NaN where outputs stayed unwritten)."""
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_gemm(a, prepare_weight(b) if prepared else b, scale_a, scale_b, out, config)
    torch.cuda.synchronize()
    reference = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    return float((out.double() - reference).norm() / reference.norm())


def main(argv=None) -> int:
    """Runs every case, or those whose indices (into CASES, then FP8_CASES, then BLOCKSCALE_CASES) are given."""
    torch.manual_seed(0)
    failures = 0
    chosen = [int(i) for i in (sys.argv[1:] if argv is None else argv)]
    total = len(CASES) + len(FP8_CASES) + len(BLOCKSCALE_CASES)
    unknown = [i for i in chosen if not 0 <= i < total]
    if unknown:  # running nothing would read as a clean sanitizer run
        print(f"gemm_sanitize: no cases {unknown}: expected indices 0..{total - 1}", file=sys.stderr)
        return 2
    for i, (m, n, k, config, with_bias, activation) in enumerate(CASES):
        if chosen and i not in chosen:
            continue
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16().t()
        bias = torch.randn(n, device="cuda") if with_bias else None
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm(a, b, out, config, bias=bias, activation=activation)
        torch.cuda.synchronize()
        reference = a.double() @ b.double() + (bias.double() if with_bias else 0)
        reference = {
            None: lambda x: x,
            "relu": torch.relu,
            "gelu": torch.nn.functional.gelu,
            "silu": torch.nn.functional.silu,
        }[activation](reference)
        error = float((out.double() - reference).norm() / reference.norm())
        ok = error < 1e-2 and not torch.isnan(out).any()
        print(f"{m}x{n}x{k} {config} bias={with_bias} {activation}: {'ok' if ok else 'WRONG'} (rel err {error:.1e})")
        failures += not ok
    for i, (m, n, k, config, prepared) in enumerate(FP8_CASES, len(CASES)):
        if chosen and i not in chosen:
            continue
        error = _fp8_case(m, n, k, config, prepared)
        ok = error < 1e-2  # (NaN: unwritten outputs, not ok)
        print(f"fp8 {m}x{n}x{k} {config} prepared={prepared}: {'ok' if ok else 'WRONG'} (rel err {error:.1e})")
        failures += not ok
    for i, (m, n, k, config) in enumerate(BLOCKSCALE_CASES, len(CASES) + len(FP8_CASES)):
        if chosen and i not in chosen:
            continue
        error = _blockscale_case(m, n, k, config)
        ok = error < 1e-2
        print(f"blockscale {m}x{n}x{k} {config}: {'ok' if ok else 'WRONG'} (rel err {error:.1e})")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

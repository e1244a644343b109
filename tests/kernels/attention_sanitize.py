"""The paged-attention kernels on small caches under compute-sanitizer (not a pytest module): from the repository root,
on a GPU,

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m tests.kernels.attention_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.kernels.attention_sanitize 0 3  # some cases

The cases of ``test_paged_decode_gpu`` that cover each kind of kernel (bf16 unsplit and split, fp8 per tensor and per
token, the two-level merge, 4 queries with a window, block size 64), each checked against the float32 reference,
then ``write_kv`` into a bf16 and an fp8 per-token cache. Exits non-zero when a result differs.
"""

from __future__ import annotations

import sys

import torch

from tests.kernels.test_paged_decode_gpu import _case, _check

CASES = [
    ("bf16", lambda: _check(_case(contexts=(1, 15, 17)))),
    ("bf16 split", lambda: _check(_case(contexts=(300, 1000, 2049), block_size=32))),
    ("fp8 tensor", lambda: _check(_case(fp8="tensor", contexts=(512, 3000, 129)), tolerance=2e-2)),
    ("fp8 token", lambda: _check(_case(fp8="token", contexts=(1, 17, 33)), tolerance=2e-2)),
    ("two-level merge", lambda: _check(_case(batch=2, kv_heads=1, contexts=(20000, 300)), tolerance=2e-2)),
    ("4 queries, window", lambda: _check(_case(queries=4, contexts=(40, 700, 90)), sliding_window=128)),
    ("block size 64", lambda: _check(_case(block_size=64, contexts=(64, 65, 1000)))),
]


def _write_kv(fp8: bool) -> None:
    from flydsl.kernels.attention import write_kv

    tokens, heads, dim, blocks, block_size = 37, 2, 128, 8, 16
    k, v = (torch.randn(tokens, heads, dim, device="cuda").bfloat16() for _ in range(2))
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    k_cache = torch.zeros(blocks, block_size, heads, dim, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(blocks * block_size, device="cuda")[:tokens].int()
    slots[3] = -1  # skipped
    scales = {}
    if fp8:
        scales = {n: torch.zeros(blocks, block_size, heads, device="cuda") for n in ("k_scale", "v_scale")}
    write_kv(k, v, k_cache, v_cache, slots, **scales)
    torch.cuda.synchronize()
    kept = slots >= 0
    rows = slots[kept].long()
    got = k_cache.view(-1, heads, dim)[rows].float()
    if fp8:
        got = got * scales["k_scale"].view(-1, heads)[rows][..., None]
    error = float((got - k[kept].float()).abs().max() / k.float().abs().max())
    assert error < (7e-2 if fp8 else 1e-2), f"write_kv error {error:.1e}"


CASES += [("write_kv bf16", lambda: _write_kv(False)), ("write_kv fp8 token", lambda: _write_kv(True))]


def main(argv=None) -> int:
    """Runs every case, or those whose indices into CASES are given."""
    chosen = [int(i) for i in (sys.argv[1:] if argv is None else argv)]
    unknown = [i for i in chosen if not 0 <= i < len(CASES)]
    if unknown:  # running nothing would read as a clean sanitizer run
        print(f"attention_sanitize: no cases {unknown}: expected indices 0..{len(CASES) - 1}", file=sys.stderr)
        return 2
    failures = 0
    for i, (name, run) in enumerate(CASES):
        if chosen and i not in chosen:
            continue
        try:
            run()
            print(f"{name}: ok")
        except AssertionError as error:
            print(f"{name}: WRONG ({error})")
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""One wgmma tile under compute-sanitizer (not a pytest module): from the repository root, on a GPU,

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m tests.compiler.wgmma_sanitize
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m tests.compiler.wgmma_sanitize

Exits non-zero when the result differs from the torch reference.
"""

from __future__ import annotations

import sys

from tests.compiler.test_expr_wgmma import Case, run_case


def main() -> int:
    failures = 0
    for case in (Case("bf16", 128), Case("e4m3", 64, rs=True), Case("bf16", 128, tile_m=128, warpgroups=2)):
        outputs, references = run_case(case, seed=1)
        bad = sum(int((got != expected).sum()) for got, expected in zip(outputs, references, strict=True))
        print(f"{case}: {'ok' if not bad else f'{bad} wrong elements'}")
        failures += bool(bad)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the paged decode kernel's main loop issues its loads and MMAs, from its SASS, without a GPU: per cache kind
(bf16, fp8 per tensor, fp8 per token), the loop's instruction count and the positions in it of the 16-byte global
loads (the next chunk's keys and values) and of the HMMAs, and the kernel's local loads and stores (spilled
registers). ptxas assembles the PTX for sm_90a; nvdisasm (``pip install nvidia-cuda-nvdisasm``) disassembles it.
docs/tuning/attention.md#left reads these numbers.

    python tools/decode_loop_sass.py [--heads 8] [--kv-heads 1] [--dim 128] [--sass-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import flydsl.compiler as flyc
from flydsl.kernels.attention import api, decode

_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/")
_LABEL = re.compile(r"(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")


def main_loop(sass: str) -> list[str]:
    """The instructions of the loop closed by the backward branch that spans the most lines."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    best = None
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i and (best is None or i - labels[m.group(1)] > best[1] - best[0]):
            best = (labels[m.group(1)], i)
    if best is None:
        return []
    return [line for line in lines[best[0] : best[1] + 1] if _INSTRUCTION.match(line)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--sass-dir", help="also write each kernel's whole SASS here")
    args = parser.parse_args(argv)
    for kv, scale in (("bf16", None), ("e4m3", "tensor"), ("e4m3", "token")):
        cfg, _, _ = api.decode_plan_config(
            batch=4, heads=args.heads, kv_heads=args.kv_heads, dim=args.dim, queries=1, q_dtype="bf16", kv_dtype=kv,
            k_scale=scale, v_scale=scale, sliding_window=None, soft_cap=False, max_context=8192, sms=132,
        )  # fmt: skip
        module = decode.paged_decode_kernel.lower(*decode.argument_specs(cfg, kv_heads=args.kv_heads))
        sass = flyc.toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
        if sass is None:
            print("decode_loop_sass: needs ptxas and nvdisasm (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
            return 1
        name = f"{kv}" + (f"_{scale}" if scale else "")
        if args.sass_dir:
            Path(args.sass_dir, f"decode_{name}.sass").write_text(sass)
        body = main_loop(sass)
        loads = [k for k, line in enumerate(body) if "LDG.E.128" in line]
        mmas = [k for k, line in enumerate(body) if "HMMA" in line]
        span = f"{loads[0]}-{loads[-1]}" if loads else "-"
        spills = len(re.findall(r"\b(?:LDL|STL)\b", sass))  # local memory: registers spilled
        print(
            f"{name:<12} {cfg.ctas_per_sm} CTAs/SM  loop {len(body)}  16-byte loads at {span} ({len(loads)})"
            f"  spill loads/stores {spills}  HMMAs at {mmas}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

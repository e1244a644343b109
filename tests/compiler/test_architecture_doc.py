"""docs/architecture.md shows the IR of examples/tiled_copy.py at every stage: its listings must stay what the
compiler produces. Each listing marked ``<!-- listing: NAME -->`` is checked line by line: with ``// comments``
removed and split at the ``...`` elisions, every piece must occur in the freshly produced text (whitespace runs
compared as one space). When this fails, regenerate the listing as the doc's "Reproduce the listings" says.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.ast_rewrite import rewrite_function

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"

# The section 3 example, as lines 1-7 of a file k.py.
BODY_SOURCE = """@flyc.kernel
def body(x: fx.Tensor, n: fx.Int32):
    acc = fx.Float32(0.0)
    for i in range(n):
        acc = acc + x[i]
    if acc > 0.0:
        x[0] = acc
"""


def _listings() -> dict[str, str]:
    found = re.findall(r"<!-- listing: (\w+) -->\n```\w*\n(.*?)\n```", DOC.read_text(), flags=re.S)
    return dict(found)


def _pieces(listing: str) -> list[str]:
    pieces = []
    for line in listing.splitlines():
        line = re.sub(r"\s//\s.*$", "", line)  # the doc's own comments
        pieces.extend(p.strip() for p in line.split("...") if p.strip())
    return pieces


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _load(path: Path, name: str, extra: dict | None = None) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(extra or {})
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _strip_locations(text: str) -> str:
    from mlir import ir

    with flyc.make_context():
        return str(ir.Module.parse(text))


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> dict[str, str]:
    kernel = _load(ROOT / "examples" / "tiled_copy.py", "architecture_doc_tiled_copy").tiled_copy
    matrix = flyc.TensorSpec((1024, 1024), "f16")
    spec = kernel.specialize(kernel._bind([matrix, matrix, True], {}))
    traced = kernel.trace(spec.key)
    compiled = flyc.compile_mlir(traced, keep_stages=True, assemble=False)

    k_py = tmp_path_factory.mktemp("doc") / "k.py"
    k_py.write_text(BODY_SOURCE)
    body = _load(k_py, "architecture_doc_k", {"flyc": flyc, "fx": fx}).body
    body_trace = body.trace(body.specialize([flyc.TensorSpec((1024,), "f32"), 1024]).key)
    nested = [c.co_name for c in _code_objects(rewrite_function(body.fn).__code__)]

    return {
        "key": f"key {spec.key}\nlaunch args {spec.launch_args}",
        "rewrite": "\n".join(f"def {name}(" for name in nested),
        "scf": body_trace,
        # The doc shows the kernel's path relative to the repository and leaves out the arguments' loc(unknown).
        "input": traced.replace(f"{ROOT}/", "").replace(" loc(unknown)", ""),
        "fly": _strip_locations(compiled.stages["fly"]),
        "llvm": _strip_locations(compiled.stages["llvm"]),
        "ptx": compiled.ptx,
        "signatures": f"{compiled.kernels} {compiled.shared_bytes}",
    }


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def test_every_stage_has_a_marked_listing():
    assert set(_listings()) == {"key", "rewrite", "scf", "input", "fly", "llvm", "ptx"}


@pytest.mark.parametrize("name", ["key", "scf", "input", "fly", "llvm", "ptx"])
def test_listing_lines_occur_in_what_the_compiler_produces(name, produced):
    text = _normal(produced[name])
    pieces = _pieces(_listings()[name])
    assert len(pieces) >= 2
    missing = [p for p in pieces if _normal(p) not in text]
    assert not missing, f"docs/architecture.md listing '{name}' no longer matches the compiler: {missing}"


def test_rewrite_listing_names_the_nested_functions_the_rewrite_builds(produced):
    named = re.findall(r"def (__fly_\w+)\(", _listings()["rewrite"])
    assert named == ["__fly_for_4_0", "__fly_then_6_0", "__fly_else_6_1"]
    for name in named:
        assert f"def {name}(" in produced["rewrite"], f"the rewrite no longer builds {name}"


def test_prose_values_match(produced):
    doc = DOC.read_text()
    assert "{'tiled_copy': 'plllplll'} {'tiled_copy': 8192}" == produced["signatures"]
    assert "`plllplll`" in doc and "fly.smem_bytes = 8192" in doc

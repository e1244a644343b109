"""tools/demo.py, the README's main job: the examples the README lists, compile-only without a GPU; with one, torch
is installed where missing and a torch that cannot use the GPU stops the demo before the first example."""

from __future__ import annotations

import configparser
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    spec = importlib.util.spec_from_file_location("flydsl_demo_tool", ROOT / "tools" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demo_runs_what_the_readme_lists():
    demo = _demo()
    readme = (ROOT / "README.md").read_text()
    job = readme[readme.index("**Set up and run the main job**") : readme.index("**Set up and pass every test**")]
    listed = re.findall(r"`(?:examples/)?(\w+\.py)`", job)
    steps = [f"gemm_{k}_" for k in (1, 2, 3, 4)]
    assert [name for name in demo.EXAMPLES if not name.startswith("gemm_")] == [
        "vector_add.py",
        "tiled_copy.py",
        "paged_decode.py",
        "moe.py",
        "00_native_demo.py",
    ]
    assert all(any(name.startswith(step) for name in demo.EXAMPLES) for step in steps)
    assert set(listed) <= set(demo.EXAMPLES) and all((ROOT / "examples" / name).is_file() for name in demo.EXAMPLES)
    # tox's demo env runs it with the torch pinned for the other torch environments.
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    assert tox["testenv:demo"]["commands"] == 'python tools/demo.py --install-torch "{[torch]requirement}"'
    assert tox["torch"]["requirement"] == "torch==2.13.0" and "torch==2.13.0" in readme


def test_without_a_gpu_every_example_compiles(monkeypatch, capsys):
    demo = _demo()
    monkeypatch.setattr(demo, "_gpu", lambda: None)
    monkeypatch.setattr(demo, "EXAMPLES", ["vector_add.py", "00_native_demo.py"])  # the quick ones
    assert demo.main(["--install-torch", "torch==2.13.0"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("demo: 2 of 2 examples compiled (no usable GPU here: not run)")
    assert "pip install" not in out


def test_a_failing_example_fails_the_demo(monkeypatch, tmp_path, capsys):
    demo = _demo()
    (tmp_path / "broken.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setattr(demo, "_gpu", lambda: None)
    monkeypatch.setattr(demo, "EXAMPLES_DIR", tmp_path)
    monkeypatch.setattr(demo, "EXAMPLES", ["broken.py"])
    assert demo.main([]) == 1
    assert "=== broken.py: FAILED (exit status 3)" in capsys.readouterr().out


def test_with_a_gpu_a_missing_torch_is_installed(monkeypatch, capsys):
    demo = _demo()
    commands = []
    monkeypatch.setattr(demo, "_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None)
    # pip is not run for real here: the command is recorded and fails, which stops the demo.
    monkeypatch.setattr(demo.subprocess, "run", lambda command, **kw: commands.append(command) or _Done(1))
    assert demo.main(["--install-torch", "torch==2.13.0"]) == 1
    assert commands == [[sys.executable, "-m", "pip", "install", "--quiet", "torch==2.13.0"]]
    assert "demo: FAILED before the first example: pip install torch==2.13.0 failed" in capsys.readouterr().out
    assert demo.main([]) == 1
    assert "torch is not installed" in capsys.readouterr().out


class _Done:
    def __init__(self, returncode):
        self.returncode = returncode


def test_with_a_gpu_a_cpu_build_of_torch_stops_the_demo(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    demo = _demo()
    monkeypatch.setattr(demo, "_gpu", lambda: "NVIDIA H200")
    assert demo.main(["--install-torch", "torch==2.13.0"]) == 1
    out = capsys.readouterr().out
    assert f"torch {torch.__version__} is a CPU build: install a CUDA build" in out and "===" not in out


def test_the_command_line():
    help_text = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--install-torch REQUIREMENT" in help_text

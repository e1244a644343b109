"""The kernel cache: disk hits skip tracing, the bypass switch, corrupt entries, concurrent processes, keys."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler import cache
from flydsl.compiler.kernel import KernelFunction

from .fakes import FakeGpuTensor


def copy_kernel(x: fx.Tensor, y: fx.Tensor):
    y[0] = x[0]


def _fresh():
    """A new KernelFunction of the same function: an empty in-memory cache, as in a new process."""
    return KernelFunction(copy_kernel)


def _args():
    return FakeGpuTensor((8,)), FakeGpuTensor((8,), pointer=1 << 21)


def _entries(tmp_path):
    return sorted((tmp_path / "flydsl-cache").rglob("*.pkl"))


def _no_trace(monkeypatch):
    def fail(self, key):
        raise AssertionError("traced although the disk cache holds the kernel")

    monkeypatch.setattr(KernelFunction, "trace", fail)


def test_a_disk_hit_skips_tracing_and_compiling(tmp_path, monkeypatch):
    first = _fresh().lower(*_args())
    assert len(_entries(tmp_path)) == 1
    _no_trace(monkeypatch)
    again = _fresh().lower(*_args())
    assert again.ptx == first.ptx and again.kernels == first.kernels


def test_ptxas_performance_notes_warn_again_from_the_disk_cache(tmp_path, monkeypatch):
    """A kernel whose ptxas run left a "Potential Performance Loss" note warns when compiled and again when a new
    process takes it from the disk cache (the tests turn the warning into an error: a warm cache must not hide it)."""
    from flydsl.compiler import toolchain

    note = "ptxas -arch=sm_90a: ptxas info    : (C7514) Potential Performance Loss: wgmma serialized (a stand-in)"
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")  # the stand-in ptxas lives in this process
    monkeypatch.setattr(toolchain, "assemble_with_notes", lambda ptx, arch, *rest: (b"cubin", (note,)))
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: "ptxas")
    with pytest.warns(flyc.PerformanceWarning, match="C7514"):
        first = _fresh().lower(*_args())
    assert first.performance_notes == (note,)
    _no_trace(monkeypatch)
    with pytest.warns(flyc.PerformanceWarning, match="C7514") as caught:
        again = _fresh().lower(*_args())
    assert again.performance_notes == (note,) and len(_entries(tmp_path)) == 1
    assert caught[0].filename == __file__  # the user's call, not the cache's or the compiler's frames


def test_the_bypass_switch_neither_reads_nor_writes(tmp_path, monkeypatch):
    _fresh().lower(*_args())
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    traced = []
    original = KernelFunction.trace
    monkeypatch.setattr(KernelFunction, "trace", lambda self, key: traced.append(key) or original(self, key))
    _fresh().lower(*_args())
    assert traced, "the bypass must compile again"
    assert len(_entries(tmp_path)) == 1


def test_a_corrupt_entry_is_compiled_again_with_a_warning(tmp_path):
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    entry.write_bytes(b"not a pickle")
    with pytest.warns(UserWarning, match="ignoring the unreadable cache entry"):
        again = _fresh().lower(*_args())
    assert again.ptx == first.ptx
    assert cache.load(entry.stem) is not None  # rewritten


def test_the_key_follows_the_source_of_called_helpers():
    def helper_one(v):
        return v

    def helper_two(v):
        return v + v

    def make(helper):
        def k(x: fx.Tensor):
            x[0] = helper(x[0])

        return k

    assert cache.source_fingerprint(make(helper_one)) != cache.source_fingerprint(make(helper_two))


@dataclasses.dataclass(frozen=True)
class _Tile:
    m: int


TILE = _Tile(4)


def _reads_config(x: fx.Tensor):
    x[0] = x[TILE.m]


def test_the_key_follows_config_globals(monkeypatch):
    first = cache.source_fingerprint(_reads_config)
    monkeypatch.setitem(globals(), "TILE", _Tile(8))
    assert cache.source_fingerprint(_reads_config) != first


def _helper_class(body: str):
    """A class ``Helper`` with one method whose code is ``body`` (as kernels' helper classes have)."""
    namespace: dict = {"__name__": __name__}
    exec(f"class Helper:\n    def scaled(self, v):\n        return {body}\n", namespace)
    return namespace["Helper"]


def _uses_helper(x: fx.Tensor):
    x[0] = Helper().scaled(x[0])  # noqa: F821 (set by the test)


def test_the_key_follows_methods_of_helper_classes(monkeypatch):
    monkeypatch.setitem(globals(), "Helper", _helper_class("v + v"))
    first = cache.source_fingerprint(_uses_helper)
    monkeypatch.setitem(globals(), "Helper", _helper_class("v * 3"))
    assert cache.source_fingerprint(_uses_helper) != first


@dataclasses.dataclass(frozen=True)
class _Shape:
    m: int

    @property
    def rows(self) -> int:
        return self.m


def test_the_key_follows_the_code_of_constexpr_classes():
    """Two configs with equal reprs whose properties differ give different keys (the repr alone would not)."""
    namespace: dict = {"dataclasses": dataclasses, "__name__": __name__}
    exec(
        "@dataclasses.dataclass(frozen=True)\nclass _Shape:\n    m: int\n\n    @property\n"
        "    def rows(self) -> int:\n        return 2 * self.m\n",
        namespace,
    )
    other = namespace["_Shape"](4)
    assert repr(other) == repr(_Shape(4))
    assert cache.source_fingerprint(_reads_config, _Shape(4)) != cache.source_fingerprint(_reads_config, other)
    assert cache.source_fingerprint(_reads_config, _Shape(4)) == cache.source_fingerprint(_reads_config, _Shape(4))


def test_processes_compiling_the_same_kernel_at_once_agree(tmp_path):
    script = tmp_path / "compile_one.py"
    script.write_text(textwrap.dedent("""
            import flydsl.compiler as flyc, flydsl.expr as fx

            class Fake:
                def __init__(self, shape):
                    self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (1 << 20, False),
                                                     "strides": None, "version": 3}

            @flyc.kernel
            def shared_kernel(x: fx.Tensor, n: fx.Int32):
                for i in range(n):
                    x[i] = x[i] * 2.0

            print(len(shared_kernel.lower(Fake((64,)), 64).ptx))
            """))
    processes = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err for _, err in outputs]
    assert len({out for out, _ in outputs}) == 1
    (entry,) = _entries(tmp_path)
    assert cache.load(entry.stem) is not None
    assert not list((tmp_path / "flydsl-cache").rglob("*.tmp"))


def test_compile_of_a_jit_function_runs_it_once():
    calls = []

    @flyc.jit
    def host(n):
        calls.append(n)

    assert flyc.compile(host, 3) is host and calls == [3]

"""The disk cache's entries: hits skip tracing, the bypass switch, what is never trusted (pickles, corrupted,
foreign, copied and old entries), odd paths (FIFOs, links, directories), concurrent processes. What the key covers:
test_dsl_cache_key.py."""

from __future__ import annotations

import collections
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import warnings

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
    """The compiled modules' entries (not the records beside them, such as ptxas's version)."""
    return sorted(
        path for path in (tmp_path / "flydsl-cache").rglob("*.flyc") if b'"kind":"record"' not in _header(path)
    )


def _header(path) -> bytes:
    return path.read_bytes().partition(b"\n")[0]


def _temporaries(tmp_path):
    return sorted((tmp_path / "flydsl-cache").rglob("*.tmp"))


def _no_trace(monkeypatch):
    def fail(self, key, bytecode):
        raise AssertionError("traced although the disk cache holds the kernel")

    monkeypatch.setattr(KernelFunction, "_traced", fail)  # (what compiles trace with: trace() is its text form)


def _counting_traces(monkeypatch) -> list:
    traced = []
    original = KernelFunction._traced
    monkeypatch.setattr(
        KernelFunction, "_traced", lambda self, key, bytecode: traced.append(key) or original(self, key, bytecode)
    )
    return traced


def _lower_warning(match: str):
    """lower() of a fresh kernel, which must warn once with ``match`` and compile again; its module."""
    with pytest.warns(UserWarning, match=match) as caught:
        compiled = _fresh().lower(*_args())
    assert len([w for w in caught if "cache entry" in str(w.message)]) == 1
    return compiled


def test_a_disk_hit_skips_tracing_and_compiling(tmp_path, monkeypatch):
    first = _fresh().lower(*_args())
    assert len(_entries(tmp_path)) == 1
    _no_trace(monkeypatch)
    again = _fresh().lower(*_args())
    assert again == first


def test_a_module_names_its_disk_cache_entry(tmp_path):
    """Compiled and stored, or read back, a module carries its entry's key (where a launch plan kept on disk loads it
    again: flydsl.kernels.plan_cache); the key is no part of what the module is."""
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    key = json.loads(_header(entry))["key"]
    again = _fresh().lower(*_args())
    assert first.cache_key == again.cache_key == key and cache.load(key).cache_key == key
    assert again == first and "cache_key" not in repr(first)


def test_ptxas_performance_notes_warn_again_from_the_disk_cache(tmp_path, monkeypatch):
    """A kernel whose ptxas run left a "Potential Performance Loss" note warns when compiled and again when a new
    process takes it from the disk cache (the tests turn the warning into an error: a warm cache must not hide it)."""
    from flydsl.compiler import toolchain

    note = "ptxas -arch=sm_90a: ptxas info    : (C7514) Potential Performance Loss: wgmma serialized (a stand-in)"
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")  # the stand-in ptxas lives in this process
    monkeypatch.setattr(toolchain, "assemble_with_notes", lambda ptx, arch, *rest: (b"cubin", (note,)))
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: "ptxas")
    monkeypatch.setattr(toolchain, "fingerprint", lambda: "a stand-in ptxas")
    with pytest.warns(flyc.PerformanceWarning, match="C7514"):
        first = _fresh().lower(*_args())
    assert first.performance_notes == (note,)
    _no_trace(monkeypatch)
    with pytest.warns(flyc.PerformanceWarning, match="C7514") as caught:
        again = _fresh().lower(*_args())
    assert again.performance_notes == (note,) and again.cubin == b"cubin" and len(_entries(tmp_path)) == 1
    assert caught[0].filename == __file__  # the user's call, not the cache's or the compiler's frames


def test_the_bypass_switch_neither_reads_nor_writes(tmp_path, monkeypatch):
    _fresh().lower(*_args())
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    traced = _counting_traces(monkeypatch)
    _fresh().lower(*_args())
    assert traced, "the bypass must compile again"
    assert len(_entries(tmp_path)) == 1


def test_an_entry_is_json_metadata_and_raw_bytes(tmp_path):
    compiled = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    header, _, payload = entry.read_bytes().partition(b"\n")
    meta = json.loads(header)
    assert meta["format"] == cache.FORMAT and meta["key"].startswith(cache.compiler_fingerprint() + "\n")
    assert payload[: meta["ptx"]["size"]].decode() == compiled.ptx
    assert (meta["cubin"] is None) == (compiled.cubin is None)
    assert cache.entry_path(meta["key"]) == entry


def test_the_cache_directory_is_private_to_the_user(tmp_path):
    _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    for directory in (tmp_path / "flydsl-cache", entry.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600


def test_a_planted_pickle_is_never_run(tmp_path):
    """Whoever can write the cache directory must not run code in the processes that read it."""
    _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    marker = tmp_path / "ran"

    class Plant:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    planted = pickle.dumps(Plant())
    entry.write_bytes(planted)
    entry.with_suffix(".pkl").write_bytes(planted)  # where the pickle format kept it
    _lower_warning("ignoring the cache entry")
    assert not marker.exists()


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("flip a cubin byte", "cubin checksum"),
        ("edit the PTX", "PTX checksum"),
        ("edit the metadata", "metadata checksum"),
        ("truncate", "payload bytes"),
        ("old format", "format 2"),
        ("not JSON", "ignoring the cache entry"),
    ],
)
def test_a_damaged_entry_is_compiled_again_with_one_warning(tmp_path, monkeypatch, damage, reason):
    from flydsl.compiler import toolchain

    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")  # a stand-in cubin, so that there is one without ptxas
    monkeypatch.setattr(toolchain, "assemble_with_notes", lambda ptx, arch, *rest: (b"\x7fELF cubin", ()))
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: "ptxas")
    monkeypatch.setattr(toolchain, "fingerprint", lambda: "a stand-in ptxas")
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    header, _, _ = bytes(data).partition(b"\n")
    meta = json.loads(header)
    if damage == "flip a cubin byte":
        data[-1] ^= 1
    elif damage == "edit the PTX":
        at = data.index(b".target", len(header))
        data[at : at + 7] = b".tarGET"
    elif damage == "edit the metadata":
        data[: len(header)] = header.replace(b'"opt_level":3', b'"opt_level":2')
        assert bytes(data[: len(header)]) != header
    elif damage == "truncate":
        del data[-3:]
    elif damage == "old format":
        meta["format"] = 2
        data[: len(header)] = json.dumps(meta).encode()
    else:
        data[:1] = b"\x80"
    entry.write_bytes(bytes(data))
    again = _lower_warning(reason)
    assert again == first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _no_trace(monkeypatch)
        assert _fresh().lower(*_args()) == first  # rewritten: served again, no warning


def test_another_keys_entry_copied_over_is_not_served(tmp_path, monkeypatch):
    @flyc.kernel
    def other_kernel(x: fx.Tensor, y: fx.Tensor):
        y[1] = x[1]

    first = _fresh().lower(*_args())
    other_kernel.lower(*_args())
    mine, theirs = sorted(_entries(tmp_path), key=lambda p: b"copy_kernel" not in p.read_bytes())
    mine.write_bytes(theirs.read_bytes())
    again = _lower_warning("another key's")
    assert again == first


def test_an_entry_another_user_owns_is_refused(tmp_path, monkeypatch):
    first = _fresh().lower(*_args())
    owner = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # the entries now belong to someone else
    again = _lower_warning(f"owned by uid {owner}")
    assert again == first


def _with_timeout(seconds: int):
    """Fails a test that blocks (a FIFO opened for reading waits for a writer) instead of hanging the suite."""
    import signal

    def expired(signum, frame):
        raise AssertionError(f"blocked for {seconds} s")

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link to an entry", "empty directory", "directory"])
def test_what_is_not_a_regular_file_is_never_read(tmp_path, kind):
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "link to /dev/zero":
        entry.symlink_to("/dev/zero")
    elif kind == "link to an entry":
        (entry.parent / "real").write_bytes(b"")
        entry.symlink_to(entry.parent / "real")
    else:
        entry.mkdir()
        if kind == "directory":
            (entry / "inside").write_text("")
    _with_timeout(60)
    try:
        again = _lower_warning("ignoring the cache entry")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second call neither warns again nor blocks
            assert _fresh().lower(*_args()) == first
    finally:
        import signal

        signal.alarm(0)
    assert again == first
    assert not _temporaries(tmp_path)
    if kind != "directory":  # repaired: a regular entry again
        assert entry.is_file() and not entry.is_symlink()


def test_a_file_where_a_shard_belongs_warns_once_and_leaves_nothing(tmp_path):
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    entry.unlink()
    shard = entry.parent
    shard.rmdir()
    shard.write_text("not a directory")
    assert _lower_warning("Not a directory") == first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fresh().lower(*_args()) == first
    assert not _temporaries(tmp_path) and shard.read_text() == "not a directory"


def test_an_entry_larger_than_the_bound_is_not_read(tmp_path, monkeypatch):
    first = _fresh().lower(*_args())
    (entry,) = _entries(tmp_path)
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", entry.stat().st_size - 1)
    assert _lower_warning("more than the") == first


_CONCURRENT = textwrap.dedent("""
    import sys
    import flydsl.compiler as flyc, flydsl.expr as fx

    class Fake:
        def __init__(self, shape):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (1 << 20, False),
                                             "strides": None, "version": 3}

    @flyc.kernel
    def shared_kernel(x: fx.Tensor, n: fx.Int32, scale: fx.Constexpr[int]):
        for i in range(n):
            x[i] = x[i] * float(scale)

    compiled = shared_kernel.lower(Fake((64,)), 64, int(sys.argv[1]))
    print(len(compiled.ptx), compiled.cubin is None)
    """)


def run_concurrently(tmp_path, processes: int, kernels: int) -> None:
    """``processes`` processes lowering ``kernels`` different kernels (round robin) at once into one cache: every
    process succeeds, the processes of one kernel agree, each kernel has one whole entry, no temporary is left."""
    script = tmp_path / "compile_one.py"
    script.write_text(_CONCURRENT)
    running = [
        subprocess.Popen(
            [sys.executable, str(script), str(2 + n % kernels)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    outputs = [p.communicate(timeout=1800) for p in running]
    assert all(p.returncode == 0 for p in running), [err for _, err in outputs if err][:3]
    assert all(not err for _, err in outputs), [err for _, err in outputs if err][:3]  # no warning either
    for k in range(kernels):
        # the last line: an editable install's rebuild check may print "waiting for the lock" lines before it
        printed = collections.Counter(outputs[n][0].splitlines()[-1] for n in range(k, processes, kernels))
        assert len(printed) == 1, f"kernel {k}: the processes disagree: {printed}"
    entries = _entries(tmp_path)
    assert len(entries) == kernels and not _temporaries(tmp_path)
    for entry in entries:
        meta = json.loads(entry.read_bytes().partition(b"\n")[0])
        assert cache.load(meta["key"]) is not None


def test_processes_compiling_the_same_and_different_kernels_at_once_agree(tmp_path):
    run_concurrently(tmp_path, processes=32, kernels=4)


def test_compile_of_a_jit_function_runs_it_once():
    calls = []

    @flyc.jit
    def host(n):
        calls.append(n)

    assert flyc.compile(host, 3) is host and calls == [3]

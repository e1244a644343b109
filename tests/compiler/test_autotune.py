"""flyc.autotune without a GPU (a fake timer): the winner is the fastest, kept in memory and as a record entry of the
disk cache (reloaded in a fresh process state without timing again), a changed candidate list tunes again, failing
candidates are left out, a record that is not to be trusted is ignored with a warning, the switches, the progress
line."""

from __future__ import annotations

import json
import warnings

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import autotune, cache

CANDIDATES = ("tile 64", "tile 128", "tile 256")
TIMES = {"tile 64": 0.9, "tile 128": 0.4, "tile 256": 0.7, "tile 512": 0.1}


@pytest.fixture(autouse=True)
def _fresh_winners():
    """Each test starts with no winner in memory, as a new process does."""
    autotune.clear()
    yield
    autotune.clear()


class FakeTimer:
    """Times ``run`` by the candidate it last ran (TIMES, ms); counts its calls."""

    def __init__(self):
        self.calls = 0
        self.ran = []

    def run(self, candidate):
        self.ran.append(candidate)
        if candidate.startswith("broken"):
            raise ValueError(f"{candidate} does not compile")

    def __call__(self, fn) -> float:
        self.calls += 1
        fn()
        return TIMES[self.ran[-1]]


def _choose(timer, candidates=CANDIDATES, key=("4096x4096x4096", "bf16")):
    return flyc.autotune.choose("gemm", key, candidates, timer.run, timer=timer)


def _records(tmp_path):
    return sorted((tmp_path / "flydsl-cache").rglob("*.flyc"))


def test_the_fastest_candidate_wins_and_is_kept_in_memory():
    timer = FakeTimer()
    assert _choose(timer) == "tile 128"
    assert timer.calls == 3
    assert _choose(timer) == "tile 128" and timer.calls == 3  # the second call: from memory


def test_the_winner_is_reloaded_from_disk_without_timing(tmp_path):
    _choose(FakeTimer())
    (path,) = _records(tmp_path)
    assert path == cache.entry_path(autotune.key_text("gemm", ("4096x4096x4096", "bf16"), CANDIDATES))
    autotune.clear()  # a new process: nothing in memory
    again = FakeTimer()
    assert _choose(again) == "tile 128" and again.calls == 0
    kept = autotune.record("gemm", ("4096x4096x4096", "bf16"), CANDIDATES)
    assert kept["winner"] == 1 and kept["candidate"] == repr("tile 128") and kept["ms"] == 0.4
    assert [row["ms"] for row in kept["timings"]] == [0.9, 0.4, 0.7]


def test_records_share_the_module_entry_format(tmp_path):
    """One JSON metadata line: the cache's format, the full key, "kind": "record", a checksum; no payload."""
    _choose(FakeTimer())
    (path,) = _records(tmp_path)
    data = path.read_bytes()
    header, newline, payload = data.partition(b"\n")
    meta = json.loads(header)
    assert newline and payload == b""
    assert meta["format"] == cache.FORMAT and meta["kind"] == "record" and "checksum" in meta
    assert meta["key"] == autotune.key_text("gemm", ("4096x4096x4096", "bf16"), CANDIDATES)
    with pytest.warns(UserWarning, match="a 'record' entry, not a compiled module"):
        assert cache.load(meta["key"]) is None


def test_another_candidate_list_or_key_tunes_again(tmp_path):
    _choose(FakeTimer())
    timer = FakeTimer()
    assert _choose(timer, CANDIDATES + ("tile 512",)) == "tile 512" and timer.calls == 4
    other = FakeTimer()
    assert _choose(other, key=("8192x4096x4096", "bf16")) == "tile 128" and other.calls == 3
    assert len(_records(tmp_path)) == 3


def test_failing_candidates_are_left_out_and_recorded():
    timer = FakeTimer()
    assert _choose(timer, ("broken 32",) + CANDIDATES) == "tile 128"
    kept = autotune.record("gemm", ("4096x4096x4096", "bf16"), ("broken 32",) + CANDIDATES)
    assert kept["winner"] == 2
    assert kept["timings"][0] == {
        "candidate": repr("broken 32"),
        "ms": None,
        "error": "ValueError: broken 32 does not compile",
    }


def test_every_candidate_failing_raises_naming_the_op_and_errors(tmp_path):
    with pytest.raises(autotune.AutotuneError, match=r"(?s)gemm 4096x4096x4096 bf16: every candidate failed.*broken 1"):
        _choose(FakeTimer(), ("broken 1", "broken 2"))
    assert _records(tmp_path) == []
    with pytest.raises(autotune.AutotuneError, match="gemm: no candidates"):
        _choose(FakeTimer(), ())


def test_no_timer_without_cuda_is_a_clear_error(monkeypatch):
    def no_cuda(fn, reps=10, warmup=2):
        raise autotune.AutotuneError("flyc.autotune: timing without a timer given needs a CUDA device")

    monkeypatch.setattr(autotune, "cuda_timer", no_cuda)
    ran = []
    with pytest.raises(autotune.AutotuneError, match="needs a CUDA device"):
        flyc.autotune.choose("gemm", "k", CANDIDATES, ran.append)


def test_the_cache_disabled_keeps_winners_in_memory_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    timer = FakeTimer()
    assert _choose(timer) == "tile 128" and _choose(timer) == "tile 128" and timer.calls == 3
    assert _records(tmp_path) == []
    autotune.clear()
    _choose(timer)
    assert timer.calls == 6


def _rewrite(path, edit) -> None:
    header, _, payload = path.read_bytes().partition(b"\n")
    meta = json.loads(header)
    edit(meta)
    meta.pop("checksum")
    meta["checksum"] = cache._sha256(cache._canonical(meta))
    path.write_bytes(cache._canonical(meta) + b"\n" + payload)


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(path.read_bytes().replace(b"tile 128", b"tile 256", 1)),  # checksum off
        lambda path: path.write_bytes(b"not json\n"),
        lambda path: _rewrite(path, lambda meta: meta.update(key="another key")),  # foreign
        lambda path: _rewrite(path, lambda meta: meta["record"].update(winner=7)),  # no such candidate
        lambda path: _rewrite(path, lambda meta: meta["record"].update(candidate="'tile 999'")),
        lambda path: _rewrite(path, lambda meta: meta.pop("kind")),  # a module's metadata
    ],
    ids=["checksum", "garbage", "foreign", "index", "repr", "module"],
)
def test_an_untrusted_record_is_ignored_with_a_warning_and_tuned_again(tmp_path, damage):
    _choose(FakeTimer())
    (path,) = _records(tmp_path)
    damage(path)
    autotune.clear()
    timer = FakeTimer()
    with pytest.warns(UserWarning, match="ignoring the (cache entry|autotuning record)"):
        assert _choose(timer) == "tile 128"
    assert timer.calls == 3
    autotune.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = FakeTimer()
        assert _choose(again) == "tile 128" and again.calls == 0  # replaced by a good record


def test_a_module_entry_is_not_served_as_a_record(tmp_path):
    key = autotune.key_text("gemm", "k", CANDIDATES)
    compiled = flyc.CompiledModule(name="m", target=flyc.SM90A, ptx="// ptx", cubin=None, kernels={})
    cache.store(key, compiled)
    with pytest.warns(UserWarning, match="not a record"):
        assert cache.load_record(key) is None


def test_enabled_honours_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv("FLYDSL_AUTOTUNE", raising=False)
    assert not autotune.enabled() and autotune.enabled(True)
    monkeypatch.setenv("FLYDSL_AUTOTUNE", "1")
    assert autotune.enabled() and not autotune.enabled(False)
    monkeypatch.setenv("FLYDSL_AUTOTUNE", "0")
    assert not autotune.enabled()


def test_a_slow_tuning_prints_its_progress_line(monkeypatch, capsys):
    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(autotune, "_clock", lambda: next(ticks))
    _choose(FakeTimer())
    line = capsys.readouterr().err
    assert line == "flydsl autotune gemm 4096x4096x4096 bf16: 3 configs, 2.5 s, best #1 'tile 128' 0.400 ms\n"


def test_a_fast_tuning_is_silent(monkeypatch, capsys):
    ticks = iter([10.0, 10.2])
    monkeypatch.setattr(autotune, "_clock", lambda: next(ticks))
    _choose(FakeTimer())
    assert capsys.readouterr().err == ""


def test_buckets_round_up_to_powers_of_two():
    assert [autotune.bucket(n) for n in (0, 1, 2, 3, 64, 65, 3000, 4096)] == [0, 1, 2, 4, 64, 128, 4096, 4096]
    with pytest.raises(ValueError):
        autotune.bucket(-1)

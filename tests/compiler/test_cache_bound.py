"""The disk cache's bound (FLYDSL_CACHE_MAX_SIZE): the least recently used entries go, a load marks its entry used,
a process prunes on its first store and every 64th after, sizes parse with their unit or say what was expected, and
`python -m flydsl.compiler.cache` shows, prunes and clears the cache."""

from __future__ import annotations

import os

import pytest

from flydsl.compiler import cache, settings


def _stored(names: list[str], size: int = 4000) -> dict:
    """Records of about ``size`` bytes each, written in order with increasing modification times."""
    paths = {}
    for age, name in enumerate(names):
        cache.store_record(name, {"payload": "x" * size})
        paths[name] = cache.entry_path(name)
        os.utime(paths[name], (1_000_000 + age, 1_000_000 + age))  # written in this order, long ago
    return paths


def test_the_least_recently_used_entries_go_first_and_a_load_marks_its_entry_used(monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", "0")  # no pruning while they are written
    paths = _stored(["a", "b", "c", "d", "e"])
    entries, total = cache.usage()
    assert entries == 5 and total > 5 * 4000
    assert cache.load_record("a") == {"payload": "x" * 4000}  # a: used now, so the newest
    removed, freed = cache.prune(total - 2 * os.path.getsize(paths["b"]))
    assert removed == 2 and freed > 0
    assert [name for name, path in paths.items() if path.exists()] == ["a", "d", "e"]
    left = cache.usage()[1]
    assert cache.prune(0) == (3, left) and cache.usage() == (0, 0) and cache.load_record("a") is None


def test_a_store_past_the_bound_prunes_to_below_it(monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", "0")
    paths = _stored([f"old{i}" for i in range(10)])
    size = os.path.getsize(paths["old0"])
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", str(6 * size))
    monkeypatch.setattr(cache, "_stores", [0])  # the first store of a process prunes
    cache.store_record("new", {"payload": "x" * 4000})
    entries, total = cache.usage()
    assert total <= 0.9 * 6 * size and cache.entry_path("new").exists() and not paths["old0"].exists()
    assert entries == 5 and all(paths[f"old{i}"].exists() for i in (6, 7, 8, 9))  # the newest four and "new"
    cache.store_record("newer", {"payload": "y"})  # the second store of the process does not walk the cache
    assert cache.usage()[0] == entries + 1


def test_no_bound_keeps_every_entry(monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", "0")
    _stored(["a", "b"])
    monkeypatch.setattr(cache, "_stores", [0])
    cache.store_record("c", {})
    assert cache.prune() == (0, 0) and cache.usage()[0] == 3


def test_only_this_users_entries_are_counted_and_nothing_else_is_removed(tmp_path):
    paths = _stored(["a"])
    shard = paths["a"].parent
    (shard / ".a.flyc.123.tmp").write_bytes(b"x" * 100)  # a store in progress
    (shard / "notes.txt").write_bytes(b"x" * 100)
    os.symlink(tmp_path, shard / ("0" * 40 + ".flyc"))  # a link named like an entry
    entry = (1, os.path.getsize(paths["a"]))
    assert cache.usage() == entry and cache.prune(0) == entry  # the entry alone counted, and removed
    assert sorted(p.name for p in shard.iterdir()) == [".a.flyc.123.tmp", "0" * 40 + ".flyc", "notes.txt"]


@pytest.mark.parametrize(
    "text, size", [("123", 123), ("4G", 4 << 30), ("500m", 500 << 20), ("1.5K", 1536), ("2GB", 2 << 30), ("0", 0)]
)
def test_sizes_parse_with_their_unit(text, size):
    assert settings.parse_size("FLYDSL_CACHE_MAX_SIZE", text, 1) == size


@pytest.mark.parametrize("text", ["lots", "-1G", "G", "inf"])
def test_a_size_that_is_not_one_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", text)
    with pytest.raises(ValueError, match="FLYDSL_CACHE_MAX_SIZE=.*expected a size in bytes"):
        settings.current()


def test_the_command_line_shows_prunes_and_clears(monkeypatch, capsys):
    monkeypatch.setenv("FLYDSL_CACHE_MAX_SIZE", "0")
    paths = _stored(["a", "b", "c"])
    assert cache.main([]) == 0 and "3 entries" in capsys.readouterr().out
    cache.main(["--prune", str(2 * os.path.getsize(paths["a"]))])
    out = capsys.readouterr().out
    assert "removed 1 entries" in out and "2 entries" in out and not paths["a"].exists()
    cache.main(["--clear"])
    assert "removed 2 entries" in capsys.readouterr().out and cache.usage() == (0, 0)


def test_the_command_line_refuses_a_size_that_is_not_one(capsys):
    with pytest.raises(SystemExit) as info:
        cache.main(["--prune", "lots"])
    assert info.value.code == 2 and "--prune='lots': expected a size in bytes" in capsys.readouterr().err

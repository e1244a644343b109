"""benchmarks/results/: every file is a record of benchmarks/record.py's schema, in its benchmark's folder, named by
its date; the index (README.md, tools/results_index.py) is current; RENAMES.tsv maps the old flat names. No GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RECORDS = sorted(RESULTS.rglob("*.json"))
OLD_WORD = "session"  # the old names' and notes' run numbering: gone from names and texts


@pytest.fixture(scope="module")
def record_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import record

        yield record
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_there_are_records():
    assert len(RECORDS) > 0


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_record_is_valid_and_in_its_folder(path, record_module):
    record = json.loads(path.read_text())
    record_module.validate(record)
    relative = path.relative_to(RESULTS)
    assert len(relative.parts) == 2, f"{relative}: records live in benchmarks/results/<folder>/"
    assert relative.parts[0] == record_module.folder(record["benchmark"]), f"{relative}: {record['benchmark']}"
    assert relative.name.startswith(record["date"] + "_"), f"{relative}: named <date>_<what>.json"
    assert OLD_WORD not in relative.name.lower()
    assert not re.search(OLD_WORD, json.dumps(record), re.IGNORECASE), f"{relative} numbers runs the old way"


def test_validate_names_the_problems(record_module):
    good = {
        "benchmark": "gemm_bench",
        "command": "python benchmarks/gemm_bench.py",
        "date": "2026-12-02",
        "git_commit": "abc1234",
        "method": None,
        "summary": None,
        "results": [],
    }
    assert record_module.validate(dict(good)) == good
    for change, message in [
        ({"benchmark": "no_such_script"}, "names no script"),
        ({"date": "2026-12"}, "not YYYY-MM-DD"),
        ({"git_commit": None}, "'git_commit' is NoneType"),
        ({"results": "x"}, "'results'"),
        ({"gpu": 1}, "'gpu' is int"),
    ]:
        with pytest.raises(ValueError, match=message):
            record_module.validate({**good, **change})
    for missing in ("command", "summary", "method"):
        with pytest.raises(ValueError, match=f"no '{missing}'"):
            record_module.validate({k: v for k, v in good.items() if k != missing})
    assert record_module.folder("norms_bench") == "norms" and record_module.folder("dsl_dispatch") == "dsl_dispatch"
    assert record_module.result_path("gemm_bench", "sweep", "2026-12-02") == RESULTS / "gemm" / "2026-12-02_sweep.json"


def test_retired_scripts_records_stay_valid(record_module):
    """A retired script's records are history: they validate without its script, and its successor exists."""
    good = {"command": "python benchmarks/launch_overhead.py", "date": "2026-11-30", "git_commit": "abc1234"}
    good |= {"method": None, "summary": None, "results": []}
    for name, successor in record_module.RETIRED.items():
        assert not (ROOT / "benchmarks" / f"{name}.py").exists() and (ROOT / "benchmarks" / f"{successor}.py").exists()
        assert record_module.validate({**good, "benchmark": name})["benchmark"] == name
    assert {"torch_ops_overhead", "launch_overhead", "dsl_dispatch"} <= set(record_module.RETIRED)


def test_write_record_writes_a_valid_record(tmp_path, record_module):
    path = tmp_path / "r.json"
    record_module.write_record(path, "norms_bench", ["--backward"], [{"kernel": "softmax"}], commit="abc1234")
    record_module.validate(json.loads(path.read_text()))


def test_index_is_current():
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "results_index.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr + "\n(run python tools/results_index.py)"


def test_renames_map_old_names_to_folders():
    rows = [line.split("\t") for line in (RESULTS / "RENAMES.tsv").read_text().splitlines()]
    assert rows[0] == ["old_name", "new_path_under_benchmarks_results"]
    olds = [old for old, _ in rows[1:]]
    assert len(olds) == len(set(olds)) and all("/" not in old and old.endswith(".json") for old in olds)
    assert all(re.fullmatch(r"[a-z0-9_]+/\d{4}-\d{2}-\d{2}_[\w.\-]+\.json", new) for _, new in rows[1:])
    assert not any(OLD_WORD in new for _, new in rows[1:])


def test_citations_are_found(tmp_path):
    """tools/results_index.py --uncited: a record counts as cited by its new path, its old name, a glob, {a,b} or
    a ``..._suffix.json`` abbreviation after a full old name; a glob of a whole folder cites none."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import results_index
    finally:
        sys.path.remove(str(ROOT / "tools"))
    paths = ["norms/2026-12-01_a.json", "norms/2026-12-01_b_final.json", "gemm/2026-11-30_sweep.json"]
    old = {"norms_2026-12-01_x_a.json": paths[0], "norms_2026-12-01_x_final.json": paths[1], "gemm_s.json": paths[2]}
    cited = results_index.cited_by
    assert cited("see benchmarks/results/gemm/2026-11-30_sweep.json", paths, old) == {paths[2]}
    assert cited("`norms_2026-12-01_x_a.json` and ..._final.json", paths, old) == {paths[0], paths[1]}
    assert cited("norms/2026-12-01_{a,b_final}.json", paths, old) == {paths[0], paths[1]}
    assert cited("norms/*_final.json", paths, old) == {paths[1]}
    assert cited("norms/*.json or benchmarks/results/*.json", paths, old) == set()  # every file: none in particular
    assert cited("gemm_s.json,2026-12-01_a.json", paths, old) == {paths[2], paths[0]}
    assert cited("nothing here.json", paths, old) == set()

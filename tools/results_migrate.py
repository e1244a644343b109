"""The one-time move of benchmarks/results/ from 251 flat JSON files in several schemas to a folder per benchmark and
one record schema (benchmarks/record.py), kept as the record of how it was done:

    python tools/results_migrate.py --plan             # prints old name -> new path, the conversions, changed texts
    python tools/results_migrate.py                    # moves and converts (git mv), writes results/RENAMES.tsv
    python tools/results_migrate.py --rewrite FILE...  # replaces the old names cited in text files by the new paths

Each file goes to ``benchmarks/results/<folder>/<date>_<what>.json``: the folder is its benchmark's (record.folder:
the producing script's name without ``_bench``), found from the file's ``benchmark`` field, or for files that named
a description or nothing there (probes, ncu reports, bundles of runs) from the script that produced or now measures
the same (:data:`SCRIPT`). ``<what>`` is the old name less the folder's words, with the old run-number word
(:data:`OLD_WORD` and a number) replaced by the commit measured; a name that would be empty gets the commit.

Conversion is lossless: every top-level field is kept under its own name, except ``commit`` (-> ``git_commit``),
``statistic`` (-> ``method`` where there was none), a description in ``benchmark`` (-> ``description``) and, in files
without ``results``, the measurements (``lines``, ``tbps``, ``runs``, ``kernels``, ...), which move under ``results``
(``lines`` as the list itself, the others under their names). Fields a record needs that a file lacked are filled in
and said so in ``migration``: the date from the file name, the command as "not recorded". In every text
:data:`OLD_WORD` goes (:data:`SCRUB`: a date, commit or run in its place) and old file names become new paths.

``--rewrite`` (for docs and sources that cite the old names) replaces exact names (with or without
``benchmarks/results/``), ``*`` globs and ``{a,b}`` alternatives (by an equivalent new glob where one exists, else the
list of new paths) and ``..._suffix.json`` abbreviations (the old name ending so that shares the longest prefix with
the nearest full name before it); what it cannot place it prints.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD_WORD = "session"  # how the old names and notes numbered runs; none of the new ones does
RESULTS = ROOT / "benchmarks" / "results"
RENAMES = RESULTS / "RENAMES.tsv"
sys.path.insert(0, str(ROOT / "benchmarks"))
from record import folder, validate  # noqa: E402

# The script behind files whose ``benchmark`` field names no script (a description, or missing): the one that
# produced them (run under ncu, or several runs bundled), or for probes the script measuring the same today.
SCRIPT = {
    "gemm_m512_m128_configs_2026-11-30.json": "gemm_bench",  # two gemm_bench runs
    "gemm_tile_widths_2026-11-30_no_serialization.json": "gemm_bench",  # gemm_bench runs
    "gemm_tile192_2026-11-30.json": "gemm_bench",  # an inline probe timing configs against cuBLAS
    "gemm_ncu_2026-11-30_4096_vs_cublas.json": "gemm_profile",  # ncu over gemm_profile.py
    "ncu_layer_norm_bf16_16384_2026-12-01_session29.json": "norms_profile",  # ncu over norms_profile.py
    "ncu_rms_norm_f32_8192_2026-12-01_session28.json": "norms_profile",
    "norms_forward_ncu_2026-11-30.json": "norms_profile",  # ncu over probe_norm_ncu.py, norms_profile.py since
    "norms_forward_ncu_2026-11-30_short_and_ring.json": "norms_profile",
    "norms_forward_ncu_2026-11-30_short_f32_vs_compile.json": "norms_profile",
    "norms_backward_ncu_2026-11-30_session18.json": "norms_backward_staged",  # ncu over norms_backward_staged.py
    "norms_backward_staged_2026-11-30_session18.json": "norms_backward_staged",  # its runs
    "norms_forward_cta_threads_2026-11-30.json": "norms_bench",  # norms_bench runs with --cta-threads
    "norms_forward_short_rows_2026-11-30.json": "norms_bench",  # probes of the register forwards
    "norms_register_warp_block_2026-11-30.json": "norms_bench",
    "norms_f32_8192_occupancy_2026-12-01_session28.json": "norms_bench",  # GPU-time probes beside its peers
    "norms_f32_looped_static_n_2026-12-01_session28.json": "norms_bench",
    "norms_layer_norm_bf16_looped_static_n_2026-12-01_session28.json": "norms_bench",
    "norms_host_us_2026-12-01_session29.json": "norms_host_time",  # a probe of the host time per call
    "norms_forward_staged_2026-12-01_session27_claims.json": "norms_forward_staged",  # probes over its launchers
    "norms_forward_staged_2026-12-01_session27_claims_clusters.json": "norms_forward_staged",
    "norms_forward_staged_2026-12-01_session27_claims_layer_norm.json": "norms_forward_staged",
    "norms_forward_staged_2026-12-01_session27_grid.json": "norms_forward_staged",
    "layout_bench_2026-11-30.json": "layout_bench",  # no benchmark field
    "layout_bench_2026-11-30b.json": "layout_bench",
}
# New names where the rule gives none worth having (no commit to name the run by, or a clash).
NAME = {
    "norms_backward_2026-11-30_staged.json": "2026-11-30_first_staged_kernels.json",
    "norms_backward_staged_2026-11-30_session18.json": "2026-11-30_configs_fma_static_n_teams.json",
    "norms_backward_ncu_2026-11-30_session18.json": "2026-11-30_ncu_230193e_9388e1b.json",
    "norms_host_us_2026-12-01_session29.json": "2026-12-01_probe_stream_key.json",
    "tiled_copy_bandwidth_2026-11-30.json": "2026-11-30_32768x32768.json",
}
# The commit of files that name it in a note only.
COMMIT = {"norms_backward_ncu_2026-11-30_session18.json": "230193e (before), 9388e1b (after)"}
ENVIRONMENT = ("date", "git_commit", "python", "torch", "gpu", "cuda", "driver", "triton")
# Measurements in files that have no ``results``: they move under it.
MEASUREMENTS = {
    "lines",
    "tbps",
    "runs",
    "kernels",
    "cases",
    "before",
    "after",
    "dispatch_us",
    "dispatch_repeats_us",
    "cold_compile_ms",
    "first_call",
    "pieces_us",
    "shape",
    "bytes_moved",
    "ptx_global_accesses",
    "flydsl_ms",
    "flydsl_tb_per_s",
    "torch_copy_ms",
    "torch_copy_tb_per_s",
    "ratio_to_torch",
    "results_by_forward_values",
}
# OLD_WORD and its number in the texts, in order: a date, a commit or a run in its place, or nothing.
SCRUB: list[tuple[str, str | Callable[[re.Match], str]]] = [
    (r"^Session \d+ final full run at", "Final full run at"),
    (r"^Session \d+ last full run at", "Last full run at"),
    (r"^Session \d+,? full run at", "Full run at"),
    (r"^Session \d+ final at", "Final run at"),
    (r"^Session \d+ confirmation at", "Confirmation at"),
    (r"^Session \d+ at ", "At "),
    (r"^Session \d+, second run", "Second run"),
    (r"^Session \d+, confirmation", "Confirmation"),
    (r"^Session \d+ \(run (\d) of (\d)\): ", r"Run \1 of \2: "),
    (r"^Session \d+, second run", "Second run"),
    (r"^Session \d+: (\w)", lambda m: m.group(1).upper()),
    (r"^Session 18 sweeps on the H200", "Sweeps on the H200 on 2026-11-30"),
    (r"on the H200 in one session,", "on the H200 on 2026-11-30,"),
    (r"\(session 17's kernel\)", "(the kernel before the fmas)"),
    (r"the kernel as session 17 left it", "the kernel before the fmas"),
    (r"\(same session\)", "(the same day)"),
    (r"same session, GPU time", "the same day, GPU time"),
    (r"New this session:", "New since the previous full run:"),
    (r"no change of this session touched them", "no change between these runs touched them"),
    (r"cells that passed in session 25 missed here", "cells that passed at dad4ee1 missed here"),
    (r"in every run of sessions 24-26", "in every full run from a5b74c5 to e22662b"),
    (r"Earlier sessions measured", "Earlier runs measured"),
    (r"; session 29, not kept as a script", "; 2026-12-01, not kept as a script"),
    (r"^session probe \(not kept", "probe (not kept"),
]
DATED = re.compile(r"^(?P<prefix>.*?)_?(?P<date>20\d\d-\d\d-\d\d)(?P<suffix>.*)\.json$")


def short_commit(record: dict) -> str | None:
    """The commit measured, as 7 hex digits (None where the record names none)."""
    found = re.match(r"[0-9a-f]{7,40}", str(record.get("git_commit") or record.get("commit") or ""))
    return found.group(0)[:7] if found else None


def script_of(old: str, data: dict) -> str:
    if old in SCRIPT:
        return SCRIPT[old]
    benchmark = data.get("benchmark")
    if isinstance(benchmark, str) and (ROOT / "benchmarks" / f"{benchmark}.py").is_file():
        return benchmark
    raise SystemExit(f"{old}: no script known for benchmark {benchmark!r}: add it to SCRIPT")


def new_name(old: str, data: dict, script: str) -> str:
    """``<date>_<what>.json``: the old name's words less the folder's, OLD_WORD + number replaced by the commit."""
    if old in NAME:
        return NAME[old]
    parts = DATED.match(old)
    prefix = [w for w in parts["prefix"].split("_") if w]
    common = 0
    for lead in (folder(script).split("_"), script.split("_")):
        same = 0
        while same < min(len(lead), len(prefix)) and prefix[same] == lead[same]:
            same += 1
        common = max(common, same)
    prefix = prefix[common:]
    suffix = parts["suffix"]
    commit = short_commit(data)
    words = [w for w in suffix.split("_") if w]
    if suffix and not suffix.startswith("_"):  # layout_bench_2026-11-30b: a second run, named by its commit
        words = [commit]
    named = []
    for word in prefix + words:
        if re.fullmatch(OLD_WORD + r"\d+", word):
            if commit is None:
                raise SystemExit(f"{old}: no commit to replace {word} with: add it to NAME")
            if commit not in prefix + words:
                named.append(commit)
        else:
            named.append(word)
    if not named:
        if commit is None:
            raise SystemExit(f"{old}: nothing to name the run by: add it to NAME")
        named = [commit]
    return f"{parts['date']}_{'_'.join(named)}.json"


def plan() -> list[tuple[str, str, dict, str]]:
    """(old name, new path under benchmarks/results/, old data, script) for every flat JSON file still there."""
    moves = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        script = script_of(path.name, data)
        moves.append((path.name, f"{folder(script)}/{new_name(path.name, data, script)}", data, script))
    targets = [move[1] for move in moves] + [str(p.relative_to(RESULTS)) for p in RESULTS.glob("*/*.json")]
    clashes = {t for t in targets if targets.count(t) > 1}
    if clashes:
        raise SystemExit(f"new names clash: {sorted(clashes)}")
    return moves


def convert(old: str, data: dict, script: str) -> dict:
    """The record of ``data`` (an old file's content) in record.py's schema, every field kept."""
    data = dict(data)
    filled = []
    record = {"benchmark": script}
    described = data.pop("benchmark", None)
    if described is not None and described != script:
        data["description"] = described
    command = data.pop("command", None)
    if isinstance(command, list):
        data["commands"] = command
        command = " ; ".join(command)
    if command is None:
        command = "not recorded"
        filled.append("command: not recorded in the original")
    record["command"] = command
    if "commit" in data:
        if "git_commit" in data:
            raise SystemExit(f"{old}: both commit and git_commit")
        data["git_commit"] = data.pop("commit")
    if "date" not in data:
        data["date"] = DATED.match(old)["date"]
        filled.append("date: from the file name")
    if "git_commit" not in data and old in COMMIT:
        data["git_commit"] = COMMIT[old]
        filled.append("git_commit: from its note")
    if "git_commit" not in data:
        commits = []
        runs = data.get("runs", [])
        for run in [*(runs.values() if isinstance(runs, dict) else runs), data.get("before"), data.get("after")]:
            if isinstance(run, dict) and ("commit" in run or "git_commit" in run):
                commits.append(re.split(r" \(", str(run.get("git_commit", run.get("commit"))))[0])
        data["git_commit"] = ", ".join(dict.fromkeys(commits)) if commits else "unknown"
        filled.append("git_commit: " + ("its runs' commits" if commits else "not recorded in the original"))
    for key in ENVIRONMENT:
        if key in data:
            record[key] = data.pop(key)
    if "method" in data:
        record["method"] = data.pop("method")
    elif "statistic" in data:
        record["method"] = data.pop("statistic")
    else:
        record["method"] = None
    record["summary"] = data.pop("summary", None)
    if "results" in data:
        results = data.pop("results")
    elif "lines" in data:
        results = data.pop("lines")
    else:
        results = {key: data.pop(key) for key in list(data) if key in MEASUREMENTS}
        if not results:
            raise SystemExit(f"{old}: no measurements found: {sorted(data)}")
    record.update(data)  # the rest, in their order, as extras
    if filled:
        record["migration"] = "; ".join(filled)
    record["results"] = results
    return validate(record)


def _leaves(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}/{index}")
    else:
        yield path, value


def check_lossless(old: str, data: dict, record: dict, texts: dict[str, str]) -> None:
    """Every value of the old file is in the record, at its place or where :func:`convert` moved it."""
    moved = {"commit": "git_commit", "statistic": "method", "lines": "results", "results": "results"}
    if "results" not in data and "lines" not in data:
        moved.update({key: f"results/{key}" for key in MEASUREMENTS})
    if data.get("benchmark") != record["benchmark"]:
        moved["benchmark"] = "description"
    if isinstance(data.get("command"), list):
        moved["command"] = "commands"
    new = dict(_leaves(record))
    for path, value in _leaves(data):
        top, _, rest = path[1:].partition("/")
        where = "/" + moved.get(top, top) + ("/" + rest if rest else "")
        value = texts.get(value, value) if isinstance(value, str) else value
        if where not in new or new[where] != value:
            raise SystemExit(f"{old}: {path} = {value!r:.80} is not at {where} in the record")


def scrub(text: str) -> str:
    for pattern, replacement in SCRUB:
        text = re.sub(pattern, replacement, text)
    return text


class Renamer:
    """Old result file names in a text -> new paths under benchmarks/results/ (exact names, globs, {a,b},
    ``..._suffix.json`` abbreviations)."""

    TOKEN = re.compile(
        r"(?:(?<=/)benchmarks/results/|(?<![\w.\-/*{},])(?:benchmarks/results/)?)(?:\.\.\.)?[\w.\-*{},]*\.json(?![\w\-])"
    )

    def __init__(self, renames: dict[str, str]):
        self.renames = renames
        self.new_paths = set(renames.values()) | {str(p.relative_to(RESULTS)) for p in RESULTS.glob("*/*.json")}
        self.unplaced: list[str] = []

    def _expand(self, pattern: str) -> list[str]:
        found = re.search(r"\{([^{}]*)\}", pattern)
        if not found:
            return [pattern]
        head, tail = pattern[: found.start()], pattern[found.end() :]
        return [p for alt in found.group(1).split(",") for p in self._expand(head + alt + tail)]

    def _glob(self, olds: list[str]) -> str:
        """Globs matching exactly the new paths of ``olds``, one per folder (``folder/*.json`` for a whole
        folder), else the paths themselves."""
        news = sorted(self.renames[o] for o in olds)
        if len(news) == 1:
            return news[0]
        groups: dict[str, list[str]] = {}
        for new in news:
            groups.setdefault(new.split("/")[0], []).append(new)
        parts = []
        for name, paths in groups.items():
            everything = sorted(p for p in self.new_paths if p.startswith(name + "/"))
            head = os.path.commonprefix(paths)
            tail = os.path.commonprefix([n[::-1] for n in paths])[::-1]
            pattern = f"{head}*{tail}" if len(head) + len(tail) <= min(len(n) for n in paths) else None
            if paths == everything:
                parts.append(f"{name}/*.json")
            elif pattern and sorted(p for p in self.new_paths if fnmatch.fnmatchcase(p, pattern)) == paths:
                parts.append(pattern)
            else:
                parts.extend(paths)
        return ", ".join(parts)

    def _abbreviation(self, text: str, suffix: str) -> list[str]:
        """The old names ``...`` + ``suffix`` (a name's end, or a glob of ends) stands for: the ones that share the
        longest prefix with the nearest full name in ``text`` (one, unless ``suffix`` is a glob); [] if unclear."""
        patterns = ["*" + p for p in self._expand(suffix)]
        candidates = [o for o in self.renames if any(fnmatch.fnmatchcase(o, p) for p in patterns) and o != suffix]
        if len(candidates) <= 1:
            return candidates
        before = re.findall(r"[\w\-]+_20\d\d-\d\d-\d\d[\w\-*{},]*\.json", text)
        if not before:
            return []
        nearest = re.split(r"[*{]", before[-1])[0]
        shared = {o: len(os.path.commonprefix([o, nearest])) for o in candidates}
        best = [o for o in candidates if shared[o] == max(shared.values())]
        glob = any(c in suffix for c in "*{")
        return best if glob or len(best) == 1 else []

    def rewrite(self, text: str, context: str | None = None) -> str:
        """``text`` with old names replaced; ``context``: the old name of the file the text is in (for its
        ``..._suffix.json`` abbreviations)."""
        out, last = [], 0
        for match in self.TOKEN.finditer(text):
            token = match.group(0)
            lead = "benchmarks/results/" if token.startswith("benchmarks/results/") else ""
            body = token[len(lead) :]
            if body.startswith(("...", "_")):
                source = (context or "") + " " + text[: match.start()]
                olds = self._abbreviation(source, body.lstrip("."))
                if not olds:
                    self.unplaced.append(token)
                    continue
                replacement = self._glob(olds)
            elif "*" in body or "{" in body:
                olds = sorted({o for p in self._expand(body) for o in self.renames if fnmatch.fnmatchcase(o, p)})
                if body == "*.json" and lead:
                    replacement = "*/*.json"
                elif not olds:
                    continue  # not a results pattern (or already new)
                else:
                    replacement = self._glob(olds)
            elif body in self.renames:
                replacement = self.renames[body]
            else:
                continue
            out.append(text[last : match.start()] + lead + replacement)
            last = match.end()
        out.append(text[last:])
        return "".join(out)


def load_renames() -> dict[str, str]:
    lines = RENAMES.read_text().splitlines()[1:]
    return dict(line.split("\t") for line in lines if line)


def _texts(value, fix):
    """``value`` (a JSON tree) with ``fix`` applied to every string in it (and to keys with OLD_WORD)."""
    if isinstance(value, dict):
        return {fix(k) if OLD_WORD in k.lower() else k: _texts(v, fix) for k, v in value.items()}
    if isinstance(value, list):
        return [_texts(v, fix) for v in value]
    return fix(value) if isinstance(value, str) else value


def migrate(dry: bool) -> int:
    moves = plan()
    renames = {old: new for old, new, _, _ in moves}
    if RENAMES.exists():
        renames = {**load_renames(), **renames}
    renamer = Renamer(renames)
    changed: dict[str, str] = {}
    for old, new, data, script in moves:

        def fix(text, old=old):
            fixed = renamer.rewrite(scrub(text), context=old)
            if fixed != text:
                changed[text] = fixed
            return fixed

        record = convert(old, data, script)
        record = _texts(record, fix)
        check_lossless(old, data, record, changed)
        if re.search(OLD_WORD, json.dumps(record), re.IGNORECASE):
            raise SystemExit(f"{old}: {OLD_WORD!r} left in {json.dumps(record)[:200]}")
        if dry:
            kept = sorted(set(data) - set(record))
            print(f"{old}\t{new}\t{'moved: ' + ', '.join(kept) if kept else ''}")
            continue
        target = RESULTS / new
        target.parent.mkdir(exist_ok=True)
        subprocess.run(["git", "mv", str(RESULTS / old), str(target)], check=True, cwd=ROOT)
        with open(target, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    if dry:
        for text, fixed in changed.items():
            print(f"\n- {text[:300]}\n+ {fixed[:300]}")
    if renamer.unplaced:
        print("unplaced abbreviations:", renamer.unplaced, file=sys.stderr)
    if not dry:
        rows = "".join(f"{old}\t{new}\n" for old, new in sorted(renames.items()))
        RENAMES.write_text("old_name\tnew_path_under_benchmarks_results\n" + rows)
        print(f"{len(moves)} files moved and converted; {RENAMES.relative_to(ROOT)} written")
    return 0


def rewrite_files(paths: list[str]) -> int:
    renamer = Renamer(load_renames())
    for path in paths:
        text = Path(path).read_text()
        new = renamer.rewrite(text)
        if new != text:
            Path(path).write_text(new)
            print(f"{path}: rewritten")
    for token in renamer.unplaced:
        print(f"not placed (rewrite by hand): {token}")
    return 1 if renamer.unplaced else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="print what would be done, change nothing")
    parser.add_argument("--rewrite", nargs="+", metavar="FILE", help="replace old result names in these files")
    args = parser.parse_args()
    if args.rewrite:
        return rewrite_files(args.rewrite)
    return migrate(args.plan)


if __name__ == "__main__":
    sys.exit(main())

"""The index of benchmarks/results/ (its README.md): each folder, what its benchmark measures, the command that
produces a record there, and its files (date, commit, one line of summary).

    python tools/results_index.py            # writes benchmarks/results/README.md
    python tools/results_index.py --check    # exits 1 where README.md is not what this writes (the tests run it)
    python tools/results_index.py --uncited  # the records no doc, test or source cites (what a pruning may delete)

A file counts as cited where a tracked or new (not ignored) text file outside benchmarks/results/ names it: by its
path (``norms/2026-11-30_70d9b99.json``, with or without ``benchmarks/results/``), its bare name, its old name
(benchmarks/results/RENAMES.tsv), a ``*`` glob or ``{a,b}`` alternatives matching either, or a ``..._suffix.json``
abbreviation (every name ending so).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
RENAMES = RESULTS / "RENAMES.tsv"
sys.path.insert(0, str(ROOT / "benchmarks"))
from record import RETIRED, folder  # noqa: E402

# What each benchmark measures, and the command that writes a record of it (OUT: its path in the folder).
BENCHMARKS = {
    "compile_times": (
        "cold compile time of each example kernel and host_overhead's noop6 (trace, lowering, PTX, ptxas; disk cache "
        "bypassed); CPU",
        "python benchmarks/compile_times.py --json OUT",
    ),
    "cublas_kernels": (
        "which cuBLAS kernel torch.matmul runs per GEMM shape (tile, stages, cluster in its name) and its time",
        "python benchmarks/cublas_kernels.py --json OUT --commit C",
    ),
    "gemm_bench": (
        "bf16 GEMM against cuBLAS in one process: squares, the 70-shape `--sweep`, `--explore` (every candidate "
        "config), `--config` (explicit configs)",
        "python benchmarks/gemm_bench.py --sweep --repeats 5 --json OUT --commit C",
    ),
    "gemm_profile": (
        "Nsight Compute sections of one GEMM launch, ours beside cuBLAS (figures copied from ncu's report)",
        "ncu --clock-control none --profile-from-start off --section ... python benchmarks/gemm_profile.py M N K",
    ),
    "host_layer_cpu": (
        "host time per call of flydsl.torch's own layer (checks, allocation, plans, autograd, replays) with the zoo's "
        "launches stubbed, against torch's op on tiny CPU tensors; CPU",
        "python benchmarks/host_layer_cpu.py --json OUT --commit C",
    ),
    "host_overhead": (
        "host time per call of the zoo's ops (functional, op, direct) against torch eager, fwd and fwd+bwd; the "
        "launch levels beneath them against torch, Triton, cuda-bindings; the cold start",
        "python benchmarks/host_overhead.py --json OUT --commit C",
    ),
    "import_time": (
        "what a zoo op's first call imports before it can launch (python -X importtime in fresh processes, grouped: "
        "the native extension, the MLIR bindings, flydsl.expr, ...); CPU",
        "python benchmarks/import_time.py --runs 5 --json OUT",
    ),
    "isolation_bench": (
        "what compiling in a forked child (the default) adds to a compile of MLIR text and to the opt CLI; CPU",
        "python benchmarks/isolation_bench.py --reps 80 --json OUT",
    ),
    "layout_bench": (
        "time of the layout algebra on typical GEMM tile layouts (cold and memoized); CPU",
        "python benchmarks/layout_bench.py --json OUT",
    ),
    "norms_bench": (
        "effective bandwidth (TB/s) of softmax, layer_norm, rms_norm, fused_add_rms_norm forward and backward "
        "against copy, torch, torch.compile (and Liger) per (kernel, dtype, N), M x N = 2^28; probes of the "
        "register and looped forwards",
        "python benchmarks/norms_bench.py --backward --reps 7 --out OUT --commit C",
    ),
    "norms_backward_staged": (
        "the staged LayerNorm/RMSNorm backward against the register kernel, kernel alone: grids, ring depths, "
        "explicit `--configs`, `--api` (the public call); ncu of it",
        "python benchmarks/norms_backward_staged.py --out OUT --commit C [--configs ...] [--api]",
    ),
    "norms_forward_staged": (
        "the staged norm and softmax forwards as routed against the register kernel and copy (N >= 32768), "
        "`--sweep` of other staged shapes; probes over its launchers",
        "python benchmarks/norms_forward_staged.py --out OUT --commit C [--sweep --shapes ...]",
    ),
    "norms_profile": (
        "Nsight Compute sections of one norm/softmax forward launch, ours beside torch.compile's kernel "
        "(figures copied from ncu's report)",
        "ncu --clock-control none --profile-from-start off --section ... python benchmarks/norms_profile.py "
        "KERNEL N DTYPE",
    ),
    "blockscale_gemm_bench": (
        "block-scaled fp8 GEMM (1 x 128 / 128 x 128 scales, bf16 out) against cuBLAS's blockwise `torch._scaled_mm`, "
        "DeepGEMM's `fp8_gemm_nt` (where tools/deepgemm-env.sh built it), our rowwise fp8_gemm, rowwise `_scaled_mm`, "
        "the bf16 gemm and (M <= 128) a same-bytes copy",
        "python benchmarks/blockscale_gemm_bench.py --sweep --repeats 5 --json OUT --commit C",
    ),
    "fp8_gemm_bench": (
        "fp8 GEMM (e4m3, per-token x per-channel scales, bf16 out) against rowwise and tensorwise "
        "`torch._scaled_mm`, the bf16 gemm and (M <= 16) a same-bytes copy; `--explore` its configs",
        "python benchmarks/fp8_gemm_bench.py --sweep --json OUT --commit C",
    ),
    "moe_bench": (
        "fused MoE (bf16 and fp8) from topk_ids to the output against torch's `_grouped_mm` / `_scaled_grouped_mm` "
        "pipelines and a loop over experts; stage kernels profiled; decode as a fraction of a same-bytes copy",
        "python benchmarks/moe_bench.py --repeats 5 --json OUT --commit C",
    ),
    "moe_decode_sweep": (
        "fused MoE at decode sizes taken apart: kernel times and the grouped skinny GEMM's configurations",
        "python benchmarks/moe_decode_sweep.py --json OUT --commit C",
    ),
    "paged_decode_ab": (
        "paged-decode kernel sources (decode.py of other commits, as files) timed against the working tree's on the "
        "same caches, next to a half copy and a read of the bytes",
        "python benchmarks/paged_decode_ab.py --variant main=exp/decode_REV.py@2,4 --json OUT --commit C",
    ),
    "paged_attention_bench": (
        "paged-attention decode (bf16, fp8 per tensor / per token caches) against a same-bytes copy, SDPA and "
        "FlashInfer",
        "python benchmarks/paged_attention_bench.py --repeats 2 --json OUT --commit C",
    ),
    "quantize_bench": (
        "fp8 quantization (bf16 -> e4m3 per token, tensor or 1 x 128 group) against torch eager, torch.compile and a "
        "same-bytes copy",
        "python benchmarks/quantize_bench.py --json OUT --commit C",
    ),
    "skinny_gemm_bench": (
        "skinny GEMM (M <= 16) against cuBLAS, gemm_ws and a same-bytes copy: time and weight TB/s after an L2 "
        "flush or over rotating weights; `--explore` its configs",
        "python benchmarks/skinny_gemm_bench.py --flush rotate --repeats 3 --json OUT --commit C",
    ),
    "softmax_backward_staged": (
        "softmax backward on the staged kernel (as routed and `--shapes`) against the register kernel and copy",
        "python benchmarks/softmax_backward_staged.py --out OUT --commit C",
    ),
    "tiled_copy_bandwidth": (
        "a Fly-tensor tiled copy over 2^30 fp32 elements against torch's copy_",
        "python benchmarks/tiled_copy_bandwidth.py --json OUT",
    ),
}
# Retired scripts (record.RETIRED): what their records measured; the command in each record is history.
RETIRED_WHAT = {
    "dsl_dispatch": "the DSL's host costs: dispatch per launch (native dispatcher, Python path) against peers, cold "
    "compile, a first call from the disk cache",
    "gemm_host_overhead": "host time per `gemm()` call and per bare launch, against torch.matmul",
    "launch_overhead": "host time per kernel launch from Python: the native launcher against torch, Triton, "
    "cuda-bindings",
    "norms_host_time": "where a norm forward call's time goes: host time, the call alone, queued behind a sleep, "
    "profiler time",
    "torch_ops_overhead": "host time per `torch.ops.flydsl.*` call (inference and fwd+bwd) against the direct call "
    "and torch",
}
TOKEN = re.compile(r"[\w.\-*{},/]*\.json(?![\w\-])")


def records() -> dict[str, dict]:
    """Every record under benchmarks/results/, by its path there (``folder/name.json``)."""
    return {str(p.relative_to(RESULTS)): json.loads(p.read_text()) for p in sorted(RESULTS.glob("*/*.json"))}


def renames() -> dict[str, str]:
    """Old name -> new path under benchmarks/results/ (RENAMES.tsv)."""
    if not RENAMES.exists():
        return {}
    rows = [line.split("\t") for line in RENAMES.read_text().splitlines()[1:] if line]
    return {old: new for old, new in rows}


def _sentence(text: str, limit: int = 150) -> str:
    text = " ".join(str(text).split())
    depth = 0
    for at, char in enumerate(text):  # the first sentence: up to ". " or "; " outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".;" and text[at + 1 : at + 2] == " " and re.match(r"[a-z0-9)%]", text[at - 1]):
            text = text[:at] + "."
            break
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return text.replace("|", "/")


def _numbers(summary: dict) -> str:
    parts = []
    for key, value in summary.items():
        if key in ("seconds", "wall_s"):
            continue  # bookkeeping, not a finding
        if isinstance(value, dict):
            inner = _numbers(value)
            if inner:
                parts.append(f"{key}: {inner}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{key} {value:.3g}")
        if len(parts) == 3:
            break
    return ", ".join(parts)


def _bars(rows: list[dict]) -> str:
    """norms_bench: how many cells met the bar, forward and backward, in GPU time where measured."""
    parts = []
    for name, key in (("forward", "meets_bar"), ("backward", "backward_meets_bar")):
        gpu = all(r.get(key + "_gpu") is not None for r in rows if r.get(key) is not None)
        flags = [r[key + "_gpu" if gpu else key] for r in rows if r.get(key) is not None]
        if flags:
            parts.append(f"{name} {sum(map(bool, flags))}/{len(flags)}")
            timed = "GPU time" if gpu else "wall time"
    return f"{', '.join(parts)} cells at the bar ({timed})"


def one_line(record: dict) -> str:
    """A line saying what a record found: its summary or note, else for norms_bench the cells at the bar, else
    its summary's first numbers, else the arguments it ran with."""
    for key in ("summary", "note", "notes", "summary_note"):
        value = record.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str) and value.strip():
            return _sentence(value)
    rows = record["results"] if isinstance(record["results"], list) else []
    if rows and all(isinstance(r, dict) for r in rows) and any("meets_bar" in k for r in rows for k in r):
        return _bars(rows)
    if isinstance(record.get("summary"), dict) and _numbers(record["summary"]):
        return _numbers(record["summary"]).replace("|", "/")
    if record.get("description"):
        return _sentence(record["description"])
    arguments = " ".join(re.sub(r"--(out|json|commit)[ =]\S+", "", record["command"].split(".py", 1)[-1]).split())
    results = record["results"]
    return _sentence(f"`{arguments}`" if arguments else f"default arguments, {len(results)} results")


def _commit(record: dict) -> str:
    commit = str(record["git_commit"])
    found = re.match(r"[0-9a-f]{7,40}", commit)
    if not found:
        return _sentence(commit, 20)
    return found.group(0)[:7] + ("+" if commit[len(found.group(0)) :].strip() else "")


def _what(script: str) -> str:
    return RETIRED_WHAT[script] if script in RETIRED else BENCHMARKS[script][0]


def index() -> str:
    """The text of benchmarks/results/README.md."""
    found = records()
    by_folder: dict[str, list[str]] = {}
    for path in found:
        by_folder.setdefault(path.split("/")[0], []).append(path)
    scripts = {folder(b): b for b in [*BENCHMARKS, *RETIRED]}
    lines = [
        "# Benchmark results",
        "",
        "<!-- Written by `python tools/results_index.py`; do not edit: `--check` (run by the tests) compares. -->",
        "",
        "Each benchmark's runs live in its folder, `benchmarks/results/<folder>/<date>_<what>.json`, as one JSON",
        "record (`benchmarks/record.py`: `benchmark`, `command`, `date`, `git_commit`, the environment (`python`,",
        "`torch`, `gpu`, `cuda`, `driver`, `triton` where known), `method`, `summary`, `results`, and extras such as",
        "`note`); `<what>` names the run in a few words or by the commit measured. `record.validate` checks a record;",
        "`tests/kernels/test_results_records.py` checks every file here and this index.",
        "",
        "`RENAMES.tsv` maps the old names (the files were flat here, in several schemas) to these paths; the",
        "conversion: `tools/results_migrate.py`.",
        "`python tools/results_index.py --uncited` lists the records no doc, test or source cites.",
        "",
        "| folder | script | runs | measures |",
        "|---|---|---|---|",
    ]
    for name in sorted(by_folder):
        script = scripts.get(name)
        what = _what(script) if script else "(not described: add it to tools/results_index.py)"
        link = f"`benchmarks/{script}.py`" if script else "?"
        if script in RETIRED:
            link += f" (retired: `{RETIRED[script]}.py`)"
        lines.append(f"| [{name}/](#{name}) | {link} | {len(by_folder[name])} | {what} |")
    for name in sorted(by_folder):
        script = scripts.get(name)
        lines += ["", f"## {name}", ""]
        if script in RETIRED:
            what = _what(script)
            successor = f"`benchmarks/{RETIRED[script]}.py` measures this now"
            lines += [f"{what[0].upper() + what[1:]}. Retired: {successor} (each record names its command).", ""]
        elif script:
            out = f"benchmarks/results/{name}/<date>_<what>.json"
            lines += [BENCHMARKS[script][0][0].upper() + BENCHMARKS[script][0][1:] + ".", ""]
            lines += [f"    {BENCHMARKS[script][1].replace('OUT', out)}", ""]
        lines += ["| file | date | commit | summary |", "|---|---|---|---|"]
        for path in by_folder[name]:
            record = found[path]
            file = path.split("/", 1)[1]
            lines.append(f"| [{file}]({path}) | {record['date']} | {_commit(record)} | {one_line(record)} |")
    return "\n".join(lines) + "\n"


def _expand(pattern: str) -> list[str]:
    found = re.search(r"\{([^{}]*)\}", pattern)
    if not found:
        return [pattern]
    head, tail = pattern[: found.start()], pattern[found.end() :]
    return [p for alt in found.group(1).split(",") for p in _expand(head + alt + tail)]


def cited_by(text: str, paths: list[str], old: dict[str, str]) -> set[str]:
    """The records (paths under benchmarks/results/) that ``text`` names, in any of the ways the module docstring
    lists; a ``..._suffix.json`` abbreviation names the old names ending so that share the longest prefix with the
    nearest full old name before it (all of them where there is none)."""
    bare: dict[str, list[str]] = {}
    for path in paths:
        bare.setdefault(path.split("/", 1)[1], []).append(path)
    names = {**{o: [n] for o, n in old.items()}, **bare}  # a bare name: old, or new in any folder
    cited = set()
    for match in TOKEN.finditer(text):
        found = match.group(0)
        for token in found.split(",") if "{" not in found else [found]:
            if "/" in token:
                token = token[token.rfind("/", 0, token.rfind("/")) + 1 :]  # folder/name, whatever came before
                if token.split("/")[0] == "results":
                    token = token.split("/", 1)[1]  # benchmarks/results/old_name.json
            for pattern in _expand(token):
                if re.fullmatch(r"\*+\.json", pattern.split("/")[-1]):
                    continue  # every file (benchmarks/results/*.json): no citation of any one
                if "/" in pattern:
                    cited |= {p for p in paths if fnmatch.fnmatchcase(p, pattern)}
                    continue
                if pattern.startswith(("...", "_")):
                    matching = [o for o in old if fnmatch.fnmatchcase(o, "*" + pattern.lstrip("."))]
                    before = re.findall(r"[A-Za-z][\w\-]*_20\d\d-\d\d-\d\d[\w\-*{},]*\.json", text[: match.start()])
                    if before and matching:
                        nearest = re.split(r"[*{]", before[-1])[0]
                        shared = {o: len(os.path.commonprefix([o, nearest])) for o in matching}
                        matching = [o for o in matching if shared[o] == max(shared.values())]
                    cited |= {old[o] for o in matching}
                elif "*" in pattern:
                    cited |= {p for name, ps in names.items() if fnmatch.fnmatchcase(name, pattern) for p in ps}
                else:
                    cited |= set(names.get(pattern, []))
    return cited & set(paths)


def uncited() -> list[str]:
    """The records that no text file outside benchmarks/results/ (tracked, or new and not ignored) names."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split("\n")
    skip = ("benchmarks/results/", "tools/results_index.py", "tools/results_migrate.py")
    paths, old = list(records()), {o: n for o, n in renames().items()}
    cited: set[str] = set()
    for name in listed:
        if not name or name.startswith(skip) or not (ROOT / name).is_file():
            continue
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if ".json" in text:
            cited |= cited_by(text, paths, old)
    return [p for p in paths if p not in cited]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where README.md is not current")
    parser.add_argument("--uncited", action="store_true", help="list the records nothing cites")
    args = parser.parse_args()
    if args.uncited:
        left = uncited()
        counts: dict[str, int] = {}
        for path in records():
            counts[path.split("/")[0]] = counts.get(path.split("/")[0], 0) + 1
        for path in left:
            alone = counts[path.split("/")[0]] == 1
            print(f"benchmarks/results/{path}" + ("  (the only record of its benchmark)" if alone else ""))
        print(f"{len(left)} of {len(records())} records cited nowhere", file=sys.stderr)
        return 0
    text = index()
    if args.check:
        if not INDEX.exists() or INDEX.read_text() != text:
            print(f"{INDEX.relative_to(ROOT)} is out of date: run python tools/results_index.py", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text)
    print(f"{INDEX.relative_to(ROOT)}: {len(records())} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())

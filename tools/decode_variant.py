"""A commit's paged-decode kernel as files for ``benchmarks/paged_decode_ab.py --variant NAME=PATH``: its
``decode.py``, made to import the ``chunk.py`` of the same commit from a file beside it (the GPU machine has no git,
and ``decode`` imports ``flydsl.kernels.attention.chunk``, which would be the working tree's).

    python tools/decode_variant.py 690a143 exp/      # exp/decode_690a143.py and exp/chunk_690a143.py
    # then, on the GPU machine: python3 benchmarks/paged_decode_ab.py --variant old=exp/decode_690a143.py@2,4 ...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

FOLDER = "packages/flydsl-kernels/src/flydsl/kernels/attention"
IMPORT = "from flydsl.kernels.attention.chunk import "


def show(rev: str, name: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{FOLDER}/{name}"], capture_output=True, text=True, check=True).stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="a git revision")
    parser.add_argument("folder", help="where to write decode_REV.py and chunk_REV.py")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    decode = show(args.rev, "decode.py")
    lines = decode.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.startswith(IMPORT)]
    if found:  # a commit since chunk.py split out of decode.py
        names = lines[found[0]][len(IMPORT) :].strip()
        lines[found[0]] = (
            "import importlib.util as _iu  # this commit's chunk module, from the file beside this one\n"
            "import pathlib as _pl\n\n"
            f'_spec = _iu.spec_from_file_location("chunk_{args.rev}",'
            f' _pl.Path(__file__).with_name("chunk_{args.rev}.py"))\n'
            "_chunk = _iu.module_from_spec(_spec)\n"
            "_spec.loader.exec_module(_chunk)\n"
            f"{names} = {', '.join(f'_chunk.{n.strip()}' for n in names.split(','))}\n"
        )
        (folder / f"chunk_{args.rev}.py").write_text(show(args.rev, "chunk.py"))
    (folder / f"decode_{args.rev}.py").write_text("".join(lines))
    print(f"{folder / f'decode_{args.rev}.py'}" + (f" (+ chunk_{args.rev}.py)" if found else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

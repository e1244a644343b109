"""``python -m flydsl.layout LAYOUT [--svg FILE] [--val VAL_LAYOUT]``: print or draw a layout from CuTe notation.

With ``--val``, LAYOUT is a thread layout and the TV layout of ``make_layout_tv(LAYOUT, VAL_LAYOUT)`` is shown.
"""

from __future__ import annotations

import argparse
import sys

from .draw import draw, print_layout
from .leaf import LayoutError
from .parse import parse_layout
from .tv import make_layout_tv

__all__ = ["main"]


def main(argv=None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m flydsl.layout", description="Print or draw a CuTe layout.")
    parser.add_argument("layout", help='a layout in CuTe notation, e.g. "(4,8):(8,1)"')
    parser.add_argument("--svg", metavar="FILE", help="write an SVG picture instead of printing a table")
    parser.add_argument("--val", metavar="LAYOUT", help="value layout: draw make_layout_tv(layout, val)")
    args = parser.parse_args(argv)
    try:
        subject = parse_layout(args.layout)
        if args.val is not None:
            subject = make_layout_tv(subject, parse_layout(args.val))
        if args.svg:
            draw(subject, args.svg)
            print(f"wrote {args.svg}")
        else:
            print_layout(subject)
    except LayoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m flydsl.layout LAYOUT [--svg FILE [--bytes N]] [--val VAL_LAYOUT]``: print or draw a layout from CuTe
notation (a shape alone, ``"(4,8)"``, is ``Layout((4, 8))``).

With ``--val``, LAYOUT is a thread layout and the TV layout of ``make_layout_tv(LAYOUT, VAL_LAYOUT)`` is shown.
``--bytes`` colours the picture's cells by 16-byte chunk of N-byte elements.
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
    parser.add_argument("layout", help='a layout in CuTe notation, e.g. "(4,8):(8,1)", or a shape alone: "(4,8)"')
    parser.add_argument("--svg", metavar="FILE", help="write an SVG picture instead of printing a table")
    parser.add_argument("--bytes", type=int, metavar="N", help="SVG: colour cells by 16-byte chunk of N-byte elements")
    parser.add_argument("--val", metavar="LAYOUT", help="value layout: draw make_layout_tv(layout, val)")
    args = parser.parse_args(argv)
    try:
        subject = parse_layout(args.layout)
        if args.val is not None:
            subject = make_layout_tv(subject, parse_layout(args.val))
        if args.svg:
            draw(subject, args.svg, element_bytes=args.bytes)
            print(f"wrote {args.svg}")
        else:
            print_layout(subject)
    except LayoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

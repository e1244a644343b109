"""Draws the picture of docs/moe.md into docs/images/moe/ (PNG, matplotlib).

    python docs/images/make_moe_pictures.py      # needs matplotlib (pip install matplotlib), no GPU

* ``token_flow.png``: four tokens routed top-2 over three experts, through align (the (token, slot) pairs sorted by
  expert, each expert's run padded to a block of 4 rows), the gather, stage 1 (each block times its expert's w1,
  gated), stage 2 (times w2) and the combine (each token's two rows, weighted, in slot order).

The routing is made up for the drawing; the steps are the kernels' (flydsl.kernels.moe.experts).
"""

from __future__ import annotations

import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "moe"
EXPERT_COLORS = ("#4c72b0", "#dd8452", "#55a868")
EXPERT_LIGHT = ("#c9d5ea", "#f4d6c2", "#c8e3cf")
PAD = "#e6e6e6"
DPI = 100
ROUTING = [(0, 2), (1, 0), (0, 1), (2, 0)]  # token t's experts, slot 0 then slot 1
BLOCK = 4


def _box(ax, x, y, w, h, text="", face="white", edge="black", size=9, weight="normal"):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, linewidth=1.0))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def _arrow(ax, start, end, color="black"):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=color, lw=1.0))


def aligned_rows():
    """[(token, slot, expert) or None for padding] in the aligned order, and each block's expert."""
    rows, experts_of_block = [], []
    for e in range(len(EXPERT_COLORS)):
        run = [(t, s, e) for t, pair in enumerate(ROUTING) for s, x in enumerate(pair) if x == e]
        padded = -(-len(run) // BLOCK) * BLOCK
        rows += run + [None] * (padded - len(run))
        experts_of_block += [e] * (padded // BLOCK)
    return rows, experts_of_block


def token_flow(plt, path):
    fig = plt.figure(figsize=(14.4, 6.6), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 144)
    ax.set_ylim(0, 66)
    ax.axis("off")
    rows, experts_of_block = aligned_rows()
    row_h, top = 3.6, 58
    titles = [
        (12, "x (T, H) and routing"),
        (33, "align_tokens + gather\nA (capacity, H)"),
        (62, "stage 1: A @ w1[e]^T\nh = silu(gate) * up"),
        (93, "stage 2: h @ w2[e]^T\ny (capacity, H)"),
        (126, "combine\nout[t] = sum_s w[t, s] y[row]"),
    ]
    for x, title in titles:
        ax.text(x, top + 4.5, title, ha="center", va="bottom", fontsize=10, weight="bold")
    # tokens with their experts
    for t, pair in enumerate(ROUTING):
        y = top - (t + 1) * 2 * row_h
        _box(ax, 1, y, 9, row_h * 1.6, f"x[{t}]", face="white")
        for s, e in enumerate(pair):
            _box(ax, 11 + 3.2 * s, y, 3, row_h * 1.6, f"e{e}", face=EXPERT_LIGHT[e], size=8)
    # the aligned rows, then the two stages per block, then y
    columns = {"a": (27, 12), "h": (57, 10), "y": (88, 12)}
    for i, row in enumerate(rows):
        y = top - (i + 1) * row_h
        for name, (x, w) in columns.items():
            if row is None:
                _box(ax, x, y, w, row_h, "pad", face=PAD, size=7)
            else:
                t, s, e = row
                label = {"a": f"x[{t}]  (t{t}, s{s})", "h": f"h  (t{t}, s{s})", "y": f"y  (t{t}, s{s})"}[name]
                _box(ax, x, y, w, row_h, label, face=EXPERT_LIGHT[e], size=7)
    for b, e in enumerate(experts_of_block):
        y0 = top - (b + 1) * BLOCK * row_h
        for x in (41, 71):
            _box(ax, x, y0 + 0.4, 10, BLOCK * row_h - 0.8, f"block {b}\nexpert {e}", face=EXPERT_COLORS[e], size=8)
            ax.texts[-1].set_color("white")
        _arrow(ax, (39.5, y0 + BLOCK * row_h / 2), (41, y0 + BLOCK * row_h / 2))
        _arrow(ax, (51, y0 + BLOCK * row_h / 2), (57, y0 + BLOCK * row_h / 2))
        _arrow(ax, (67, y0 + BLOCK * row_h / 2), (71, y0 + BLOCK * row_h / 2))
        _arrow(ax, (81, y0 + BLOCK * row_h / 2), (88, y0 + BLOCK * row_h / 2))
    # the combine: each token's rows, in slot order
    position = {(row[0], row[1]): i for i, row in enumerate(rows) if row is not None}
    for t in range(len(ROUTING)):
        y = top - (t + 1) * 2 * row_h
        _box(ax, 118, y, 16, row_h * 1.6, f"out[{t}]", face="white")
        for s in range(2):
            i = position[(t, s)]
            _arrow(ax, (100, top - (i + 0.5) * row_h), (118, y + row_h * (1.2 - 0.8 * s)), color="#777777")
    ax.text(
        72,
        3,
        "Pad rows (each expert's run rounded up to a block) are multiplied but never gathered or combined; "
        "the combine adds slot 0 then slot 1, so the output does not depend on the order of the rows.",
        ha="center",
        fontsize=9,
    )
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("make_moe_pictures: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    OUT.mkdir(exist_ok=True)
    token_flow(plt, OUT / "token_flow.png")
    print(f"wrote {OUT / 'token_flow.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

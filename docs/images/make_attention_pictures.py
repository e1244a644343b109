"""Draws the pictures of docs/attention.md into docs/images/attention/ (PNG, matplotlib).

    python docs/images/make_attention_pictures.py      # needs matplotlib (pip install matplotlib), no GPU

* ``paged_layout.png``: three sequences' block tables pointing at scattered blocks of the paged cache (num_blocks,
  block_size, Hkv, D), and one block's rows: block_size tokens x Hkv heads, D contiguous values each.
* ``split_merge.png``: one sequence's context cut into splits, each split's CTA with its warps' 16-token chunks,
  each split's partial (max, sum, O), and the last CTA to finish merging them.

The numbers in the pictures (block ids, lengths, split sizes) are made up for the drawing, laid out as the kernels
lay them out (block_size 16, 4 warps per CTA, chunks of 16 tokens).
"""

from __future__ import annotations

import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "attention"
BLOCK_SIZE = 16
COLORS = ("#4c72b0", "#dd8452", "#55a868")  # one per sequence
LIGHT = ("#c9d5ea", "#f4d6c2", "#c8e3cf")
FREE = "#e6e6e6"
WARP_COLORS = ("#8da0cb", "#fc8d62", "#66c2a5", "#e78ac3")
DPI = 100


def _box(ax, x, y, w, h, text="", face="white", edge="black", size=9, weight="normal", **kw):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, linewidth=kw.pop("lw", 1.0), **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def _arrow(ax, start, end, color="black", rad=0.0, style="-|>", lw=1.2, ls="-"):
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops=dict(arrowstyle=style, color=color, lw=lw, ls=ls, connectionstyle=f"arc3,rad={rad}"),
    )


def _canvas(plt, width, height):
    fig = plt.figure(figsize=(width / 10, height / 10), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def paged_layout(plt, path):
    """Block tables -> scattered cache blocks -> one block's (token, head) rows."""
    fig, ax = _canvas(plt, 134, 66)
    sequences = [(40, [7, 2, 10]), (20, [4, 11]), (55, [0, 9, 5, 3])]  # (context length, blocks in order)
    num_blocks, max_blocks = 12, 4
    owner = {block: (b, i) for b, (_, blocks) in enumerate(sequences) for i, block in enumerate(blocks)}

    # Left: the block tables and context lengths.
    ax.text(2, 61.5, "block_tables (B, max_blocks) int32", fontsize=10, weight="bold")
    ax.text(2, 58.5, "context_lens (B,) int32", fontsize=10, weight="bold")
    cell, cells_x = 5.2, 13
    table_y = {}
    for b, (length, blocks) in enumerate(sequences):
        y = 50 - 9 * b
        table_y[b] = y
        ax.text(2, y + 2, f"b = {b}", fontsize=9, va="center", color=COLORS[b], weight="bold")
        ax.text(2, y - 1.2, f"len {length}", fontsize=8, va="center", color=COLORS[b])
        for i in range(max_blocks):
            if i < len(blocks):
                _box(ax, cells_x + i * cell, y, cell, 4, str(blocks[i]), face=LIGHT[b], edge=COLORS[b], size=9)
            else:
                _box(ax, cells_x + i * cell, y, cell, 4, "-", face="white", edge="#999999", size=9)
        for i in range(max_blocks):
            ax.text(cells_x + (i + 0.5) * cell, y - 1.3, f"{16 * i}..", fontsize=6, ha="center", color="#666666")
    ax.text(
        2,
        20.5,
        "entry i of row b: the block that holds\npositions 16 i .. 16 i + 15 of sequence b\n"
        "(entries past the context are not used)",
        fontsize=8,
        va="top",
    )

    # Middle: the cache's blocks, colored by the sequence that owns them, filled as far as its context goes.
    cache_x, block_w, block_h, top = 50, 16, 3.9, 57
    ax.text(cache_x - 6, 61.5, "k_cache, v_cache", fontsize=10, weight="bold")
    ax.text(cache_x - 6, 58.5, "(num_blocks, block_size, Hkv, D)", fontsize=8)
    ax.text(cache_x - 6, 8.8, "bX: p-q = sequence X's positions p..q", fontsize=8)
    block_y = {}
    for block in range(num_blocks):
        y = top - (block + 1) * block_h
        block_y[block] = y
        ax.text(cache_x - 1, y + block_h / 2, str(block), fontsize=8, ha="right", va="center")
        if block not in owner:
            _box(ax, cache_x, y, block_w, block_h, "free", face=FREE, edge="#999999", size=7)
            continue
        b, i = owner[block]
        length = sequences[b][0]
        used = min(BLOCK_SIZE, length - 16 * i)
        _box(ax, cache_x, y, block_w, block_h, face="white", edge=COLORS[b])
        _box(ax, cache_x, y, block_w * used / BLOCK_SIZE, block_h, face=LIGHT[b], edge=COLORS[b], lw=0)
        _box(ax, cache_x, y, block_w, block_h, face="none", edge=COLORS[b])
        ax.text(
            cache_x + block_w / 2,
            y + block_h / 2,
            f"b{b}: {16 * i}-{16 * i + used - 1}",
            fontsize=7,
            ha="center",
            va="center",
        )
    for b, (_, blocks) in enumerate(sequences):
        for i, block in enumerate(blocks):
            start = (cells_x + (i + 0.5) * cell, table_y[b] + 0.9)
            ax.plot(*start, marker="o", markersize=2.5, color=COLORS[b])
            end = (cache_x - 2.6, block_y[block] + block_h / 2)
            _arrow(ax, start, end, color=COLORS[b], rad=-0.08 * (1 if block_y[block] > table_y[b] else -1), lw=0.9)

    # Right: block 10 (sequence 0, positions 32..47, context 40) row by row: token x head, D values each.
    zoom_block, first = 10, 32
    zx, zy, row_h, head_w = 88, 12.5, 2.55, 19
    ax.text(zx - 6, 61.5, f"block {zoom_block}: (block_size, Hkv, D) = (16, 2, 128)", fontsize=10, weight="bold")
    ax.text(zx - 6, 58.8, "row r: token r of the block; per head, D contiguous values", fontsize=8)
    for head in range(2):
        ax.text(zx + (head + 0.5) * head_w, zy + 16 * row_h + 1.2, f"head {head}", fontsize=9, ha="center")
    for r in range(BLOCK_SIZE):
        y = zy + (BLOCK_SIZE - 1 - r) * row_h
        written = first + r < sequences[0][0]
        for head in range(2):
            face = LIGHT[0] if written else "white"
            _box(ax, zx + head * head_w, y, head_w, row_h, face=face, edge="#777777", lw=0.6)
            if written:
                ax.text(zx + head * head_w + 0.8, y + row_h / 2, "d = 0 1 2 ... 127", fontsize=6, va="center")
        ax.text(zx - 1, y + row_h / 2, f"{r}", fontsize=7, ha="right", va="center")
        ax.text(zx + 2 * head_w + 1, y + row_h / 2, f"pos {first + r}", fontsize=7, va="center", color="#444444")
    ax.text(zx + head_w, zy + 3.5 * row_h, "not written yet (positions >= len 40)", fontsize=8, ha="center",
            va="center", color="#555555", bbox=dict(facecolor="white", edgecolor="none"))  # fmt: skip
    ax.text(zx - 4.5, zy + 8 * row_h, "row", fontsize=7, rotation=90, va="center")
    y10 = block_y[zoom_block]
    for corner, target in ((y10 + block_h, zy + 16 * row_h), (y10, zy)):
        ax.plot([cache_x + block_w, zx - 5.5], [corner, target], color="#777777", lw=0.8, ls="--")

    ax.text(
        2,
        4.8,
        "position p of sequence b: block block_tables[b, p // block_size], row p % block_size;  write_kv's slot ="
        " block * block_size + row",
        fontsize=9,
    )
    ax.text(
        2,
        1.2,
        "element (block, row, head, d) at ((block * block_size + row) * Hkv + head) * D + d;  fp8 caches: one float32"
        " scale per tensor or per (block, row, head)",
        fontsize=9,
    )
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def split_merge(plt, path):
    """One sequence's context in splits and chunks; the CTAs' warps, partials and the last CTA's merge."""
    fig, ax = _canvas(plt, 134, 74)
    context, chunk, per_split, warps = 300, 16, 7, 4  # split_tokens = 7 chunks = 112 tokens
    chunks = -(-context // chunk)
    splits = -(-chunks // per_split)
    x0, cw = 8, 6.2

    ax.text(2, 70.5, f"one (sequence b, KV head) pair: context_len = {context} tokens, 16-token chunks,", fontsize=10)
    ax.text(2, 67.5, f"split_tokens = {per_split * chunk} (the plan's choice): {splits} splits = {splits} CTAs of the"
            " grid (splits, Hkv x row tiles, B)", fontsize=10)  # fmt: skip
    ax.text(84, 70.5, "m: a query row's largest logit (base 2)", fontsize=9)
    ax.text(84, 67.5, "l: its sum of 2^(logit - m); O: its output", fontsize=9)
    # The context as chunks, each colored by the warp of its split that takes it.
    y_bar = 58
    for c in range(chunks):
        split, local = divmod(c, per_split)
        warp = local % warps
        width = cw * min(chunk, context - c * chunk) / chunk
        _box(ax, x0 + c * cw, y_bar, width, 4, f"w{warp}", face=WARP_COLORS[warp], edge="black", size=8)
    for t in range(0, context + 1, 112):
        ax.text(x0 + t / chunk * cw, y_bar - 1.5, str(t), fontsize=7, ha="center")
    ax.text(x0 + context / chunk * cw, y_bar - 1.5, str(context), fontsize=7, ha="center")
    ax.text(x0 - 1, y_bar + 2, "tokens", fontsize=8, ha="right", va="center")
    for s in range(splits):
        left = x0 + s * per_split * cw
        right = x0 + min((s + 1) * per_split * cw, context / chunk * cw)
        ax.plot([left + 0.2, left + 0.2, right - 0.2, right - 0.2], [62.6, 63.6, 63.6, 62.6], color="black", lw=1)
        ax.text((left + right) / 2, 64.3, f"split {s}", fontsize=9, ha="center", weight="bold")

    # Each split's CTA: its warps' chunks, the online softmax in registers, the warps merged in shared memory.
    cta_w, cta_h, cta_y = 40, 30, 18
    cta_x = [2 + s * (cta_w + 4) for s in range(splits)]
    for s in range(splits):
        x = cta_x[s]
        _box(ax, x, cta_y, cta_w, cta_h, face="#fafafa", edge="black", lw=1.2)
        ax.text(x + 1, cta_y + cta_h - 2, f"CTA (split {s}, KV head, b): 4 warps", fontsize=9, weight="bold")
        mine = [c for c in range(chunks) if c // per_split == s]
        left = x0 + s * per_split * cw + per_split * cw / 2
        _arrow(ax, (min(left, x0 + context / chunk * cw - 12), y_bar - 2.5), (x + cta_w / 2, cta_y + cta_h + 0.3),
               color="#555555")  # fmt: skip
        for w in range(warps):
            taken = [c - s * per_split for c in mine if (c - s * per_split) % warps == w]
            y = cta_y + cta_h - 7 - 4.2 * w
            label = ", ".join(str(t) for t in taken) if taken else "none"
            _box(ax, x + 1, y, 9, 3.4, f"warp {w}", face=WARP_COLORS[w], size=8)
            noun = "chunks" if len(taken) > 1 else "chunk"
            ax.text(x + 11, y + 1.7, f"{noun} {label} of the split: running m, l, O", fontsize=7.5, va="center")
        ax.text(x + 1, cta_y + 6.2, "Q: the KV head's query rows (group x Q), in registers;\nper chunk: S = Q K^T,"
                " online softmax,\nO^T += V^T P^T (mma.sync, no shared memory)", fontsize=7, va="center",
                color="#333333")  # fmt: skip
        _box(ax, x + 1, cta_y + 0.6, cta_w - 2, 2.2, "warps merged in shared memory", face="white", size=7)
    # The partials each split writes: its normalized O and (max, sum) per query row, float32.
    part_y = 9.5
    for s in range(splits):
        x = cta_x[s] + 4
        _box(ax, x, part_y, cta_w - 8, 4.5, f"partial {s}: m{s}, l{s}, O{s}  (float32)", face="#fff6d5", size=8)
        _arrow(ax, (cta_x[s] + cta_w / 2, cta_y), (cta_x[s] + cta_w / 2, part_y + 4.6))
    # The counter and the merge by the split that arrives last (here split 1).
    order = {2: "1st", 0: "2nd", 1: "3rd: merges"}
    for s in range(splits):
        ax.text(cta_x[s] + cta_w - 1, cta_y - 2, f"arrives {order[s]}", fontsize=8, ha="right", color="#aa0000")
    merge_x, merge_w = 22, 90
    _box(ax, merge_x, 0.6, merge_w, 6.3, face="#fde0dd", edge="#aa0000", lw=1.2)
    ax.text(
        merge_x + merge_w / 2,
        3.75,
        "the last CTA to finish (atom.add on the (b, KV head) counter returns splits - 1; here split 1) merges:\n"
        "M = max_s m_s,   out = sum_s 2^(m_s - M) l_s O_s / sum_s 2^(m_s - M) l_s   (x v_scale), and resets"
        " the counter to 0",
        fontsize=8,
        ha="center",
        va="center",
    )
    for s in range(splits):
        _arrow(ax, (cta_x[s] + cta_w / 2, part_y), (merge_x + merge_w * (s + 1) / (splits + 1), 6.9), color="#aa0000")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def main() -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: pip install matplotlib", file=sys.stderr)
        return 1
    OUT.mkdir(exist_ok=True)
    paged_layout(plt, OUT / "paged_layout.png")
    split_merge(plt, OUT / "split_merge.png")
    print("wrote", sorted(f"{p.name} ({p.stat().st_size // 1024} KB)" for p in OUT.glob("*.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Notation, parser, ASCII tables, SVG pictures and the command line."""

import subprocess
import sys

import pytest
from hypothesis import given

import flydsl.layout as fl
from flydsl.layout import Layout

from .layout_strategies import layouts
from .layout_symbolic import Sym


@given(layouts())
def test_parse_round_trip(L):
    assert fl.parse_layout(repr(L)) == L
    shape_text, stride_text = repr(L).split(":")
    assert fl.parse_int_tuple(shape_text) == L.shape and fl.parse_int_tuple(stride_text) == L.stride


def test_parser():
    assert fl.parse_layout("((2,4),8):((1,16),2)") == Layout(((2, 4), 8), ((1, 16), 2))
    assert fl.parse_layout(" ( 4 , 8 ) : ( 1 , -4 ) ") == Layout((4, 8), (1, -4))
    assert fl.parse_layout("4:1") == Layout(4, 1) and fl.parse_layout("():()") == Layout((), ())
    assert fl.parse_layout(repr(fl.Swizzle(3, 4, 3)) + " o 0 o (8,64):(64,1)") == fl.make_composed_layout(
        fl.Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1))
    )
    assert fl.parse_int_tuple("(4,(2,_))") == (4, (2, None))
    # A shape alone is what Layout(shape) builds (compact, column-major), inside a composed layout too.
    assert fl.parse_layout("(4,8)") == Layout((4, 8)) and fl.parse_layout("((2,2),8)") == Layout(((2, 2), 8))
    assert fl.parse_layout("Sw<1,0,1> o 0 o (2,2)") == fl.make_composed_layout(fl.Swizzle(1, 0, 1), 0, Layout((2, 2)))
    syms = [Sym(f"dyn{k}") for k in range(3)]
    L = fl.parse_layout("(?,?):(1,?)", leaf=lambda k: syms[k])
    assert L.shape == (syms[0], syms[1]) and L.stride[0] == 1 and L.stride[1] is syms[2]
    for bad, message in [
        ("(4,8):(1,4", "expected"),
        ("(4,8):", "expected more"),
        ("(4,8) (1,4)", "trailing"),
        ("(4,8):(1,4) x", "unexpected"),
        ("(4,8):(1,4),", "trailing"),
        ("(?,8):(1,?)", "no leaf factory"),
        ("(4,8):(1,4,2)", "not congruent"),
    ]:
        with pytest.raises(fl.LayoutError, match=message):
            fl.parse_layout(bad)


def test_print_layout(capsys):
    fl.print_layout(Layout((2, 3), (3, 1)))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "(2,3):(3,1)" and out[3] == " 0  | 0 | 1 | 2 |" and out[5] == " 1  | 3 | 4 | 5 |"
    fl.print_layout(fl.make_layout_tv(Layout((4, 2), (2, 1)), Layout((1, 2), (2, 1))))
    out = capsys.readouterr().out.splitlines()
    assert out[3] == " 0  | T0V0 | T0V1 | T1V0 | T1V1 |"
    assert fl.layout_table(Layout(4, 2)).splitlines()[3] == " 0  | 0 | 2 | 4 | 6 |"


def test_draw(tmp_path):
    svg = fl.draw(Layout((4, 8), (8, 1)), tmp_path / "a.svg")
    assert svg == (tmp_path / "a.svg").read_text() and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("<rect") == 33 and ">31</text>" in svg and "(4,8):(8,1)" in svg
    tv = fl.draw(fl.make_layout_tv(Layout((4, 2), (2, 1)), Layout((1, 2), (2, 1))))
    assert tv.count(">T7</text>") == 2 and tv.count(">V1</text>") == 8
    composed = fl.draw(fl.make_composed_layout(fl.Swizzle(1, 0, 1), 0, Layout((2, 2), (2, 1))))
    assert "Sw&lt;1,0,1&gt;" in composed
    with pytest.raises(fl.LayoutError, match="rank 1 or 2"):
        fl.draw(Layout((2, 2, 2)))


def _fills(svg: str) -> list[str]:
    """The fill colour of each cell, in row-major order (the first rect is the background)."""
    return [line.split('fill="')[1].split('"')[0] for line in svg.splitlines() if line.startswith("<rect x=")]


def test_swizzle_pictures_colour_what_the_swizzle_moves():
    # Sw<2,0,2> over a row-major 4x4: each row is a permutation of the row's 4 columns. Coloured by the bits the
    # swizzle flips, every row and every column holds each of 4 colours once (a Latin square); coloured by offset
    # mod 8, rows 0 and 2 had the same colours in the same order and the permutation did not show.
    svg = fl.draw(fl.make_composed_layout(fl.Swizzle(2, 0, 2), 0, Layout((4, 4), (4, 1))))
    grid = [_fills(svg)[4 * m : 4 * m + 4] for m in range(4)]
    assert all(len(set(row)) == 4 for row in grid) and all(len({row[n] for row in grid}) == 4 for n in range(4))
    assert len({c for row in grid for c in row}) == 4 and "offset bits 0-1" in svg
    # The 128-byte swizzle of bf16, Sw<3,3,3>: 8 consecutive elements are one 16-byte chunk and keep one colour;
    # a row's 8 chunks have 8 colours, and chunk 0 of each row lands in another column (the swizzle).
    atom = fl.make_composed_layout(fl.Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    rows = [_fills(fl.draw(atom))[64 * m : 64 * m + 64] for m in range(8)]
    assert all(len(set(row[8 * c : 8 * c + 8])) == 1 for row in rows for c in range(8))
    assert all(len(set(row)) == 8 for row in rows)
    first_chunk = [next(n for n in range(64) if atom(m, n) % 64 < 8) // 8 for m in range(8)]
    assert sorted(first_chunk) == list(range(8))
    assert all(rows[m][8 * first_chunk[m]] == rows[0][0] for m in range(8))


def test_pictures_coloured_by_16_byte_chunk():
    # (4,16):(16,1) of 2-byte elements: 8 elements a chunk, so each row has two colours, and rows differ.
    fills = _fills(fl.draw(Layout((4, 16), (16, 1)), element_bytes=2))
    assert all(fills[16 * m + n] == fills[16 * m] for m in range(4) for n in range(8))
    assert fills[0] != fills[8] and fills[0] != fills[16]
    with pytest.raises(fl.LayoutError, match="element_bytes"):
        fl.draw(Layout(4), element_bytes=0)


def test_command_line(tmp_path):
    run = [sys.executable, "-m", "flydsl.layout"]
    table = subprocess.run(run + ["(4,8):(8,1)"], capture_output=True, text=True, check=True).stdout
    assert table.splitlines()[0] == "(4,8):(8,1)" and "| 24 | 25 |" in table
    shape_only = subprocess.run(run + ["(4,8)"], capture_output=True, text=True)
    assert shape_only.returncode == 0 and shape_only.stdout.splitlines()[0] == "(4,8):(1,4)", shape_only.stderr
    out = tmp_path / "out.svg"
    subprocess.run(run + ["(4,8):(8,1)", "--svg", str(out)], check=True, capture_output=True)
    assert out.read_text().startswith("<svg")
    subprocess.run(run + ["(2,16):(16,1)", "--svg", str(out), "--bytes", "4"], check=True, capture_output=True)
    assert "16-byte chunk of 4-byte elements" in out.read_text()
    tv = subprocess.run(run + ["(4,2):(2,1)", "--val", "(1,2):(2,1)"], capture_output=True, text=True, check=True)
    assert "T0V1" in tv.stdout
    bad = subprocess.run(run + ["(4,8):(1,4"], capture_output=True, text=True)
    assert bad.returncode == 2 and "error: parse" in bad.stderr

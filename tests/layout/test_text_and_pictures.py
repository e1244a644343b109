"""Notation, parser, ASCII tables, SVG pictures and the command line."""

import subprocess
import sys

import pytest
from hypothesis import given

import flydsl.layout as fl
from flydsl.layout import Layout

from .layout_strategies import layouts


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
    names = iter("MN")
    L = fl.parse_layout("(?,?):(1,?)", leaf=lambda k: f"dyn{k}")
    assert L.shape == ("dyn0", "dyn1") and L.stride == (1, "dyn2") and next(names) == "M"
    for bad, message in [
        ("(4,8):(1,4", "expected"),
        ("(4,8)", "expected :"),
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


def test_command_line(tmp_path):
    run = [sys.executable, "-m", "flydsl.layout"]
    table = subprocess.run(run + ["(4,8):(8,1)"], capture_output=True, text=True, check=True).stdout
    assert table.splitlines()[0] == "(4,8):(8,1)" and "| 24 | 25 |" in table
    out = tmp_path / "out.svg"
    subprocess.run(run + ["(4,8):(8,1)", "--svg", str(out)], check=True, capture_output=True)
    assert out.read_text().startswith("<svg")
    tv = subprocess.run(run + ["(4,2):(2,1)", "--val", "(1,2):(2,1)"], capture_output=True, text=True, check=True)
    assert "T0V1" in tv.stdout
    bad = subprocess.run(run + ["(4,8):(1,4"], capture_output=True, text=True)
    assert bad.returncode == 2 and "error: parse" in bad.stderr

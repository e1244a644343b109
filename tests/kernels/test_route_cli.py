"""``python -m flydsl.kernels.route``: the one lookup from an input to its kernel and configuration, from a shell."""

from __future__ import annotations

import pytest

from flydsl.kernels import route as cli
from flydsl.kernels.rows.router import RowOp, route


@pytest.mark.parametrize(
    "argv, op, n, dtype, where",
    [
        (["layer_norm", "4096", "--dtype", "f32"], RowOp.LAYER_NORM, 4096, "f32", {}),
        (["softmax", "65536", "--unaligned"], RowOp.SOFTMAX, 65536, "bf16", {"rows_aligned": False}),
        (["rms_norm_backward", "262144", "--dtype", "f32"], RowOp.RMS_NORM_BACKWARD, 262144, "f32", {"sums": 1}),
        (["fused_add_rms_norm", "32768", "--register"], RowOp.FUSED_ADD_RMS_NORM, 32768, "bf16", {"staged": False}),
    ],
)
def test_the_command_prints_the_routers_answer(capsys, argv, op, n, dtype, where):
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    found = route(op, n, dtype, **where)
    assert f"kernel: {found.kernel.value} ({found.function})" in printed
    assert str(found.config) in printed


def test_gemm_routes_through_its_plan(capsys):
    assert cli.main(["gemm", "16", "4096", "4096"]) == 0
    printed = capsys.readouterr().out
    assert "route: skinny" in printed and "launch skinny_gemm_kernel" in printed
    assert cli.main(["gemm", "4096", "4096", "4096"]) == 0
    assert "launch gemm_ws" in capsys.readouterr().out


def test_bad_input_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit):
        cli.main(["layer_norm", "0"])
    assert "n: expected a positive row length" in capsys.readouterr().err

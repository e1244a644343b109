"""Every configuration the row ops' router returns, on data (the GPU): for each distinct route of the routes' grid
(tests/kernels/norms_routes.py: N at both ends of every table range, the register kernels' regimes and odd N, every
dtype, the backward's column sums; the CPU side compiles and inspects them: test_norms_routes_cpu.py), the public
function is called on random rows, checked to take that route on this device, and its outputs are checked against
float64 (the tolerances of test_norms_gpu.py): on a few rows and, for the persistent grids (staged kernels, the
backward), on more rows than the grid has CTA groups (rows claimed or walked around the grid, rings wrapping)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.device import sm_count  # noqa: E402
from flydsl.kernels.rows.launch import persistent_groups  # noqa: E402
from flydsl.kernels.rows.router import RowKernel, RowOp, route  # noqa: E402

from . import norms_routes  # noqa: E402
from .norms_gpu_support import (  # noqa: E402
    TORCH_DTYPE,
    backward_mod,
    check_fused_add_in_place,
    check_layer_norm,
    check_layer_norm_backward,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    check_softmax_backward,
    forward_mod,
    make_input,
    softmax_mod,
    spied_routes,
)

CASES = norms_routes.distinct(norms_routes.cases())
MAX_ELEMENTS = 1 << 24  # per row tensor


def _row_counts(case) -> list:
    """A few rows, and (persistent grids) more than twice the grid's CTA groups can hold at once."""
    n, cfg = case.n, case.route.config
    few = max(1, min(67, (1 << 22) // n))
    if not hasattr(cfg, "blocks_per_sm") or case.route.kernel is RowKernel.LOOPED:  # a CTA per row group
        return [few]
    rc = cfg.row
    wrap = 2 * persistent_groups(cfg, 1 << 30, 132) * rc.rows_per_cta + 5
    return sorted({3, min(wrap, max(3, MAX_ELEMENTS // n))})


def _spied(case):
    op = case.op
    if op is RowOp.SOFTMAX:
        return softmax_mod, "forward_route"
    if op is RowOp.SOFTMAX_BACKWARD:
        return softmax_mod, "backward_route"
    return (backward_mod, "backward_route") if op.backward else (forward_mod, "forward_route")


def _run(case, rows: int) -> None:
    op, n, dtype = case.op, case.n, TORCH_DTYPE[case.dtype]
    x = make_input(rows, n, dtype)
    w = torch.randn(n, device="cuda", dtype=dtype) if case.sums or not op.backward else None
    if op is RowOp.SOFTMAX:
        check_softmax(x * 3)
    elif op is RowOp.SOFTMAX_BACKWARD:
        check_softmax_backward(make_input(rows, n, dtype) + 0.5, torch.softmax(x.float() * 3, dim=-1).to(dtype))
    elif op is RowOp.LAYER_NORM:
        check_layer_norm(x * 2 + 8, w, torch.randn(n, device="cuda", dtype=torch.float32))  # a mean away from 0
    elif op is RowOp.RMS_NORM:
        check_rms_norm(x, w)
    elif op is RowOp.FUSED_ADD_RMS_NORM:
        check_fused_add_in_place(x, w)
    elif op is RowOp.LAYER_NORM_BACKWARD:
        b = torch.randn(n, device="cuda", dtype=dtype) if w is not None else None
        check_layer_norm_backward(make_input(rows, n, dtype), x * 2 + 0.5, w, b)
    else:
        check_rms_norm_backward(make_input(rows, n, dtype), x, w)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_routed_config_is_correct_on_data(case, monkeypatch):
    here = route(case.op, case.n, case.dtype, sums=case.sums, sms=sm_count(0))
    if here != case.route:
        pytest.skip(f"routed otherwise on this device ({sm_count(0)} SMs)")
    module, name = _spied(case)
    for rows in _row_counts(case):
        with spied_routes(monkeypatch, module, name) as taken:
            _run(case, rows)
        assert taken and taken[-1] == case.route, (case.name, taken[-1:])
        if case.route.kernel is not RowKernel.REGISTER:
            assert all(found == case.route for found in taken)

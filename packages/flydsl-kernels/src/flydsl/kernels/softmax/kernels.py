"""Softmax over rows, forward and backward: the kernels and their launch.

Forward, the register kernel (:func:`softmax_forward_kernel`): the row is read once into registers, ``max`` reduced,
``exp2((x - max) * log2(e))`` (``ex2.approx``), ``sum`` reduced, each value scaled by ``1 / sum``. Long rows take
the staged kernel (:func:`softmax_forward_staged_kernel`: the norms' staged forward with
:class:`~flydsl.kernels.rows.configs.SoftmaxFlags`; each CTA's ``(max, sum)`` combined as the online softmax does).
Backward: ``dx = y * (dy - sum(dy * y))``, in registers (:func:`softmax_backward_kernel`) or on the staged kernel
with dy and y in its ring (:func:`softmax_backward_staged_kernel`). Which runs: the router
(:mod:`flydsl.kernels.rows.router`).
"""

from __future__ import annotations

from collections.abc import Callable

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import nvvm
from flydsl.kernels.device import sm_count
from flydsl.kernels.memory import can_allocate
from flydsl.kernels.rows.configs import SoftmaxBackwardFlags, SoftmaxFlags, StagedForwardConfig
from flydsl.kernels.rows.launch import device_groups, launch_rows, staged_plan
from flydsl.kernels.rows.layout import RowConfig
from flydsl.kernels.rows.reduce import row_done, row_reduce, row_smem, thread_reduce
from flydsl.kernels.rows.router import Route, RowKernel, RowOp, route
from flydsl.kernels.rows.staged_forward import RowTensors, rows_staged_forward
from flydsl.kernels.rows.tiles import load_row, row_position, store_row
from flydsl.kernels.softmax.api import SoftmaxTensors
from flydsl.kernels.validation import TensorInfo, rows_aligned

__all__ = [
    "softmax_forward_kernel",
    "softmax_backward_kernel",
    "softmax_forward_staged_kernel",
    "softmax_backward_staged_kernel",
    "forward",
    "backward",
    "forward_plan",
    "backward_plan",
    "forward_route",
    "backward_route",
]

_LOG2E = 1.4426950408889634
SOFTMAX = SoftmaxFlags()
SOFTMAX_BACKWARD = SoftmaxBackwardFlags()


@flyc.kernel
def softmax_forward_kernel(x: fx.Tensor, out: fx.Tensor, cfg: fx.Constexpr[RowConfig]):
    rows, n = x.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=2)
    xs, _ = load_row(cfg, x, pos, n, rows, fill=float("-inf"))  # -inf: neutral for max, exp gives 0
    row_max = row_reduce(cfg, pos, smem, 0, thread_reduce(xs, "max"), "max")
    shift = row_max * _LOG2E
    es = [nvvm.ex2_approx(v * _LOG2E - shift, ftz=True) for v in xs]
    total = row_reduce(cfg, pos, smem, 1, thread_reduce(es), "add", last=True)
    scale = 1.0 / total
    store_row(cfg, out, pos, n, rows, [e * scale for e in es])
    row_done(cfg)


@flyc.kernel
def softmax_backward_kernel(dy: fx.Tensor, y: fx.Tensor, dx: fx.Tensor, cfg: fx.Constexpr[RowConfig]):
    rows, n = y.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=1)
    dys, _ = load_row(cfg, dy, pos, n, rows)
    ys, _ = load_row(cfg, y, pos, n, rows)
    dot = row_reduce(cfg, pos, smem, 0, thread_reduce([a * b for a, b in zip(dys, ys, strict=True)]), "add", last=True)
    store_row(cfg, dx, pos, n, rows, [b * (a - dot) for a, b in zip(dys, ys, strict=True)])
    row_done(cfg)


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the cluster's pushes)
def softmax_forward_staged_kernel(
    x: fx.Tensor, out: fx.Tensor, exchange: fx.Tensor, cfg: fx.Constexpr[StagedForwardConfig]
):
    """``exchange``: a team's tagged pairs (:func:`~flydsl.kernels.rows.launch.staged_exchange`), else unused."""
    rows_staged_forward(cfg, SOFTMAX, RowTensors(x=x, out=out, exchange=exchange), None)


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))
def softmax_backward_staged_kernel(
    dy: fx.Tensor, y: fx.Tensor, dx: fx.Tensor, exchange: fx.Tensor, cfg: fx.Constexpr[StagedForwardConfig]
):
    """``dx = y * (dy - sum(dy * y))`` per row; ``exchange`` as the forward's."""
    rows_staged_forward(cfg, SOFTMAX_BACKWARD, RowTensors(x=dy, residual=y, out=dx, exchange=exchange), None)


def forward_route(t: SoftmaxTensors, staged: bool = True) -> Route:
    """The route :func:`forward` takes for ``t`` (``staged=False``: the register kernel)."""
    return _route(RowOp.SOFTMAX, t, (t.x, t.out), staged)


def backward_route(t: SoftmaxTensors, staged: bool = True) -> Route:
    """The route :func:`backward` takes for ``t``."""
    return _route(RowOp.SOFTMAX_BACKWARD, t, (t.dy, t.x, t.out), staged)


def _route(op: RowOp, t: SoftmaxTensors, row_tensors, staged: bool) -> Route:
    return route(
        op,
        t.x.shape[1],
        t.x.dtype,
        rows_aligned=rows_aligned(*row_tensors),
        sms=sm_count(t.x.device),
        scratch=can_allocate(t.x),
        staged=staged,
    )


def forward(t: SoftmaxTensors, chosen: Route | None = None) -> None:
    """Launches softmax's forward on validated tensors along ``chosen`` (default :func:`forward_route`)."""
    forward_plan(t, chosen)(t.x.obj, t.out.obj)


def backward(t: SoftmaxTensors, chosen: Route | None = None) -> None:
    """Launches softmax's backward on validated tensors along ``chosen`` (default :func:`backward_route`)."""
    backward_plan(t, chosen)(t.dy.obj, t.x.obj, t.out.obj)


def forward_plan(t: SoftmaxTensors, chosen: Route | None = None) -> Callable:
    """The launch :func:`forward` makes for tensors of ``t``'s signature (:mod:`flydsl.kernels.plans`), as a function
    of the raw ``(x, out)`` with the route and the grid fixed."""
    chosen = None if _empty(t) else chosen or forward_route(t)
    return _plan("forward", chosen, t.x, softmax_forward_kernel, softmax_forward_staged_kernel)


def backward_plan(t: SoftmaxTensors, chosen: Route | None = None) -> Callable:
    """The launch :func:`backward` makes for tensors of ``t``'s signature, as a function of the raw ``(dy, y, dx)``."""
    chosen = None if _empty(t) else chosen or backward_route(t)
    return _plan("backward", chosen, t.x, softmax_backward_kernel, softmax_backward_staged_kernel)


def _empty(t: SoftmaxTensors) -> bool:
    rows, n = t.x.shape
    return rows == 0 or n == 0


def _plan(which: str, chosen: Route | None, like: TensorInfo, register_kernel, staged_kernel) -> Callable:
    """The launch of ``chosen`` (None: nothing to launch) on tensors of ``like``'s rows: the register kernel on its
    grid, or the staged one on its persistent grid with its exchange (a team's pairs, the claimed rows' counter:
    :func:`~flydsl.kernels.rows.launch.staged_plan`)."""
    if chosen is None:
        return _nothing
    _check_route(which, chosen)
    cfg, rows = chosen.config, like.shape[0]
    if chosen.kernel is RowKernel.STAGED:
        groups = device_groups(cfg, rows, like.device)

        def staged(*tensors_and_exchange):
            launch_rows(staged_kernel, (*tensors_and_exchange, cfg), cfg, groups)

        return staged_plan(cfg, like, rows, staged)
    grid, block = cfg.grid(rows), cfg.block
    cluster = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None

    def launch(*tensors):
        register_kernel(*tensors, cfg).launch(grid=grid, block=block, cluster=cluster)

    return launch


def _nothing(*tensors) -> None:
    """The plan of an empty input: no launch."""


def _check_route(which: str, chosen: Route) -> None:
    """A route softmax's kernels take: a register route with a RowConfig, a staged one with a StagedForwardConfig."""
    wanted = {RowKernel.REGISTER: RowConfig, RowKernel.STAGED: StagedForwardConfig}.get(chosen.kernel)
    if wanted is None or not isinstance(chosen.config, wanted):
        raise ValueError(f"softmax {which}: no kernel takes a {chosen.kernel} route with {chosen.config}")

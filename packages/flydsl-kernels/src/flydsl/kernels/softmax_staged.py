"""The staged softmax forward for long rows (:func:`flydsl.kernels.softmax.forward` takes it by default where
:func:`softmax_staged_config` has a config, as the norms' forward does): the norms' staged forward
(:func:`flydsl.kernels.norm_staged._rows_staged_forward`) with :class:`~flydsl.kernels.norm_config.SoftmaxFlags`. A
persistent grid; each thread copies its chunks of x rows ahead into a shared-memory ring (``cp.async``); each CTA
reduces its part of a row to ``(max m_r, sum exp(x - m_r))`` (two block reductions) and, for a row over a cluster,
pushes that pair to every peer (``st.async`` + mbarrier; past 8 CTAs, a team: tagged stores to global memory,
polled by one warp), writing the row ``lag`` rows later from ``max = max_r m_r`` and ``sum = sum_r s_r exp(m_r -
max)`` (the online softmax's combination: every factor <= 1). Configs: :func:`~flydsl.kernels.norm_config.forward_shape`
(N a multiple of 16 bytes, rows 16-byte aligned).

The backward (``dx = y * (dy - sum(dy * y))``) runs on the same kernel with
:class:`~flydsl.kernels.norm_config.SoftmaxBackwardFlags`: dy and y in the ring, each CTA's ``sum(dy * y)`` pushed
and summed as RMSNorm's sum of squares; configs :func:`~flydsl.kernels.norm_config.softmax_backward_shape`."""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.kernels.norm_config import (
    SoftmaxBackwardFlags,
    SoftmaxFlags,
    StagedForwardConfig,
    routed_staged_forward_config,
    softmax_backward_staged_config,
)
from flydsl.kernels.norm_staged import _rows_staged_forward
from flydsl.kernels.normalization import _aligned16, forward_exchange, routable, staged_forward_groups

__all__ = [
    "SOFTMAX",
    "SOFTMAX_BACKWARD",
    "backward_staged",
    "forward_staged",
    "softmax_backward_staged_kernel",
    "softmax_forward_staged_kernel",
    "softmax_staged_config",
]

SOFTMAX = SoftmaxFlags()
SOFTMAX_BACKWARD = SoftmaxBackwardFlags()


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the cluster's pushes)
def softmax_forward_staged_kernel(
    x: fx.Tensor, out: fx.Tensor, exchange: fx.Tensor, cfg: fx.Constexpr[StagedForwardConfig]
):
    """``exchange``: a team's tagged pairs (:func:`~flydsl.kernels.normalization.forward_exchange`), else unused."""
    _rows_staged_forward(cfg, SOFTMAX, (x, x, x, x, out, x, x, x, exchange), None)


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))
def softmax_backward_staged_kernel(
    dy: fx.Tensor, y: fx.Tensor, dx: fx.Tensor, exchange: fx.Tensor, cfg: fx.Constexpr[StagedForwardConfig]
):
    """``dx = y * (dy - sum(dy * y))`` per row; ``exchange`` as the forward's."""
    _rows_staged_forward(cfg, SOFTMAX_BACKWARD, (dy, y, dy, dy, dx, dy, dy, dy, exchange), None)


def softmax_staged_config(n: int, dtype: str) -> StagedForwardConfig | None:
    """The staged softmax's config where :func:`flydsl.kernels.softmax.forward` takes it (see
    :func:`~flydsl.kernels.norm_config.forward_shape`), or None."""
    return routed_staged_forward_config(n, dtype, "softmax")


def forward_staged(x, out, cfg: StagedForwardConfig | None = None) -> bool:
    """Launches the staged softmax on validated :class:`~flydsl.kernels.host.RowTensor` arguments (x, out: rows
    16-byte aligned) with ``cfg`` (default :func:`softmax_staged_config`, where ``normalization.routable``); False
    (nothing launched) where there is no config or the rows are not 16-byte aligned: the caller then launches the
    register kernel."""
    rows, n = x.shape
    if cfg is None:
        cfg = softmax_staged_config(n, x.dtype)
        cfg = cfg if cfg is not None and routable(cfg, x) else None
    if cfg is None or rows == 0 or not _aligned16(x, out):
        return False
    groups = staged_forward_groups(cfg, rows, x.device)
    rc = cfg.row
    exchange = forward_exchange(cfg, x.obj, rows)
    softmax_forward_staged_kernel(x.obj, out.obj, exchange, cfg).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )
    return True


def backward_staged(dy, y, dx, cfg: StagedForwardConfig | None = None) -> bool:
    """Launches the staged backward on validated RowTensor arguments with ``cfg`` (default
    :func:`~flydsl.kernels.norm_config.softmax_backward_staged_config`, where ``normalization.routable``); False
    (nothing launched) where there is no config or a tensor's rows are not 16-byte aligned."""
    rows, n = y.shape
    if cfg is None:
        cfg = softmax_backward_staged_config(n, y.dtype)
        cfg = cfg if cfg is not None and routable(cfg, y) else None
    if cfg is None or rows == 0 or not _aligned16(dy, y, dx):
        return False
    groups = staged_forward_groups(cfg, rows, y.device)
    rc = cfg.row
    exchange = forward_exchange(cfg, y.obj, rows)
    softmax_backward_staged_kernel(dy.obj, y.obj, dx.obj, exchange, cfg).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )
    return True

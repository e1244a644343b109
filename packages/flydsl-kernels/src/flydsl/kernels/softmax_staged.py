"""The staged softmax forward for long rows (:func:`flydsl.kernels.softmax.forward` takes it by default where
:func:`softmax_staged_config` has a config, as the norms' forward does): the norms' staged forward
(:func:`flydsl.kernels.norm_staged_forward._rows_staged_forward`) with
:class:`~flydsl.kernels.norm_config.SoftmaxFlags`. A persistent grid; each thread copies its chunks of x rows ahead into
a shared-memory ring (``cp.async``); each CTA reduces its part of a row to ``(max m_r, sum exp(x - m_r))`` (two block
reductions) and, for a row over a cluster, pushes that pair to every peer (``st.async`` + mbarrier; past 8 CTAs, a team:
tagged stores to global memory, polled by one warp), writing the row ``lag`` rows later from ``max = max_r m_r`` and
``sum = sum_r s_r exp(m_r - max)`` (the online softmax's combination: every factor <= 1). Configs:
:func:`~flydsl.kernels.norm_config.forward_shape` (N a multiple of 16 bytes, rows 16-byte aligned).

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
from flydsl.kernels.norm_staged_forward import _rows_staged_forward
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
    default = softmax_staged_config(x.shape[1], x.dtype) if cfg is None else None
    return _launch(softmax_forward_staged_kernel, (x, out), cfg, default)


def backward_staged(dy, y, dx, cfg: StagedForwardConfig | None = None) -> bool:
    """Launches the staged backward on validated RowTensor arguments with ``cfg`` (default
    :func:`~flydsl.kernels.norm_config.softmax_backward_staged_config`, where ``normalization.routable``); False
    (nothing launched) where there is no config or a tensor's rows are not 16-byte aligned."""
    default = softmax_backward_staged_config(y.shape[1], y.dtype) if cfg is None else None
    return _launch(softmax_backward_staged_kernel, (dy, y, dx), cfg, default)


def _launch(kernel, tensors, cfg: StagedForwardConfig | None, default: StagedForwardConfig | None) -> bool:
    """``kernel`` on the RowTensors ``tensors`` (the last one is the output) and a team's exchange tensor, with
    ``cfg``, else ``default`` where ``normalization.routable`` on the first tensor; False (nothing launched) without a
    config, without rows, or where a tensor's rows are not 16-byte aligned."""
    like = tensors[0]
    rows = like.shape[0]
    if cfg is None:
        cfg = default if default is not None and routable(default, like) else None
    if cfg is None or rows == 0 or not _aligned16(*tensors):
        return False
    groups = staged_forward_groups(cfg, rows, like.device)
    rc = cfg.row
    cfg, exchange = forward_exchange(cfg, like.obj, rows)
    kernel(*(t.obj for t in tensors), exchange, cfg).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )
    return True

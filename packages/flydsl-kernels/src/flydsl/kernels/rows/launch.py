"""Launching a row kernel's route, host side, as the norms and softmax share it: the persistent grid's size (CTA
groups that fit the device at once), a team's exchange tensor and claimed rows' counter (scratch in the input's
framework), and the launch itself with the route's block and cluster shape."""

from __future__ import annotations

from collections.abc import Callable

from flydsl.kernels.device import max_active_clusters, sm_count
from flydsl.kernels.memory import CLAIM_COUNTERS, allocated, claim_counter, empty_rows
from flydsl.kernels.plans import ScratchPlan
from flydsl.kernels.rows.exchange import exchange_columns

__all__ = ["persistent_groups", "device_groups", "team_exchange", "staged_exchange", "staged_plan", "launch_rows"]


def persistent_groups(cfg, rows: int, sms: int, active: int | None = None) -> int:
    """The persistent grid's CTA groups (CTAs, clusters or teams) for a staged or backward config: as many as fit at
    once, each taking an equal share of the rows. Clusters of 4 or 8 CTAs cannot fill every SM (a cluster lives in
    one GPC): 7/8 of ``blocks_per_sm * SMs / cluster`` of them unless the driver says how many fit (``active``,
    :func:`~flydsl.kernels.device.max_active_clusters`) (docs/tuning/norms.md#register-backward)."""
    rc = cfg.row
    fit = cfg.blocks_per_sm * sms // rc.cluster
    if rc.cluster_shape is not None:  # a team needs no GPC of its own: every SM
        fit = active if active else fit * 7 // 8
    return max(1, min(-(-rows // rc.rows_per_cta), fit))


def device_groups(cfg, rows: int, device: int) -> int:
    """:func:`persistent_groups` on CUDA device ``device`` (its SMs, and the driver's count of the clusters that fit
    at once); a ValueError where a team's CTAs cannot all be resident at once."""
    rc = cfg.row
    sms = sm_count(device)
    if rc.team and rc.cluster > cfg.blocks_per_sm * sms:  # its CTAs would wait for peers that never start
        raise ValueError(
            f"a team of {rc.cluster} CTAs per row does not fit device {device} at once ({sms} SMs x"
            f" {cfg.blocks_per_sm} CTA each); use a config with fewer CTAs per row"
        )
    active = None
    if rc.cluster_shape is not None:
        active = max_active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, device)
    return persistent_groups(cfg, rows, sms, active)


def team_exchange(cfg, like, rows: int, what: str):
    """A team's exchange tensor in ``like``'s framework (a TensorInfo): each row's line of tagged pairs, zeroed
    ((rows, 4 x team size) float32: one small memset per launch)."""
    exchange = empty_rows(like, (rows, exchange_columns(cfg)), what, scratch=True)
    exchange.zero_() if hasattr(exchange, "zero_") else exchange.fill(0)
    return exchange


def staged_exchange(cfg, like, rows: int):
    """The staged forward's ``exchange`` argument for ``cfg`` on the rows of ``like`` (a TensorInfo): a team's tagged
    pairs, claimed rows' counter, else ``like`` itself (unused)."""
    if cfg.row.team:
        return team_exchange(cfg, like, rows, "forward row pairs")
    if cfg.claim_rows:
        return claim_counter(like)
    return like.obj


def staged_plan(cfg, like, rows: int, launch: Callable) -> Callable:
    """A staged route's plan of its call's tensors (the first one's rows: ``like``, a TensorInfo) over
    ``launch(*tensors, exchange)``: a team's exchange is zeroed in Python on each call (a ScratchPlan); claimed rows'
    counters are the stream's held pair, which a torch replay takes itself (``made``: no Python per call);
    otherwise the first tensor stands for the unused exchange and the plan is the launch alone."""
    if not (cfg.row.team or cfg.claim_rows):
        return lambda *tensors: launch(*tensors, tensors[0])

    def exchange_of(first, *rest) -> tuple:
        return (staged_exchange(cfg, allocated(first), rows),)

    if cfg.row.team or not like.is_torch:
        return ScratchPlan(exchange_of, launch)
    import torch

    return ScratchPlan(exchange_of, launch, ((0, (2,), torch.int32, CLAIM_COUNTERS),))


def launch_rows(kernel, args, cfg, groups: int) -> None:
    """``kernel(*args)`` on ``groups`` CTA groups of the staged or backward config ``cfg`` (its block and
    cluster)."""
    rc = cfg.row
    kernel(*args).launch(grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape)

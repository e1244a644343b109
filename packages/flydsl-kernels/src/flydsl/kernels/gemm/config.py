"""The warp-specialized GEMM's configurations: :class:`GemmConfig` (tile, pipeline depth, consumers, cluster, split K,
schedule), the shared-memory budget it must fit, the candidates worth timing for a problem
(:func:`candidate_configs`) and the choice among them (:func:`choose_config`), ranked by a cost model fitted on the
H200 (:func:`estimated_seconds`). Why each choice is made, with its measurements: ``docs/tuning/gemm.md``."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from flydsl.compiler import cache
from flydsl.kernels.gemm.block_scales import slot_bytes
from flydsl.kernels.gemm.schedulers import cluster_tiles, split_plan, stream_k_steps

__all__ = [
    "SMEM_BYTES",
    "STAGING_BOX",
    "TALL_BLOCKSCALE_GAIN",
    "TALL_BLOCKSCALE_MIN_M",
    "WIDE_BLOCKSCALE_GAIN",
    "GemmConfig",
    "candidate_configs",
    "choose_blockscale_config",
    "choose_config",
    "choose_fp8_config",
    "estimated_seconds",
    "fp8_config",
    "max_stages",
    "staging_bytes",
    "staging_fits",
]

SMEM_BYTES = 227 * 1024  # Hopper's shared memory per CTA
STAGING_BOX = (64, 64)  # the TMA-store epilogue's (rows, columns) boxes, GemmConfig.store_boxes per consumer
STORE_BOXES = (1, 2, 4)  # the staging boxes a consumer may have


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """The CTA tile (``tile_m`` x ``tile_n``, K steps of ``tile_k``), the pipeline depth, the consumer warpgroups,
    the grouped tile order, the cluster and split K; checked when built.

    ``schedule``: "cooperative" (the consumers share each tile, ``tile_m / consumers`` rows each) or "pingpong" (two
    consumers take every other tile whole: one's epilogue runs while the other's MMAs do; its accumulators,
    ``tile_m * tile_n / 128`` per thread, must stay <= 128). ``stream_k`` (cooperative, no split K): the tiles of the
    last waves are shared out by K steps, evenly over the SMs, and finished from fp32 partials
    (:class:`~flydsl.kernels.gemm.schedulers.StreamKTiles`). ``split_tail`` (with ``split_k``): only the tiles past
    the last full wave are split into ``split_k`` K parts, so that a partial last wave of whole tiles becomes a
    shorter wave of parts (:func:`~flydsl.kernels.gemm.schedulers.split_plan`)."""

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    stages: int = 4
    consumers: int = 2
    group_m: int = 8
    cluster_m: int = 2  # CTAs along M sharing each B tile: each loads 1/cluster_m of it, multicast to all
    cluster_n: int = 1  # or CTAs along N sharing each A tile (the larger operand of 256 x 128 tiles); not both
    split_k: int = 1  # K split over this many CTAs per tile (fp32 partials, summed by the last): for few tiles
    schedule: str = "cooperative"
    stream_k: bool = False
    split_tail: bool = False  # split K only in the tiles past the last full wave
    store_boxes: int = 2  # the TMA-store epilogue's staging boxes per consumer: 1 leaves room for a deeper pipeline,
    # 4 stage a 128 x 128 consumer tile whole (no part waits for another's store)

    def __post_init__(self):
        if self.schedule not in ("cooperative", "pingpong"):
            raise ValueError(f"{self}: schedule must be 'cooperative' or 'pingpong'")
        if self.schedule == "pingpong" and (
            self.consumers != 2 or self.split_k != 1 or self.tile_m % 64 or self.tile_m * self.tile_n > 128 * 128
        ):
            raise ValueError(
                f"{self}: pingpong takes 2 consumers, no split K, 64-row blocks and at most 128 x 128 outputs per"
                " tile (each consumer holds a whole tile's accumulators)"
            )
        if (
            self.consumer_rows % 64
            or self.tile_m % self.consumers
            or self.tile_n % 16
            or self.tile_n > 256
            or self.tile_k % 64
        ):
            raise ValueError(
                f"{self}: tile_m must split into {self.consumers} consumer warpgroups of 64-row blocks; tile_n a"
                " multiple of 16 up to 256 (not a multiple of 64: B K-major, C stored from registers); tile_k a"
                " multiple of 64 (one 128-byte swizzled row of bf16)"
            )
        # A K-major B part starts a whole 128B-swizzle atom (8 rows of 128 bytes) into the slot: 8-row parts.
        if self.cluster_m not in (1, 2, 4) or self.tile_n % (8 * self.cluster_m):
            raise ValueError(
                f"{self}: cluster_m must be 1, 2 or 4 and split tile_n into parts of a multiple of 8 columns (a"
                " multiple of 64 for B given MN-major, checked at launch)"
            )
        if self.cluster_n not in (1, 2, 4) or self.tile_m % (64 * self.cluster_n):
            raise ValueError(f"{self}: cluster_n must be 1, 2 or 4 and split tile_m into 64-row parts")
        if self.cluster_m > 1 and self.cluster_n > 1:
            raise ValueError(f"{self}: a cluster runs along M (cluster_m) or along N (cluster_n), not both")
        if not isinstance(self.split_k, int) or not 1 <= self.split_k <= 64:
            raise ValueError(f"{self}: split_k must be an int in 1..64")
        if self.stream_k and (self.split_k != 1 or self.schedule != "cooperative"):
            raise ValueError(f"{self}: stream_k takes the cooperative schedule and no split K")
        if self.stream_k and self.cluster > 2:  # its finishers spin on other workers: all must be resident
            raise ValueError(
                f"{self}: stream_k takes clusters of at most 2 CTAs (its finishers wait for other clusters, and not"
                " every 4-CTA cluster of a full grid is resident at once)"
            )
        if self.store_boxes not in STORE_BOXES:
            raise ValueError(f"{self}: store_boxes must be one of {STORE_BOXES}")
        if self.split_tail and self.split_k == 1:
            raise ValueError(f"{self}: split_tail splits the last wave's tiles into split_k parts: set split_k > 1")

    @property
    def cluster(self) -> int:
        """The CTAs of a cluster (along M or along N)."""
        return self.cluster_m * self.cluster_n

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def consumer_rows(self) -> int:
        """The rows of a tile one consumer warpgroup multiplies and stores."""
        return self.tile_m if self.schedule == "pingpong" else self.tile_m // self.consumers

    def stage_bytes(self, element_bytes: int = 2) -> int:
        return (self.tile_m + self.tile_n) * self.tile_k * element_bytes


def staging_bytes(cfg: GemmConfig, element_bytes: int = 2) -> int:
    """Shared memory the TMA-store epilogue's staging boxes take (``cfg.store_boxes`` per consumer warpgroup)."""
    return cfg.consumers * cfg.store_boxes * STAGING_BOX[0] * STAGING_BOX[1] * element_bytes


def staging_fits(cfg: GemmConfig, operand_bytes: int = 2, slot_extra: int = 0) -> bool:
    """The TMA-store epilogue applies to ``cfg`` (operands of ``operand_bytes`` bytes, ``slot_extra`` more bytes per
    slot: a block-scaled GEMM's scales): its tiles split into 64-column parts (the staging boxes' width), and the
    staging boxes fit in shared memory beside the pipeline (1 KB kept for barriers and alignment)."""
    pipeline = cfg.stages * (cfg.stage_bytes(operand_bytes) + slot_extra)
    return cfg.tile_n % STAGING_BOX[1] == 0 and pipeline + staging_bytes(cfg) <= SMEM_BYTES - 1024


def max_stages(
    tile_m: int,
    tile_n: int,
    tile_k: int = 64,
    element_bytes: int = 2,
    store_boxes: int = 2,
    slot_extra: int = 0,
    most: int = 8,
) -> int:
    """The deepest pipeline whose slots (``slot_extra`` more bytes each: a block-scaled GEMM's scales) fit in shared
    memory beside the TMA-store epilogue's ``store_boxes`` staging boxes per consumer (one or two consumer
    warpgroups: ``tile_m`` 64 or more) and 1 KB for barriers and alignment; at most ``most``."""
    staging = min(2, tile_m // 64) * store_boxes * STAGING_BOX[0] * STAGING_BOX[1] * element_bytes
    return min(most, (SMEM_BYTES - 1024 - staging) // ((tile_m + tile_n) * tile_k * element_bytes + slot_extra))


def deepest_pipeline(tile_m: int, tile_n: int, slot_extra: int = 0) -> dict:
    """``stages`` and ``store_boxes`` of the deepest pipeline for a tile shape: one TMA-store staging box per consumer
    where that buys a stage (docs/tuning/gemm.md#store-boxes), else two."""
    deepest = {boxes: max_stages(tile_m, tile_n, store_boxes=boxes, slot_extra=slot_extra) for boxes in (1, 2)}
    boxes = 1 if deepest[1] > deepest[2] else 2
    return dict(stages=deepest[boxes], store_boxes=boxes)


def candidate_configs(m: int, n: int, k: int, sms: int) -> list[GemmConfig]:
    """The configurations worth timing for an (m, n, k) problem: tile widths 64..256, 64-row tiles (one consumer)
    when M is that small, clusters only where there are two tile rows to share B, splits of K only where the tiles
    alone leave SMs idle, splits of the last wave's tiles only (``split_tail``) where there are more tiles than SMs
    and the last wave is not full, stream-K there too (where each SM gets at least 4 of its K steps), pingpong
    128 x 128 tiles where there are two per CTA, and 256 x 128 tiles for M >= 2048, alone, in clusters along M or
    in clusters along N sharing their A tile (docs/tuning/gemm.md#candidates). Each with the deepest pipeline that
    fits."""
    configs = []
    for tile_m, consumers in ((256, 2), (128, 2), (64, 1)):
        if (tile_m == 64 and m > 64) or (tile_m == 256 and m < 2048):
            continue
        for tile_n in (256, 192, 128, 64) if tile_m < 256 else (128,):  # 256 rows: 128 x 128 per consumer at most
            tiles = -(-m // tile_m) * -(-n // tile_n)
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2)):
                if cluster_m == 2 and (-(-m // tile_m) < 2 or tile_n % 128):
                    continue
                if cluster_n == 2 and (tile_m < 256 or -(-n // tile_n) < 2):  # A shared only where it is larger
                    continue
                shape = dict(tile_m=tile_m, tile_n=tile_n, consumers=consumers, **deepest_pipeline(tile_m, tile_n))
                shape.update(cluster_m=cluster_m, cluster_n=cluster_n)
                whole = GemmConfig(**shape)
                for split_k in (1, 2, 3, 4, 6, 8):
                    if split_k > 1 and (tiles * split_k > 2 * sms or tiles >= sms or k < split_k * 512):
                        continue
                    configs.append(GemmConfig(**shape, split_k=split_k))
                # the last wave's tiles, as the kernel plans them (cluster tiles), in CTAs
                tail = cluster_tiles(m, n, whole) % (sms // whole.cluster) * whole.cluster
                for split_k in (2, 3, 4) if tiles >= sms and tail else ():
                    if tail * split_k <= 2 * sms and k >= split_k * 512:
                        configs.append(GemmConfig(**shape, split_k=split_k, split_tail=True))
                if stream_k_steps(m, n, k, whole, sms) >= 4:
                    configs.append(GemmConfig(**shape, stream_k=True))
    if m > 64:  # pingpong consumers, whole 128 x 128 tiles each, where there are tiles for both
        for cluster_m in (1, 2) if m > 128 else (1,):
            if -(-m // 128) * -(-n // 128) >= 2 * sms // cluster_m:
                configs.append(
                    GemmConfig(tile_n=128, stages=max_stages(128, 128), cluster_m=cluster_m, schedule="pingpong")
                )
    return configs


# The cost model choose_config ranks candidates by (docs/tuning/gemm.md#cost-model: the fit and its accuracy). A
# work unit (a tile, or one K part of it) costs the longer of its tensor-core time and its operand bytes at one SM's
# load rate, plus a fixed cost; a wave of units costs at least the wave's share of the problem's unique bytes at HBM
# speed (waves as the kernel plans them, over cluster tiles: a cluster's CTAs past C's edge hold SMs too); split K
# adds its fp32 partials' round trip and the finish of each tile (the last split reads the others' partials).
_SM_TFLOPS = 990.0 / 132  # dense bf16 peak per SM (TFLOP/s), at the efficiency below for 128x256 tiles
_MMA_EFFICIENCY = {256: 0.8, 192: 0.68, 128: 0.72, 64: 0.56}  # by tile width; 64-row tiles reach 0.6 of it
_SM_LOAD_BYTES_PER_S = 100e9
_HBM_BYTES_PER_S = 3.6e12
_UNIT_COST_S = 2e-6
_SPLIT_K_FINISH_S = 3e-6


def estimated_seconds(m: int, n: int, k: int, cfg: GemmConfig, sms: int) -> float:
    """The cost model's time for ``cfg`` on an (m, n, k) bf16/fp16 problem on ``sms`` SMs (see the comment above)."""
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    slots = sms // cfg.cluster * cfg.cluster
    # The kernel's plan, over cluster tiles and clusters, counted in CTAs (a cluster's CTAs past C's edge included:
    # they hold SMs too).
    split_from, units = (cfg.cluster * x for x in split_plan(cluster_tiles(m, n, cfg), sms // cfg.cluster, cfg))
    k_steps = -(-k // cfg.tile_k) * cfg.tile_k
    groups = ((split_from, k_steps), (units - split_from, k_steps / cfg.split_k))  # (units, K of each): whole, parts
    efficiency = _MMA_EFFICIENCY[min(cfg.tile_n, 256)] * (1.0 if cfg.consumers == 2 else 0.6)
    unique_bytes = 2.0 * (m * k + n * k + m * n)
    seconds = 0.0
    for count, k_part in groups:
        compute = 2.0 * cfg.tile_m * cfg.tile_n * k_part / (_SM_TFLOPS * 1e12 * efficiency)
        loads = (min(cfg.tile_m, m) + cfg.tile_n) * k_part * 2 / _SM_LOAD_BYTES_PER_S
        unit = max(compute, loads) + _UNIT_COST_S
        left = count
        while left > 0:  # each wave at least its share of the unique bytes at HBM speed
            wave = min(left, slots)
            seconds += max(unit, unique_bytes * wave * k_part / (tiles * k_steps) / _HBM_BYTES_PER_S)
            left -= wave
    if cfg.split_k > 1:
        split_share = (tiles - split_from) / tiles  # of C's elements, written as fp32 partials and read back
        others = (cfg.split_k - 1) * min(cfg.tile_m, m) * cfg.tile_n * 4  # the last split's reads of a tile
        seconds += 2.0 * cfg.split_k * m * n * 4 * split_share / _HBM_BYTES_PER_S
        seconds += others / _SM_LOAD_BYTES_PER_S + _SPLIT_K_FINISH_S
    return seconds


_SPLIT_TAIL_MARGIN = 1.05  # the model's gain a split last wave needs (docs/tuning/gemm.md#split-tail)


@functools.cache
def choose_config(m: int, n: int, k: int, sms: int, tile_widths: tuple = (256, 192, 128, 64)) -> GemmConfig:
    """The configuration for an (m, n, k) problem on ``sms`` SMs: 64-row tiles (one consumer warpgroup) when M <= 64,
    2-CTA clusters whenever there are two tile rows to share B, and among the rest of :func:`candidate_configs`
    (tile width, split of K) the one :func:`estimated_seconds` ranks fastest; a split of the last wave
    (``split_tail``) only where the model has it at least :data:`_SPLIT_TAIL_MARGIN` faster than the best without it.
    Pingpong, stream-K and 256 x 128 tiles are left out: timed, they won too rarely for a model that cannot yet tell
    where (docs/tuning/gemm.md#not-chosen). ``tile_widths``: the tile_n allowed."""
    configs = [
        cfg
        for cfg in candidate_configs(m, n, k, sms)
        if cfg.tile_n in tile_widths
        and (cfg.tile_m == 64) == (m <= 64)
        and (cfg.cluster_m == 2 or -(-m // cfg.tile_m) < 2 or cfg.tile_n % 128)
        and cfg.schedule == "cooperative"
        and not cfg.stream_k
        and cfg.tile_m <= 128
    ]
    best = min(configs, key=lambda cfg: estimated_seconds(m, n, k, cfg, sms))
    if best.split_tail:
        whole = min(
            (cfg for cfg in configs if not cfg.split_tail), key=lambda cfg: estimated_seconds(m, n, k, cfg, sms)
        )
        if estimated_seconds(m, n, k, whole, sms) < _SPLIT_TAIL_MARGIN * estimated_seconds(m, n, k, best, sms):
            return whole
    return best


def fp8_config(cfg: GemmConfig) -> GemmConfig:
    """The fp8 form of a 16-bit operands' configuration: K steps twice as long (128 fp8 elements, one 128-byte
    swizzled row), hence the same bytes per pipeline stage and the same stages."""
    return dataclasses.replace(cfg, tile_k=2 * cfg.tile_k)


@functools.cache
def choose_fp8_config(m: int, n: int, k: int, sms: int) -> GemmConfig:
    """The configuration for an (m, n, k) problem of fp8 operands: to the cost model an fp8 K is a bf16 K / 2 (the same
    operand bytes per K step, twice the tensor cores' rate), so it is :func:`choose_config`'s for K / 2 in K steps of
    128 (:func:`fp8_config`)."""
    return fp8_config(choose_config(m, n, -(-k // 2), sms))


WIDE_BLOCKSCALE_GAIN = 1.08  # a 192-wide block-scaled tile's time per element against a 128 x 128 tile's
TALL_BLOCKSCALE_GAIN = 1.12  # a 256 x 128 tile's (its K loop two steps an iteration), fitted at M 512-8192
TALL_BLOCKSCALE_MIN_M = 512  # ... from this M on (the least timed)
# Set at run time by tuning scripts: keyed where they differ from these
# (flydsl.compiler.cache.package_key).
cache.declare_tunables(__name__, "WIDE_BLOCKSCALE_GAIN", "TALL_BLOCKSCALE_GAIN", "TALL_BLOCKSCALE_MIN_M")


@functools.cache
def choose_blockscale_config(m: int, n: int, k: int, sms: int) -> GemmConfig:
    """The configuration of a block-scaled fp8 GEMM: :func:`choose_fp8_config`'s among tiles at most 128 wide, with
    the deepest pipeline whose slots also hold their K step's scales, or the same 192 wide, or 256 x 128 in clusters
    of 2 CTAs along N sharing A (DeepGEMM's tile), where fewer waves of those make up for their larger tiles (a
    waves model: waves times each tile's elements, over :data:`WIDE_BLOCKSCALE_GAIN` for 192-wide tiles and
    :data:`TALL_BLOCKSCALE_GAIN` for 256 x 128 ones, those from :data:`TALL_BLOCKSCALE_MIN_M` rows; a split K keeps
    the 128-wide tile). Each consumer thread holds two K blocks' accumulators beside the float32 sums where three sets
    fit (tiles 128 wide: 64 registers per 64 rows each), one otherwise (192: 96; 256 x 128: one 64-row block's 64
    beside two blocks' sums), and a tile takes one or two scales per 128-column block of B
    (docs/tuning/blockscale.md#wide-tiles, #scales-by-tma)."""
    cfg = fp8_config(choose_config(m, n, -(-k // 2), sms, tile_widths=(128, 64)))
    if cfg.tile_n == 128 and cfg.split_k == 1:

        def cost(c):  # waves of tiles, each as long as its elements over its gain (tiles 128 wide: 1)
            tiles = -(-m // c.tile_m) * -(-n // c.tile_n)
            gain = WIDE_BLOCKSCALE_GAIN if c.tile_n == 192 else TALL_BLOCKSCALE_GAIN if c.tile_m == 256 else 1.0
            return -(-tiles // sms) * c.tile_m * c.tile_n / gain

        wide = dataclasses.replace(cfg, tile_n=192)
        if cost(wide) < cost(cfg):
            cfg = wide
        tall = dataclasses.replace(cfg, tile_m=256, tile_n=128, cluster_m=1, cluster_n=2)
        if cfg.tile_m == 128 and m >= TALL_BLOCKSCALE_MIN_M and cost(tall) < cost(cfg):
            cfg = tall
    return dataclasses.replace(cfg, **deepest_pipeline(cfg.tile_m, cfg.tile_n, slot_bytes(cfg.tile_m)))

"""FlyDSL's kernel expression API: numeric types, tensors and layouts, and the GPU operations kernels use.

import flydsl.expr as fx
from flydsl.expr import arith, gpu, math
from flydsl.expr import buffer_ops, nvvm, vector
from flydsl.expr.typing import T, Int32
"""

import flydsl.expr.buffer_ops as buffer_ops
import flydsl.expr.cluster as cluster
import flydsl.expr.mbarrier as mbarrier
import flydsl.expr.nvvm as nvvm
import flydsl.expr.tma as tma
import flydsl.expr.vector as vector
import flydsl.expr.wgmma as wgmma
from flydsl.expr import arith, gpu, math
from flydsl.expr.layout import cosize, crd2idx, get, idx2crd, make_layout, rank, size
from flydsl.expr.numeric import (
    BFloat16,
    Boolean,
    Float8E4M3FN,
    Float8E5M2,
    Float16,
    Float32,
    Float64,
    Index,
    Int8,
    Int16,
    Int32,
    Int64,
    Numeric,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    fastmath,
    fp_contract,
)
from flydsl.expr.params import Constexpr, Stream, const_expr, range_constexpr
from flydsl.expr.pipeline import Pipeline, PipelineState, TileScheduler, TmaPipeline
from flydsl.expr.printf import printf
from flydsl.expr.tensor import SmemAllocator, SmemPtr, Tensor, copy, local_partition, local_tile
from flydsl.expr.tiled_copy import TiledCopy
from flydsl.expr.tma import TmaDescriptor, TmaTile
from flydsl.expr.typing import T

__all__ = [
    "arith",
    "gpu",
    "math",
    "vector",
    "buffer_ops",
    "nvvm",
    "printf",
    "T",
    "Numeric",
    "fp_contract",
    "fastmath",
    "Boolean",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Uint8",
    "Uint16",
    "Uint32",
    "Uint64",
    "Index",
    "Float16",
    "BFloat16",
    "Float32",
    "Float64",
    "Float8E4M3FN",
    "Float8E5M2",
    "Tensor",
    "Constexpr",
    "Stream",
    "const_expr",
    "range_constexpr",
    "make_layout",
    "idx2crd",
    "crd2idx",
    "get",
    "size",
    "cosize",
    "rank",
    "copy",
    "local_tile",
    "local_partition",
    "SmemAllocator",
    "SmemPtr",
    "cluster",
    "wgmma",
    "mbarrier",
    "tma",
    "TmaDescriptor",
    "TmaTile",
    "Pipeline",
    "TmaPipeline",
    "PipelineState",
    "TileScheduler",
    "TiledCopy",
]

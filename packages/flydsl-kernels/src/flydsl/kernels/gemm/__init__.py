"""Hopper GEMMs: ``C = activation(A @ B + bias)`` in bf16/fp16, and ``fp8_gemm`` of fp8 operands with float32 scales,
with fp32 accumulation.

    from flydsl.kernels.gemm import fp8_gemm, gemm, prepare_weight
    c = gemm(a, b, bias=bias, activation="gelu")   # a (M, K), b (K, N): torch tensors on the GPU
    c = fp8_gemm(a8, w8.t(), scale_a, scale_w)     # fp8 a (M, K), w (N, K); scales per tensor, token or channel
    c = fp8_gemm(a8, prepare_weight(w8.t()), scale_a, scale_w)   # the same with weights prepared once
    c = blockscale_gemm(a8, w8.t(), a_scales, w_scales)   # scales per 1 x 128 of a and 128 x 128 of w

Two kernels: the warp-specialized persistent kernel (``gemm_ws``: TMA producer, wgmma consumers, 2-CTA clusters,
split K / stream-K, TMA-store epilogue) and, for M <= 16 with ``nn.Linear`` weights, a weight-streaming
``mma.sync`` kernel (``skinny_gemm_kernel``). The modules, from the bottom up, are the building blocks a new GEMM
composes:

================  =====================================================================================================
config            GemmConfig, its shared-memory budget, candidate_configs, choose_config and its cost model
schedulers        work units of a persistent kernel: TileScheduler, GroupedTiles, SplitKTiles, StreamKTiles
operands          operand_layout, OperandTiles (TMA loads into a pipeline slot), Producer/produce; host: TMA views
mainloop          Consumer, mma_steps, drain: the wgmma mainloop over an mbarrier pipeline
epilogue          Epilogue, Scale, EpilogueTensors: scales, bias, activation in float32; register and TMA stores
partials          fp32 partial tiles of split K and stream-K; the split_k_reduce kernel
warp_specialized  warp_specialized_gemm (the body), gemm_ws and gemm_ws_scaled (the kernels)
skinny            SkinnyConfig, choose_skinny_config, skinny_gemm_kernel (M <= 16)
prepared          prepare_weight: fp8 weights laid out once as the K panels the kernels load (PreparedWeight)
plan              plan_gemm: a call's route, configuration, TMA views, epilogue, grids and scratch, without a GPU
launch            gemm, skinny_gemm, launch_plan: a plan run on torch tensors
arguments         the entry points' argument checks
================  =====================================================================================================

``python -m flydsl.kernels.gemm.plan M N K`` prints what runs for a shape. Why it is tuned as it is:
``docs/tuning/gemm.md``.
"""

from flydsl.kernels.gemm.arguments import check_arguments, check_devices, zero_product
from flydsl.kernels.gemm.config import (
    GemmConfig,
    candidate_configs,
    choose_blockscale_config,
    choose_config,
    choose_fp8_config,
    estimated_seconds,
    fp8_config,
    max_stages,
    staging_bytes,
    staging_fits,
)
from flydsl.kernels.gemm.epilogue import ACTIVATIONS, Epilogue, EpilogueTensors, Scale
from flydsl.kernels.gemm.launch import blockscale_gemm, fp8_gemm, gemm, launch_plan, skinny_gemm
from flydsl.kernels.gemm.operands import MatrixSpec, operand_layout
from flydsl.kernels.gemm.partials import split_k_reduce
from flydsl.kernels.gemm.plan import GemmPlan, plan_blockscale, plan_gemm
from flydsl.kernels.gemm.prepared import PreparedWeight, prepare_weight
from flydsl.kernels.gemm.skinny import MAX_M, SkinnyConfig, choose_skinny_config, skinny_gemm_kernel
from flydsl.kernels.gemm.warp_specialized import gemm_ws, gemm_ws_blockscaled, gemm_ws_scaled

__all__ = [
    "ACTIVATIONS",
    "MAX_M",
    "Epilogue",
    "EpilogueTensors",
    "GemmConfig",
    "GemmPlan",
    "MatrixSpec",
    "PreparedWeight",
    "Scale",
    "SkinnyConfig",
    "blockscale_gemm",
    "candidate_configs",
    "check_arguments",
    "check_devices",
    "choose_blockscale_config",
    "choose_config",
    "choose_fp8_config",
    "choose_skinny_config",
    "estimated_seconds",
    "fp8_config",
    "fp8_gemm",
    "gemm",
    "gemm_ws",
    "gemm_ws_blockscaled",
    "gemm_ws_scaled",
    "launch_plan",
    "max_stages",
    "operand_layout",
    "plan_blockscale",
    "plan_gemm",
    "prepare_weight",
    "skinny_gemm",
    "skinny_gemm_kernel",
    "split_k_reduce",
    "staging_bytes",
    "staging_fits",
    "zero_product",
]

"""flydsl.kernels without a GPU: every kernel compiles, in every regime (warp, block, cluster; even and odd N), to PTX
that ptxas assembles for sm_90a with the accesses we expect; the configs cover N; argument validation names the
argument before anything is launched."""

from __future__ import annotations

import importlib

import pytest

import flydsl.compiler as flyc
from flydsl.kernels import norms
from flydsl.kernels.reduction import RowConfig, row_config

softmax_mod = importlib.import_module("flydsl.kernels.softmax")
norm_mod = importlib.import_module("flydsl.kernels.normalization")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))


class FakeGpuTensor:
    """Only ``__cuda_array_interface__`` (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, pointer=1 << 20):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (pointer, False),
            "strides": strides,
            "version": 3,
        }


_TYPESTR = {"f32": "<f4", "f16": "<f2"}

# (N, dtype): one per regime edge: warp (1 thread per row ... 32), block, cluster; odd N (per-element tails).
REGIME_CASES = [(1, "f32"), (3, "f16"), (1024, "bf16"), (4097, "f32"), (32768, "bf16"), (65537, "f16"), (262144, "f32")]


def _regime_ids():
    return [f"{n}-{dtype}-{row_config(n, dtype).regime}" for n, dtype in REGIME_CASES]


def _assembled(module) -> str:
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def _accesses(ptx: str) -> set:
    return {line.split()[0] for line in ptx.splitlines() if line.strip().startswith(("ld.global", "st.global"))}


def test_configs_cover_every_n():
    for dtype in ("f32", "f16", "bf16"):
        for n in [1, 2, 3, 7, 8, 31, 1000, 1024, 4097, 32768, 65537, 131072, 262144, 262145, 1 << 20]:
            for held in (1, 2, 4):
                cfg = row_config(n, dtype, held)
                assert cfg.capacity >= n, (n, dtype, cfg)
                assert cfg.block <= 1024 and cfg.cluster <= 8
    assert row_config(1024, "bf16").regime == "warp"
    assert row_config(2048, "bf16").regime == "block"
    assert row_config(65536, "bf16").regime == "cluster" and row_config(262144, "f32").cluster == 8
    with pytest.raises(ValueError, match="power of two"):
        RowConfig("f32", 4, 1, 48, 1, 1, True)


@pytest.mark.parametrize("n, dtype", REGIME_CASES, ids=_regime_ids())
def test_softmax_compiles_in_every_regime(n, dtype):
    spec = flyc.TensorSpec((8, n), dtype)
    cfg = row_config(n, dtype)
    ptx = _assembled(softmax_mod.softmax_forward_kernel.lower(spec, spec, cfg))
    assert "ex2.approx.f32" in ptx
    if cfg.even:
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= _accesses(ptx)  # 16-byte row tiles
    if cfg.cluster > 1:
        assert "mapa.shared::cluster" in ptx and "barrier.cluster.wait" in ptx
    bwd = row_config(n, dtype, held=4)
    _assembled(softmax_mod.softmax_backward_kernel.lower(spec, spec, spec, bwd))


@pytest.mark.parametrize("n, dtype", REGIME_CASES[1::2], ids=_regime_ids()[1::2])
def test_norms_compile_in_every_regime(n, dtype):
    rows = flyc.TensorSpec((8, n), dtype)
    weight = flyc.TensorSpec((n,), "f32")
    stats = flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, n), "f32")
    variants = [
        norm_mod.NormFlags(False, weight=True, bias=True, mean=True, rstd=True),
        norm_mod.NormFlags(True, residual=True, weight=True),
    ]
    for flags in variants:
        cfg = row_config(n, dtype, held=2 if flags.residual else 1)
        module = norm_mod.norm_forward_kernel.lower(
            rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
        )
        _assembled(module)
    for flags in (norm_mod.NormFlags(False, weight=True, bias=True), norm_mod.NormFlags(True, weight=True)):
        cfg = row_config(n, dtype, held=4)
        _assembled(
            norm_mod.norm_backward_kernel.lower(rows, rows, weight, stats, stats, rows, partial, partial, cfg, flags)
        )
    _assembled(norm_mod.column_sum_kernel.lower(partial, flyc.TensorSpec((n,), dtype)))


def _x(shape=(4, 64), typestr="<f4", strides=None):
    return FakeGpuTensor(shape, typestr, strides)


def test_validation_names_the_argument():
    x = _x()
    with pytest.raises(ValueError, match="x: expected a 2-D tensor"):
        norms.softmax(_x((64,)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float16 or bfloat16, got i32"):
        norms.softmax(_x(typestr="<i4"))
    with pytest.raises(ValueError, match="x: expected unit stride on the last dim"):
        norms.softmax(_x(strides=(4, 8)))
    with pytest.raises(ValueError, match="out: expected N = 64"):
        norms.softmax(x, out=_x((4, 32)))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        norms.softmax(x, out=_x(typestr="<f2"))
    with pytest.raises(TypeError, match="pass the output tensor explicitly"):
        norms.softmax(x)
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\)"):
        norms.rms_norm(x, _x((32,)), out=_x())
    with pytest.raises(ValueError, match="eps: expected a non-negative number"):
        norms.layer_norm(x, None, None, eps=-1.0, out=_x())
    with pytest.raises(TypeError, match="rstd: expected dtype float32"):
        norms.rms_norm(x, None, out=_x(), rstd=FakeGpuTensor((4,), "<f2"))
    with pytest.raises(ValueError, match=r"mean: expected shape \(4,\)"):
        norms.layer_norm_backward(x, x, None, _x((5,)), _x((4,)), dx=_x())
    with pytest.raises(ValueError, match="residual: expected 4 rows"):
        norms.fused_add_rms_norm(x, _x((3, 64)), None, out=_x(), residual_out=_x())
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        norms.softmax_backward(_x(typestr="<f2"), x, dx=_x())

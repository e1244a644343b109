"""@flyc.kernel on CPU: tracing, specialization, argument checks and PTX for sm_90a (no GPU needed)."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

from .fakes import FakeGpuTensor


@flyc.kernel
def vadd(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        c[i] = a[i] + b[i]


@flyc.kernel
def scaled_rows(x: fx.Tensor, y: fx.Tensor, alpha: fx.Float32, cols: fx.Constexpr[int]):
    row = gpu.block_idx.x
    for j in fx.range_constexpr(cols):
        y[row, j] = x[row, j] * alpha


def _vectors(n=1000, typestr="<f4", pointer=1 << 20):
    return [FakeGpuTensor((n,), typestr, pointer + k * 4096) for k in range(3)]


def test_kernel_compiles_to_ptx_for_sm_90a():
    module = vadd.lower(*_vectors(), 1000)
    assert module.kernels == {"vadd": "plplpli"}  # per tensor: pointer, extent; the unit stride is static
    assert ".target sm_90a" in module.ptx and "ld.global" in module.ptx
    assert module.cubin is not None  # ptxas assembled it


def test_one_binary_serves_every_size():
    first = vadd.specialize(vadd._bind([*_vectors(1000), 1000], {}))
    second = vadd.specialize(vadd._bind([*_vectors(77), 77], {}))
    assert first.key == second.key
    assert second.launch_args[:2] == [1 << 20, 77]


def test_specialization_follows_dtype_strides_and_alignment():
    def key(*tensors):
        return vadd.specialize(vadd._bind([*tensors, 1], {})).key

    base = key(*_vectors())
    assert key(*_vectors(typestr="<f2")) != base
    misaligned = _vectors(pointer=(1 << 20) + 4)
    assert key(*misaligned) != base
    strided = FakeGpuTensor((10,), strides=(8,))
    assert key(strided, *_vectors()[1:]) != base


def test_constexpr_values_are_part_of_the_key_and_unroll():
    x, y = FakeGpuTensor((4, 8)), FakeGpuTensor((4, 8))
    spec3 = scaled_rows.specialize(scaled_rows._bind([x, y, 2.0, 3], {}))
    spec4 = scaled_rows.specialize(scaled_rows._bind([x, y, 2.0, 4], {}))
    assert spec3.key != spec4.key
    text = scaled_rows.trace(spec4.key)
    assert text.count("fly.store") == 4 and "scf.for" not in text


def test_2d_tensor_layout_has_dynamic_shape_and_specialized_strides():
    x, y = FakeGpuTensor((4, 8)), FakeGpuTensor((4, 8))
    spec = scaled_rows.specialize(scaled_rows._bind([x, y, 2.0, 2], {}))
    # Row-major (4, 8): the row stride 8 is a multiple of 16 bytes, the column stride is 1.
    assert spec.key[0] == ("f32", 2, (16, 1), True)
    text = scaled_rows.trace(spec.key)
    assert "!fly.layout<(?,?):(?{div=4},1)>" in text


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((1, 2), TypeError, r"kernel 'vadd\(a, b, c, n\)'"),
        ((*_vectors(), 1.5), TypeError, "argument 'n': expected an int for Int32"),
        ((*_vectors(), 2**40), OverflowError, "argument 'n'"),
        ((object(), *_vectors()[1:], 1), TypeError, "argument 'a': expected a GPU tensor"),
        ((FakeGpuTensor((4,), "<c8"), *_vectors()[1:], 1), TypeError, "argument 'a': unsupported element type"),
    ],
)
def test_bad_arguments_name_the_parameter(args, error, message):
    with pytest.raises(error, match=message):
        vadd.specialize(vadd._bind(list(args), {}))


def test_unannotated_parameters_are_refused_at_decoration():
    with pytest.raises(TypeError, match="parameter 'n' needs an annotation"):

        @flyc.kernel
        def bad(x: fx.Tensor, n):
            pass


def test_mixing_types_needs_an_explicit_conversion():
    @flyc.kernel
    def mixed(x: fx.Tensor, n: fx.Int32):
        x[0] = x[0] + n

    with pytest.raises(TypeError, match="cannot combine Float32 and Int32 implicitly") as info:
        mixed.lower(FakeGpuTensor((4,)), 1)
    # The traceback ends in the user's kernel; of FlyDSL's frames only the entry point that re-raised remains.
    assert info.traceback[-1].name == "mixed"
    internal = [entry for entry in info.traceback if "flydsl" in str(entry.path) and "tests" not in str(entry.path)]
    assert len(internal) <= 1, [str(entry.path) for entry in internal]


def test_compile_returns_a_callable_for_one_specialization():
    with pytest.raises(TypeError, match="expected a @flyc.kernel or @flyc.jit function"):
        flyc.compile(lambda: None)


def test_tensor_specs_compile_without_a_gpu_and_specialize_like_tensors():
    spec = flyc.TensorSpec((1000,), "f32")
    assert vadd.lower(spec, spec, spec, 1000).kernels == {"vadd": "plplpli"}
    key = vadd.specialize(vadd._bind([spec, spec, spec, 1], {})).key
    assert key == vadd.specialize(vadd._bind([*_vectors(), 1], {})).key
    row_major = flyc.TensorSpec((4, 8), "float16")
    assert row_major.strides == (8, 1) and row_major.dtype == "f16"
    assert flyc.TensorSpec((4,), "i8").dtype == "i8"  # MLIR names first (numpy's "i8" would be int64)
    unaligned = flyc.TensorSpec((1000,), "f32", aligned=False)
    assert vadd.specialize(vadd._bind([unaligned, spec, spec, 1], {})).key != key
    with pytest.raises(ValueError, match="dtype: expected one of"):
        flyc.TensorSpec((4,), "complex64")
    with pytest.raises(ValueError, match="strides: expected 2 strides"):
        flyc.TensorSpec((4, 8), strides=(1,))


@flyc.kernel
def row_total(x: fx.Tensor, out: fx.Tensor):
    row = gpu.block_idx.x
    acc = fx.Float32(0.0)
    for j in range(x.shape[1]):
        acc = acc + x[row, j]
    out[row] = acc


def test_mark_static_compiles_extents_in():
    x, out = flyc.TensorSpec((4, 8), "f32"), flyc.TensorSpec((4,), "f32")
    dynamic = row_total.specialize([x, out])
    static = row_total.specialize([flyc.mark_static(x, dims=(-1,)), out])
    assert static.key != dynamic.key and static.key[0][4] == (None, 8)
    assert len(static.launch_args) == len(dynamic.launch_args) - 1  # the marked extent is not passed
    text = row_total.trace(static.key)
    assert "!fly.layout<(?,8):(?{div=4},1)>" in text
    assert re.search(r"arith.constant 8 : index", text)
    other = row_total.specialize([flyc.mark_static(flyc.TensorSpec((4, 16), "f32"), dims=(1,)), out])
    assert other.key != static.key  # each value of a static extent is its own binary
    with pytest.raises(ValueError, match="argument 'x': mark_static dims must be ints in"):
        row_total.specialize([flyc.mark_static(x, dims=(2,)), out])
    assert row_total.lower(flyc.mark_static(x), out).kernels == {"row_total": "plpl"}


def test_the_default_stream_of_array_interface_tensors_is_the_one_they_name():
    from flydsl.compiler.args import describe_tensor
    from flydsl.compiler.frameworks import default_stream

    on_stream = FakeGpuTensor((4,))
    on_stream.__cuda_array_interface__["stream"] = 0x1234
    assert default_stream([describe_tensor(on_stream, "x")]) == 0x1234
    assert default_stream([describe_tensor(FakeGpuTensor((4,)), "x")]) == 0


def _argmax(a, b):
    """(value, index) pairs: the larger value, the lower index among equal ones."""
    take = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
    return [fx.arith.select(take, b[0], a[0]), fx.arith.select(take, b[1], a[1])]


@flyc.kernel
def warp_argmax(x: fx.Tensor, best: fx.Tensor, where: fx.Tensor):
    lane = gpu.lane_id()
    i = gpu.block_idx.x * 32 + lane
    value, index = gpu.warp_reduce((x[i], i), _argmax)
    if lane == 0:
        best[gpu.block_idx.x] = value
        where[gpu.block_idx.x] = index


def test_warp_reduce_of_a_tuple_shuffles_each_value_and_combines_them_jointly():
    spec = flyc.TensorSpec((64,), "f32")
    ptx = warp_argmax.lower(spec, flyc.TensorSpec((2,), "f32"), flyc.TensorSpec((2,), "i32")).ptx
    assert ptx.count("shfl.sync.bfly.b32") == 2 * 5  # both values at each of the 5 butterfly steps

    with pytest.raises(TypeError, match="combine function of two tuples"):

        @flyc.kernel
        def tuple_with_a_named_op(x: fx.Tensor):
            gpu.warp_reduce((x[0], x[1]), "add")

        tuple_with_a_named_op.lower(spec)


@flyc.kernel
def scaled_sums(x: fx.Tensor, y: fx.Tensor, contract: fx.Constexpr[bool]):
    i = gpu.thread_idx.x
    v = x[i]
    with fx.fp_contract(contract):
        y[i] = v * v + 1.0
    y[i + 64] = v * 3.0 + v


def test_float_products_and_sums_fuse_into_fma_unless_fp_contract_is_off():
    """Float + - * carry ``contract`` (nvcc's --fmad=true default): a product feeding a sum becomes one fma.
    Inside ``fx.fp_contract(False)`` each is rounded on its own (PTX ``.rn`` forbids ptxas to fuse them)."""
    spec = flyc.TensorSpec((128,), "f32")
    fused = scaled_sums.lower(spec, spec, True).ptx
    assert fused.count("fma.rn.f32") == 2 and "mul.rn.f32" not in fused
    apart = scaled_sums.lower(spec, spec, False).ptx
    assert apart.count("fma.rn.f32") == 1 and apart.count("mul.rn.f32") == 1 and apart.count("add.rn.f32") == 1


def test_a_kernel_traces_with_contraction_whatever_region_its_caller_is_in():
    """An fp_contract region around host code does not reach into kernels traced there: the cached kernel would
    otherwise depend on its first caller (the key does not hold the region)."""
    spec = flyc.TensorSpec((128,), "f32")
    with fx.fp_contract(False):
        inside = scaled_sums.lower(spec, spec, True).ptx
    assert inside.count("fma.rn.f32") == 2 and inside == scaled_sums.lower(spec, spec, True).ptx

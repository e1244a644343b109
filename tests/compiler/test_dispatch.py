"""The native launch path of ``@flyc.kernel`` (``runtime.Dispatcher``): it must compute exactly the specialization
key and launch arguments of the Python path (the disk cache key is made of them), launch only registered
specializations, and leave every argument the Python path would refuse to it (so errors still name the parameter).

Without a GPU, torch tensors are stood for by :class:`FakeTorchTensor` (a type whose module starts with ``torch``,
as kernel.py recognizes torch tensors) and launches by ``Dispatcher._dry_run``. The GPU tests use real torch."""

from __future__ import annotations

import importlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler import runtime
from flydsl.compiler._native import launcher

from .fakes import FakeGpuTensor

kernel_module = importlib.import_module("flydsl.compiler.kernel")  # the package's `kernel` is the decorator
frameworks = importlib.import_module("flydsl.compiler.frameworks")
attributes_module = importlib.import_module("flydsl.compiler.attributes")


class FakeDtype:
    """A torch dtype stand-in: one object per type, ``str`` as torch spells it."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


DTYPES = {name: FakeDtype(name) for name in ("float32", "float16", "bfloat16", "float64", "int8", "int64", "uint8")}


class FakeTorchTensor:
    """Reads like a torch tensor (is_cuda, dtype, data_ptr(), shape, stride(), get_device()); never dereferenced."""

    def __init__(self, shape, dtype="float32", strides=None, pointer=1 << 20, cuda=True, device=0):
        self.shape = tuple(shape)
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        if strides is None:
            strides, step = [], 1
            for extent in reversed(self.shape):
                strides.append(step)
                step *= extent
            strides = reversed(strides)
        self._strides = tuple(strides)
        self._pointer = pointer
        self.is_cuda = cuda
        self.device = f"cuda:{device}" if cuda else "cpu"
        self._device = device if cuda else -1

    def data_ptr(self):
        return self._pointer

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device


FakeTorchTensor.__module__ = "torch_fake_for_tests"


@flyc.kernel
def mixed(x: fx.Tensor, y: fx.Tensor, a: fx.Float32, n: fx.Int32, flag: fx.Constexpr[bool], s: fx.Stream):
    i = fx.gpu.block_idx.x * fx.gpu.block_dim.x + fx.gpu.thread_idx.x
    if i < n:
        if flag:
            y[i] = x[i] * a


@flyc.kernel
def two(x: fx.Tensor, y: fx.Tensor):
    if fx.gpu.thread_idx.x == 0:
        y[0] = x[0]


def _python(kernel, values):
    spec = kernel.specialize(list(values))
    return spec.key, spec.launch_args


def _native(kernel, values):
    return kernel.new_dispatcher().describe(values)


def test_keys_and_arguments_match_the_python_path():
    cases = [
        (FakeTorchTensor((64,)), FakeTorchTensor((64,)), 2.0, 64, True, None),
        (FakeTorchTensor((8, 16), "float16"), FakeTorchTensor((8, 16), "float16", (1, 8)), 1, 0, False, 7),
        (FakeTorchTensor((3, 5), strides=(5, 1), pointer=(1 << 20) + 4), FakeTorchTensor(()), -1.5, -3, 1, None),
        (
            FakeTorchTensor((4, 4, 4), "int8", (16, 4, 1)),
            FakeTorchTensor((2, 3), "int64", (0, 3)),
            0.0,
            2**31 - 1,
            0,
            0,
        ),
        (FakeTorchTensor((7,), "bfloat16", (3,)), FakeTorchTensor((1, 1), "uint8", (1, 1)), 1e30, -(2**31), "s", None),
    ]
    for values in cases:
        expected = _python(mixed, values)
        assert _native(mixed, values) == expected
        key, args = _native(mixed, values)
        assert repr(key) == repr(expected[0])  # the disk cache key is made of repr(key): same types too


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(sorted(DTYPES)),
    shape=st.lists(st.integers(0, 1 << 40), max_size=4),
    data=st.data(),
    pointer=st.integers(0, (1 << 64) - 1),
)
def test_tensor_keys_match_the_python_path(dtype, shape, data, pointer):
    strides = data.draw(st.lists(st.integers(-(1 << 40), 1 << 40), min_size=len(shape), max_size=len(shape)))
    x = FakeTorchTensor(shape, dtype, strides, pointer)
    y = FakeTorchTensor((3,), "float32", pointer=data.draw(st.integers(0, 1 << 50)))
    expected = _python(two, (x, y))  # first: the Python path registers the tensor type and dtypes
    # A tensor whose offsets reach 2^31 elements is specialized apart (a sixth key element), natively too.
    assert _native(two, (x, y)) == expected


def test_numbers_and_constexprs_match_the_python_path():
    @flyc.kernel
    def numbers(
        a: fx.Int32, b: fx.Int64, c: fx.Float64, d: fx.Constexpr[int], e: fx.Constexpr, f: fx.Uint8, g: fx.Uint64
    ):
        pass

    for values in [
        (0, 0, 0.0, 0, None, 0, 0),
        (1, -(2**63), 3, 2**70, (1, "a", 2.5), 255, 2**63 - 1),
        (-(2**31), 2**63 - 1, float("inf"), -1, "text", 1, 5),
    ]:
        expected = _python(numbers, values)
        assert _native(numbers, values) == expected
    # A bool is not an integer argument on either path: the native one declines, the Python one says why.
    for position in (0, 1, 5, 6):
        values = [1, 1, 1.0, 0, None, 1, 1]
        values[position] = True
        assert _native(numbers, values) is None
        with pytest.raises(TypeError, match="expected an int for .*, got True"):
            _python(numbers, values)


TYPESTRS = ["<f4", "<f2", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u4"]


@settings(max_examples=150, deadline=None)
@given(
    typestr=st.sampled_from(TYPESTRS),
    shape=st.lists(st.integers(0, 1 << 15), max_size=4),  # row-major strides fit int64 (else both paths refuse)
    data=st.data(),
    pointer=st.integers(1, (1 << 64) - 1),  # (a null pointer: both refuse, test_array_interface.py)
)
def test_array_interface_keys_match_the_python_path(typestr, shape, data, pointer):
    """cupy-like arrays (``__cuda_array_interface__``, strides in bytes or None) launch natively once kernel.py
    has seen their type, with its key and arguments."""
    item = int(typestr[2:])
    strides = data.draw(
        st.one_of(
            st.none(),
            st.lists(
                st.integers(-(1 << 30), 1 << 30).map(lambda s: s * item), min_size=len(shape), max_size=len(shape)
            ),
        )
    )
    x = FakeGpuTensor(shape, typestr, pointer, None if strides is None else tuple(strides))
    y = FakeTorchTensor((3,), "float32")
    expected = _python(two, (x, y))  # first: the Python path registers the array type and the typestrs
    assert _native(two, (x, y)) == expected  # (wide ones too: a sixth key element)


def test_array_interface_streams_and_refusals_match_the_python_path():
    x = FakeGpuTensor((64,), "<f4")
    y = FakeGpuTensor((64,), "<f4")
    y.__cuda_array_interface__["stream"] = 77  # v3: the stream the producer works on (x names none: y's counts)
    values = (x, y, 1.0, 64, True, None)
    dispatcher, _ = _registered(mixed, values)
    assert (
        dispatcher._dry_run(values, 1, 32)["stream"]
        == 77
        == frameworks.default_stream(mixed.specialize(list(values)).tensors)
    )
    x.__cuda_array_interface__["stream"] = 1  # the legacy default stream, named
    assert dispatcher._dry_run(values, 1, 32)["stream"] == 1
    del y.__cuda_array_interface__["stream"], x.__cuda_array_interface__["stream"]
    assert dispatcher._dry_run(values, 1, 32)["stream"] == 0
    odd = FakeGpuTensor((4, 4), "<f4", strides=(16, 2))  # a stride that is not a whole element: Python raises
    assert dispatcher.describe((odd, y, *values[2:])) is None
    with pytest.raises(ValueError, match="not multiples of the element size"):
        mixed.specialize([odd, y, *values[2:]])
    complex_values = FakeGpuTensor((4,), "<c8")
    assert dispatcher.describe((complex_values, y, *values[2:])) is None


@pytest.mark.parametrize(
    "values",
    [
        (flyc.TensorSpec((4,)), FakeTorchTensor((4,)), 1.0, 1, True, None),
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), 1.0, 1, True),  # too few
    ],
)
def test_other_tensors_take_the_python_path(values):
    dispatcher = mixed.new_dispatcher()
    assert dispatcher.describe(values) is None
    assert dispatcher.launch(values, 1, 32) is False


@pytest.mark.parametrize(
    "values",
    [
        (FakeTorchTensor((4,), cuda=False), FakeTorchTensor((4,)), 1.0, 1, True, None),  # a CPU tensor
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), True, 1, True, None),  # a bool for a float
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), "1", 1, True, None),
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), 1.0, 2**31, True, None),  # out of Int32's range
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), 1.0, 1.0, True, None),  # a float for an int
        (FakeTorchTensor((4,)), FakeTorchTensor((4,)), 1.0, 1, [True], None),  # an unhashable Constexpr
        (FakeTorchTensor((4,), FakeDtype("complex64")), FakeTorchTensor((4,)), 1.0, 1, True, None),
    ],
)
def test_what_the_python_path_refuses_is_left_to_it(values):
    dispatcher = mixed.new_dispatcher()
    assert dispatcher.describe(values) is None
    assert dispatcher.launch(values, 1, 32) is False
    with pytest.raises((TypeError, ValueError, OverflowError)) as error:
        mixed.specialize(list(values))
    assert "argument '" in str(error.value)


def _registered(kernel, values, shared=0):
    """A dispatcher with the specialization of ``values`` registered (signature from the compiled module)."""
    key = kernel.specialize(list(values)).key
    signature = kernel.compiled_module(kernel.specialize(list(values))).kernels[kernel.name]
    dispatcher = kernel.new_dispatcher()
    assert dispatcher.add(key, None, signature, shared)
    return dispatcher, signature


def test_dry_run_packs_what_the_launcher_would():
    values = (FakeTorchTensor((8, 16), strides=(16, 1)), FakeTorchTensor((8, 16), strides=(32, 1)), 0.5, 100, True, 7)
    dispatcher, signature = _registered(mixed, values, shared=64)
    key, args = _python(mixed, values)
    run = dispatcher._dry_run(values, (2, 3), 128)
    expected = runtime._rt._validate_launch((2, 3), 128, signature, args, 64, 7)
    assert run["params"] == expected["params"]
    assert (run["grid"], run["block"], run["cluster"]) == ((2, 3, 1), (128, 1, 1), None)
    assert (run["shared_mem"], run["stream"], run["key"]) == (64, 7, key)
    assert struct.unpack_from("<Q", run["params"])[0] == 1 << 20

    class Stream:
        cuda_stream = 99

    assert dispatcher._dry_run(values, 1, 1, stream=Stream())["stream"] == 99  # the launch's stream wins
    assert dispatcher._dry_run(values, 1, 1, stream=5)["stream"] == 5
    assert dispatcher._dry_run(values, 1, 1, smem=100)["shared_mem"] == 100
    assert dispatcher._dry_run(values, 1, 1, smem=63) is None  # too little: the Python path raises
    assert dispatcher._dry_run(values, 1, 1, stream=object()) is None
    with pytest.raises(ValueError, match="threads"):  # the launcher's own errors, as from Function.launch
        dispatcher._dry_run(values, 1, 2048)


def test_tensors_past_2_31_elements_launch_natively_under_their_own_key():
    """A tensor whose offsets reach 2^31 elements has a specialization of its own (64-bit offsets); the native path
    keys it apart from a small one of the same dtype and rank and launches it as the Python path would."""
    small = FakeTorchTensor((1024, 1024))
    last_small = FakeTorchTensor((1 << 16, 1 << 15))  # 2^31 elements: the last one's offset is 2^31 - 1
    wide = FakeTorchTensor((1 << 16, 1 << 15 | 1), strides=(1 << 16, 1))  # strided past 2^31
    out = FakeTorchTensor((3,), "float32")
    assert len(_python(two, (wide, out))[0][0]) == 6
    assert len(_python(two, (small, out))[0][0]) == len(_python(two, (last_small, out))[0][0]) == 4
    dispatcher, signature = _registered(two, (wide, out))
    assert dispatcher._dry_run((small, out), 1, 32, stream=0) is None  # not the wide specialization
    run = dispatcher._dry_run((wide, out), 1, 32, stream=0)
    key, args = _python(two, (wide, out))
    assert run["key"] == key and run["params"] == runtime._rt._validate_launch(1, 32, signature, args, 0, 0)["params"]
    assert _native(two, (last_small, out)) == _python(two, (last_small, out))


def test_a_tensor_passed_twice_is_read_once():
    """The zoo's kernels pass their first tensor for the tensors a variant leaves out: its second occurrence reuses
    the first read (the key and the packed arguments of two equal tensors), without calling it again."""

    class Counted(FakeTorchTensor):
        reads = 0

        def data_ptr(self):
            Counted.reads += 1
            return super().data_ptr()

    Counted.__module__ = FakeTorchTensor.__module__
    twins = (FakeTorchTensor((8, 16)), FakeTorchTensor((8, 16)), 0.5, 100, True, 7)
    dispatcher, _ = _registered(mixed, twins)
    t = Counted((8, 16))
    assert frameworks.is_torch_tensor(t)  # registers the type with the native path
    same = (t, t, 0.5, 100, True, 7)
    assert _native(mixed, same) == _native(mixed, twins) == _python(mixed, same)
    Counted.reads = 0
    run = dispatcher._dry_run(same, 1, 32)
    assert run is not None and run["params"] == dispatcher._dry_run(twins, 1, 32)["params"]
    assert Counted.reads == 1


@flyc.kernel
def traced_shape(x: fx.Tensor, threads: fx.Constexpr[int]):
    flyc.set_kernel_attributes(threads=threads, cluster=2)
    x[fx.gpu.thread_idx.x] = 1.0


def test_launches_against_compiled_shapes_are_left_to_the_python_path():
    """The native dispatcher declines a launch whose block (or given cluster) contradicts the shapes a kernel was
    compiled with, here from set_kernel_attributes; the Python path then raises, naming the argument."""
    values = (FakeTorchTensor((384,)), 384)
    spec = traced_shape.specialize(list(values))
    compiled = traced_shape.compiled_module(spec)
    assert compiled.launch_shapes == {"traced_shape": ((384, 1, 1), (2, 1, 1))}
    dispatcher = traced_shape.new_dispatcher()
    block, cluster = compiled.launch_shapes["traced_shape"]
    assert dispatcher.add(spec.key, None, compiled.kernels["traced_shape"], 0, block, cluster)
    assert dispatcher._dry_run(values, 2, 384, stream=5) is not None  # (a stream: no torch stream getter here)
    assert dispatcher._dry_run(values, 2, (384, 1, 1), stream=5, cluster=2) is not None
    assert dispatcher._dry_run(values, 2, 256, stream=5) is None
    assert dispatcher._dry_run(values, 2, 384, stream=5, cluster=(1, 1, 1)) is None
    with pytest.raises(ValueError, match=r"block: kernel 'traced_shape' was compiled for blocks of \(384, 1, 1\)"):
        attributes_module.check_launch_shape("traced_shape", block, cluster, 256, None)
    with pytest.raises(ValueError, match=r"cluster: kernel 'traced_shape' was compiled for clusters of \(2, 1, 1\)"):
        attributes_module.check_launch_shape("traced_shape", block, cluster, 384, 4)


class CountedConfig:
    """A Constexpr value that counts its hashes (configurations are frozen dataclasses: hashing costs a tuple)."""

    hashes = 0

    def __init__(self, tiles):
        self.tiles = tiles

    def __hash__(self):
        CountedConfig.hashes += 1
        return hash(self.tiles)

    def __eq__(self, other):
        return isinstance(other, CountedConfig) and other.tiles == self.tiles


def test_constexprs_are_hashed_only_when_not_the_registered_object():
    config = CountedConfig(4)
    values = (FakeTorchTensor((64,)), FakeTorchTensor((64,)), 1.0, 64, config, 3)
    dispatcher, _ = _registered(mixed, values)
    before = CountedConfig.hashes
    assert dispatcher._dry_run(values, 1, 32) is not None  # the registered object itself: matched by identity
    assert CountedConfig.hashes == before
    assert dispatcher._dry_run((*values[:4], CountedConfig(4), 3), 1, 32) is not None  # an equal one: hash + ==
    assert CountedConfig.hashes == before + 1
    assert dispatcher._dry_run((*values[:4], CountedConfig(5), 3), 1, 32) is None


def test_only_registered_specializations_launch():
    values = (FakeTorchTensor((64,)), FakeTorchTensor((64,)), 1.0, 64, True, 3)
    dispatcher, _ = _registered(mixed, values)
    assert len(dispatcher) == 1
    assert dispatcher._dry_run(values, 1, 32) is not None
    assert dispatcher._dry_run((*values[:4], 1, 3), 1, 32) is None  # another Constexpr value (1 == True, an int)
    assert dispatcher._dry_run((*values[:4], False, 3), 1, 32) is None
    unaligned = FakeTorchTensor((64,), pointer=(1 << 20) + 4)
    assert dispatcher._dry_run((unaligned, *values[1:]), 1, 32) is None
    halves = FakeTorchTensor((64,), "float16")
    assert dispatcher._dry_run((halves, *values[1:]), 1, 32) is None
    strided = FakeTorchTensor((64,), strides=(2,))
    assert dispatcher._dry_run((strided, *values[1:]), 1, 32) is None
    assert dispatcher._dry_run((FakeTorchTensor((5,)), FakeTorchTensor((9,)), 2.0, 7, True, 3), 1, 32) is not None
    assert dispatcher.add(mixed.specialize(list(values)).key, None, "p", 0)  # the same key replaces its entry
    assert len(dispatcher) == 1
    dispatcher.clear()
    assert dispatcher._dry_run(values, 1, 32) is None


def test_the_default_stream_is_the_first_tensors_current_stream():
    values = (FakeTorchTensor((64,), device=3), FakeTorchTensor((64,)), 1.0, 64, True, None)
    dispatcher, _ = _registered(mixed, values)
    seen = []
    launcher._register_stream_getter(lambda device: seen.append(device) or 1234)
    try:
        assert dispatcher._dry_run(values, 1, 32)["stream"] == 1234
        assert seen == [3]
    finally:  # what kernel.py registered, if anything (GPU tests may share this process)
        launcher._register_stream_getter(frameworks._current_torch_stream)


def test_kernel_calls_take_the_native_path_first(monkeypatch):
    calls = []

    def fake_dispatch(values, grid, block, smem, stream, cluster):
        calls.append((values, grid, block, smem, stream, cluster))
        return True

    monkeypatch.setattr(two, "_dispatch", fake_dispatch)
    x, y = FakeTorchTensor((4,)), FakeTorchTensor((4,))
    two(x, y).launch(2, 64, stream=5)
    two(x, y=y).launch(1, 32)
    assert calls == [((x, y), 2, 64, None, 5, None), ([x, y], 1, 32, None, None, None)]


def test_compiled_kernels_hold_their_one_specialization(monkeypatch):
    x, y = flyc.TensorSpec((4,)), flyc.TensorSpec((4,))
    monkeypatch.setattr(kernel_module.KernelFunction, "loaded", lambda self, spec: _Loaded(self, spec))
    compiled = flyc.compile(two, x, y)
    assert len(compiled._dispatcher) == 1
    values = (FakeTorchTensor((4,)), FakeTorchTensor((9,)))
    assert compiled._dispatcher._dry_run(values, 1, 32, stream=0)["key"] == compiled.key
    assert compiled._dispatcher._dry_run((FakeTorchTensor((4,), "float16"), values[1]), 1, 32, stream=0) is None


class _Loaded:
    """A loaded kernel without a GPU: the Function is None (``add`` accepts it for tests)."""

    def __init__(self, kernel, spec):
        self.function = None
        self.signature = kernel.compiled_module(spec).kernels[kernel.name]
        self.shared_bytes = 0
        self.block = self.cluster = None


# --- on the GPU ------------------------------------------------------------------------------------------------------


@flyc.kernel
def scale(x: fx.Tensor, y: fx.Tensor, a: fx.Float32, n: fx.Int32):
    i = fx.gpu.block_idx.x * fx.gpu.block_dim.x + fx.gpu.thread_idx.x
    if i < n:
        y[i] = x[i] * a


@pytest.mark.gpu
def test_native_launches_on_the_gpu():
    torch = pytest.importorskip("torch")
    x = torch.randn(1000, device="cuda")
    y = torch.full_like(x, float("nan"))
    scale(x, y, 2.0, 1000).launch(4, 256)  # the Python path: compiles, registers
    assert len(scale._dispatcher) == 1
    y2 = torch.full_like(x, float("nan"))
    assert scale._dispatch((x, y2, 3.0, 1000), 4, 256, None, None, None) is True
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 2)
    torch.testing.assert_close(y2, x * 3)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the tensors' current stream
        scale(x, y, 4.0, 1000).launch(4, 256)
    scale(x, y2, 5.0, 1000).launch(4, 256, stream=stream)
    stream.synchronize()
    torch.testing.assert_close(y, x * 4)
    torch.testing.assert_close(y2, x * 5)
    assert len(scale._dispatcher) == 1 and len(scale._loaded) == 1

    y.fill_(float("nan"))
    scale(x[1:], y[1:], 2.0, 999).launch(4, 256)  # another specialization (data not 16-byte aligned): a new binary
    torch.cuda.synchronize()
    assert len(scale._loaded) == 2 and len(scale._dispatcher) == 2
    torch.testing.assert_close(y[1:], x[1:] * 2)

    with pytest.raises(ValueError, match="argument 'x': expected a CUDA tensor"):
        scale(x.cpu(), y, 2.0, 1000).launch(4, 256)
    with pytest.raises(OverflowError, match="argument 'n'"):
        scale(x, y, 2.0, 2**40).launch(4, 256)
    with pytest.raises(TypeError, match="argument 'a'"):
        scale(x, y, "2", 1000).launch(4, 256)
    with pytest.raises(ValueError, match="threads"):
        scale(x, y, 2.0, 1000).launch(4, 2048)

    compiled = flyc.compile(scale, x, y, 1.0, 1000)
    compiled(x, y, 6.0, 1000, grid=4, block=256)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 6)
    with pytest.raises(TypeError, match="was compiled for"):
        compiled(x[1:], y[1:], 2.0, 999, grid=4, block=256)


@flyc.kernel
def tma_first_element(src: fx.TmaDescriptor, out: fx.Tensor, scale: fx.Float32):
    if fx.gpu.thread_idx.x == 0:
        out[0] = src.shape[0].to(fx.Float32) * scale


def _tma_tile(shape=(256, 128), box=(64, 64), pointer=1 << 20, fill=7):
    tile = fx.TmaTile(FakeTorchTensor(shape, "bfloat16", pointer=pointer), box)
    tile._map = runtime.TensorMap.from_bytes(bytes([fill]) * 128)  # no driver here to encode one
    return tile


def test_tma_tiles_match_the_python_path_and_pack_their_maps():
    values = (_tma_tile(), FakeTorchTensor((4,)), 0.5)
    assert _native(tma_first_element, values) == _python(tma_first_element, values)
    dispatcher, signature = _registered(tma_first_element, values)
    assert signature.startswith("mll")
    key, args = _python(tma_first_element, values)
    run = dispatcher._dry_run(values, 1, 32, stream=0)
    assert run["key"] == key and run["tensor_maps"] == [bytes([7]) * 128]
    assert struct.unpack_from("<qq", run["params"], 8) == (256, 128)  # the extents after the map's slot
    # Another tensor of the same geometry class launches natively with its own map and extents.
    other = (_tma_tile(shape=(512, 64), pointer=1 << 21, fill=9), FakeTorchTensor((4,)), 0.5)
    assert dispatcher._dry_run(other, 1, 32, stream=0)["tensor_maps"] == [bytes([9]) * 128]
    # Another box is another specialization: left to the Python path.
    assert dispatcher._dry_run((_tma_tile(box=(32, 64)), *values[1:]), 1, 32, stream=0) is None
    assert dispatcher._dry_run((FakeTorchTensor((4,)), *values[1:]), 1, 32, stream=0) is None  # not a TmaTile


def test_a_tma_tiles_tensor_gives_the_default_stream():
    values = (_tma_tile(), FakeTorchTensor((4,), device=5), 0.5)
    values[0].source._device = 2  # the tile's tensor comes first, as in kernel.py
    dispatcher, _ = _registered(tma_first_element, values)
    seen = []
    launcher._register_stream_getter(lambda device: seen.append(device) or 4321)
    try:
        assert dispatcher._dry_run(values, 1, 32)["stream"] == 4321
        assert seen == [2]
    finally:
        launcher._register_stream_getter(frameworks._current_torch_stream)


@pytest.mark.gpu
def test_cupy_arrays_launch_natively_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(1000, dtype=cupy.float32)
    y = cupy.full(1000, cupy.nan, dtype=cupy.float32)
    scale(x, y, 2.0, 1000).launch(4, 256)  # the Python path: compiles, registers cupy's array type
    y2 = cupy.full(1000, cupy.nan, dtype=cupy.float32)
    assert scale._dispatch((x, y2, 3.0, 1000), 4, 256, None, None, None) is True  # natively
    stream = cupy.cuda.Stream()
    y3 = cupy.full(1000, cupy.nan, dtype=cupy.float32)
    with stream:  # cupy names its current stream in __cuda_array_interface__: the launch goes there
        scale(x, y3, 4.0, 1000).launch(4, 256)
    stream.synchronize()
    cupy.cuda.Device().synchronize()
    assert cupy.allclose(y, x * 2) and cupy.allclose(y2, x * 3) and cupy.allclose(y3, x * 4)

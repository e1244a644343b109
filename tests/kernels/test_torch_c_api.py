"""Torch tensors read through torch's stable C API (flydsl.compiler.torch_c_api): every fact the launcher reads that
way equals what the tensor's attributes say, anything it cannot read falls back to the attributes, and
``launcher.empty_like`` makes what ``torch.empty_like`` would."""

import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flydsl.compiler import torch_c_api  # noqa: E402
from flydsl.compiler._native import launcher  # noqa: E402

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@pytest.fixture(scope="module", autouse=True)
def c_api_on():
    why = torch_c_api.enable()
    assert why is None, why
    assert torch_c_api.status() == "on"


def facts_by_attributes(x):
    return (x.dtype, x.data_ptr(), x.get_device(), tuple(x.shape), tuple(x.stride()))


def both_readers(x):
    slow = launcher._tensor_facts(x, False)  # first: the C API learns each dtype's object from a read of them
    fast = launcher._tensor_facts(x, True)
    assert slow == facts_by_attributes(x)
    return fast, slow


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    dtype=st.sampled_from(DTYPES),
    view=st.sampled_from(["plain", "transpose", "slice", "step", "expand"]),
)
def test_the_c_api_reads_what_the_attributes_say(shape, dtype, view):
    x = torch.empty(shape, dtype=dtype)
    if view == "transpose" and x.dim() >= 2:
        x = x.transpose(0, -1)
    elif view == "slice" and x.dim() >= 1 and x.shape[0] > 1:
        x = x[1:]
    elif view == "step" and x.dim() >= 1:
        x = x[..., ::2]
    elif view == "expand":
        x = x.unsqueeze(0).expand(3, *x.shape)
    fast, slow = both_readers(x)
    assert fast == slow


def test_parameters_and_subclasses_are_read_too():
    class Tagged(torch.Tensor):
        pass

    for x in (torch.nn.Parameter(torch.randn(4, 6)), torch.randn(2, 3).as_subclass(Tagged)):
        fast, slow = both_readers(x)
        assert fast == slow


def test_what_the_c_api_cannot_read_is_read_from_the_attributes():
    meta = torch.empty(3, 4, device="meta")  # another device type
    sparse = torch.eye(3).to_sparse()  # another layout: no strides
    assert launcher._tensor_facts(meta, True) is None
    assert launcher._tensor_facts(meta, False) == facts_by_attributes(meta)
    assert launcher._tensor_facts(sparse, True) is None
    assert launcher._tensor_facts(torch.float32, True) is None  # not a tensor at all


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_like_makes_what_torch_empty_like_makes(dtype):
    x = torch.empty((3, 5, 7), dtype=dtype)
    for like in (x, x.transpose(0, 2), x[:, 1:, ::2]):
        made = launcher.empty_like(like)
        expected = torch.empty_like(like, memory_format=torch.contiguous_format)
        assert type(made) is torch.Tensor
        assert (made.dtype, made.shape, made.stride(), made.device) == (
            expected.dtype,
            expected.shape,
            expected.stride(),
            expected.device,
        )
        assert not made.requires_grad and made.data_ptr() != like.data_ptr()


def test_empty_like_follows_inference_mode_and_declines_other_types():
    x = torch.randn(4, 4)
    with torch.inference_mode():
        assert launcher.empty_like(x).is_inference()
    assert not launcher.empty_like(x).is_inference()
    assert launcher.empty_like(torch.nn.Parameter(x)) is None  # torch.empty_like would return a plain tensor too,
    assert launcher.empty_like(x.to_sparse()) is None  # but the C API path makes only torch.Tensor's own type


def test_plan_keys_are_those_of_the_attributes():
    from flydsl.kernels.plans import signature

    calls = [
        (torch.randn(8, 32)[:, 1:], None, 3, torch.float16),
        (torch.randn(4, 4, dtype=torch.bfloat16).t(), torch.empty(0, dtype=torch.int8), "rows", [2, 3]),
        (torch.nn.Parameter(torch.randn(5)), torch.empty((), dtype=torch.float64), 1.5, True),
    ]
    fast = [signature(*args) for args in calls]
    launcher._pause_torch_c_api(True)
    try:
        slow = [signature(*args) for args in calls]
    finally:
        launcher._pause_torch_c_api(False)
    assert None not in fast and fast == slow


def test_the_environment_keeps_it_off():
    child = subprocess.run(
        [sys.executable, "-c", "import flydsl.compiler.torch_c_api as t, torch; print(t.enable(), t.status())"],
        env={**os.environ, "FLYDSL_TORCH_C_API": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.split() == ["FLYDSL_TORCH_C_API=0"] * 2


def test_a_torch_without_the_c_api_is_read_through_its_attributes():
    script = (
        "import torch\n"
        "from flydsl.compiler._native import launcher\n"
        "x = torch.ones(3)\n"
        "why = launcher._enable_torch_c_api('/nonexistent', (x,), None)\n"
        "launcher._pause_torch_c_api(False)  # never enabled: stays off\n"
        "print(why)\n"
        "print(launcher._tensor_facts(x, True), launcher.empty_like(x))\n"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    why, facts = child.stdout.splitlines()
    assert why.startswith("torch's C API: aoti_torch_get_dim not found") and facts == "None None"


def test_the_zoo_allocates_through_it_as_new_empty_would():
    from flydsl.kernels.memory import torch_empty_like, torch_new_empty

    x = torch.randn(6, 10, dtype=torch.bfloat16)[:, ::2]
    for shape, dtype in [((4,), torch.float32), ([2, 3], torch.float8_e4m3fn), ((5, 1), None), ((3,), torch.int16)]:
        made = torch_new_empty(x, shape, dtype)
        expected = x.new_empty(shape) if dtype is None else x.new_empty(shape, dtype=dtype)
        assert (made.dtype, made.shape, made.stride(), made.device) == (
            expected.dtype,
            expected.shape,
            expected.stride(),
            expected.device,
        )
    assert launcher.empty_like(x, (3,), torch.complex128) is None  # a dtype not shown yet: torch_new_empty's fallback
    made = torch_empty_like(x)
    assert made.is_contiguous() and made.shape == x.shape and made.dtype == x.dtype


@pytest.mark.gpu
def test_cuda_tensors_and_the_current_stream_are_read_as_torch_says():
    x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)[:, 8:]
    fast, slow = both_readers(x)
    assert fast == slow and fast[2] == torch.cuda.current_device()
    made = launcher.empty_like(x, (3, 5), torch.float32)
    assert made.is_cuda and made.device == x.device and made.shape == (3, 5) and made.dtype == torch.float32
    from flydsl.kernels.memory import stream_key

    assert launcher.stream_key(torch.ones(2)) is None  # a CPU tensor has no stream
    launcher._register_stream_getter(torch._C._cuda_getCurrentRawStream)  # what the launch paths register
    params = struct.pack("<Q", x.data_ptr())
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            recording = launcher.LaunchRecording()
            with recording:
                launcher._note_launch("kernel", (1, 1, 1), (32, 1, 1), None, 0, stream.cuda_stream, "p", params)
            plan = recording.plan((x,), None, None, 1)
            assert isinstance(plan, launcher.LaunchPlan), plan
            (step,) = plan._dry_run(x)
            assert step["stream"] == stream.cuda_stream  # read through the C API: the stream torch holds current
            assert launcher.stream_key(x) == stream_key(x) == (x.get_device(), stream.cuda_stream)

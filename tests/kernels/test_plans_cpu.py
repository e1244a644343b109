"""Launch plans without a GPU (flydsl.kernels.plans): the call signature tells apart every fact validation and routing
read, arguments that cannot be keyed give no key, the plan store's bound, and calls that fail validation keep no plan.
Replays: recorded launches (the recording's test hook stands in for the driver) replay with each pointer patched to
the argument it pointed into, and everything a replay would get wrong is declined with its reason. The GPU side (plans
reused and replayed, never for another signature, results right) is tests/kernels/test_plans_gpu.py."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.compiler._native import launcher  # noqa: E402
from flydsl.kernels import plans  # noqa: E402
from flydsl.kernels.gemm import gemm  # noqa: E402
from flydsl.kernels.norms import api as norms_api  # noqa: E402
from flydsl.kernels.softmax import api as softmax_api  # noqa: E402


def test_signature_tells_apart_dtype_shape_strides_alignment_and_type():
    base = torch.zeros(8, 64, dtype=torch.bfloat16)
    variants = {
        "itself": base,
        "dtype": torch.zeros(8, 64, dtype=torch.float16),
        "rows": torch.zeros(9, 64, dtype=torch.bfloat16),
        "n": torch.zeros(8, 32, dtype=torch.bfloat16),
        "row stride": torch.zeros(8, 128, dtype=torch.bfloat16)[:, :64],
        "transposed": torch.zeros(64, 8, dtype=torch.bfloat16).t(),
        "misaligned": torch.zeros(8 * 64 + 1, dtype=torch.bfloat16)[1:].view(8, 64),
        "parameter": torch.nn.Parameter(torch.zeros(8, 64, dtype=torch.bfloat16), requires_grad=False),
        "flat": torch.zeros(8 * 64, dtype=torch.bfloat16),
    }
    keys = {name: plans.signature(t) for name, t in variants.items()}
    assert all(isinstance(k, bytes) for k in keys.values())
    assert len(set(keys.values())) == len(keys), keys
    assert plans.signature(torch.zeros(8, 64, dtype=torch.bfloat16)) == keys["itself"]  # another tensor, same facts
    offset = torch.zeros(8 * 64 + 8, dtype=torch.bfloat16)[8:].view(8, 64)  # 16 bytes in: aligned as well
    assert plans.signature(offset) == keys["itself"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e4m3fn]),
    st.integers(0, 3),
    st.booleans(),
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e4m3fn]),
    st.integers(0, 3),
    st.booleans(),
)
def test_signatures_are_equal_exactly_when_the_facts_are(shape_a, dtype_a, skip_a, t_a, shape_b, dtype_b, skip_b, t_b):
    """Two tensors (a shape, a dtype, a start some elements into a buffer, perhaps transposed) key alike if and only if
    dtype, shape, strides and address mod 16 agree."""

    def make(shape, dtype, skip, transposed):
        numel = 1
        for e in shape:
            numel *= e
        t = torch.zeros(numel + skip, dtype=torch.float32).to(dtype)[skip:].view(shape)
        return t.t() if transposed and t.dim() == 2 else t

    a, b = make(shape_a, dtype_a, skip_a, t_a), make(shape_b, dtype_b, skip_b, t_b)
    facts = [(t.dtype, tuple(t.shape), t.stride(), t.data_ptr() & 15) for t in (a, b)]
    assert (plans.signature(a) == plans.signature(b)) == (facts[0] == facts[1])


def test_signature_of_other_arguments():
    key = plans.signature(None, 1e-5, "gelu", [8, 4])
    assert isinstance(key, bytes) and key == plans.signature(None, 1e-5, "gelu", [8, 4])
    others = [
        (None, 1e-6, "gelu", [8, 4]),
        (None, 1e-5, "relu", [8, 4]),
        (None, 1e-5, "gelu", [8, 5]),
        (None, 1e-5, "gelu", (8, 4)),  # a tuple is another call than a list
        (None, 1e-5, "gelu", [8, 4], None),
    ]
    assert len({key, *(plans.signature(*o) for o in others)}) == len(others) + 1
    # equal values of other types are other calls (eps=1 validates as 1.0; eps=True is refused)
    assert len({plans.signature(1), plans.signature(1.0), plans.signature(True)}) == 3
    assert plans.signature(0.0) != plans.signature(-0.0)  # the bits: a -0.0 default is another call
    assert plans.signature(torch.float16) == plans.signature(torch.float16) != plans.signature(torch.bfloat16)
    assert plans.signature(object()) is None  # not keyed: such a call validates every time
    assert plans.signature([8, torch.zeros(1)]) is None
    assert plans.signature([8, True]) is None  # bools are not the ints of a shape
    assert plans.signature(torch.zeros(2), object()) is None
    assert plans.signature(2**70) is None  # past int64


def test_a_store_keeps_its_limit_and_ignores_calls_without_a_key():
    store = plans.Plans("test", limit=2)
    assert store.add(None, "plan") == "plan" and len(store) == 0 and store.get(None) is None
    for i in range(3):
        store.add((i,), f"plan {i}")
    assert len(store) == 2 and store.get((0,)) is None and store.get((2,)) == "plan 2"  # the oldest went first
    plans.clear_all()
    assert len(store) == 0


@pytest.mark.parametrize(
    "call, store",
    [
        (lambda x: zoo.softmax(x), softmax_api._SOFTMAX),
        (lambda x: zoo.layer_norm(x, None, None), norms_api._LAYER_NORM),
        (lambda x: zoo.rms_norm(x, None), norms_api._RMS_NORM),
        (lambda x: zoo.fused_add_rms_norm(x, x, None), norms_api._FUSED_ADD_RMS_NORM),
        (lambda x: gemm(x, x.t()), None),
    ],
    ids=["softmax", "layer_norm", "rms_norm", "fused_add_rms_norm", "gemm"],
)
def test_a_call_that_fails_validation_keeps_no_plan_and_fails_again(call, store):
    x = torch.zeros(4, 8, dtype=torch.bfloat16)  # on the CPU: refused, naming the argument
    for _ in range(2):
        with pytest.raises(ValueError, match="expected a CUDA tensor"):
            call(x)
    stores = [store] if store is not None else [p for p in plans._ALL if p.name.startswith("flydsl.kernels.")]
    assert all(len(s) == 0 for s in stores)


def _params(*values):
    return struct.pack(f"<{len(values)}Q", *values)


def test_a_recording_replays_with_the_new_arguments_pointers(stream_getter):
    x, out = torch.randn(8, 64), torch.empty(8, 64)
    recording = launcher.LaunchRecording()
    # pointers to x and 2 rows into out, an int, a null pointer (an absent optional tensor)
    recording._add(
        "k", (4, 1, 1), (128, 1, 1), (2, 1, 1), 1024, 7, "ppip", _params(x.data_ptr(), out[2:].data_ptr(), 64, 0)
    )
    recording._add("other", (1, 1, 1), (32, 1, 1), None, 0, 7, "p", _params(out.data_ptr()))
    plan = recording.plan((x, out, 1e-5))
    assert isinstance(plan, launcher.LaunchPlan) and len(plan) == 2, plan
    x2, out2 = torch.randn(8, 64), torch.empty(8, 64)
    first, second = plan._dry_run(x2, out2, 1e-5)
    assert struct.unpack("<4Q", first["params"]) == (x2.data_ptr(), out2.data_ptr() + 2 * 64 * 4, 64, 0)
    assert (first["grid"], first["block"], first["cluster"], first["shared_mem"], first["stream"]) == (
        (4, 1, 1), (128, 1, 1), (2, 1, 1), 1024, 7,
    )  # fmt: skip
    assert struct.unpack("<Q", second["params"]) == (out2.data_ptr(),) and second["cluster"] is None
    with pytest.raises(TypeError, match="expected 3 arguments, got 2"):
        plan._dry_run(x2, out2)
    assert plan(x2, out2, 1e-5) is None  # the test hook's launches: everything but the driver's part
    # an argument aligned otherwise than when recorded (an output no key described): the fallback, or an error
    misaligned = torch.empty(8 * 64 + 1)[1:].view(8, 64)
    assert plan._dry_run(x2, misaligned, 1e-5) == "fallback"
    with pytest.raises(ValueError, match="aligned otherwise than when recorded"):
        plan(x2, misaligned, 1e-5)
    with_fallback = recording.plan((x, out, 1e-5), lambda *args: ("python plan", args[1] is misaligned))
    assert with_fallback(x2, misaligned, 1e-5) == ("python plan", True)


def test_a_replay_encodes_each_tensor_map_for_its_arguments_address(stream_getter):
    """A TMA descriptor's global address lands in an argument: the replay encodes it again at the same offset into
    that argument's memory (the test hook's maps are not encoded: the dry run says where each would point)."""
    a, out = torch.randn(16, 64), torch.empty(16, 64)
    recording = launcher.LaunchRecording()
    recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "mmp", _params(a.data_ptr(), out[4:].data_ptr(), 0))
    plan = recording.plan((a, out))
    assert isinstance(plan, launcher.LaunchPlan), plan
    a2, out2 = torch.randn(16, 64), torch.empty(16, 64)
    (launch,) = plan._dry_run(a2, out2)
    assert launch["tensor_maps"] == [a2.data_ptr(), out2.data_ptr() + 4 * 64 * 4]
    assert plan(a2, out2) is None


@pytest.mark.parametrize(
    "case, reason",
    [
        ("scratch", "a pointer into no argument"),
        ("aliased", "a pointer into more than one argument"),
        ("address as an int", "an integer that holds an argument's address"),
        ("tma of scratch", "a TMA descriptor of memory no argument holds"),
        ("stream", "on another stream"),
        ("no tensor", "no torch tensor among the arguments"),
        ("nothing", "no launch was recorded"),
    ],
)
def test_a_recording_declines_what_a_replay_could_get_wrong(stream_getter, case, reason):
    x, out, scratch = torch.randn(8, 64), torch.empty(8, 64), torch.empty(16)
    args = (x, out)
    recording = launcher.LaunchRecording()
    add = recording._add
    if case == "scratch":
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), scratch.data_ptr()))
    elif case == "aliased":
        args = (x, x)
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), x.data_ptr()))
    elif case == "address as an int":
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pL", _params(x.data_ptr(), out.data_ptr()))
    elif case == "tma of scratch":  # (the test hook makes a tensor map of the address given)
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pm", _params(x.data_ptr(), scratch.data_ptr()))
    elif case == "stream":
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 8, "pp", _params(x.data_ptr(), out.data_ptr()))
    elif case == "no tensor":
        args = (1.0,)
        add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "i", _params(3))
    why = recording.plan(args)
    assert isinstance(why, str) and reason in why, why


def test_a_replayable_plan_is_replayed_after_its_first_call(fake_recording):
    store = plans.Plans("test", replay=True)
    calls = []

    def plan(x, out):
        calls.append(x)
        rows = out.view(-1, out.shape[-1])  # a view: allowed
        fake_recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), rows.data_ptr()))

    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    assert store.add(key, plan)(x, out) is None and calls == [x]
    replay = store.get(key)
    assert isinstance(replay, launcher.LaunchPlan) and not store.declined
    x2, out2 = torch.randn(4, 8), torch.empty(4, 8)
    (launch,) = replay._dry_run(x2, out2)
    assert struct.unpack("<2Q", launch["params"]) == (x2.data_ptr(), out2.data_ptr())


def test_a_plan_that_returns_a_value_is_kept_in_python(fake_recording):
    store = plans.Plans("test", replay=True)

    def plan(x, out):
        fake_recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), out.data_ptr()))
        return out

    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    store.add(key, plan)(x, out)
    assert store.get(key) is not plan and store.declined[key] == "the plan returns a value"
    store.get(key)(x, out)  # recorded once more (inner plans may replay natively by then), then kept as it is
    assert store.get(key) is plan and store.declined[key] == "the plan returns a value"


def test_a_declined_plan_is_recorded_once_more(fake_recording, monkeypatch):
    """A first call whose launches point into memory no argument holds (an inner plan's Python scratch, say) is
    recorded again on the second call, which replays natively where that call's launches are the arguments' own."""
    store = plans.Plans("test", replay=True)
    scratch = torch.empty(4)
    pointers = iter([scratch.data_ptr()])
    recordings = [fake_recording]

    def plan(x, out):
        target = next(pointers, out.data_ptr())
        recordings[-1]._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), target))

    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    store.add(key, plan)(x, out)
    assert "no argument" in store.declined[key] and not isinstance(store.get(key), launcher.LaunchPlan)
    recordings.append(type(fake_recording)())
    monkeypatch.setattr(launcher, "LaunchRecording", lambda: recordings[-1])
    store.get(key)(x, out)
    assert isinstance(store.get(key), launcher.LaunchPlan)


def test_recording_enters_no_dispatch_mode(fake_recording, monkeypatch):
    """A first call is recorded without a TorchDispatchMode: entering the first one imports torch's compiler stack
    (~1 s in a fresh process), which a cold first call must not pay (the contract is checked by the tests instead)."""
    import torch.utils._python_dispatch as python_dispatch

    entered = []
    monkeypatch.setattr(python_dispatch.TorchDispatchMode, "__enter__", lambda self: entered.append(self) or self)
    store = plans.Plans("test", replay=True)

    def plan(x):
        fake_recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "p", _params(x.data_ptr()))

    x = torch.randn(4)
    store.add(plans.signature(x), plan)(x)
    assert not entered and isinstance(store.get(plans.signature(x)), launcher.LaunchPlan)


def test_replays_off(fake_recording, monkeypatch):
    monkeypatch.setenv("FLYDSL_LAUNCH_REPLAY", "0")
    store = plans.Plans("test", replay=True)

    def plan(x):
        fake_recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "p", _params(x.data_ptr()))

    x = torch.randn(4)
    key = plans.signature(x)
    assert store.add(key, plan) is plan


@pytest.mark.parametrize("given", [False, True], ids=["allocated", "given"])
def test_a_scratch_plan_replays_its_launches_over_fresh_scratch(fake_recording, given):
    """A ScratchPlan: the scratch function (outputs not given, per-call memory) runs on every call, the launches over
    the arguments and the scratch are recorded once and replayed; a given output returned by the scratch function is
    the argument itself (one object), not an alias."""
    store = plans.Plans("test", replay=True)
    made = []

    def scratch(x, out):
        made.append(torch.empty(4))
        return (torch.empty_like(x) if out is None else out, made[-1])

    def launch(x, out, result, workspace):
        fake_recording._add(
            "k",
            (1, 1, 1),
            (32, 1, 1),
            None,
            0,
            7,
            "ppp",
            _params(x.data_ptr(), result.data_ptr(), workspace.data_ptr()),
        )

    x, out = torch.randn(4, 8), torch.empty(4, 8) if given else None
    key = plans.signature(x, out)
    result, workspace = store.add(key, plans.ScratchPlan(scratch, launch))(x, out)
    assert workspace is made[-1] and (result is out if given else result.shape == x.shape)
    replay = store.get(key)
    assert isinstance(replay, launcher.LaunchPlan), store.declined
    x2, out2 = torch.randn(4, 8), torch.empty(4, 8) if given else None
    result2, workspace2 = replay(x2, out2)  # the scratch function ran again: new memory, launched over it
    assert workspace2 is made[-1] and (result2 is out2 if given else result2.shape == x.shape)
    (launched,) = replay._dry_run(x2, out2)
    pointers = struct.unpack("<3Q", launched["params"])
    assert pointers[0] == x2.data_ptr() and pointers[2] == made[-1].data_ptr()  # the dry run's own scratch
    assert not given or pointers[1] == out2.data_ptr()


def test_which_plans_replay_without_python(stream_getter):
    """LaunchPlan.replays_without_python: what C++ callers (flydsl.torch's autograd node, through the
    `_native_replay` capsule) may replay without the GIL: launches on pointers into the arguments and made outputs;
    not plans with tensor maps (their cached encodings) or a scratch function."""
    x, out = torch.randn(8, 64), torch.empty(8, 64)
    plans.signature(x)  # torch tensors known to the key builder
    recording = launcher.LaunchRecording()
    recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), out.data_ptr()))
    plain = recording.plan((x, out))
    assert isinstance(plain, launcher.LaunchPlan) and plain.replays_without_python, plain
    maps = launcher.LaunchRecording()
    maps._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "mp", _params(x.data_ptr(), out.data_ptr()))
    assert not maps.plan((x, out)).replays_without_python
    scratch = recording.plan((x, out), None, lambda x: (torch.empty(8, 64),), 1)  # out: what scratch(x) made
    assert isinstance(scratch, launcher.LaunchPlan) and not scratch.replays_without_python
    assert type(launcher._native_replay).__name__ == "PyCapsule"


def test_a_recording_sees_only_its_own_threads_launches():
    """Recordings are per thread: a launch another thread makes meanwhile is not in them (zoo calls from several
    threads record their own first calls)."""
    import threading

    x = torch.randn(4)
    note = lambda: launcher._note_launch(
        "k", (1, 1, 1), (32, 1, 1), None, 0, 7, "p", _params(x.data_ptr())
    )  # noqa: E731
    mine = launcher.LaunchRecording()
    with mine:
        note()
        other = threading.Thread(target=note)
        other.start()
        other.join()
        with launcher.LaunchRecording() as inner:  # nested: both see the launch
            note()
    assert len(mine) == 2 and len(inner) == 1
    note()  # after the recording: not noted
    assert len(mine) == 2


def test_a_plan_over_a_plan_that_makes_memory_replays_whole(stream_getter):
    """Two entry points' plans, one calling the other (a torch op over a kernel entry point): the inner makes a fresh
    tensor and flags held per stream; the outer is declined on its first call (the inner's first call made them in
    Python), recorded again on its second, when the inner replays natively, and from then on replays both launches
    itself, making the inner's memory, with bytes to keep on disk."""
    from flydsl.compiler import torch_c_api

    assert torch_c_api.enable() is None

    def note(*tensors):
        pointers = _params(*(t.data_ptr() for t in tensors))
        launcher._note_launch("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "p" * len(tensors), pointers)

    inner_store, outer_store = plans.Plans("test.inner", replay=True), plans.Plans("test.outer", replay=True)
    inner_made = ((0, (4,), torch.float32), (0, (16,), torch.int32, "test.composed_flags"))

    def inner_call(x, out):
        key = plans.signature(x, out)
        plan = inner_store.get(key) or inner_store.add(
            key,
            plans.ScratchPlan(
                lambda x, out: (x.new_empty((4,)), torch.zeros(16, dtype=torch.int32)),
                lambda x, out, tmp, flags: (note(x, tmp, flags), note(tmp, out)) and None,
                inner_made,
            ),
        )
        plan(x, out)

    def outer_call(x):
        key = plans.signature(x)
        plan = outer_store.get(key) or outer_store.add(
            key, plans.ScratchPlan(lambda x: (torch.empty_like(x),), inner_call, ((0, None, None),))
        )
        return plan(x)[0], key

    for _ in range(3):
        x = torch.randn(4, 8)
        out, key = outer_call(x)
        assert out.shape == x.shape
    replay = outer_store.get(key)
    assert isinstance(replay, launcher.LaunchPlan), outer_store.declined
    first, second = replay._dry_run(x)
    x_ptr, tmp_ptr, flags_ptr = struct.unpack("<3Q", first["params"])
    tmp_again, out_ptr = struct.unpack("<2Q", second["params"])
    assert x_ptr == x.data_ptr() and tmp_again == tmp_ptr and out_ptr not in (0, x_ptr, tmp_ptr)
    assert replay._to_bytes() is not None and len(replay(x)) == 1  # only its own output returned

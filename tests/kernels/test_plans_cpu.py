"""Launch plans without a GPU (flydsl.kernels.plans): the call signature tells apart every fact validation and routing
read, arguments that cannot be keyed give no key, the plan store's bound, and calls that fail validation keep no plan.
Replays: recorded launches (the recording's test hook stands in for the driver) replay with each pointer patched to
the argument it pointed into, and everything a replay would get wrong is declined with its reason. The GPU side (plans
reused and replayed, never for another signature, results right) is tests/kernels/test_plans_gpu.py."""

from __future__ import annotations

import importlib
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


@pytest.fixture
def stream_getter():
    """A stream getter that says stream 7 (none is registered before a torch launch); the real one after."""
    launcher._register_stream_getter(lambda device: 7)
    yield
    launcher._register_stream_getter(importlib.import_module("flydsl.compiler.kernel")._current_torch_stream)


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


@pytest.fixture
def fake_recording(monkeypatch, stream_getter):
    """plans' recordings replaced by one the test's plans add their launches to (the driver's stand-in)."""
    recording = launcher.LaunchRecording()
    monkeypatch.setattr(launcher, "LaunchRecording", lambda: recording)
    return recording


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
    assert store.get(key) is plan and store.declined[key] == "the plan returns a value"


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


# --- plans kept on disk (flydsl.kernels.plan_cache) -----------------------------------------------------------------


def test_a_plan_round_trips_through_its_bytes(stream_getter):
    """A LaunchPlan's bytes (everything but its kernels' functions) make a plan that replays alike: the same
    parameters on new arguments, the same fallback where an argument is aligned otherwise; bytes cut, padded or of
    another format are refused, and a plan with a scratch function has no bytes."""
    x, out = torch.randn(8, 64), torch.empty(8, 64)
    plans.signature(x)  # torch tensors known to the key builder
    recording = launcher.LaunchRecording()
    recording._add(
        "k",
        (4, 1, 1),
        (128, 1, 1),
        (2, 1, 1),
        1024,
        7,
        "ppipm",
        _params(x.data_ptr(), out[2:].data_ptr(), 64, 0, out.data_ptr()),
    )
    recording._add("other", (1, 1, 1), (32, 1, 1), None, 0, 7, "p", _params(out.data_ptr()))
    plan = recording.plan((x, out, 1e-5))
    data = plan._to_bytes()
    again = launcher.LaunchPlan._from_bytes(data, [None, None])
    x2, out2 = torch.randn(8, 64), torch.empty(8, 64)
    assert again._dry_run(x2, out2, 1e-5) == plan._dry_run(x2, out2, 1e-5) and len(again) == 2
    assert again._to_bytes() == data and again._functions() == [None, None]
    assert again._dry_run(x2, torch.empty(8 * 64 + 1)[1:].view(8, 64), 1e-5) == "fallback"
    for bad, why in [(data[:-1], "end early"), (data + b"\0", "bytes past"), (b"FLYX" + data[4:], "not a plan")]:
        with pytest.raises(ValueError, match=why):
            launcher.LaunchPlan._from_bytes(bad, [None, None])
    with pytest.raises(ValueError, match="one function per step"):
        launcher.LaunchPlan._from_bytes(data, [None])
    scratch = recording.plan((x, out, 1e-5), None, lambda *args: (), 3)
    assert scratch._to_bytes() is None


class _FakeFunction:
    """What plan_cache reads of a loaded kernel's Function (no GPU: the recorded steps have none)."""

    def __init__(self, name):
        self.name, self.dependent_launch, self.handle = name, True, id(self)


@pytest.fixture
def kept(fake_recording, monkeypatch, tmp_path):
    """Plans kept on disk under a private cache, the recorded steps standing for kernels loaded from it: keep() sees
    one Function per step whose module is "module-key"; load() hands the bytes to LaunchPlan._from_bytes with the
    test hook's steps (dry runs), noting which kernels it would have loaded."""
    from flydsl.compiler import runtime
    from flydsl.kernels import plan_cache

    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "1")
    monkeypatch.setattr(plan_cache, "_devices", lambda: (("a GPU", 9, 0, 132),))
    monkeypatch.setattr(plan_cache, "_register_stream_getter", lambda: None)  # the fixture's stream 7 stays
    monkeypatch.setattr(launcher.LaunchPlan, "_functions", lambda plan: [_FakeFunction("k")] * len(plan))
    monkeypatch.setattr(runtime, "origin", lambda function: "module-key")
    loaded = []
    monkeypatch.setattr(plan_cache, "_function", lambda *found: loaded.append(found) or found)
    original = launcher.LaunchPlan._from_bytes
    monkeypatch.setattr(
        launcher.LaunchPlan, "_from_bytes", staticmethod(lambda data, fns, fb: original(data, [None] * len(fns), fb))
    )
    return loaded


def _recorded_store(fake_recording, name="test.kept"):
    store = plans.Plans(name, replay=True)

    def plan(x, out):
        fake_recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), out.data_ptr()))

    return store, plan


def test_a_recorded_plan_is_kept_on_disk_and_found_by_a_new_store(fake_recording, kept, monkeypatch):
    store, plan = _recorded_store(fake_recording)
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    store.add(key, plan)(x, out)  # recorded, replayable: kept
    fresh, _ = _recorded_store(fake_recording)  # another process's store of the same entry point
    found = fresh.get(key)
    assert isinstance(found, launcher.LaunchPlan) and kept == [("module-key", "k", True)]
    x2, out2 = torch.randn(4, 8), torch.empty(4, 8)
    (launch,) = found._dry_run(x2, out2)
    assert struct.unpack("<2Q", launch["params"]) == (x2.data_ptr(), out2.data_ptr())
    assert fresh.get(key) is found and len(kept) == 1  # kept in memory from then on
    # not found: another signature, another entry point, other settings, the plan cache off
    assert fresh.get(plans.signature(torch.randn(4, 9), torch.empty(4, 9))) is None
    assert _recorded_store(fake_recording, "test.other")[0].get(key) is None
    monkeypatch.setenv("FLYDSL_AUTOTUNE", "1")
    assert _recorded_store(fake_recording)[0].get(key) is None
    monkeypatch.delenv("FLYDSL_AUTOTUNE")
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "0")
    assert _recorded_store(fake_recording)[0].get(key) is None
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "1")
    assert isinstance(_recorded_store(fake_recording)[0].get(key), launcher.LaunchPlan)


def test_routes_edited_in_place_turn_plans_on_disk_off(fake_recording, kept):
    """router.clear_cache() (after a routing table was edited in place, which the disk keys do not see): this process
    neither finds nor keeps plans on disk from then on."""
    from flydsl.kernels.rows import router

    store, plan = _recorded_store(fake_recording)
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    store.add(key, plan)(x, out)
    assert isinstance(_recorded_store(fake_recording)[0].get(key), launcher.LaunchPlan)
    router.clear_cache()
    assert _recorded_store(fake_recording)[0].get(key) is None
    other = plans.signature(torch.randn(4, 9), torch.empty(4, 9))
    store, plan = _recorded_store(fake_recording, "test.after_edit")
    store.add(other, plan)(torch.randn(4, 9), torch.empty(4, 9))
    plans._routes_edited = False  # (restored by the fixture anyway) nothing was kept while edited
    assert _recorded_store(fake_recording, "test.after_edit")[0].get(other) is None


def test_an_entry_point_keeps_at_most_keep_on_disk_signatures_per_process(fake_recording, kept, monkeypatch):
    monkeypatch.setattr(plans, "KEEP_ON_DISK", 1)
    store, plan = _recorded_store(fake_recording)
    keys = []
    for n in (8, 9):
        x, out = torch.randn(4, n), torch.empty(4, n)
        keys.append(plans.signature(x, out))
        store.add(keys[-1], plan)(x, out)
    fresh, _ = _recorded_store(fake_recording)
    assert isinstance(fresh.get(keys[0]), launcher.LaunchPlan) and fresh.get(keys[1]) is None


def test_a_kept_plan_meeting_another_alignment_is_dropped(fake_recording, kept):
    """Where a kept plan's replay meets an argument aligned otherwise (no Python plan to fall back on), the call
    raises, and the plan is forgotten in memory and on disk: the next call validates and routes again."""
    store, plan = _recorded_store(fake_recording)
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x)  # out not keyed: an output allocated per call
    store.add(key, plan)(x, out)
    fresh, _ = _recorded_store(fake_recording)
    found = fresh.get(key)
    with pytest.raises(RuntimeError, match="aligned otherwise than when it was recorded"):
        found(x, torch.empty(4 * 8 + 1)[1:].view(4, 8))
    assert fresh._plans.get(key) is None and _recorded_store(fake_recording)[0].get(key) is None


def test_plans_are_not_kept_without_the_setting_or_a_cached_kernel(fake_recording, kept, monkeypatch, tmp_path):
    from flydsl.compiler import runtime

    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = plans.signature(x, out)
    monkeypatch.setattr(runtime, "origin", lambda function: None)  # a kernel that is not in the disk cache
    store, plan = _recorded_store(fake_recording)
    store.add(key, plan)(x, out)
    assert _recorded_store(fake_recording)[0].get(key) is None
    monkeypatch.setattr(runtime, "origin", lambda function: "module-key")
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "0")
    store, plan = _recorded_store(fake_recording)
    store.add(key, plan)(x, out)
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "1")
    assert _recorded_store(fake_recording)[0].get(key) is None and not list(tmp_path.rglob("*.flyc"))[1:]


def test_the_launch_path_imports_no_tracer():
    """flydsl.compiler's names load on first use: what a launch from the disk cache needs (the launcher, the cache,
    the runtime) imports neither the DSL (flydsl.expr) nor the tracer (flydsl.compiler.kernel); the decorators stay
    the package's names after their submodules are imported."""
    import subprocess
    import sys

    code = (
        "import sys; import flydsl.compiler._native, flydsl.compiler.cache, flydsl.compiler.runtime;"
        "import flydsl.kernels.plan_cache;"
        "tracer = ('flydsl.expr', 'flydsl.compiler.kernel', 'mlir._mlir_libs');"
        "print(sorted(m for m in sys.modules if m.startswith(tracer)));"
        "import flydsl.compiler as flyc, flydsl.compiler.kernel, flydsl.compiler.jit;"
        "print(callable(flyc.kernel) and not isinstance(flyc.kernel, type(sys)), callable(flyc.jit))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["[]", "True True"], run.stdout


_PORTABLE_CALL = (
    "import torch\n"
    "from flydsl.compiler._native import launcher\n"
    "from flydsl.kernels import plans, plan_cache\n"
    "from flydsl.kernels.gemm import GemmConfig\n"
    "x = torch.ones(4, 8)[:, 1:]\n"
    "key = plans.signature(x, None, 3, 1.5, 'rows', [2, 3], True, torch.float16, torch.nn.Parameter(torch.ones(2)))\n"
    "print(launcher.portable_plan_key(key))\n"
    "print(plan_cache.portable_key((key, GemmConfig(tile_m=64, consumers=1), None, False)))\n"
)


def test_a_signature_has_the_same_portable_text_in_every_process():
    """A plan key names types and dtypes by address, which differ from process to process; the disk cache keys kept
    plans by its portable text (types and dtypes by name), which a new process builds alike for the same call."""
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _PORTABLE_CALL], capture_output=True, text=True) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-2000:]
    first, second = (run.stdout.splitlines() for run in runs)
    assert first == second and "None" not in first
    assert first[0].startswith("Ttorch.Tensor,torch.float32,") and "Dtorch.float16;" in first[0]
    assert "torch.nn.parameter.Parameter,torch.float32" in first[0] and "GemmConfig(tile_m=64" in first[1]
    keys = [plans.signature(torch.ones(4, 8)), plans.signature(torch.ones(4, 8).t()), plans.signature(torch.ones(8))]
    assert len({launcher.portable_plan_key(k) for k in keys}) == 3  # what tells calls apart stays in the text


def test_only_keys_this_process_built_are_read():
    key = plans.signature(torch.ones(2, 3))
    assert launcher.portable_plan_key(key) is not None
    tampered = key[:1] + b"\x01" * 8 + key[9:]  # a type address no key builder wrote
    assert launcher.portable_plan_key(tampered) is None
    assert launcher.portable_plan_key(b"T" + b"\x07" * 40) is None and launcher.portable_plan_key(b"?") is None
    assert launcher.portable_plan_key(key[:-3]) is None  # cut short


def test_gemm_keys_are_kept_and_found_by_their_portable_text(fake_recording, kept):
    """The GEMM entry points key a tuple (the signature, the configuration, ...); kept plans of such keys are found
    by a new store (before, the tuple reached bytes.hex() and raised)."""
    from flydsl.kernels.gemm import GemmConfig

    x, out = torch.randn(4, 8), torch.empty(4, 8)
    key = (plans.signature(x, out), GemmConfig(tile_m=64, consumers=1), None, False)
    store, plan = _recorded_store(fake_recording, "test.gemm")
    store.add(key, plan)(x, out)
    assert isinstance(_recorded_store(fake_recording, "test.gemm")[0].get(key), launcher.LaunchPlan)
    other = (plans.signature(x, out), GemmConfig(tile_m=128), None, False)
    assert _recorded_store(fake_recording, "test.gemm")[0].get(other) is None


def test_outputs_a_replay_makes_natively(stream_getter):
    """A ScratchPlan whose scratch is only fresh outputs names them (``made``): a replay makes them through torch's C
    API (no Python per call) and calls the scratch function only where the API is paused; such a plan has bytes, and
    the plan read back makes them alike."""
    from flydsl.compiler import torch_c_api

    assert torch_c_api.enable() is None
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    plans.signature(x)  # torch tensors known to the key builder
    made = ((0, None, None), (0, (4,), torch.float32))
    calls = []

    def scratch(x):
        calls.append(x)
        return torch.empty_like(x), x.new_empty((4,), dtype=torch.float32)

    out, stats = scratch(x)
    recording = launcher.LaunchRecording()
    recording._add(
        "k", (1, 1, 1), (32, 1, 1), None, 0, 7, "ppp", _params(x.data_ptr(), out.data_ptr(), stats.data_ptr())
    )
    plan = recording.plan((x, out, stats), None, scratch, 1, made)
    x2 = torch.randn(4, 8, dtype=torch.bfloat16)
    calls.clear()
    out2, stats2 = plan(x2)
    assert calls == [] and (out2.shape, out2.dtype, stats2.shape, stats2.dtype) == (
        x.shape,
        x.dtype,
        (4,),
        torch.float32,
    )
    (launch,) = plan._dry_run(x2)
    assert struct.unpack("<3Q", launch["params"])[0] == x2.data_ptr()
    launcher._pause_torch_c_api(True)
    try:
        assert len(plan(x2)) == 2 and calls == [x2]  # the API off: the scratch function makes them
    finally:
        launcher._pause_torch_c_api(False)
    data = plan._to_bytes()
    assert data is not None
    again = launcher.LaunchPlan._from_bytes(data, [None])
    out3, stats3 = again(x2)
    assert (out3.shape, out3.dtype, stats3.shape, stats3.dtype) == (x.shape, x.dtype, (4,), torch.float32)
    assert recording.plan((x, out, stats), None, scratch, 1)._to_bytes() is None  # a Python scratch only: no bytes

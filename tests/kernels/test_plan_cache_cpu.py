"""Launch plans kept on disk without a GPU (flydsl.kernels.plan_cache): a plan's bytes round-trip, a recorded plan is
kept and found by a new store of the same entry point (never by another signature, entry point or settings), the
limits on keeping (the setting, a cached kernel, routes edited in place, KEEP_ON_DISK), a kept plan meeting another
alignment, portable keys, the launch path's imports, and outputs a replay makes natively. The two-process GPU side is
tests/kernels/test_plans_gpu.py."""

from __future__ import annotations

import struct

import pytest

torch = pytest.importorskip("torch")

from flydsl.compiler._native import launcher  # noqa: E402
from flydsl.kernels import plans  # noqa: E402


def _params(*values):
    return struct.pack(f"<{len(values)}Q", *values)


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


def test_memory_a_replay_keeps_per_stream(stream_getter):
    """``made`` values named (split K's workspace and flags) are buffers held per stream, zero when made, shared by
    every plan that names them (grown to the largest asked for; a call on another stream gets its own), fresh ones
    beside them per call; the plan read back from its bytes holds them alike; a name needs a shape and a dtype."""
    from flydsl.compiler import torch_c_api

    assert torch_c_api.enable() is None
    x = torch.randn(4, 8)
    plans.signature(x)
    made = ((0, (4,), torch.float32), (0, (16,), torch.int32, "test.flags"))

    def scratch(x):
        return x.new_empty((4,)), torch.zeros(16, dtype=torch.int32)

    partials, flags = scratch(x)
    recording = launcher.LaunchRecording()
    recording._add(
        "k", (1, 1, 1), (32, 1, 1), None, 0, 7, "ppp", _params(x.data_ptr(), partials.data_ptr(), flags.data_ptr())
    )
    plan = recording.plan((x, partials, flags), None, scratch, 1, made)
    for replay in (plan, launcher.LaunchPlan._from_bytes(plan._to_bytes(), [None])):
        first_partials, first_flags = replay(x)
        assert first_flags.dtype == torch.int32 and first_flags.shape == (16,) and not first_flags.any()
        again_partials, again_flags = replay(x)
        assert again_flags is first_flags and again_partials is not first_partials
        (launch,) = replay._dry_run(x)
        assert struct.unpack("<3Q", launch["params"])[2] == first_flags.data_ptr()
        launcher._register_stream_getter(lambda device: 9)  # another stream: its own flags
        try:
            _, other_flags = replay(x)
        finally:
            launcher._register_stream_getter(lambda device: 7)
        assert other_flags is not first_flags and not other_flags.any()
        assert replay(x)[1] is first_flags
    larger = recording.plan((x, partials, flags), None, scratch, 1, (made[0], (0, (32,), torch.int32, "test.flags")))
    grown = larger(x)[1]
    assert grown.numel() == 32 and not grown.any() and plan(x)[1] is grown  # one buffer per name, grown
    for wrong in ((0, None, torch.int32, "test.flags"), (0, (16,), torch.int32, "")):
        with pytest.raises(ValueError, match="held per stream"):
            recording.plan((x, partials, flags), None, scratch, 1, (made[0], wrong))


def test_the_python_path_and_replays_hold_one_buffer_per_name(stream_getter, monkeypatch):
    """memory.held and a replay's named made values share one registry: the buffer a replay made is the one the
    Python path gets for the same (name, dtype, device, stream) and the other way round, grown for either; another
    stream or dtype gets its own; torch's C API off (or a tensor it cannot make like), the Python path still holds
    it; release_held drops them all and the next call makes a new one, zero."""
    from flydsl.compiler import torch_c_api
    from flydsl.kernels import memory

    assert torch_c_api.enable() is None
    memory.release_held()
    x = torch.randn(4, 8)
    plans.signature(x)
    flags = torch.zeros(16, dtype=torch.int32)
    recording = launcher.LaunchRecording()
    recording._add("k", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), flags.data_ptr()))
    made = ((0, (16,), torch.int32, "test.shared"),)
    plan = recording.plan((x, flags), None, lambda x: (torch.zeros(16, dtype=torch.int32),), 1, made)
    (replayed,) = plan(x)
    ((name, device, stream, dtype, tensor),) = memory.held_buffers()
    assert (name, stream, dtype, tensor) == ("test.shared", 7, torch.int32, replayed)
    monkeypatch.setattr(memory, "stream_key", lambda like: (device, 7))
    assert memory.held(x, "test.shared", 8, torch.int32) is replayed  # fits: the replay's buffer
    replayed.fill_(3)  # (a kernel that left it dirty: grown buffers are zero all the same)
    grown = memory.held(x, "test.shared", 64, torch.int32)
    assert grown.shape == (64,) and not grown.any() and plan(x)[0] is grown
    assert memory.held(x, "test.shared", 16, torch.float32) is not grown  # another dtype
    monkeypatch.setattr(memory, "stream_key", lambda like: (device, 9))
    assert memory.held(x, "test.shared", 16, torch.int32) is not grown  # another stream
    launcher._pause_torch_c_api(True)
    try:  # the C API off: made through like.new_zeros
        paused = memory.held(x, "test.paused", 5, torch.int32)
        assert paused.shape == (5,) and paused.dtype == torch.int32 and not paused.any()
    finally:
        launcher._pause_torch_c_api(False)
    weight = torch.nn.Parameter(torch.randn(2))
    assert memory.held(weight, "test.like_a_parameter", 3, torch.float32).shape == (3,)
    assert memory.release_held() == 5 and memory.held_buffers() == []
    monkeypatch.setattr(memory, "stream_key", lambda like: (device, 7))
    again = memory.held(x, "test.shared", 16, torch.int32)
    assert again is not grown and not again.any() and plan(x)[0] is again
    with pytest.raises(ValueError, match="a name"):
        memory.held(x, "", 4, torch.int32)
    memory.release_held()


def test_a_plan_over_plans_makes_the_memory_they_made(stream_getter):
    """A plan recorded around an inner replay that made memory (a fresh tensor, flags kept per stream) makes that
    memory itself: it replays whole (a torch op over a kernel entry point whose plan splits K), returns nothing of
    it, keeps it in its bytes, and falls back to Python where torch's C API is off."""
    from flydsl.compiler import torch_c_api

    assert torch_c_api.enable() is None
    x = torch.randn(4, 8)
    plans.signature(x)
    tmp, flags = x.new_empty((4,)), torch.zeros(16, dtype=torch.int32)
    recording = launcher.LaunchRecording()
    recording._add(
        "k1", (1, 1, 1), (32, 1, 1), None, 0, 7, "ppp", _params(x.data_ptr(), tmp.data_ptr(), flags.data_ptr())
    )
    made = ((0, (4,), torch.float32), (0, (16,), torch.int32, "test.nested_flags"))
    inner = recording.plan(
        (x, tmp, flags), None, lambda x: (x.new_empty((4,)), torch.zeros(16, dtype=torch.int32)), 1, made
    )
    fallbacks = []
    outer_recording = launcher.LaunchRecording()
    with outer_recording:
        inner_tmp, _ = inner(x)  # the inner replay makes them (and says so to the recording)
        launcher._note_launch(
            "k2", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), inner_tmp.data_ptr())
        )
    outer = outer_recording.plan((x,), lambda x: fallbacks.append(x))
    assert isinstance(outer, launcher.LaunchPlan), outer
    for replay in (outer, launcher.LaunchPlan._from_bytes(outer._to_bytes(), [None, None])):
        assert replay(x) is None
        k1, k2 = replay._dry_run(x)
        x_ptr, tmp_ptr, flags_ptr = struct.unpack("<3Q", k1["params"])
        assert x_ptr == x.data_ptr() and struct.unpack("<2Q", k2["params"]) == (x_ptr, tmp_ptr)
        assert tmp_ptr not in (0, inner_tmp.data_ptr())
        assert struct.unpack("<3Q", replay._dry_run(x)[0]["params"])[2] == flags_ptr  # kept per stream
    launcher._pause_torch_c_api(True)
    try:
        assert outer(x) is None and fallbacks == [x]
    finally:
        launcher._pause_torch_c_api(False)
    # made like a plain tensor among the arguments (the C API makes none like an nn.Parameter)
    weight = torch.nn.Parameter(torch.randn(2))
    with launcher.LaunchRecording() as around_a_parameter:
        inner_tmp, _ = inner(x)
        launcher._note_launch(
            "k2", (1, 1, 1), (32, 1, 1), None, 0, 7, "pp", _params(x.data_ptr(), inner_tmp.data_ptr())
        )
    with_weight = around_a_parameter.plan((weight, x), lambda *args: fallbacks.append(args))
    assert with_weight(weight, x) is None and len(fallbacks) == 1
    python_scratch = launcher.LaunchRecording()
    with python_scratch:
        inner(x)
    assert "no argument" in python_scratch.plan((x, x.new_empty(2)), None, lambda x: (x.new_empty(2),), 1)

"""Launch plans: what a zoo call decided, kept per call signature, so that a later call with the same signature skips
the deciding.

The first call of an entry point with a given signature validates its arguments (:mod:`flydsl.kernels.validation`)
and routes them, then keeps the result as a plan: a function of the raw arguments that allocates the outputs not
given and launches the chosen kernels with their configuration and grid fixed. A later call whose signature is the
same runs the plan directly: one key built, one dict lookup, the native launch.

The signature (:func:`signature`: bytes, built by ``flydsl.compiler._runtime.plan_key``) holds every fact about the
arguments that validation and routing read: per torch tensor its type, dtype, shape, strides, the low four bits of its
address (16-byte alignment: the vectorized and TMA paths' condition) and its device; per other argument its type and
value (``None`` where absent; a list or tuple of ints; a torch dtype). A call that differs in any of them, a misaligned
view, a transposed or strided input, another dtype or another GPU, gets a key of its own, and with it its own
validation and route: a plan never serves a call it was not made for. Arguments that are not torch tensors (cupy
arrays, DLPack objects) or values that are not plain numbers, strings, dtypes or None give no key: such calls take the
validating path every time.

What the plan leaves to each call is what must be fresh per call: the outputs, per-call scratch (a team's exchange,
split-K partials) and the current stream (read by the launcher), so plans also serve calls captured in CUDA graphs.

Replays (``Plans(..., replay=True)``): where a plan's first call does nothing but launch kernels on its arguments, its
launches are recorded (``_runtime.LaunchRecording``) and later calls replay them natively (``_runtime.LaunchPlan``:
each pointer parameter patched to the argument it pointed into, each TMA descriptor encoded again for its argument's
address, the device's current stream): no Python between the key and the driver. A replayed plan must do nothing
else but those launches and views: no torch operation that writes memory (a fill, a copy), which a replay would skip;
what it must do on every call belongs in a :class:`ScratchPlan`'s scratch function. (A ``TorchDispatchMode`` could
watch for such operations, but entering the first one imports torch's compiler stack, ~1 s in a fresh process: the
zoo's tests watch instead, ``tests/kernels/test_replay_contract.py``.) A plan is kept in its Python form
(:attr:`Plans.declined` says why) where its first call returned a value, or a pointer or descriptor it passed lands
in no argument (scratch, a buffer kept by the plan) or in more than one (aliased arguments); a declined plan is
recorded once more on its second call. An argument aligned otherwise than when recorded runs the Python plan. A plan
that needs memory beyond its arguments (outputs it allocates, per-call scratch, buffers kept per stream) is a
:class:`ScratchPlan`: its scratch function runs in Python on every call, and its launches, over the arguments and the
scratch, are what is recorded and replayed; where the scratch is only fresh tensors and buffers held per stream
(``made``), the replay makes it itself, with no Python. Plans compose: memory an inner replay made while an outer
plan was recorded (a torch op over a kernel entry point that splits K) is made by the outer replay too, so the outer
plan replays whole (which is why a declined plan gets its second recording: on its first call the inner plans ran in
Python). ``FLYDSL_LAUNCH_REPLAY=0`` turns replays off.

Kept on disk (by default; ``FLYDSL_PLAN_CACHE=0`` turns it off; :mod:`flydsl.kernels.plan_cache`): a recorded
replay is also written to the disk cache beside its kernels, and a signature this process has no plan for is looked up
there first, so that a new process's first call of a known signature replays without importing the kernel modules or
routing again. A record is ~1 KB per call signature; an entry point writes at most :data:`KEEP_ON_DISK` new ones per
process (a workload whose shapes keep changing, as prefill lengths do, would otherwise write one per shape).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from flydsl.kernels.validation import is_torch

__all__ = ["Plans", "ScratchPlan", "signature", "clear_all"]

_SCALARS = (type(None), bool, int, float, str)
_ALL: list[Plans] = []
_routes_edited = False  # clear_all(routes_edited=True) was called: plans on disk may hold routes of before
KEEP_ON_DISK = 256  # new signatures an entry point writes to the disk cache per process (~1 KB each)


_plan_key = None  # runtime.plan_key, bound on the first call (``import flydsl.torch`` loads no compiler)


def signature(*args) -> bytes | None:
    """The call signature of ``args`` (see the module docstring), or None where an argument cannot be keyed."""
    return (_plan_key or _bind_plan_key())(args)


def key_function():
    """The native function :func:`signature` calls on its arguments' tuple (for C++ callers that key a call
    themselves: ``flydsl.torch``'s autograd node)."""
    return _plan_key or _bind_plan_key()


def _bind_plan_key():
    global _plan_key
    from flydsl.compiler._native import launcher

    launcher._register_key_type_learner(_learn_key_type)
    _plan_key = launcher.plan_key
    return _plan_key


def _learn_key_type(value) -> bool:
    """``plan_key``'s hook for a type it has not seen: torch dtypes, and torch tensors whose type leaves dispatch to
    torch (``torch.Tensor``, ``nn.Parameter``); wrapper subclasses (fake and functional tensors, DTensor) get no key:
    they hold no memory of their own to launch on."""
    from flydsl.compiler import torch_c_api
    from flydsl.compiler._native import launcher

    kind = type(value)
    if kind.__name__ == "dtype" and kind.__module__ == "torch":
        launcher._register_key_type(kind)
        return True
    if kind not in _SCALARS and is_torch(value) and _dispatches_as_torch(kind):
        torch_c_api.register_tensor_type(kind)
        return True
    return False


def _dispatches_as_torch(kind) -> bool:
    torch = sys.modules["torch"]
    return getattr(kind, "__torch_dispatch__", None) is torch.Tensor.__torch_dispatch__


class ScratchPlan:
    """A plan whose launches use memory beyond its arguments: ``scratch(*args)`` returns it as a tuple of tensors
    (outputs not given, per-call scratch, buffers kept per stream or by the plan: whatever it must be for this call;
    it may run torch operations, which happen on every call), then ``launch(*args, *scratch)`` launches. A call
    returns the scratch tuple. Replayed, the scratch function still runs in Python on each call; the launches do
    not. ``made``: where the scratch is only fresh tensors (outputs), per value ``(like, shape or None, dtype or
    None)`` (an index of the call's arguments; None: that argument's shape, dtype), or ``(like, shape, dtype, name)``
    for the buffer of that name held per device and stream (split K's workspace and flags: one for every plan naming
    it, grown as needed, zero when made, each kernel leaving it so): a replay then makes them through torch's C API
    (contiguous, on the argument's device) and calls ``scratch`` only where the API is off; such a plan can be kept on
    disk."""

    __slots__ = ("scratch", "launch", "made")

    def __init__(self, scratch: Callable, launch: Callable, made: tuple | None = None):
        self.scratch, self.launch, self.made = scratch, launch, made

    def __call__(self, *args) -> tuple:
        extra = self.scratch(*args)
        self.launch(*args, *extra)
        return extra


class Plans:
    """One entry point's plans by call signature (at most ``limit``: the oldest goes first); with ``replay``, plans
    that only launch kernels on their arguments are recorded on their first call and replayed natively after."""

    def __init__(self, name: str, limit: int = 1024, replay: bool = False):
        self.name = name
        self.limit = limit
        self.replay = replay
        self.declined: dict = {}  # key -> why its plan is not replayed (the latest ``limit``)
        self._plans: dict = {}
        # The kept plans by signature: the dict itself, never replaced (for callers that key a call themselves with
        # key_function(): flydsl.torch's autograd node and eager entry points; a key missing there may still be on
        # disk: get() looks). An attribute, not a property: read on every eager call.
        self.by_signature = self._plans
        self._written = 0  # plans this process wrote to the disk cache (at most KEEP_ON_DISK)
        _ALL.append(self)

    def __repr__(self):
        return f"<Plans {self.name}: {len(self._plans)}>"

    def __len__(self):
        return len(self._plans)

    def get(self, key):
        """The plan made for ``key`` (None: none, or no key). A plan is usually a function of the call's arguments;
        ``flydsl.torch``'s ops keep their checked output specs. With ``replay`` (and the plan cache on), a key
        this process has no plan for is looked up in the disk cache (:mod:`flydsl.kernels.plan_cache`)."""
        if key is None:
            return None
        plan = self._plans.get(key)
        if plan is None and self.replay and _plan_cache_on():
            plan = self._kept_on_disk(key)
        return plan

    def _kept_on_disk(self, key):
        from flydsl.kernels import plan_cache

        plan = plan_cache.load(self.name, key, lambda: self._plans.pop(key, None))
        if plan is not None:
            self._keep(key, plan)
        return plan

    def _keep(self, key, plan) -> None:
        plans = self._plans
        if len(plans) >= self.limit:
            plans.pop(next(iter(plans)))
        plans[key] = plan

    def add(self, key, plan):
        """Keeps ``plan`` for ``key`` (nothing kept without a key); returns what to call now: ``plan``, or with
        ``replay`` a first call that records it."""
        if key is None:
            return plan
        plans = self._plans
        self._keep(key, plan)
        if not (self.replay and _replays_on()):
            return plan

        recordings = 0

        def first_call(*args):
            # Recorded twice at most: a plan over inner plans (a torch op over a kernel entry point) whose first
            # call recorded those plans in Python finds them replayed natively on its second call, memory and all.
            nonlocal recordings
            recordings += 1
            if type(plan) is ScratchPlan:
                result = plan.scratch(*args)
                _, replay, why = _recorded(plan.launch, (*args, *result), plan, plan.scratch, len(args), plan.made)
            else:
                result, replay, why = _recorded(plan, args, plan)
            if replay is not None and plans.get(key) in (plan, first_call):
                plans[key] = replay
                if self._written < KEEP_ON_DISK and _plan_cache_on():
                    from flydsl.kernels import plan_cache

                    self._written += 1
                    plan_cache.keep(self.name, key, replay)
            elif why is not None:
                if recordings == 1 and plans.get(key) is plan:
                    plans[key] = first_call
                elif plans.get(key) is first_call:
                    plans[key] = plan
                declined = self.declined
                if len(declined) >= self.limit:
                    declined.pop(next(iter(declined)))
                declined[key] = why
            return result

        return first_call

    def clear(self) -> None:
        self._plans.clear()
        self.declined.clear()


_ON_CLEAR: list = []  # what else keeps plans (flydsl.torch's autograd node), told by clear_all


def on_clear(forget: Callable[[], object]) -> None:
    """Calls ``forget()`` in each :func:`clear_all`: for holders of plans outside these tables."""
    _ON_CLEAR.append(forget)


def clear_all(routes_edited: bool = False) -> None:
    """Forgets every entry point's plans (tests; after a change to routing tables at run time). ``routes_edited``:
    routing tables were edited in place, which the disk cache's keys do not see, so this process neither looks up
    nor keeps plans on disk from then on."""
    global _routes_edited
    _routes_edited = _routes_edited or routes_edited
    for plans in _ALL:
        plans.clear()
    for forget in _ON_CLEAR:
        forget()


def _replays_on() -> bool:
    from flydsl.compiler import settings

    return settings.current().launch_replay


def _plan_cache_on() -> bool:
    from flydsl.compiler import settings

    current = settings.current()
    return current.plan_cache and current.launch_replay and current.cache_enabled and not _routes_edited


def _recorded(launch, args, fallback, scratch=None, nargs=None, made=None) -> tuple:
    """Runs ``launch(*args)``; returns (its result, a ``_runtime.LaunchPlan`` replaying it or None, why not or None).
    ``fallback``: what the replay calls for arguments aligned otherwise; ``scratch`` and ``made``: a
    :class:`ScratchPlan`'s, whose values are ``args`` past the caller's ``nargs``."""
    torch = sys.modules.get("torch")
    if torch is None:  # no torch tensor among the arguments: nothing a replay could read
        return launch(*args), None, None
    from flydsl.compiler._native import launcher

    with launcher.LaunchRecording() as recording:
        result = launch(*args)
    if result is not None:
        return result, None, "the plan returns a value"
    replay = recording.plan(args, fallback, scratch, nargs, made)
    if isinstance(replay, str):
        return result, None, replay
    return result, replay, None

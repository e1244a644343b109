"""Launch plans kept on disk (on by default; ``FLYDSL_PLAN_CACHE=0`` turns it off): a replayable plan
(:mod:`flydsl.kernels.plans`, "Replays") is written beside the kernels it launches when its first call records it,
and a process whose call misses in memory looks there before validating and routing. A kept signature's first call
in a new process then costs its key, the cache reads and the kernels' module loads: not the imports of the kernel
modules, nor the checks and the routing (issue 31's cold start).

The entry's key: the entry point (the ``Plans``' name), the call signature (which holds every fact validation and
routing read of the arguments; as text another process builds alike, :func:`portable_key`), and what a route may
read beyond them: FlyDSL's compiler sources, the zoo's sources (and the torch adapter's, for its entry points), the
settings, and each visible device's name, compute capability and SM count. The entry: the plan's bytes
(``LaunchPlan._to_bytes``: the launches, each pointer as an argument and an offset, each TMA descriptor's spec) and
per launch its kernel's module (the JIT cache's key of it), name and dependent-launch flag. Not kept: plans with a
scratch function (Python on every call) and launches of kernels that did not come from the disk cache.

A kept plan's arguments are aligned as its signature says, and outputs allocated per call come from torch's caching
allocator (512-byte aligned): a replay should never meet an argument aligned otherwise. Where one does, the call
raises ``RuntimeError`` (a plan recorded in another process has no Python plan to fall back on) and the entry is
dropped, so the next call validates and routes again.
"""

from __future__ import annotations

import base64
import functools
import warnings

from flydsl.compiler import cache, runtime, settings
from flydsl.compiler._native import launcher

__all__ = ["keep", "load", "portable_key"]

FORMAT = 2  # 2: LaunchPlan bytes 3 (buffers held per stream by name, inner replays' memory)
_SM_COUNT, _CC_MAJOR, _CC_MINOR = 16, 75, 76  # CUdevice_attribute
_modules: dict = {}  # a module's cache key -> its LoadedModule, in this process
_warned: set = set()


@functools.cache
def _devices() -> tuple | None:
    """(name, compute capability, SMs) of each visible device: routes read the SM count. None where the driver
    cannot tell (no driver, no device): nothing is kept then."""
    try:
        return tuple(
            (
                launcher.device_name(i),
                launcher.device_attribute(_CC_MAJOR, i),
                launcher.device_attribute(_CC_MINOR, i),
                launcher.device_attribute(_SM_COUNT, i),
            )
            for i in range(launcher.device_count())
        )
    except launcher.CudaError:
        return None


def portable_key(key) -> str | None:
    """The call signature ``key`` as text that a new process builds alike for the same call, or None where it cannot
    be (plan_key's bytes name types and dtypes by address: ``launcher.portable_plan_key`` names them; the GEMMs key a
    tuple of those bytes and their configuration)."""
    if isinstance(key, bytes):
        return launcher.portable_plan_key(key)
    if isinstance(key, tuple):
        parts = [portable_key(part) for part in key]
        return None if None in parts else "(" + ", ".join(parts) + ")"
    text = repr(key)
    return None if " at 0x" in text else text  # an object's default repr holds its address


def _entry_key(name: str, key) -> str | None:
    """The disk cache's key of ``name``'s plan for ``key``, or None where the signature has no portable text."""
    portable = portable_key(key)
    devices = _devices()
    if portable is None or not devices:
        return None
    packages = ["flydsl.kernels"] + (["flydsl.torch"] if name.startswith("flydsl.torch") else [])
    return cache.key_text(
        f"launch plan {FORMAT}",
        name,
        portable,
        cache.compiler_fingerprint(),
        *(cache.package_key(package) for package in packages),
        settings.current(),
        devices,
    )


def _warn_once(what: str, error: BaseException) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"flydsl: {what} ({type(error).__name__}: {error})", RuntimeWarning, stacklevel=3)


def keep(name: str, key, plan) -> None:
    """Writes ``plan`` (a ``LaunchPlan`` just recorded for ``key`` by the entry point ``name``) to the disk cache,
    where it can be kept; a failure only warns (once): keeping is an optimization."""
    data = plan._to_bytes()
    functions = plan._functions()
    if data is None or None in functions:
        return
    modules = [runtime.origin(function) for function in functions]
    if None in modules:
        return
    record = {
        "plan": base64.b64encode(data).decode("ascii"),
        "modules": modules,
        "kernels": [function.name for function in functions],
        "dependent": [bool(function.dependent_launch) for function in functions],
    }
    entry = _entry_key(name, key)
    if entry is None:
        return
    try:
        cache.store_record(entry, record)
    except (OSError, RuntimeError, ValueError, TypeError) as error:
        _warn_once(f"launch plans are not kept on disk: {name}", error)


def load(name: str, key, forget):
    """The ``LaunchPlan`` kept for ``key`` of the entry point ``name``, its kernels loaded; None where none is kept or
    it cannot be used (warned once). ``forget()`` drops the in-memory plan where a replay meets an argument aligned
    otherwise than when recorded."""
    entry = _entry_key(name, key)
    if entry is None:
        return None
    record = cache.load_record(entry)
    if record is None or "plan" not in record:  # none, or dropped
        return None
    try:
        functions = [
            _function(module, kernel, dependent)
            for module, kernel, dependent in zip(record["modules"], record["kernels"], record["dependent"], strict=True)
        ]
        if None in functions:
            return None
        data = base64.b64decode(record["plan"], validate=True)
        plan = launcher.LaunchPlan._from_bytes(data, functions, _misaligned(name, entry, forget))
        _register_stream_getter()
        return plan
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        _warn_once(f"a launch plan kept on disk is not used: {name}", error)
        return None


def _register_stream_getter() -> None:
    """A replay launches on its device's current torch stream: the getter the first torch launch of
    ``flydsl.compiler.kernel`` registers, which a process replaying only kept plans never imports."""
    import torch

    launcher._register_stream_getter(torch._C._cuda_getCurrentRawStream)


def _function(module_key: str, kernel: str, dependent: bool):
    """The loaded ``Function`` of ``kernel`` in the module cached under ``module_key`` (None: no longer cached)."""
    loaded = _modules.get(module_key)
    if loaded is None:
        compiled = cache.load(module_key)
        if compiled is None:
            return None
        loaded = _modules[module_key] = runtime.load(compiled)
    function = loaded.function(kernel)
    if dependent:
        function.dependent_launch = True
    return function


def _misaligned(name: str, entry: str, forget):
    def fallback(*args):
        forget()
        cache.store_record(entry, {"dropped": True})  # no plan in it: the next process routes again
        raise RuntimeError(
            f"{name}: a launch plan kept on disk met an argument aligned otherwise than when it was recorded; it is"
            " dropped and the next call validates and routes again (FLYDSL_PLAN_CACHE=0 turns kept plans off)"
        )

    return fallback

"""Memoization of the algebra: :func:`static_cache` keeps the results of pure functions called on static arguments
(ints, static layouts, swizzles), :func:`clear_caches` empties them, and :func:`lift_composed` applies a layout
function to a composed layout's inner layout. No dependency on the other modules (static arguments are recognized by
their ``_fly_static`` method)."""

from __future__ import annotations

import functools
import threading

__all__ = ["static_cache", "clear_caches", "lift_composed"]

_CACHES = []
_OUTER = threading.local()


def _static_arg(x) -> bool:
    # Hashable by value and free of dynamic leaves: ints, None, static layouts, swizzles, tuples of those.
    if x is None or type(x) is int:
        return True
    if type(x) is tuple:
        return all(_static_arg(c) for c in x)
    probe = getattr(x, "_fly_static", None)
    return probe is not None and probe()


def static_cache(fn):
    """Decorator: memoize ``fn`` (a pure function of immutable arguments) when every argument is static; calls
    with a dynamic leaf (whose ops must be emitted each time, and which hash by identity) always run ``fn``.
    :func:`clear_caches` empties every such cache."""
    cached = functools.lru_cache(maxsize=4096)(fn)
    _CACHES.append(cached)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # Only the outermost call is memoized: the intermediate layouts of one operation are fresh objects, and
        # checking and hashing each of them would cost more than it saves.
        if getattr(_OUTER, "depth", 0) or not (
            all(_static_arg(a) for a in args) and all(_static_arg(v) for v in kwargs.values())
        ):
            return fn(*args, **kwargs)
        _OUTER.depth = 1
        try:
            return cached(*args, **kwargs)
        finally:
            _OUTER.depth = 0

    wrapper.uncached = fn
    return wrapper


def clear_caches() -> None:
    """Empty the memo of every :func:`static_cache` function (to time the algebra itself, or to free memory)."""
    for cached in _CACHES:
        cached.cache_clear()


def lift_composed(fn):
    """Decorator: when the first argument is a composed layout (anything with ``_fly_lift``, see
    :class:`flydsl.layout.ComposedLayout`), apply ``fn`` to its inner layout and keep the outer function."""

    @functools.wraps(fn)
    def wrapper(layout, *args, **kwargs):
        lift = getattr(layout, "_fly_lift", None)
        if lift is not None:
            return lift(lambda inner: wrapper(inner, *args, **kwargs))
        return fn(layout, *args, **kwargs)

    return wrapper

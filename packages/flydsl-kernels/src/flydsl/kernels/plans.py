"""Launch plans: what a zoo call decided, kept per call signature, so that a later call with the same signature skips
the deciding.

The first call of an entry point with a given signature validates its arguments (:mod:`flydsl.kernels.validation`)
and routes them, then keeps the result as a plan: a function of the raw arguments that allocates the outputs not
given and launches the chosen kernels with their configuration and grid fixed. A later call whose signature is the
same runs the plan directly: one key built, one dict lookup, the native launch.

The signature (:func:`signature`) holds every fact about the arguments that validation and routing read: per torch
tensor its type, dtype, shape, strides, the low four bits of its address (16-byte alignment: the vectorized and TMA
paths' condition) and its device; per other argument its type and value (``None`` where absent; a list or tuple of ints
as a tuple; a torch dtype). A call that differs in any of them, a misaligned view, a transposed or strided input,
another dtype or another GPU, gets a key of its own, and with it its own validation and route: a plan never serves a
call it was not made for. Arguments that are not torch tensors (cupy arrays, DLPack objects) or values that are not
plain numbers, strings, dtypes or None give no key: such calls take the validating path every time.

What the plan leaves to each call is what must be fresh per call: the outputs, per-call scratch (a team's exchange,
split-K partials) and the current stream (read by the launcher), so plans also serve calls captured in CUDA graphs.
"""

from __future__ import annotations

from flydsl.kernels.validation import _TORCH_TYPES, is_torch

__all__ = ["Plans", "signature", "clear_all"]

_SCALARS = (type(None), bool, int, float, str)
_ALL: list[Plans] = []


def signature(*args) -> tuple | None:
    """The call signature of ``args`` (see the module docstring), or None where an argument cannot be keyed."""
    parts = []
    append = parts.append
    for value in args:
        kind = type(value)
        if kind in _TORCH_TYPES or (kind not in _SCALARS and is_torch(value)):
            append((kind, value.dtype, value.shape, value.stride(), value.data_ptr() & 15, value.get_device()))
        elif kind in _SCALARS:
            append((kind, value))  # the type too: 1, 1.0 and True are equal keys otherwise
        elif kind in (list, tuple) and all(type(e) is int for e in value):  # a shape (normalized_shape)
            append((kind, tuple(value)))
        elif kind.__name__ == "dtype" and kind.__module__ == "torch":  # an output dtype
            append((kind, value))
        else:
            return None
    return tuple(parts)


class Plans:
    """One entry point's plans by call signature (at most ``limit``: the oldest goes first)."""

    def __init__(self, name: str, limit: int = 1024):
        self.name = name
        self.limit = limit
        self._plans: dict[tuple, object] = {}
        _ALL.append(self)

    def __repr__(self):
        return f"<Plans {self.name}: {len(self._plans)}>"

    def __len__(self):
        return len(self._plans)

    def get(self, key: tuple | None):
        """The plan made for ``key`` (None: none, or no key). A plan is usually a function of the call's arguments;
        ``flydsl.torch``'s ops keep their checked output specs."""
        return None if key is None else self._plans.get(key)

    def add(self, key: tuple | None, plan):
        """Keeps ``plan`` for ``key`` (nothing kept without a key); returns ``plan``."""
        if key is not None:
            plans = self._plans
            if len(plans) >= self.limit:
                plans.pop(next(iter(plans)))
            plans[key] = plan
        return plan

    def clear(self) -> None:
        self._plans.clear()


def clear_all() -> None:
    """Forgets every entry point's plans (tests; after a change to routing tables at run time)."""
    for plans in _ALL:
        plans.clear()

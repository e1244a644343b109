"""Ops whose only results are writes into some of their inputs (:func:`register_mutating_op`).

An op whose only results are writes into some of its inputs (``write_kv``: the new keys and values into a paged KV
cache) is registered by :func:`register_mutating_op`: ``flydsl::<name>`` alone (a functional form would copy the
caches to return them), its schema inferred from the signature (every parameter an input, defaults kept; the inputs
it writes annotated ``Tensor(a!)``), returning ``()``, through the same machinery (:class:`_Op`: checks once per
call signature, device checks, a fake that only checks). Under ``torch.compile`` it is functionalized
(``auto_functionalized``) and inductor writes in place again; it bumps the version counters of what it writes and
refuses inputs that require grad while grad mode is on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from flydsl.kernels.plans import Plans, signature
from flydsl.torch._registry import _Op, _registered, eager

__all__ = ["FlyMutatingOp", "register_mutating_op", "registered_mutating_ops"]

_MUTATING_OPS: dict[str, FlyMutatingOp] = {}


class FlyMutatingOp(_Op):
    """One op registered as ``torch.ops.flydsl.<name>`` alone: it writes into the inputs that ``mutates`` names
    (annotated ``Tensor(a!)`` in its schema) and returns nothing (see the module docstring)."""

    def __init__(self, name: str, impl: Callable, mutates: Sequence[str], check: Callable):
        self.name = name
        self.impl = impl
        self.check = check
        signature = inspect.signature(impl, eval_str=True)
        params = list(signature.parameters.values())
        if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
            raise TypeError(f"flydsl op {name}: a mutating op takes its inputs as plain parameters (no outputs)")
        self._set_inputs(params)
        names = [p.name for p in params]
        tensors = {param_name for _, param_name in self._tensor_inputs}
        if not mutates or any(m not in tensors for m in mutates):
            raise TypeError(f"flydsl op {name}: mutates: expected names of its tensor parameters, got {mutates!r}")
        self.mutates = tuple(mutates)
        self._mutated = tuple(names.index(m) for m in self.mutates)
        self._input_signature = signature.replace(return_annotation=None)
        # The checked calls' work by signature: the implementation, its launches replayed natively from the second
        # call and kept on disk (flydsl.kernels.plans), so a known signature's first call in a new process neither
        # imports the kernel modules nor routes again.
        self._runs = Plans(f"flydsl.{name} (run)", replay=True)
        self.op = self._register()

    def _validate(self, inputs, real: bool) -> None:
        self.check(*inputs)
        self._same_device([(name, inputs[i]) for i, name in self._tensor_inputs if inputs[i] is not None], real)

    def _run(self, inputs, key=...) -> None:
        """The op on real tensors: checked once per call signature (``key``: already computed), then :meth:`_work`
        through the signature's kept run."""
        if key is ...:
            key = signature(*inputs)
        plan = self._runs.get(key)
        if plan is None:
            self._validate(inputs, real=True)
            plan = self._runs.add(key, self.impl)
        self._work(inputs, plan)

    def _work(self, inputs, plan) -> None:
        """A checked call's work: inputs that require grad refused, the written inputs' versions bumped, the kernels
        (``plan``: the implementation, or its replay)."""
        if self._needs_grad(inputs):
            raise RuntimeError(
                f"flydsl.{self.name}: an input requires grad, and this op records no gradients: run it under"
                " torch.no_grad(), or detach its inputs"
            )
        for i in self._mutated:  # what the ADInplaceOrView kernel of an in-place op does
            value = inputs[i]
            if value is not None and not value.is_inference():
                torch.autograd.graph.increment_version(value)
        plan(*inputs)

    def call(self, *inputs) -> None:
        """The op on all its inputs (positional): without the dispatcher where it would land in our own kernel
        (:func:`eager` tensors; a signature with a kept run is one: the checks passed on real CUDA tensors of the types
        it names), with the same checks and version bumps; through ``torch.ops.flydsl`` while something traces or
        intercepts the call, or for other tensors."""
        if not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()):
            key = signature(*inputs)
            plan = self._runs.get(key)
            if plan is not None:
                return self._work(inputs, plan)
            if eager(*(inputs[i] for i, _ in self._tensor_inputs)):
                return self._run(inputs, key)
        self.op.default(*inputs)

    def _register(self):
        def real(*args, **kwargs):
            self._run(self._inputs(args, kwargs))

        def fake(*args, **kwargs):
            self._validate(self._inputs(args, kwargs), real=False)

        return self._define(self.name, self._input_signature, self.mutates, real, fake)


def register_mutating_op(name: str, *, mutates: Sequence[str], check: Callable) -> Callable:
    """Registers ``torch.ops.flydsl.<name>`` alone from a function that writes into some of its inputs (``mutates``,
    their names) and returns None: its schema returns ``()``. ``check(*inputs)`` validates metadata only, as
    :func:`register_op`'s; the decorator adds the device checks. Returns the :class:`FlyMutatingOp`."""

    def decorate(impl: Callable) -> FlyMutatingOp:
        return _registered(name, _MUTATING_OPS, lambda: FlyMutatingOp(name, impl, mutates, check))

    return decorate


def registered_mutating_ops() -> dict[str, FlyMutatingOp]:
    """Every mutating-only op (:func:`register_mutating_op`) registered so far, by name."""
    return dict(_MUTATING_OPS)

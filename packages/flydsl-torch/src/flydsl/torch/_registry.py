"""The one registration decorator behind every ``torch.ops.flydsl.*`` op.

An op is written once, as the function that writes its results into given tensors::

    @register_op("softmax", outputs=lambda x: (like(x),), check=check_softmax)
    def softmax(x: Tensor, *, out: Tensor) -> None:
        kernels.softmax(rows(x), out=rows(out))

Keyword-only parameters are the outputs (``Tensor | None`` for an output the caller may leave out). From that the
decorator defines, in the ``flydsl`` namespace of ``torch.library``:

- ``flydsl::softmax_out`` -- the mutating op (its outputs annotated ``Tensor(a!)``) that writes into the outputs
  given; its schema lists every input, then every output, all without defaults, e.g.
  ``torch.ops.flydsl.layer_norm_out(x, [n], w, b, 1e-5, y, None, None)`` (``None``: a statistic not written);
- ``flydsl::softmax`` -- the functional op: allocates the outputs that ``outputs`` describes, then writes them;
- a fake (meta) implementation of both (``torch.library.register_fake``), so that FakeTensorMode, meta tensors and
  ``torch.compile`` trace them without a GPU and without graph breaks.

The schemas are inferred from the function's signature (``torch.library.infer_schema``). The ops are defined with
``torch.library.Library`` rather than ``torch.library.custom_op``: the same schemas and fake implementations, but
the real implementation is a plain CPU/CUDA kernel of the dispatcher, without custom_op's Python layers around every
call (about 10 us each). Gradients (``FlyOp.register_autograd``, with the arguments of
``torch.library.register_autograd``) come through our own Autograd kernel rather than torch's generated one: where
no input requires grad and nothing but the backend kernel sits below autograd (plain CPU/CUDA tensors, no dispatch
mode, no functionalization), it calls the implementation directly instead of redispatching through a context
manager, a dataclass and a second trip through the dispatcher (about 10 us per inference call). Everything else
(fake tensors, ``torch.compile``, vmap) redispatches as torch's kernel does.

``outputs(*inputs)`` returns one ``(shape, dtype)`` per output, or ``None`` for an output the op does not write
with these inputs (the functional op then returns an empty tensor in its place). ``check(*inputs)`` validates
metadata only (dtypes, shapes), so that the same errors come from eager calls, fake tensors and compiled graphs;
the decorator adds the device checks and the checks of given outputs against ``outputs``. The function itself runs
only on real CUDA tensors (on CPU tensors the op raises, naming the argument). ``FlyOp.register_autograd``
attaches gradients to the functional op; the mutating ops record none and refuse inputs that require grad while
grad mode is on.

Ops whose only results are writes into their inputs (``write_kv``) are :mod:`flydsl.torch._mutating`'s, on the same
:class:`_Op` machinery.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence

import torch
from flydsl.kernels.memory import torch_empty_like, torch_new_empty
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = [
    "NAMESPACE",
    "FlyOp",
    "eager",
    "register_op",
    "registered_ops",
]

NAMESPACE = "flydsl"
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")  # kept alive for as long as the ops are
_OPS: dict[str, FlyOp] = {}
_NAMES: set[str] = set()  # every op's name, functional or mutating (flydsl.torch._mutating)

OutputSpec = tuple[Sequence[int], torch.dtype] | None

_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AFTER_AUTOGRAD_RAW = _AFTER_AUTOGRAD.raw_repr()  # the same mask as an int: one binding call less per op call


def _direct_keysets() -> frozenset:
    """The dispatch keys left below autograd when the redispatch would land straight in our CPU or CUDA kernel:
    the backend and ADInplaceOrView (a fallthrough for these ops; absent on inference tensors)."""
    keys = torch._C.DispatchKey
    raw = set()
    for backend in (keys.CPU, keys.CUDA):
        plain = torch._C.DispatchKeySet(backend)
        raw.add(plain.raw_repr())
        raw.add(plain.add(keys.ADInplaceOrView).raw_repr())
    return frozenset(raw)


_DIRECT = _direct_keysets()


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_plain_keysets: set = set()  # the raw dispatch key sets of plain CUDA tensors (see eager)


def _plain_keyset(raw: int) -> bool:
    """Whether ``raw`` (a tensor's dispatch key set) is that of a plain CUDA tensor, with or without autograd keys
    (inference tensors have none)."""
    if not _plain_keysets:
        keys = torch._C.DispatchKey
        cuda = torch._C.DispatchKeySet(keys.CUDA)
        with_autograd = cuda.add(keys.ADInplaceOrView).add(keys.AutogradCUDA).add(keys.AutocastCUDA)
        _plain_keysets.update((cuda.raw_repr(), cuda.add(keys.AutocastCUDA).raw_repr(), with_autograd.raw_repr()))
    return raw in _plain_keysets


def eager(*tensors) -> bool:
    """Whether a call on ``tensors`` (None: absent) may skip torch's dispatcher: nothing is tracing it
    (``torch.compile``, ``torch.export``), no dispatch mode is active (fake tensors, FLOP counters), and every tensor
    is a plain CUDA tensor (no subclass, no functorch or functionalization wrapper). The dispatcher would then land in
    the op's CUDA kernel (or, for inputs that require grad, our Autograd kernel, then the CUDA kernel) through layers
    that cost more host time than the launch (benchmarks/host_overhead.py); everything else takes the op."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    keys = torch._C._dispatch_keys
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TYPES or not _plain_keyset(keys(t).raw_repr())):
            return False
    return True


def _made(like: torch.Tensor, spec: OutputSpec) -> tuple:
    """How an output of ``spec`` is made for calls whose first tensor input has ``like``'s signature: (its shape,
    its dtype), None for the input's; contiguous on the input's device. An unwritten output gets an empty tensor. A
    replay makes it so natively (``ScratchPlan``'s ``made``), :func:`_output_maker` in Python."""
    if spec is None:
        return ((0,), None)
    shape, dtype = spec
    if dtype is like.dtype and like.shape == shape:
        return (None, None)
    return (tuple(shape), dtype)


def _output_maker(like: torch.Tensor, spec: OutputSpec) -> Callable:
    """:func:`_made`'s output as a function of the input (through torch's C API where it is on,
    ``flydsl.kernels.memory``)."""
    shape, dtype = _made(like, spec)
    if shape is None:
        return torch_empty_like
    return lambda like: torch_new_empty(like, shape, dtype)


# autograd.Function's apply as torch's C extension defines it (what ``Function.apply`` calls after its Python layer)
_C_APPLY = vars(torch._C._FunctionBase).get("apply")


def _is_tensor_param(annotation) -> bool:
    return annotation is torch.Tensor or torch.Tensor in typing.get_args(annotation)


class _Op:
    """What :class:`FlyOp` and :class:`~flydsl.torch._mutating.FlyMutatingOp` share: the inputs (their defaults, which
    the dispatcher leaves out), the device checks and the definition in ``torch.library``."""

    name: str
    _input_signature: inspect.Signature  # the inputs alone, with their defaults

    def _set_inputs(self, input_params: list) -> None:
        self.input_params = input_params
        self._n_inputs = len(input_params)
        # The dispatcher leaves out trailing arguments equal to their defaults: _inputs puts them back.
        self._defaults = tuple(p.default for p in input_params)
        self._n_required = sum(1 for p in input_params if p.default is inspect.Parameter.empty)
        self._tensor_inputs = tuple((i, p.name) for i, p in enumerate(input_params) if _is_tensor_param(p.annotation))

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def _inputs(self, args, kwargs) -> tuple:
        if not kwargs and self._n_required <= len(args) <= self._n_inputs:  # how the dispatcher passes them
            return tuple(args) + self._defaults[len(args) :]
        bound = self._input_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def _same_device(self, tensors: list, real: bool) -> None:
        """Every ``(name, tensor)`` on one device: (``real``) one CUDA device, else (fake) the first one's."""
        if real:
            self._check_devices(tensors)
        else:
            first_name, first = tensors[0]
            for name, value in tensors:
                if value.device != first.device:
                    self._device_error(name, value, first_name, first)

    def _check_devices(self, tensors: list) -> None:
        first_name, first = tensors[0]
        device = first.get_device()  # an int: cheaper than comparing torch.device objects
        for name, value in tensors:
            if not value.is_cuda:
                raise ValueError(
                    f"flydsl.{self.name}: {name}: expected a CUDA tensor, got one on {value.device} "
                    "(the flydsl.torch.nn modules fall back to torch on the CPU; the ops do not)"
                )
            if value.get_device() != device:
                self._device_error(name, value, first_name, first)

    def _device_error(self, name, value, first_name, first):
        raise ValueError(
            f"flydsl.{self.name}: {name}: expected a tensor on {first.device} (where {first_name} is), "
            f"got one on {value.device}"
        )

    def _needs_grad(self, inputs) -> bool:
        """Whether an input requires grad while grad mode is on (which the mutating ops refuse: they record none)."""
        if torch.is_grad_enabled():
            for i, _ in self._tensor_inputs:
                if inputs[i] is not None and inputs[i].requires_grad:
                    return True
        return False

    @staticmethod
    def _define(name: str, signature: inspect.Signature, mutates: tuple, real: Callable, fake: Callable):
        def prototype(*args, **kwargs): ...

        prototype.__signature__ = signature
        _LIB.define(name + torch.library.infer_schema(prototype, mutates_args=mutates))
        for key in ("CPU", "CUDA"):  # CPU: so that a CPU tensor gets our error, naming the argument
            _LIB.impl(name, real, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
        return getattr(torch.ops.flydsl, name)


class FlyOp(_Op):
    """One op registered as ``torch.ops.flydsl.<name>`` (functional) and ``torch.ops.flydsl.<name>_out``."""

    def __init__(self, name: str, impl: Callable, outputs: Callable[..., Sequence[OutputSpec]], check: Callable):
        self.name = name
        self.impl = impl
        self.outputs = outputs
        self.check = check
        signature = inspect.signature(impl, eval_str=True)
        params = list(signature.parameters.values())
        self.output_names = tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
        self._set_inputs([p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY])
        if not self.output_names:
            raise TypeError(f"flydsl op {name}: declare its outputs as keyword-only parameters")
        # The mutating op lists its outputs after its inputs (schemas with keyword-only tensors are refused by parts
        # of torch.library), all without defaults: an input default cannot precede a required output, and every
        # output, optional or not, is then named by the caller (the dispatcher reports one left out).
        positional, empty = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty
        self._out_signature = signature.replace(
            parameters=[p.replace(default=empty) for p in self.input_params]
            + [p.replace(kind=positional, default=empty) for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        )
        results = [torch.Tensor] * len(self.output_names)
        self._functional_signature = signature.replace(
            parameters=self.input_params,
            return_annotation=results[0] if len(results) == 1 else tuple.__class_getitem__(tuple(results)),
        )
        self._input_signature = self._functional_signature
        self._checked_functional = Plans(f"flydsl.{name} (checked)")
        self._checked_out = Plans(f"flydsl.{name}_out (checked)")
        self._runs = Plans(f"flydsl.{name} (run)", replay=True)  # _run's work, replayed natively
        self._eager_function = None  # register_autograd's Function for eager calls (see call)
        self._gradients = None  # register_autograd's (setup_context, backward), for the C++ node (_nodes)
        self._node_gradients = None  # their C++ node's Gradients (False: no node built; None: not looked up yet)
        self._native_backward = None  # register_autograd's NativeBackward: the node's backward without Python
        self._single = len(self.output_names) == 1
        self.out = self._register_out()
        self.functional = self._register_functional()

    # --- what both ops share ------------------------------------------------------------------------------------

    def _validate(self, inputs, given: dict | None, real: bool) -> list[OutputSpec]:
        """Checks the inputs' metadata, the given outputs against ``outputs`` and (``real``) that every tensor is on
        one CUDA device; returns the output specs. Errors are built only when raised."""
        self.check(*inputs)
        specs = self.outputs(*inputs)
        tensors = [(name, inputs[i]) for i, name in self._tensor_inputs if inputs[i] is not None]
        if given is not None:
            for (name, value), spec in zip(given.items(), specs, strict=True):
                if value is None:
                    continue
                if spec is None:
                    raise ValueError(f"flydsl.{self.name}: {name}: not written with these inputs; pass None")
                shape, dtype = spec
                if value.dtype != dtype or tuple(value.shape) != tuple(shape):
                    raise ValueError(
                        f"flydsl.{self.name}: {name}: expected a {_dtype_name(dtype)} tensor of shape "
                        f"{tuple(shape)}, got {_dtype_name(value.dtype)} {tuple(value.shape)}"
                    )
                tensors.append((name, value))
        self._same_device(tensors, real)
        return specs

    def _checked(self, inputs, given: dict | None, key=...) -> list[OutputSpec]:
        """:meth:`_validate` on real tensors, once per call signature (:mod:`flydsl.kernels.plans`: the tensors'
        shapes, strides, dtypes, alignment and devices, the other arguments' values; ``key``: already computed): the
        output specs."""
        plans = self._checked_functional if given is None else self._checked_out
        if key is ...:
            key = signature(*inputs) if given is None else signature(*inputs, *given.values())
        specs = plans.get(key)
        if specs is None:
            specs = plans.add(key, self._validate(inputs, given, real=True))
        return specs

    # --- the mutating op -----------------------------------------------------------------------------------------

    def _split(self, args, kwargs) -> tuple[tuple, dict]:
        if not kwargs and len(args) == self._n_inputs + len(self.output_names):
            return tuple(args[: self._n_inputs]), dict(zip(self.output_names, args[self._n_inputs :], strict=True))
        bound = self._out_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        given = {name: values.pop(name) for name in self.output_names}
        return tuple(values.values()), given

    def _register_out(self):
        def real(*args, **kwargs):
            inputs, given = self._split(args, kwargs)
            self._checked(inputs, given)
            if self._needs_grad(inputs):
                raise RuntimeError(
                    f"flydsl.{self.name}_out: an input requires grad, and the *_out ops record no gradients:"
                    f" call torch.ops.flydsl.{self.name} (or flydsl.torch.functional), or run under"
                    " torch.no_grad()"
                )
            for value in given.values():  # what the ADInplaceOrView kernel of an in-place op does
                if value is not None and not value.is_inference():
                    torch.autograd.graph.increment_version(value)
            self.impl(*inputs, **given)

        def fake(*args, **kwargs):
            inputs, given = self._split(args, kwargs)
            self._validate(inputs, given, real=False)

        return self._define(f"{self.name}_out", self._out_signature, self.output_names, real, fake)

    # --- the functional op ---------------------------------------------------------------------------------------

    def _allocate(self, inputs, specs) -> tuple:
        """The outputs of a call (``specs``: :meth:`_validate`'s), a tuple: one fresh tensor per output, an empty one
        standing in for an output not written with these inputs."""
        like = inputs[self._tensor_inputs[0][0]]
        return tuple(_output_maker(like, spec)(like) for spec in specs)

    def _kept_run(self, inputs, specs) -> ScratchPlan:
        """The functional op's work for calls of one signature, as a plan of the inputs: its scratch allocates the
        outputs, its launch runs the implementation on them (the unwritten ones passed as None) and is replayed
        natively where it only launches kernels (:mod:`flydsl.kernels.plans`). A call returns the outputs' tuple."""
        like_index = self._tensor_inputs[0][0]
        makers = tuple(_output_maker(inputs[like_index], spec) for spec in specs)
        unwritten = frozenset(i for i, spec in enumerate(specs) if spec is None)
        made = tuple((like_index, *_made(inputs[like_index], spec)) for spec in specs)
        impl, n_inputs, names = self.impl, self._n_inputs, self.output_names

        if len(makers) == 1:
            (make,) = makers

            def outputs(*inputs) -> tuple:
                return (make(inputs[like_index]),)

        else:

            def outputs(*inputs) -> tuple:
                like = inputs[like_index]
                return tuple([make(like) for make in makers])

        def launch(*args) -> None:
            outs = args[n_inputs:]
            impl(*args[:n_inputs], **{name: None if i in unwritten else outs[i] for i, name in enumerate(names)})

        return ScratchPlan(outputs, launch, made)

    def _run(self, inputs, key=...):
        """The functional op on real tensors: validated inputs, allocated outputs, the implementation. The outputs'
        facts follow from the inputs' (the specs, fresh allocations), so the run is kept as a plan by the inputs'
        signature alone (``key``: already computed; :meth:`_kept_run`) and later calls of the signature go through
        :meth:`call`'s plan directly."""
        return self._result(self._run_outputs(*inputs, key=key))

    def _run_outputs(self, *inputs, key=...) -> tuple:
        """:meth:`_run`'s outputs as a tuple (the C++ autograd node's forward for a first call)."""
        if key is ...:
            key = signature(*inputs)
        plan = self._runs.get(key)
        if plan is None:
            plan = self._runs.add(key, self._kept_run(inputs, self._checked(inputs, None, key)))
        return plan(*inputs)

    def _result(self, outputs: tuple):
        return outputs[0] if self._single else outputs

    def eager_out(self, inputs: tuple, given: dict) -> None:
        """The mutating op's work without the dispatcher, for ``flydsl.torch.functional``'s inference path:
        :func:`eager` tensors that need no gradient, outputs just allocated by the caller like the first input (so
        neither checked nor keyed, and no version counter to bump). The inputs are checked as the functional op checks
        them (once per signature), then the implementation runs; the functional keeps the call as a plan of its own
        (replayed natively from its second call)."""
        self._checked(inputs, None)
        self.impl(*inputs, **given)

    def call(self, *inputs):
        """The functional op on all its inputs (positional): without the dispatcher where it would land in our own
        kernels (:func:`eager` tensors: the work directly, or through the same gradients' ``autograd.Function`` where
        an input requires grad), else through ``torch.ops.flydsl``. A call whose signature has a kept run (a first call
        passed :func:`eager` and the checks with it: the signature names the tensor types, devices and layouts) goes
        straight to that plan, unless something traces or intercepts it (``torch.compile``, a dispatch mode)."""
        if not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()):
            key = signature(*inputs)
            plan = self._runs.get(key)
            if plan is not None:
                if self._eager_function is not None and self._needs_grad(inputs):
                    return self._apply_eager(plan, inputs)
                return self._result(plan(*inputs))
            if eager(*(inputs[i] for i, _ in self._tensor_inputs)):
                if not self._needs_grad(inputs):
                    return self._run(inputs, key)
                if self._eager_function is not None:
                    return self._apply_eager(None, inputs)
        return self.functional.default(*inputs)

    def call_kept_with_grad(self, *inputs):
        """:meth:`call`'s shortest path, for a caller that has seen an input requiring grad with grad mode on and
        nothing tracing or intercepting the call: the signature's kept run with gradients recorded (the C++ node
        looks it up and applies it in one call where it is built, else :meth:`_apply_eager`); None where no run is
        kept for the signature (a first call: the caller checks its arguments and takes :meth:`call`)."""
        if self._eager_function is None:
            return None
        gradients = self._node_gradients
        if gradients is None:
            gradients = self._bind_node_gradients()
        if gradients and (out := gradients.apply_kept(inputs)) is not None:  # the node's own lookup: one call
            return out
        plan = self._runs.get(signature(*inputs))
        if plan is None:
            return None
        return self._apply_eager(plan, inputs)

    def _apply_eager(self, plan, inputs):
        """The eager call with gradients recorded: through the C++ autograd node where it is built
        (:mod:`flydsl.torch._nodes`), else ``EagerFunction.apply(plan, *inputs)``, without torch's Python layer over
        it where no functorch transform is active (that layer unwraps functorch's wrappers, which eager calls have
        none of: ~1 us a call). Under functorch transforms, the Function."""
        if torch._C._are_functorch_transforms_active():
            return self._eager_function.apply(plan, *inputs)
        gradients = self._node_gradients
        if gradients is None:
            gradients = self._bind_node_gradients()
        if gradients:
            return gradients.apply(self._run_outputs if plan is None else plan, inputs)
        return self._eager_apply(plan, *inputs)

    def _bind_node_gradients(self):
        """The C++ node's ``Gradients`` of this op (:mod:`flydsl.torch._nodes`), or False where it is not built."""
        from flydsl.torch import _nodes

        node = _nodes.module()
        setup, backward = self._gradients
        self._node_gradients = (
            False
            if node is None
            else _nodes.gradients(node, self.name, setup, backward, self._single, self._native_backward, self._runs)
        )
        return self._node_gradients

    def _register_functional(self):
        def real(*args, **kwargs):
            return self._run(self._inputs(args, kwargs))

        def fake(*args, **kwargs):
            inputs = self._inputs(args, kwargs)
            return self._result(self._allocate(inputs, self._validate(inputs, None, real=False)))

        return self._define(self.name, self._functional_signature, (), real, fake)

    def register_autograd(self, backward: Callable, setup_context: Callable, native=None) -> None:
        """Gradients of the functional op: ``setup_context(ctx, inputs, output)`` saves what ``backward(ctx,
        *grads)`` needs, as with ``torch.library.register_autograd`` (whose generated kernel this replaces with a
        leaner one, see the module docstring). ``backward`` gets None for the gradient of an output that nothing
        used (no zeros are materialized) and returns one gradient (or None) per input. ``native``: a
        :class:`flydsl.torch._nodes.NativeBackward` where ``backward`` is one call of a backward op on the output
        gradients and saved tensors, which the C++ node then replays without Python."""
        self._native_backward = native
        overload = self.functional.default
        run, result_of = self._run, self._result
        tensor_positions = tuple(i for i, _ in self._tensor_inputs)

        def below_autograd(keyset, inputs):
            if keyset.raw_repr() & _AFTER_AUTOGRAD_RAW in _DIRECT:  # the redispatch would land in our kernel
                return run(inputs)
            with torch._C._AutoDispatchBelowAutograd():
                return overload.redispatch(keyset & _AFTER_AUTOGRAD, *inputs)

        def backward_past_first(ctx, *grads):
            """``backward`` on the op's inputs: the Functions' first input (the keyset, the plan) takes no gradient."""
            needs = ctx.needs_input_grad
            ctx.needs_input_grad = needs[1:]
            try:
                result = backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = needs
            return (None, *result) if isinstance(result, tuple) else (None, result)

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, keyset, *inputs):
                result = below_autograd(keyset, inputs)
                setup_context(ctx, inputs, result)
                # Gradients of unused outputs arrive as None instead of zeros that autograd would allocate and fill
                # on every backward (two kernels per call for a norm's mean and rstd, which nothing differentiates).
                ctx.set_materialize_grads(False)
                return result

            backward = staticmethod(backward_past_first)

        Function.__name__ = Function.__qualname__ = f"FlyBackward_{self.name}"

        class EagerFunction(torch.autograd.Function):
            """The same gradients for :meth:`FlyOp.call`'s eager calls: no keyset, no redispatch."""

            @staticmethod
            def forward(ctx, plan, *inputs):  # plan: the signature's kept run (None: a first call, checked by run)
                result = run(inputs) if plan is None else result_of(plan(*inputs))
                setup_context(ctx, inputs, result)
                ctx.set_materialize_grads(False)
                return result

            backward = staticmethod(backward_past_first)

        EagerFunction.__name__ = EagerFunction.__qualname__ = f"FlyBackward_{self.name}"
        self._eager_function = EagerFunction
        self._gradients = (setup_context, backward)
        self._eager_apply = _C_APPLY.__get__(None, EagerFunction) if _C_APPLY is not None else EagerFunction.apply

        def autograd_kernel(keyset, *args, **kwargs):
            inputs = self._inputs(args, kwargs)
            if torch.is_grad_enabled():
                for i in tensor_positions:
                    if inputs[i] is not None and inputs[i].requires_grad:
                        return Function.apply(keyset, *inputs)
            return below_autograd(keyset, inputs)

        _LIB.impl(self.name, autograd_kernel, "Autograd", with_keyset=True)


def _registered(name: str, table: dict, make: Callable):
    """``make()``'s op kept in ``table`` under ``name``, a name no op of the ``flydsl`` namespace (functional or
    mutating) has yet."""
    if name in _NAMES:
        raise RuntimeError(f"flydsl op {name} is already registered")
    op = table[name] = make()
    _NAMES.add(name)
    return op


def register_op(name: str, *, outputs: Callable[..., Sequence[OutputSpec]], check: Callable) -> Callable:
    """Registers ``torch.ops.flydsl.<name>`` and ``torch.ops.flydsl.<name>_out`` from the function that writes the
    outputs (its keyword-only parameters); returns the :class:`FlyOp`."""

    def decorate(impl: Callable) -> FlyOp:
        return _registered(name, _OPS, lambda: FlyOp(name, impl, outputs, check))

    return decorate


def registered_ops() -> dict[str, FlyOp]:
    """Every functional op (with its ``*_out`` op) registered so far, by name."""
    return dict(_OPS)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

"""The C++ autograd node of flydsl.torch's eager calls (``csrc/autograd_node.cpp``), on by default
(``FLYDSL_TORCH_NODES=0``: off).

A Python ``torch.autograd.Function`` costs about as much host time per call as torch's whole softmax forward and
backward (``benchmarks/autograd_node_cpu.py``); the eager calls that record gradients
(:meth:`flydsl.torch._registry.FlyOp.call`) record ``FlyBackward`` instead: a ``torch::autograd::Node`` whose backward
replays the backward op's kept plan without Python or the GIL (:class:`NativeBackward`) or calls the op's Python
backward. The same ``setup_context`` (or :class:`Saved` declaration) and ``backward`` serve both paths (the
:class:`NodeContext` speaks the part of ``FunctionCtx`` they use), so results are the same either way. Measured
(``docs/tuning/host.md#autograd``): forward + backward 1.12-1.25x torch eager's host time through the Function,
0.91-1.08x through the node (H100 host).

Per op, ``module().Gradients(name, setup_context, backward, NodeContext, single, native, declared)`` binds them
once; its ``apply(forward, inputs)`` runs the forward (a plan returning the outputs' tuple) and records the node.

The node is a torch extension: built with ``torch.utils.cpp_extension`` (a C++ compiler and ninja) the first time a
process needs it, once per torch version and Python (about 20 s, announced on stderr; ``_nodes.build()`` builds it
ahead of time), kept under FlyDSL's cache directory and imported from there after. Where it cannot be built, the
reason is kept there too (so later processes do not try again; delete ``failed.txt`` to retry), a warning says so
(:func:`module`), and gradients go through the Python Function.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NativeBackward", "NodeContext", "Saved", "build", "gradients", "module"]

SOURCE = Path(__file__).with_name("csrc") / "autograd_node.cpp"
_UNSET = object()
_module = _UNSET


@dataclass(frozen=True)
class NativeBackward:
    """An op's backward that is one call of a backward op on the op's output gradients and saved tensors (softmax:
    ``softmax_backward(dy, y)``), so that the node can replay that call's kept plan (a ``_runtime.LaunchPlan``)
    itself, on autograd's device thread without the GIL, once a backward through Python has shown which plan the
    call signature takes (up to 8 signatures per op). ``op``: the backward op (a ``FlyOp``); ``arguments``: per
    argument of it, ``("grad", i)`` (the gradient of the op's output i, None where unused), ``("saved", j)`` (the
    j-th tensor ``setup_context`` saved) or ``("context", name)`` (a value ``setup_context`` set on the context,
    e.g. ``normalized_shape``: one the forward's plan fixes, so plans are then kept per forward plan too);
    ``gradients``: per input of the op, the index of the backward op's output that is its gradient, or None;
    ``defined``: the arguments that must be tensors for the replay (else the Python backward runs: e.g. layer_norm's
    bias gradient without a weight is computed in Python); ``unused``: the op's outputs whose gradients must be
    None for the replay (fused_add_rms_norm's residual_out, whose gradient Python adds). A backward whose gradient
    mode is on (``create_graph``),
    under a dispatch mode, or on arguments without a known plan (another signature, plans that need Python: held
    memory, tensor maps) goes through the op's Python backward, which must compute the same gradients."""

    op: object
    arguments: tuple
    gradients: tuple
    defined: tuple = ()
    unused: tuple = ()

    def spec(self) -> tuple:
        """What ``Gradients(native=...)`` takes: (sources, outputs_of, defined, unused, learn, the runtime's replay
        capsule)."""
        from flydsl.compiler._native import launcher
        from flydsl.kernels.plans import signature

        runs = self.op._runs

        def learn(*args):
            plan = runs.get(signature(*args))
            return plan if getattr(plan, "replays_without_python", False) else None

        return self.arguments, self.gradients, self.defined, self.unused, learn, launcher._native_replay


@dataclass(frozen=True)
class Saved:
    """An op's ``setup_context`` declared rather than written, so that the C++ node records a forward without calling
    Python or making a context (the context of a backward that runs in Python is made then, with ``values`` set on
    it). ``tensors``: what ``save_for_backward`` gets, in order, each ``("input", i)`` or ``("output", j)`` (a None
    input saves None); ``non_differentiable``: outputs that take no gradient; ``values``: ``(name, i)``, the context
    attribute ``name`` set to input ``i`` (e.g. ``normalized_shape``). Called as a ``setup_context(ctx, inputs,
    output)``, it does the same through Python (the ``autograd.Function`` path)."""

    tensors: tuple
    non_differentiable: tuple = ()
    values: tuple = ()

    def __call__(self, ctx, inputs, output) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        if self.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[j] for j in self.non_differentiable))
        for name, i in self.values:
            setattr(ctx, name, inputs[i])
        ctx.save_for_backward(*(outputs[i] if kind == "output" else inputs[i] for kind, i in self.tensors))

    def spec(self) -> tuple:
        """What ``Gradients(declared=...)`` takes."""
        return self.tensors, self.non_differentiable, self.values


_BOUND: list = []  # every Gradients made with a native backward (their kept plans go with plans.clear_all)


def gradients(node, name: str, setup, backward, single: bool, native: NativeBackward | None, runs=None):
    """The node's ``Gradients`` of one op (``node``: :func:`module`'s extension); a :class:`Saved` ``setup`` is
    declared to the node; ``runs``: the op's kept runs (a ``Plans``), for ``apply_kept``."""
    import torch
    from flydsl.kernels.plans import key_function

    bound = node.Gradients(
        name,
        setup,
        backward,
        NodeContext,
        single,
        None if native is None else native.spec(),
        setup.spec() if isinstance(setup, Saved) else None,
        None if runs is None else (key_function(), runs.by_signature, torch._C._are_functorch_transforms_active),
    )
    if native is not None:
        if not _BOUND:
            from flydsl.kernels import plans

            plans.on_clear(lambda: [g.clear() for g in _BOUND])
        _BOUND.append(bound)
    return bound


class NodeContext:
    """The ``ctx`` that an op's ``setup_context`` and ``backward`` get on the node's path: what they use of
    ``torch.autograd.Function``'s context. The node reads ``to_save`` and ``non_differentiable`` after the setup (and
    keeps the tensors as SavedVariables, not here), sets ``needs_input_grad`` (one bool per input), and sets
    ``saved_tensors`` for the backward call only."""

    to_save: tuple = ()
    non_differentiable: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        if value:
            raise NotImplementedError("flydsl.torch's autograd node passes unused outputs' gradients as None")


def _name_and_directory() -> tuple[str, Path]:
    import torch
    from flydsl.compiler import settings

    stamp = "\n".join(
        [
            *(hashlib.sha256(path.read_bytes()).hexdigest() for path in [SOURCE, *sorted(SOURCE.parent.glob("*.h"))]),
            torch.__version__,
            sys.version,
            str(torch._C._GLIBCXX_USE_CXX11_ABI),
            sysconfig.get_config_var("EXT_SUFFIX") or "",
        ]
    )
    name = "flydsl_autograd_node_" + hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return name, settings.current().cache_dir / "torch-autograd-node" / name


def _import(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    return extension


class _KeptFailure(RuntimeError):
    """A build that failed in an earlier process (its reason kept in ``failed.txt``)."""


def build(quiet: bool = False):
    """The node's extension module: imported from the cache directory, or built there first. Raises where it cannot
    be built (and keeps the reason, see the module docstring)."""
    import torch  # noqa: F401  (the extension links against the torch this process loaded)

    name, directory = _name_and_directory()
    built = directory / f"{name}.so"
    if built.is_file():
        return _import(name, built)
    failed = directory / "failed.txt"
    if failed.is_file():
        raise _KeptFailure(failed.read_text())
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(
            f"flydsl: building the C++ autograd node for torch {torch.__version__} (once, ~20 s) in {directory}",
            file=sys.stderr,
            flush=True,
        )
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([*_ninja_directories(), path])  # cpp_extension runs `ninja` from PATH
    try:
        return cpp_extension.load(
            name, [str(SOURCE)], extra_cflags=["-O2"], build_directory=str(directory), verbose=False
        )
    except Exception as error:  # a compiler missing, a build error: kept, so no later process pays for it again
        failed.write_text(f"{type(error).__name__}: {error}")
        raise
    finally:
        os.environ["PATH"] = path


def _ninja_directories() -> list[str]:
    """Where a pip-installed ninja is, when this Python's environment is not activated: the ``ninja`` package's
    binary folder and this interpreter's scripts folder."""
    directories = [sysconfig.get_path("scripts")]
    try:
        import ninja

        directories.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    return directories


def module():
    """The built extension (``apply``), or None where it is off (``FLYDSL_TORCH_NODES=0``) or cannot be built.
    Settled on the first call of the process. A failure warns where the node was asked for
    (``FLYDSL_TORCH_NODES=1``), or by default in the process whose build failed (later ones read the kept reason
    and stay quiet)."""
    global _module
    if _module is not _UNSET:
        return _module
    from flydsl.compiler import settings

    _module = None
    wanted = settings.current().torch_nodes
    if wanted is False:
        return None
    try:
        _module = build()
    except _KeptFailure as error:  # a build that failed before, in an earlier process
        if wanted:
            _warn(error)
    except Exception as error:  # any failure leaves gradients on the Python Function
        _warn(error)
    return _module


def _warn(error: Exception) -> None:
    warnings.warn(
        "flydsl: the C++ autograd node is not available, gradients go through a Python autograd.Function (more host"
        f" time per call; FLYDSL_TORCH_NODES=0 chooses it without trying the node): {error}",
        RuntimeWarning,
        stacklevel=3,
    )

"""Whether the GIL on autograd's device thread is what a Python backward costs on a GPU host (issue 31, fwd+bwd):
forward + backward of a softmax through C++ autograd nodes that differ only in how their backward runs.

    python benchmarks/autograd_gil_probe.py [--calls 1000] [--repeats 9] [--rows 8 --cols 1024] [--json F.json]

On CPU stand-ins (no device thread: a CPU graph's backward runs on the calling thread) a Python backward costs a few
us over torch's; on GPU hosts the shipped paths lose 60-75 us per forward + backward that their parts, timed alone,
do not add up to (docs/tuning/host.md#autograd). A CUDA graph's backward runs on autograd's device thread, which must
take the GIL for a Python backward while the caller's thread waits in ``autograd.grad``. Each path below does the
same GPU work (``at::_softmax`` and ``at::_softmax_backward_data`` on ``rows x cols`` bf16), timed per call of
``torch.autograd.grad(f(x), x, dy)``, batches interleaved, medians of ``repeats``:

- ``torch``: ``torch.softmax`` (torch's own C++ node);
- ``native_node``: ``ProbeNode``, a C++ node whose backward calls the op natively, never taking the GIL;
- ``gil_node``: the same node taking the GIL on the device thread for its backward, the work still native;
- ``python_node``: the same node calling a Python function for its backward (what ``flydsl.torch._nodes`` does);
- ``python_function``: a Python ``torch.autograd.Function`` over the same torch ops;
- ``flydsl_node``: ``flydsl.torch.functional.softmax`` as shipped, through ``flydsl.torch._nodes``' C++ node, whose
  backward replays softmax_backward's plan natively (``NativeBackward``) once known;
- ``replay_node``, ``flydsl_forward_node``, ``flydsl_forward_replay_node``: ``native_node`` with flydsl's backward
  replay, its forward plan, or both swapped in (the bisection from ``native_node`` to ``flydsl_node``: whether a
  forward + backward's extra host time is flydsl's kernels and replays or ``FlyBackward``'s bookkeeping).

On a GPU the paths are timed call by call, interleaved, behind a sleep kernel (``host_timing.host_us_rounds``: a
round calls each path once; ``calls // 20`` rounds per repeat); on CPU, in batches.

If ``native_node`` runs at torch's time and ``gil_node`` / ``python_node`` do not, a backward replayed natively (no
GIL) is the fix; if ``native_node`` loses too, the gap is elsewhere (the node's bookkeeping, allocation, streams).
Built with ``torch.utils.cpp_extension.load_inline`` on the first run (a C++ compiler and ninja, ~1 min).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from record import write_record

SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace {

using torch::autograd::variable_list;
using NodePtr = decltype(std::declval<torch::autograd::Edge>().function); // shared_ptr before torch 2.13

enum class Backward { Native = 0, Gil = 1, Python = 2, Replay = 3 };

// flydsl._runtime's `_native_replay` capsule (version 1; flydsl's NativeReplay.cpp): the softmax_backward plan that
// Backward::Replay replays on autograd's device thread, as flydsl.torch's node does.
struct NativeReplayTable {
  uint32_t version;
  void *(*planPointer)(PyObject *);
  int (*replay)(void *, void *const *, size_t, void **, size_t, char *, size_t);
};
const NativeReplayTable *replayTable = nullptr;
void *replayPlan = nullptr;
PyObject *replayKeep = nullptr; // the plan, kept alive for the process

void bind_replay(py::object capsule, py::object plan) {
  const char *name = "flydsl._runtime.native_replay";
  replayTable = static_cast<const NativeReplayTable *>(PyCapsule_GetPointer(capsule.ptr(), name));
  if (!replayTable || replayTable->version != 1)
    throw std::runtime_error("autograd_gil_probe: not a version 1 replay capsule");
  replayPlan = replayTable->planPointer(plan.ptr());
  if (!replayPlan)
    throw std::runtime_error("autograd_gil_probe: the plan does not replay without Python");
  replayKeep = plan.release().ptr();
}

at::Tensor replayed(const at::Tensor &grad, const at::Tensor &out) {
  at::Tensor dy = grad, y = out;
  void *args[2] = {&dy, &y}, *made[8] = {};
  char error[256] = "";
  if (replayTable->replay(replayPlan, args, 2, made, 8, error, sizeof error) != 1 || !made[0])
    throw std::runtime_error(std::string("autograd_gil_probe: the replay declined or failed: ") + error);
  auto *tensor = static_cast<at::Tensor *>(made[0]);
  at::Tensor dx = std::move(*tensor);
  delete tensor;
  return dx;
}

struct ProbeNode : torch::autograd::Node {
  Backward how = Backward::Native;
  PyObject *python = nullptr; // borrowed: the caller keeps the function alive for the node's lifetime
  torch::autograd::SavedVariable y;

  variable_list apply(variable_list &&grads) override {
    at::Tensor out = y.unpack(getptr());
    if (how == Backward::Native)
      return {at::_softmax_backward_data(grads[0], out, -1, out.scalar_type())};
    if (how == Backward::Replay)
      return {replayed(grads[0], out)};
    py::gil_scoped_acquire gil;
    if (how == Backward::Gil)
      return {at::_softmax_backward_data(grads[0], out, -1, out.scalar_type())};
    py::object dx = py::reinterpret_borrow<py::object>(python)(
        py::reinterpret_steal<py::object>(THPVariable_Wrap(grads[0])),
        py::reinterpret_steal<py::object>(THPVariable_Wrap(out)));
    return {THPVariable_Unpack(dx.ptr())};
  }
  void release_variables() override { y.reset_data(); }
};

template <typename Ptr> Ptr makeProbe() { // (a template: only the branch of this torch is instantiated)
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<ProbeNode>();
  else
    return c10::make_intrusive<ProbeNode>(); // torch 2.13: nodes are intrusive_ptr
}

// forward: None (at::_softmax) or a callable of x returning the outputs' tuple (flydsl's kept softmax plan).
at::Tensor softmax(const at::Tensor &x, int how, py::object python, py::object forward) {
  at::Tensor out;
  {
    at::AutoGradMode off(false);
    if (forward.is_none()) {
      out = at::_softmax(x, -1, false);
    } else {
      py::tuple outputs = forward(py::reinterpret_steal<py::object>(THPVariable_Wrap(x)));
      out = THPVariable_Unpack(outputs[0].ptr());
    }
  }
  if (torch::autograd::compute_requires_grad(x)) {
    NodePtr node = makeProbe<NodePtr>();
    auto *probe = static_cast<ProbeNode *>(node.get());
    probe->how = static_cast<Backward>(how);
    probe->python = python.ptr();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out, node);
    probe->y = torch::autograd::SavedVariable(out, true);
  }
  return out;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax", &softmax);
  m.def("bind_replay", &bind_replay);
}
"""


def measure(rows: int, cols: int, calls: int, repeats: int) -> tuple[list, str]:
    import torch
    from torch.utils.cpp_extension import load_inline

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    extension = load_inline("flydsl_autograd_gil_probe", cpp_sources=SOURCE, extra_cflags=["-O2"])
    x = torch.randn(rows, cols, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(rows, cols, device=device, dtype=dtype)

    def python_backward(grad, out):
        return torch._softmax_backward_data(grad, out, -1, out.dtype)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            out = torch._softmax(inp, -1, False)
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            (out,) = ctx.saved_tensors
            return torch._softmax_backward_data(grad, out, -1, out.dtype)

    def node(how: int, forward=None):
        return lambda: torch.autograd.grad(extension.softmax(x, how, python_backward, forward), (x,), dy)

    paths = {
        "torch": lambda: torch.autograd.grad(torch.softmax(x, -1), (x,), dy),
        "native_node": node(0),
        "gil_node": node(1),
        "python_node": node(2),
        "python_function": lambda: torch.autograd.grad(Function.apply(x), (x,), dy),
    }
    if device == "cuda":
        from flydsl.torch import _nodes, ops
        from flydsl.torch import functional as F

        # flydsl's softmax through the C++ node (its default) only: the paths are timed call by call, interleaved,
        # and switching to the Python Function and back rebinds the op's gradients on every call (1.30-1.36x torch
        # at 47b47bd, all of it the rebinding); the Function's own time is the ops table's (FLYDSL_TORCH_NODES=0).
        _nodes._module = _nodes.build(quiet=True)  # (not `node`: the probe's paths above are made by that function)
        ops.softmax._node_gradients = None
        paths["flydsl_node"] = lambda: torch.autograd.grad(F.softmax(x), (x,), dy)
        paths.update(_bisect_paths(torch, extension, node, x, dy))
    for fn in paths.values():
        for _ in range(100):
            fn()
    reference = paths["torch"]()[0].float()
    for name, fn in paths.items():  # the same gradients, so the same work
        got = fn()[0].float()
        if not torch.allclose(got, reference, atol=2e-2, rtol=2e-2):
            raise AssertionError(f"autograd_gil_probe: {name}'s gradient differs from torch's")
    if device == "cuda":  # call by call, interleaved, the GPU kept busy (host_timing)
        from host_timing import host_us_rounds, paired_ratio

        timed = host_us_rounds(paths, max(20, calls // 20), repeats)
        results = [
            {"path": name, "us": timed[name]["host_us"], "ratio_vs_torch": paired_ratio(timed[name], timed["torch"])}
            for name in paths
        ]
        return results, device
    samples = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    results = []
    for name in paths:
        ratio = statistics.median(a / b for a, b in zip(samples[name], samples["torch"], strict=True))
        results.append(
            {"path": name, "us": round(statistics.median(samples[name]), 2), "ratio_vs_torch": round(ratio, 3)}
        )
    return results, device


def _bisect_paths(torch, extension, node, x, dy) -> dict:
    """The probe's node with flydsl's pieces swapped in, between ``native_node`` (torch's at the cycle) and
    ``flydsl_node``: ``replay_node`` (torch's forward, the backward replaying flydsl's softmax_backward plan through
    ``_runtime._native_replay`` on autograd's device thread, as flydsl's node does), ``flydsl_forward_node`` (flydsl's
    kept softmax plan as the forward, torch's backward) and ``flydsl_forward_replay_node`` (both flydsl's: what
    ``flydsl_node`` runs, in the probe's minimal node instead of ``FlyBackward``)."""
    from flydsl.compiler._native import launcher
    from flydsl.kernels.plans import signature
    from flydsl.torch import ops

    plain = x.detach()
    for _ in range(2):  # the first call records the runs, the second replays them
        y = ops.softmax.call(plain)
        ops.softmax_backward.call(dy, y)
    forward = ops.softmax._runs.get(signature(plain))
    backward = ops.softmax_backward._runs.get(signature(dy, y))
    if forward is None or backward is None:
        raise RuntimeError("autograd_gil_probe: flydsl kept no softmax or softmax_backward run")
    extension.bind_replay(launcher._native_replay, backward)
    return {
        "replay_node": node(3),
        "flydsl_forward_node": node(0, forward),
        "flydsl_forward_replay_node": node(3, forward),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json")
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    results, device = measure(args.rows, args.cols, args.calls, args.repeats)
    print(f"{'path':<20}{'us per fwd+bwd':>16}{'vs torch':>10}")
    for row in results:
        print(f"{row['path']:<20}{row['us']:>16.2f}{row['ratio_vs_torch']:>10.3f}")
    by_path = {row["path"]: row for row in results}
    summary = {f"{name}_ratio_vs_torch": row["ratio_vs_torch"] for name, row in by_path.items() if name != "torch"}
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    if args.json:
        method = (
            f"{device} tensors {args.rows} x {args.cols}; torch.autograd.grad per call, paths' batches interleaved "
            f"({args.calls} calls, synchronized around each batch), median of {args.repeats} repeats; ratios: the "
            "median of per-repeat ratios against torch.softmax"
        )
        argv = sys.argv[1:] if argv is None else argv
        write_record(args.json, "autograd_gil_probe", argv, results, commit=args.commit, method=method, summary=summary)


if __name__ == "__main__":
    main()

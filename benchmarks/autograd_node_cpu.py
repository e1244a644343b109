"""What forward + backward would cost with the zoo's gradients as C++ autograd nodes instead of Python
``autograd.Function``s, measured without a GPU: the evidence for issue 31's fwd+bwd bar (<= 1.0x torch eager), which a
Python Function cannot meet (its floor alone is about torch's whole softmax forward + backward).

    python benchmarks/autograd_node_cpu.py [--calls 2000] [--repeats 9] [--json F.json]

A small torch extension (built on the first run with ``torch.utils.cpp_extension.load_inline``: a C++ compiler and
ninja are needed, ~1 min, cached after) defines ``FlyNode``: a ``torch::autograd::Node`` whose forward allocates the
output with ``at::empty_like``, calls a replay (``_runtime.LaunchPlan``) on (x, out) and records itself as the
output's grad_fn; its ``apply`` (the backward, on the autograd engine's thread) allocates dx and calls the backward
replay on (dy, y, dx). The replays are recorded from launches noted through ``_runtime._note_launch`` on CPU tensors
(as benchmarks/host_layer_cpu.py does): a replay does all of its work but ``cuLaunchKernel``. Timed, per call of
``torch.autograd.grad(f(x), x, dy)`` on 8 x 4096 float32 CPU tensors, batches interleaved, medians of ``repeats``:

- ``torch``: torch.softmax on 8 x 16 (its host path with almost no arithmetic: the CPU stand-in of torch eager);
- ``python_function_floor``: a Python Function that only allocates its output and gradient;
- ``flydsl_python``: ``flydsl.torch.functional.softmax`` with its gradients through the Python Function (the
  default) over the kept replays;
- ``flydsl_node``: the same call with ``FLYDSL_TORCH_NODES=1``: through ``flydsl.torch._nodes``' C++ node (a Python
  context and the op's Python ``setup_context`` and ``backward``);
- ``cpp_node_floor``: FlyNode without replays (allocations and the node only);
- ``cpp_node``: FlyNode over the two replays, everything in C++: the floor of a node per op.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time

from record import write_record

ROWS, N = 8, 4096

SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

using torch::autograd::variable_list;

// Calls a replay (a Python callable) on tensors; None: nothing to call (the floor).
void replay(const py::object &plan, std::initializer_list<at::Tensor> tensors) {
  if (plan.is_none())
    return;
  py::tuple args(tensors.size());
  size_t i = 0;
  for (const at::Tensor &t : tensors)
    args[i++] = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  plan(*args);
}

struct FlyNode : torch::autograd::Node {
  py::object backwardPlan;
  torch::autograd::SavedVariable y;

  variable_list apply(variable_list &&grads) override {
    at::Tensor out = y.unpack(getptr());
    at::Tensor dx = at::empty_like(out);
    {
      py::gil_scoped_acquire gil;
      replay(backwardPlan, {grads[0], out, dx});
    }
    return {dx};
  }
  void release_variables() override { y.reset_data(); }
  ~FlyNode() override {
    py::gil_scoped_acquire gil;
    backwardPlan = py::object();
  }
};

at::Tensor softmax(const at::Tensor &x, py::object forwardPlan, py::object backwardPlan) {
  at::Tensor out = at::empty_like(x);
  replay(forwardPlan, {x, out});
  if (torch::autograd::compute_requires_grad(x)) {
    auto node = c10::make_intrusive<FlyNode>();  // torch 2.13: nodes are intrusive_ptr (shared_ptr before)
    node->backwardPlan = std::move(backwardPlan);
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out, node);
    node->y = torch::autograd::SavedVariable(out, true);
  }
  return out;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax", &softmax); }
"""


def _replays(torch, launcher, x):
    """The forward replay over (x, out) and the backward one over (dy, y, dx): one noted launch each."""

    def recorded(tensors, name):
        recording = launcher.LaunchRecording()
        packed = struct.pack(f"<{len(tensors)}Q", *[t.data_ptr() for t in tensors])
        with recording:
            launcher._note_launch(name, (ROWS, 1, 1), (256, 1, 1), None, 0, 0, "p" * len(tensors), packed)
        plan = recording.plan(tuple(tensors))
        if not isinstance(plan, launcher.LaunchPlan):
            raise RuntimeError(f"autograd_node_cpu: the {name} replay was declined: {plan}")
        return plan

    y = torch.empty_like(x)
    return recorded((x, y), "softmax"), recorded((torch.empty_like(x), y, torch.empty_like(x)), "softmax_backward")


def measure(calls: int, repeats: int) -> dict:
    import host_layer_cpu
    import torch
    from launch_levels import AllocatingFunction
    from torch.utils.cpp_extension import load_inline

    from flydsl.compiler._native import launcher
    from flydsl.kernels.plans import signature
    from flydsl.torch import _nodes
    from flydsl.torch import functional as F

    extension = load_inline("flydsl_autograd_node_cpu", cpp_sources=SOURCE, extra_cflags=["-O2"])
    host_layer_cpu.stand_in_launches()
    x = torch.randn(ROWS, N).requires_grad_(True)
    dy = torch.ones(ROWS, N)
    signature(x)  # torch tensors known to the key builder
    launcher._register_stream_getter(lambda device: 0)
    forward, backward = _replays(torch, launcher, x.detach())
    tiny = torch.randn(ROWS, 16, requires_grad=True)
    tiny_dy = torch.ones(ROWS, 16)
    node = _nodes.build()

    def shipped(with_node: bool):
        def call():
            _nodes._module = node if with_node else None
            return torch.autograd.grad(F.softmax(x), (x,), dy)

        return call

    paths = {
        "torch": lambda: torch.autograd.grad(torch.softmax(tiny, -1), (tiny,), tiny_dy),
        "python_function_floor": lambda: torch.autograd.grad(AllocatingFunction.apply(x), (x,), dy),
        "flydsl_python": shipped(False),
        "flydsl_node": shipped(True),
        "cpp_node_floor": lambda: torch.autograd.grad(extension.softmax(x, None, None), (x,), dy),
        "cpp_node": lambda: torch.autograd.grad(extension.softmax(x, forward, backward), (x,), dy),
    }
    for fn in paths.values():
        for _ in range(200):
            fn()
    samples = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    rows = []
    for name in paths:
        ratio = statistics.median(a / b for a, b in zip(samples[name], samples["torch"], strict=True))
        rows.append({"path": name, "us": round(statistics.median(samples[name]), 2), "ratio_vs_torch": round(ratio, 3)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json")
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    rows = measure(args.calls, args.repeats)
    print(f"{'path':<24}{'us per fwd+bwd':>16}{'vs torch':>10}")
    for row in rows:
        print(f"{row['path']:<24}{row['us']:>16.2f}{row['ratio_vs_torch']:>10.3f}")
    if args.json:
        by_path = {row["path"]: row for row in rows}
        summary = {f"{name}_ratio_vs_torch": by_path[name]["ratio_vs_torch"] for name in by_path if name != "torch"}
        method = (
            "CPU tensors; replays recorded from launches noted through _runtime._note_launch (no cuLaunchKernel); "
            "torch.autograd.grad per call, paths' batches interleaved, median of repeats; ratios: the median of "
            "per-repeat ratios against torch.softmax on 8 x 16"
        )
        write_record(
            args.json,
            "autograd_node_cpu",
            sys.argv[1:] if argv is None else argv,
            rows,
            commit=args.commit,
            method=method,
            summary=summary,
        )


if __name__ == "__main__":
    main()

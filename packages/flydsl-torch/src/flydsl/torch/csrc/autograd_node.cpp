// FlyBackward: the autograd node that flydsl.torch's eager calls record instead of a Python autograd.Function
// (whose own machinery costs about as much host time as torch's whole softmax forward + backward). Built once per
// torch version by flydsl.torch._nodes (torch.utils.cpp_extension) and loaded from the disk cache after that.
//
// Gradients(name, setup, backward, context_type, single).apply(forward, inputs) runs forward(*inputs) (the outputs'
// tuple; single: the result is its only item) with grad mode off, lets the op's setup_context(ctx, inputs, result)
// fill a new context_type() (torch.autograd.Function's vocabulary: save_for_backward, mark_non_differentiable,
// attributes), and records one FlyBackward node as the differentiable outputs' grad_fn. The
// node keeps the saved tensors as SavedVariables (an output saved for its own backward holds no reference to its
// node), and on the backward calls backward(ctx, *grads) with ctx.saved_tensors set for the call only: one gradient
// per input, None for an unused output's gradient (no zeros materialized).
//
// The GIL: the backward runs on autograd's device thread, which takes the GIL for it, while the caller's thread waits
// in autograd.grad without it. Everything else the node owns is dropped without the GIL where it can be: the op's
// backward is shared through a shared_ptr (no reference count of a Python object per node), and the context goes in
// release_variables, right after the backward on the same thread. The node itself is often destroyed on the device
// thread once the caller's thread holds the GIL again; a destructor that took the GIL there would wait for it.

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace {

// torch 2.13 made nodes intrusive_ptr (shared_ptr before): the pointer type an Edge holds.
using NodePtr = decltype(std::declval<Edge>().function);

py::object wrap(const at::Tensor &tensor) {
  if (!tensor.defined())
    return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

// One op's backward(ctx, *grads) -> one gradient per input (a tuple) or the only one; shared by the op's Gradients
// and its nodes, destroyed with the GIL by the last of them (normally the Gradients).
struct OpBackward {
  std::string opName;
  py::object function;

  OpBackward(std::string name, py::object backward) : opName(std::move(name)), function(std::move(backward)) {}
  ~OpBackward() {
    if (!Py_IsInitialized()) { // the interpreter is gone: its objects with it
      function.release();
      return;
    }
    py::gil_scoped_acquire gil;
    function = py::object();
  }
};

struct FlyBackward : Node {
  std::shared_ptr<const OpBackward> op;
  py::object context; // the op's ctx: what setup_context set on it, needs_input_grad; None once released
  std::vector<SavedVariable> saved;
  std::vector<int> slots; // per output of the op: its gradient's index among the node's inputs, -1: none

  std::string name() const override { return "FlyBackward_" + op->opName; }

  variable_list apply(variable_list &&grads) override {
    py::gil_scoped_acquire gil;
    if (!context)
      throw std::runtime_error(torch::autograd::ERR_BACKWARD_TWICE);
    py::tuple savedTensors(saved.size());
    for (size_t i = 0; i < saved.size(); ++i)
      savedTensors[i] = wrap(saved[i].unpack(getptr()));
    py::tuple args(slots.size() + 1);
    args[0] = context;
    for (size_t i = 0; i < slots.size(); ++i)
      args[i + 1] = slots[i] < 0 ? py::none() : wrap(grads[slots[i]]);
    py::object result;
    context.attr("saved_tensors") = savedTensors;
    try {
      result = op->function(*args);
    } catch (...) {
      py::delattr(context, "saved_tensors");
      throw;
    }
    py::delattr(context, "saved_tensors"); // held only for the call: no tensor stays reachable from the node
    variable_list gradients(num_outputs());
    if (!py::isinstance<py::tuple>(result)) {
      if (num_outputs() != 1)
        throw std::runtime_error(name() + ": backward returned one gradient for " +
                                 std::to_string(num_outputs()) + " inputs");
      result = py::make_tuple(result);
    }
    py::tuple values = result;
    if (values.size() != num_outputs())
      throw std::runtime_error(name() + ": backward returned " + std::to_string(values.size()) +
                               " gradients for " + std::to_string(num_outputs()) + " inputs");
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i].is_none() || !should_compute_output(i))
        continue;
      if (!THPVariable_Check(values[i].ptr()))
        throw std::runtime_error(name() + ": the gradient of input " + std::to_string(i) + " is not a tensor");
      gradients[i] = THPVariable_Unpack(values[i].ptr());
    }
    return gradients;
  }

  // Called by the engine right after apply where the graph is not kept: the context goes here, on the thread that
  // just ran the backward, while the caller's thread still waits without the GIL.
  void release_variables() override {
    for (SavedVariable &variable : saved)
      variable.reset_data();
    if (context) {
      py::gil_scoped_acquire gil;
      context = py::object();
    }
  }

  ~FlyBackward() override {
    if (!context) // released (or never set): nothing of Python's left to drop
      return;
    if (!Py_IsInitialized()) { // the interpreter is gone: its objects with it
      context.release();
      return;
    }
    py::gil_scoped_acquire gil; // a kept graph (retain_graph) or a backward that never ran
    context = py::object();
  }
};

template <typename Ptr, typename T = FlyBackward> Ptr makeNode() {
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<Node>>)
    return std::make_shared<T>();
  else
    return c10::make_intrusive<T>();
}

bool contains(const py::tuple &tensors, PyObject *value) {
  for (const py::handle &item : tensors)
    if (item.ptr() == value)
      return true;
  return false;
}

// One op's gradients: its name, setup_context, backward and context type, bound once (register_autograd).
struct Gradients {
  std::shared_ptr<const OpBackward> backward;
  py::object setup, contextType;
  bool single; // the op has one output: forward's tuple is unwrapped

  py::object apply(const py::object &forward, const py::tuple &inputs) const;
};

py::object Gradients::apply(const py::object &forward, const py::tuple &inputs) const {
  py::object result;
  {
    at::AutoGradMode off(false); // as in torch.autograd.Function.forward: the forward records nothing
    result = forward(*inputs);   // the outputs' tuple
  }
  py::tuple outputs = result;
  if (single)
    result = outputs[0];
  std::vector<Edge> edges(inputs.size());
  py::tuple needs(inputs.size());
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool needed = false;
    if (THPVariable_Check(inputs[i].ptr())) {
      const at::Tensor &input = THPVariable_Unpack(inputs[i].ptr());
      if (input.requires_grad()) {
        edges[i] = torch::autograd::impl::gradient_edge(input);
        needed = any = true;
      }
    }
    needs[i] = py::bool_(needed);
  }
  if (!any || !at::GradMode::is_enabled())
    return result;
  py::object context = contextType();
  context.attr("needs_input_grad") = needs;
  setup(context, inputs, result);
  // The context type's class attributes default both to (): the instance's are read, then dropped (the node keeps
  // the saved tensors as SavedVariables, not the context).
  py::tuple toSave = context.attr("to_save");
  py::tuple fixed = context.attr("non_differentiable");
  if (toSave.size())
    context.attr("to_save") = py::tuple();
  if (fixed.size())
    context.attr("non_differentiable") = py::tuple();

  NodePtr node = makeNode<NodePtr>();
  auto *fly = static_cast<FlyBackward *>(node.get());
  fly->op = backward;
  fly->context = context;
  node->set_next_edges(std::move(edges));
  fly->slots.assign(outputs.size(), -1);
  for (size_t i = 0; i < outputs.size(); ++i) {
    PyObject *output = outputs[i].ptr();
    if (!THPVariable_Check(output) || contains(fixed, output))
      continue;
    const at::Tensor &tensor = THPVariable_Unpack(output);
    if (!tensor.defined() || !(tensor.is_floating_point() || tensor.is_complex()))
      continue;
    if (tensor.requires_grad())
      throw std::runtime_error("flydsl." + backward->opName + ": an output already records gradients");
    fly->slots[i] = static_cast<int>(node->num_inputs());
    torch::autograd::set_history(tensor, node);
  }
  fly->saved.reserve(toSave.size());
  for (const py::handle &value : toSave) {
    if (value.is_none()) {
      fly->saved.emplace_back();
      continue;
    }
    if (!THPVariable_Check(value.ptr()))
      throw std::runtime_error("flydsl." + backward->opName + ": save_for_backward takes tensors or None");
    fly->saved.emplace_back(THPVariable_Unpack(value.ptr()), contains(outputs, value.ptr()));
  }
  return result;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "flydsl.torch's C++ autograd node (flydsl.torch._nodes)";
  py::class_<Gradients>(module, "Gradients")
      .def(py::init([](std::string name, py::object setup, py::object backward, py::object contextType,
                       bool single) {
             return Gradients{std::make_shared<const OpBackward>(std::move(name), std::move(backward)),
                              std::move(setup), std::move(contextType), single};
           }),
           py::arg("name"), py::arg("setup"), py::arg("backward"), py::arg("context_type"), py::arg("single"))
      .def("apply", &Gradients::apply, py::arg("forward"), py::arg("inputs"));
}

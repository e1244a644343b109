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
// An op may declare what its backward keeps instead (Gradients' `declared`, flydsl.torch._nodes.Saved: tensors among
// the inputs and outputs, non-differentiable outputs, values among the inputs set on ctx): the forward then runs no
// Python past the forward itself and makes no context; one is made, with the declared values, only for a backward
// that runs in Python.
//
// The GIL: the backward runs on autograd's device thread, which takes the GIL for it, while the caller's thread waits
// in autograd.grad without it. Everything else the node owns is dropped without the GIL where it can be: the op's
// backward is shared through a shared_ptr (no reference count of a Python object per node), and the context goes in
// release_variables, right after the backward on the same thread. The node itself is often destroyed on the device
// thread once the caller's thread holds the GIL again; a destructor that took the GIL there would wait for it.
//
// A native backward (NativeBackward: Gradients' `native`, for ops whose backward is one backward op's call on the
// output gradients and saved tensors) never takes the GIL once known: the first backward of a call signature runs in
// Python and shows which kept plan (a _runtime.LaunchPlan that replays without Python) the backward op's call took;
// later backwards of that signature replay it here, through _runtime's `_native_replay` capsule, on torch handles,
// and the node's Python references go to the op's next call on the caller's thread (OpBackward::dropLater).
// Measured on an H100 host (benchmarks/autograd_gil_probe.py): a backward taking the GIL costs 4-8% of softmax's
// forward + backward, calling Python 5-9% more, a Python autograd.Function 15-27%.

#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <pybind11/pybind11.h>

#include "native_backward.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
using flydsl_node::ArgFacts;
using flydsl_node::NativeBackward;
using flydsl_node::NativeReplayTable;
using flydsl_node::factsOf;
using flydsl_node::nativeBackward;

namespace {

// torch 2.13 made nodes intrusive_ptr (shared_ptr before): the pointer type an Edge holds.
using NodePtr = decltype(std::declval<Edge>().function);

py::object wrap(const at::Tensor &tensor) {
  if (!tensor.defined())
    return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

// What an op's backward keeps, declared (Gradients' `declared`: (saves, non_differentiable, values), _nodes.Saved).
struct Declared {
  std::vector<std::pair<bool, int>> saves;         // (an output?, its index among the outputs or the inputs)
  std::vector<int> fixed;                          // outputs that take no gradient
  std::vector<std::pair<std::string, int>> values; // ctx attributes: (name, the input that is its value)
};

std::unique_ptr<Declared> declaredSetup(const py::object &spec) {
  if (spec.is_none())
    return nullptr;
  py::tuple items = spec;
  if (items.size() != 3)
    throw std::invalid_argument("declared: expected (saves, non_differentiable, values)");
  auto declared = std::make_unique<Declared>();
  for (const py::handle &save : py::tuple(items[0])) {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(save);
    std::string kind = py::cast<std::string>(pair[0]);
    if (kind != "input" && kind != "output")
      throw std::invalid_argument("declared: a saved tensor is ('input', i) or ('output', j), got " + kind);
    declared->saves.emplace_back(kind == "output", py::cast<int>(pair[1]));
  }
  for (const py::handle &output : py::tuple(items[1]))
    declared->fixed.push_back(py::cast<int>(output));
  for (const py::handle &value : py::tuple(items[2])) {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(value);
    declared->values.emplace_back(py::cast<std::string>(pair[0]), py::cast<int>(pair[1]));
  }
  return declared;
}

// One op's backward(ctx, *grads) -> one gradient per input (a tuple) or the only one, its native backward and
// declared setup if it has them, and its context type; shared by the op's Gradients and its nodes, destroyed with the
// GIL by the last of them (normally the Gradients).
struct OpBackward {
  std::string opName;
  py::object function, contextType;
  std::unique_ptr<NativeBackward> native;
  std::unique_ptr<const Declared> declared;
  mutable std::mutex droppedMutex;
  mutable std::vector<PyObject *> dropped; // references released without the GIL, dropped by the next call's

  // Keeps a reference for drop() (any thread, no GIL).
  void dropLater(PyObject *object) const {
    std::lock_guard<std::mutex> lock(droppedMutex);
    dropped.push_back(object);
  }
  // Drops the references dropLater kept (with the GIL).
  void drop() const {
    std::vector<PyObject *> objects;
    {
      std::lock_guard<std::mutex> lock(droppedMutex);
      objects.swap(dropped);
    }
    for (PyObject *object : objects)
      Py_DECREF(object);
  }

  OpBackward(std::string name, py::object backward, py::object contextType, std::unique_ptr<NativeBackward> native,
             std::unique_ptr<const Declared> declared)
      : opName(std::move(name)), function(std::move(backward)), contextType(std::move(contextType)),
        native(std::move(native)), declared(std::move(declared)) {}
  ~OpBackward() {
    if (!Py_IsInitialized()) { // the interpreter is gone: its objects with it
      function.release();
      contextType.release();
      if (native) {
        native->learn.release();
        native->entries.clear();
      }
      return;
    }
    py::gil_scoped_acquire gil;
    function = py::object();
    contextType = py::object();
    drop();
    if (native) {
      native->clear();
      native->learn = py::object();
    }
  }
};

struct FlyBackward : Node {
  std::shared_ptr<const OpBackward> op;
  py::object context; // the op's ctx: what setup_context set on it, needs_input_grad (declared: made for a Python
                      // backward only); None once released
  py::object values;  // declared: the values of the ctx attributes (a tuple), None once released
  uint64_t needs = 0; // declared: needs_input_grad, a bit per input
  bool released = false;
  std::vector<SavedVariable> saved;
  std::vector<int> slots; // per output of the op: its gradient's index among the node's inputs, -1: none
  PyObject *forward = nullptr; // with a native backward by forward plan: the plan that made it (a reference)

  std::string name() const override { return "FlyBackward_" + op->opName; }

  variable_list apply(variable_list &&grads) override {
    if (released)
      throw std::runtime_error(torch::autograd::ERR_BACKWARD_TWICE);
    NativeBackward *native = op->native.get();
    std::vector<at::Tensor> nativeArgs;
    if (native) { // the backward op's kept plan, replayed here without the GIL where one is known
      std::vector<at::Tensor> unpacked;
      for (SavedVariable &variable : saved)
        unpacked.push_back(variable.unpack(getptr()));
      nativeArgs = native->arguments(grads, unpacked, slots);
      if (unusedOutputs(grads) && !at::GradMode::is_enabled() && c10::impl::TorchDispatchModeTLS::stack_len() == 0)
        if (std::optional<std::vector<at::Tensor>> outputs = native->replay(nativeArgs, forward))
          return gradientsOf(*outputs);
    }
    py::gil_scoped_acquire gil;
    variable_list gradients = pythonBackward(grads);
    if (native && unusedOutputs(grads) && !at::GradMode::is_enabled())
      native->remember(nativeArgs, forward, context);
    return gradients;
  }

  // Whether the outputs the native backward needs unused got no gradient.
  bool unusedOutputs(const variable_list &grads) const {
    for (int output : op->native->unused)
      if (output >= 0 && size_t(output) < slots.size() && slots[size_t(output)] >= 0 &&
          grads[size_t(slots[size_t(output)])].defined())
        return false;
    return true;
  }

  // The input gradients among the backward op's outputs (a native replay's).
  variable_list gradientsOf(const std::vector<at::Tensor> &outputs) {
    variable_list gradients(num_outputs());
    const std::vector<int> &outputOf = op->native->outputOf;
    for (size_t i = 0; i < gradients.size() && i < outputOf.size(); ++i)
      if (outputOf[i] >= 0 && size_t(outputOf[i]) < outputs.size() && should_compute_output(i))
        gradients[i] = outputs[size_t(outputOf[i])];
    return gradients;
  }

  // A declared op's context, for a backward in Python (with the GIL): needs_input_grad and the declared values.
  py::object makeContext() const {
    py::object made = op->contextType();
    py::tuple needed(num_outputs());
    for (size_t i = 0; i < num_outputs(); ++i)
      needed[i] = py::bool_((needs >> i) & 1);
    made.attr("needs_input_grad") = needed;
    const auto &declaredValues = op->declared->values;
    for (size_t k = 0; k < declaredValues.size(); ++k)
      made.attr(declaredValues[k].first.c_str()) = py::handle(PyTuple_GET_ITEM(values.ptr(), k));
    return made;
  }

  // The op's Python backward(ctx, *grads), with the GIL.
  variable_list pythonBackward(const variable_list &grads) {
    if (!context)
      context = makeContext();
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
  // just ran the backward, while the caller's thread still waits without the GIL; an op with a native backward
  // leaves it to the op's next call on the caller's thread (OpBackward::dropLater), so that this thread never
  // takes the GIL.
  void release_variables() override {
    for (SavedVariable &variable : saved)
      variable.reset_data();
    released = true;
    if (forward) // (only with a native backward)
      op->dropLater(std::exchange(forward, nullptr));
    if (!context && !values)
      return;
    if (op->native) {
      for (py::object *object : {&context, &values})
        if (*object)
          op->dropLater(object->release().ptr());
      return;
    }
    py::gil_scoped_acquire gil;
    context = values = py::object();
  }

  ~FlyBackward() override {
    if (forward)
      op->dropLater(forward);
    if (!context && !values) // released (or never set): nothing of Python's left to drop
      return;
    if (!Py_IsInitialized()) { // the interpreter is gone: its objects with it
      context.release();
      values.release();
      return;
    }
    py::gil_scoped_acquire gil; // a kept graph (retain_graph) or a backward that never ran
    context = values = py::object();
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
  py::object setup;
  bool single; // the op has one output: forward's tuple is unwrapped
  py::object planKey, plans, transforms; // `kept`: the op's kept runs, see applyKept

  py::object apply(const py::object &forward, const py::tuple &inputs) const;

  // apply() of the op's kept run for these inputs (plans[plan_key(inputs)]) in one call from Python; None where no
  // run is kept (or no `kept` was given) or a functorch transform is active (the caller takes its Python path).
  py::object applyKept(const py::tuple &inputs) const {
    if (!plans)
      return py::none();
    py::object active = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(transforms.ptr()));
    if (!active)
      throw py::error_already_set();
    if (PyObject_IsTrue(active.ptr()))
      return py::none();
    py::object key = py::reinterpret_steal<py::object>(PyObject_CallOneArg(planKey.ptr(), inputs.ptr()));
    if (!key)
      throw py::error_already_set();
    if (key.is_none())
      return py::none();
    PyObject *plan = PyDict_GetItemWithError(plans.ptr(), key.ptr()); // borrowed
    if (!plan) {
      if (PyErr_Occurred())
        throw py::error_already_set();
      return py::none();
    }
    return apply(py::reinterpret_borrow<py::object>(plan), inputs);
  }
  void clear() const {
    if (backward->native)
      backward->native->clear();
  }
  uint64_t nativeReplays() const { return backward->native ? backward->native->replays.load() : 0; }
};

// The node's saved tensors and non-differentiable outputs (to_save, non_differentiable) from the op's Python
// setup_context on a new context, which the node keeps.
std::pair<py::tuple, py::tuple> pythonSetup(const Gradients &gradients, FlyBackward &fly, const py::tuple &inputs,
                                            const py::object &result, const py::tuple &needs) {
  py::object context = gradients.backward->contextType();
  context.attr("needs_input_grad") = needs;
  gradients.setup(context, inputs, result);
  // The context type's class attributes default both to (): the instance's are read, then dropped (the node keeps
  // the saved tensors as SavedVariables, not the context).
  py::tuple toSave = context.attr("to_save");
  py::tuple fixed = context.attr("non_differentiable");
  if (toSave.size())
    context.attr("to_save") = py::tuple();
  if (fixed.size())
    context.attr("non_differentiable") = py::tuple();
  fly.context = std::move(context);
  return {toSave, fixed};
}

const at::Tensor *tensorOf(const py::handle &value, const std::string &opName) {
  if (value.is_none())
    return nullptr;
  if (!THPVariable_Check(value.ptr()))
    throw std::runtime_error("flydsl." + opName + ": a saved value is not a tensor or None");
  return &THPVariable_Unpack(value.ptr());
}

py::object Gradients::apply(const py::object &forward, const py::tuple &inputs) const {
  backward->drop(); // contexts that native backwards released on autograd's device thread
  PyObject *made;
  {
    at::AutoGradMode off(false); // as in torch.autograd.Function.forward: the forward records nothing
    made = PyObject_Call(forward.ptr(), inputs.ptr(), nullptr); // the outputs' tuple
  }
  if (!made)
    throw py::error_already_set();
  py::tuple outputs = py::reinterpret_steal<py::tuple>(made);
  py::object result = single ? py::object(outputs[0]) : py::object(outputs);
  if (!at::GradMode::is_enabled())
    return result;
  const size_t count = inputs.size();
  std::vector<Edge> edges(count);
  uint64_t needs = 0;
  for (size_t i = 0; i < count; ++i) {
    PyObject *input = PyTuple_GET_ITEM(inputs.ptr(), i);
    if (THPVariable_Check(input) && THPVariable_Unpack(input).requires_grad()) {
      if (i >= 64)
        throw std::runtime_error("flydsl." + backward->opName + ": a gradient of an input past the 64th");
      edges[i] = torch::autograd::impl::gradient_edge(THPVariable_Unpack(input));
      needs |= uint64_t(1) << i;
    }
  }
  if (!needs)
    return result;

  NodePtr node = makeNode<NodePtr>();
  auto *fly = static_cast<FlyBackward *>(node.get());
  fly->op = backward;
  fly->needs = needs;
  const Declared *declared = backward->declared.get();
  std::pair<py::tuple, py::tuple> python; // without a declaration: (to_save, non_differentiable) from Python
  if (declared) {
    if (!declared->values.empty()) {
      py::tuple values(declared->values.size());
      for (size_t k = 0; k < declared->values.size(); ++k)
        values[k] = inputs[size_t(declared->values[k].second)];
      fly->values = std::move(values);
    }
  } else {
    py::tuple needed(count);
    for (size_t i = 0; i < count; ++i)
      needed[i] = py::bool_((needs >> i) & 1);
    python = pythonSetup(*this, *fly, inputs, result, needed);
  }
  if (backward->native && backward->native->byForward) // kept until the node is released (OpBackward::dropLater)
    fly->forward = py::object(forward).release().ptr();
  node->set_next_edges(std::move(edges));
  fly->slots.assign(outputs.size(), -1);
  for (size_t i = 0; i < outputs.size(); ++i) {
    PyObject *output = outputs[i].ptr();
    bool fixed = declared ? std::find(declared->fixed.begin(), declared->fixed.end(), int(i)) != declared->fixed.end()
                          : contains(python.second, output);
    if (fixed || !THPVariable_Check(output))
      continue;
    const at::Tensor &tensor = THPVariable_Unpack(output);
    if (!tensor.defined() || !(tensor.is_floating_point() || tensor.is_complex()))
      continue;
    if (tensor.requires_grad())
      throw std::runtime_error("flydsl." + backward->opName + ": an output already records gradients");
    fly->slots[i] = static_cast<int>(node->num_inputs());
    torch::autograd::set_history(tensor, node);
  }
  if (declared) {
    fly->saved.reserve(declared->saves.size());
    for (const auto &[isOutput, index] : declared->saves) {
      const at::Tensor *tensor = tensorOf(isOutput ? outputs[size_t(index)] : inputs[size_t(index)], backward->opName);
      if (tensor)
        fly->saved.emplace_back(*tensor, isOutput);
      else
        fly->saved.emplace_back();
    }
    return result;
  }
  const py::tuple &toSave = python.first;
  fly->saved.reserve(toSave.size());
  for (const py::handle &value : toSave) {
    const at::Tensor *tensor = tensorOf(value, backward->opName);
    if (tensor)
      fly->saved.emplace_back(*tensor, contains(outputs, value.ptr()));
    else
      fly->saved.emplace_back();
  }
  return result;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "flydsl.torch's C++ autograd node (flydsl.torch._nodes)";
  py::class_<Gradients>(module, "Gradients")
      .def(py::init([](std::string name, py::object setup, py::object backward, py::object contextType,
                       bool single, py::object native, py::object declared, py::object kept) {
             Gradients made{std::make_shared<const OpBackward>(std::move(name), std::move(backward),
                                                               std::move(contextType), nativeBackward(native),
                                                               declaredSetup(declared)),
                            std::move(setup), single};
             if (!kept.is_none()) { // (plan_key, plans dict, transforms active?)
               py::tuple items = kept;
               if (items.size() != 3 || !PyDict_Check(items[1].ptr()))
                 throw std::invalid_argument("kept: expected (plan_key, a dict of plans, transforms_active)");
               made.planKey = items[0];
               made.plans = items[1];
               made.transforms = items[2];
             }
             return made;
           }),
           py::arg("name"), py::arg("setup"), py::arg("backward"), py::arg("context_type"), py::arg("single"),
           py::arg("native") = py::none(), py::arg("declared") = py::none(), py::arg("kept") = py::none())
      .def("apply", &Gradients::apply, py::arg("forward"), py::arg("inputs"))
      .def("apply_kept", &Gradients::applyKept, py::arg("inputs"),
           "apply() of the kept run of these inputs' signature, or None (none kept, or a functorch transform).")
      .def("clear", &Gradients::clear, "Forgets the plans the native backward keeps.")
      .def_property_readonly("native_replays", &Gradients::nativeReplays,
                             "How many backwards the node replayed without Python (tests, benchmarks).");
}

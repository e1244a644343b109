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

namespace {

// torch 2.13 made nodes intrusive_ptr (shared_ptr before): the pointer type an Edge holds.
using NodePtr = decltype(std::declval<Edge>().function);

py::object wrap(const at::Tensor &tensor) {
  if (!tensor.defined())
    return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

// flydsl._runtime's replays for C++ callers (its `_native_replay` capsule, version 1; NativeReplay.cpp says how).
struct NativeReplayTable {
  uint32_t version;
  void *(*planPointer)(PyObject *);
  int (*replay)(void *, void *const *, size_t, void **, size_t, char *, size_t);
};

// A tensor argument of a backward op as its plan key sees it (flydsl.kernels.plans.signature: dtype, shape,
// strides, device and address mod 16 of a plain CUDA tensor; undefined: None).
struct ArgFacts {
  bool defined = false;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::DeviceIndex device = -1;
  int64_t alignment = 0;
  std::vector<int64_t> sizes, strides;

  bool operator==(const ArgFacts &o) const {
    return defined == o.defined && dtype == o.dtype && device == o.device && alignment == o.alignment &&
           sizes == o.sizes && strides == o.strides;
  }
};

// Facts of a CUDA strided tensor or an undefined one; nullopt for anything else (the Python path takes it).
std::optional<ArgFacts> factsOf(const at::Tensor &t) {
  ArgFacts f;
  if (!t.defined())
    return f;
  if (!t.is_cuda() || t.layout() != c10::kStrided)
    return std::nullopt;
  f.defined = true;
  f.dtype = t.scalar_type();
  f.device = t.get_device();
  f.alignment = int64_t(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
  f.sizes.assign(t.sizes().begin(), t.sizes().end());
  f.strides.assign(t.strides().begin(), t.strides().end());
  return f;
}

// An op whose backward is one call of a kept plan of its backward op on the output gradients and saved tensors
// (Gradients' `native`): the node replays that plan itself, without Python and without the GIL, once a backward
// through Python has shown which plan a call signature takes. Up to kPlans signatures are kept.
struct NativeBackward {
  static constexpr size_t kPlans = 8, kMaxArgs = 16, kMaxMade = 8;
  enum class Kind { Grad, Saved, Context };
  struct Source {
    Kind kind;        // the gradient of the op's output `index`, the node's saved tensor `index`, or a value
    int index;        // the context's attribute `name` set (not a tensor: fixed by the forward's plan, see
    std::string name; // Entry::forward)
  };
  struct Entry {
    std::vector<ArgFacts> facts;
    PyObject *forward; // with context values: the forward plan that fixed them (a reference), else null
    void *plan;        // the LaunchPlan, kept alive by `keep`
    PyObject *keep;    // a reference (dropped with the GIL)
  };
  std::vector<Source> sources;
  std::vector<int> defined;  // arguments that must be defined tensors (else the Python backward runs)
  std::vector<int> unused;   // outputs of the op whose gradients must be None (else the Python backward runs)
  bool byForward = false;    // some argument is a context value: plans are kept per forward plan too
  std::vector<int> outputOf; // per op input: the backward op's output that is its gradient, -1: none
  py::object learn;          // learn(*args) -> the signature's LaunchPlan if it replays without Python, else None
  const NativeReplayTable *table = nullptr;
  std::mutex mutex;          // over entries: replays (no GIL) against learning and clearing (with the GIL)
  std::vector<Entry> entries;
  std::atomic<uint64_t> replays{0}; // backwards replayed here (tests, benchmarks)

  // The arguments of the backward op for these gradients and saved tensors.
  std::vector<at::Tensor> arguments(const variable_list &grads, const std::vector<at::Tensor> &saved,
                                    const std::vector<int> &slots) const {
    std::vector<at::Tensor> args;
    args.reserve(sources.size());
    for (const Source &source : sources) {
      if (source.kind == Kind::Grad)
        args.push_back(slots[source.index] < 0 ? at::Tensor() : grads[slots[source.index]]);
      else if (source.kind == Kind::Saved)
        args.push_back(saved[source.index]);
      else
        args.push_back(at::Tensor()); // (a value: no handle)
    }
    return args;
  }

  // The backward op's outputs from its kept plan, or nullopt where none is known for these arguments or the plan
  // declines (then the Python path runs). Called without the GIL.
  std::optional<std::vector<at::Tensor>> replay(std::vector<at::Tensor> &args, PyObject *forward) {
    if (args.size() > kMaxArgs)
      return std::nullopt;
    for (int index : defined)
      if (!args[size_t(index)].defined())
        return std::nullopt;
    std::vector<ArgFacts> facts;
    facts.reserve(args.size());
    for (const at::Tensor &arg : args) {
      std::optional<ArgFacts> f = factsOf(arg);
      if (!f)
        return std::nullopt;
      facts.push_back(std::move(*f));
    }
    void *handles[kMaxArgs], *made[kMaxMade] = {}; // (a replay fills the first of `made`, one per output)
    for (size_t i = 0; i < args.size(); ++i)
      handles[i] = args[i].defined() ? static_cast<void *>(&args[i]) : nullptr; // AtenTensorHandle: at::Tensor *
    char error[512] = "";
    int status = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (const Entry &entry : entries)
        if (entry.facts == facts && entry.forward == (byForward ? forward : nullptr)) {
          status = table->replay(entry.plan, handles, args.size(), made, kMaxMade, error, sizeof error);
          break;
        }
    }
    if (status < 0)
      throw std::runtime_error(std::string("flydsl: a backward's replay failed: ") + error);
    if (status == 0)
      return std::nullopt;
    replays.fetch_add(1, std::memory_order_relaxed);
    std::vector<at::Tensor> outputs;
    for (void *handle : made) { // handles made by aoti_torch_empty_strided (new at::Tensors): ours to delete
      if (!handle)
        break;
      auto *tensor = static_cast<at::Tensor *>(handle);
      outputs.push_back(std::move(*tensor));
      delete tensor;
    }
    return outputs;
  }

  // After a backward through Python (with the GIL): keeps the plan these arguments took, where it replays
  // without Python.
  void remember(const std::vector<at::Tensor> &args, PyObject *forward, const py::object &context) {
    if (byForward && !forward)
      return;
    forward = byForward ? forward : nullptr;
    std::vector<ArgFacts> facts;
    for (const at::Tensor &arg : args) {
      std::optional<ArgFacts> f = factsOf(arg);
      if (!f)
        return;
      facts.push_back(std::move(*f));
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (const Entry &entry : entries)
        if (entry.facts == facts && entry.forward == forward)
          return;
    }
    py::tuple values(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      if (sources[i].kind == Kind::Context)
        values[i] = context.attr(sources[i].name.c_str());
      else
        values[i] = args[i].defined() ? py::reinterpret_steal<py::object>(THPVariable_Wrap(args[i])) : py::none();
    py::object plan = learn(*values);
    void *pointer = plan.is_none() ? nullptr : table->planPointer(plan.ptr());
    if (!pointer)
      return;
    std::lock_guard<std::mutex> lock(mutex);
    if (entries.size() >= kPlans) {
      Py_DECREF(entries.front().keep);
      Py_XDECREF(entries.front().forward);
      entries.erase(entries.begin());
    }
    Py_XINCREF(forward);
    entries.push_back(Entry{std::move(facts), forward, pointer, plan.release().ptr()});
  }

  // Forgets the kept plans (flydsl.kernels.plans.clear_all), with the GIL.
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    for (Entry &entry : entries) {
      Py_DECREF(entry.keep);
      Py_XDECREF(entry.forward);
    }
    entries.clear();
  }
};

// One op's backward(ctx, *grads) -> one gradient per input (a tuple) or the only one, and its native backward if
// it has one; shared by the op's Gradients and its nodes, destroyed with the GIL by the last of them (normally the
// Gradients).
struct OpBackward {
  std::string opName;
  py::object function;
  std::unique_ptr<NativeBackward> native;
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

  OpBackward(std::string name, py::object backward, std::unique_ptr<NativeBackward> native)
      : opName(std::move(name)), function(std::move(backward)), native(std::move(native)) {}
  ~OpBackward() {
    if (!Py_IsInitialized()) { // the interpreter is gone: its objects with it
      function.release();
      if (native) {
        native->learn.release();
        native->entries.clear();
      }
      return;
    }
    py::gil_scoped_acquire gil;
    function = py::object();
    drop();
    if (native) {
      native->clear();
      native->learn = py::object();
    }
  }
};

struct FlyBackward : Node {
  std::shared_ptr<const OpBackward> op;
  py::object context; // the op's ctx: what setup_context set on it, needs_input_grad; None once released
  std::vector<SavedVariable> saved;
  std::vector<int> slots; // per output of the op: its gradient's index among the node's inputs, -1: none
  PyObject *forward = nullptr; // with a native backward by forward plan: the plan that made it (a reference)

  std::string name() const override { return "FlyBackward_" + op->opName; }

  variable_list apply(variable_list &&grads) override {
    if (!context) // (the pointer read only: no reference counted, no GIL needed)
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

  // The op's Python backward(ctx, *grads), with the GIL.
  variable_list pythonBackward(const variable_list &grads) {
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
    if (forward) // (only with a native backward)
      op->dropLater(std::exchange(forward, nullptr));
    if (!context)
      return;
    if (op->native) {
      op->dropLater(context.release().ptr());
      return;
    }
    py::gil_scoped_acquire gil;
    context = py::object();
  }

  ~FlyBackward() override {
    if (forward)
      op->dropLater(forward);
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
  void clear() const {
    if (backward->native)
      backward->native->clear();
  }
  uint64_t nativeReplays() const { return backward->native ? backward->native->replays.load() : 0; }
};

// Gradients' `native`: (sources, outputs_of, defined, unused, learn, capsule), None: none (NativeBackward, _nodes.py).
std::unique_ptr<NativeBackward> nativeBackward(const py::object &spec) {
  if (spec.is_none())
    return nullptr;
  py::tuple items = spec;
  if (items.size() != 6)
    throw std::invalid_argument("native: expected (sources, outputs_of, defined, unused, learn, capsule)");
  auto native = std::make_unique<NativeBackward>();
  for (const py::handle &source : py::tuple(items[0])) {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(source);
    std::string kind = py::cast<std::string>(pair[0]);
    if (kind == "context") {
      native->sources.push_back({NativeBackward::Kind::Context, -1, py::cast<std::string>(pair[1])});
      native->byForward = true;
    } else if (kind == "grad" || kind == "saved") {
      auto which = kind == "grad" ? NativeBackward::Kind::Grad : NativeBackward::Kind::Saved;
      native->sources.push_back({which, py::cast<int>(pair[1]), ""});
    } else {
      throw std::invalid_argument("native: a source is ('grad', output), ('saved', index) or ('context', name), got " +
                                  kind);
    }
  }
  if (native->sources.size() > NativeBackward::kMaxArgs)
    throw std::invalid_argument("native: too many arguments");
  for (const py::handle &index : py::tuple(items[1]))
    native->outputOf.push_back(index.is_none() ? -1 : py::cast<int>(index));
  for (const py::handle &index : py::tuple(items[2])) {
    native->defined.push_back(py::cast<int>(index));
    if (native->defined.back() < 0 || size_t(native->defined.back()) >= native->sources.size())
      throw std::invalid_argument("native: a defined argument's index is out of range");
  }
  for (const py::handle &output : py::tuple(items[3]))
    native->unused.push_back(py::cast<int>(output));
  native->learn = items[4];
  const char *name = "flydsl._runtime.native_replay";
  auto *table = static_cast<const NativeReplayTable *>(PyCapsule_GetPointer(items[5].ptr(), name));
  if (!table)
    throw py::error_already_set();
  if (table->version != 1)
    throw std::invalid_argument("native: flydsl._runtime's replay table is of another version");
  native->table = table;
  return native;
}

py::object Gradients::apply(const py::object &forward, const py::tuple &inputs) const {
  backward->drop(); // contexts that native backwards released on autograd's device thread
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
  if (backward->native && backward->native->byForward) // kept until the node is released (OpBackward::dropLater)
    fly->forward = py::object(forward).release().ptr();
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
                       bool single, py::object native) {
             return Gradients{std::make_shared<const OpBackward>(std::move(name), std::move(backward),
                                                                 nativeBackward(native)),
                              std::move(setup), std::move(contextType), single};
           }),
           py::arg("name"), py::arg("setup"), py::arg("backward"), py::arg("context_type"), py::arg("single"),
           py::arg("native") = py::none())
      .def("apply", &Gradients::apply, py::arg("forward"), py::arg("inputs"))
      .def("clear", &Gradients::clear, "Forgets the plans the native backward keeps.")
      .def_property_readonly("native_replays", &Gradients::nativeReplays,
                             "How many backwards the node replayed without Python (tests, benchmarks).");
}

// The native backward of flydsl.torch's C++ autograd node (autograd_node.cpp, which includes this file once): an
// op's backward that is one call of a kept plan of its backward op, replayed without Python through
// flydsl._runtime's `_native_replay` capsule.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flydsl_node {
namespace { // (one translation unit includes this file: its types stay as hidden as pybind11's)

namespace py = pybind11;
using torch::autograd::variable_list;

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

} // namespace
} // namespace flydsl_node

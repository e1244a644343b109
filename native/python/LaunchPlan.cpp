//===- LaunchPlan.cpp - Call keys, launch recordings and replays ----------===//
//
// See LaunchPlan.h. A replay is only as right as the recording it came from,
// so LaunchRecording.plan refuses (returns the reason) whatever it cannot
// prove to be a function of the arguments alone: a pointer or a TMA
// descriptor's address that lands in no argument (scratch, a buffer the plan
// keeps) or in more than one (aliased arguments), an integer parameter
// holding an argument's address, a descriptor given as bytes, a launch on
// another stream than the arguments' current one. A replay encodes each TMA
// descriptor again for its argument's address (the last few kept). What the
// Python side must add (no torch operation ran beside the launches) is
// flydsl.kernels.plans's part. The plan's types: LaunchPlanSteps.h; as bytes:
// PlanBytes.cpp.
//
//===----------------------------------------------------------------------===//

#include "LaunchPlan.h"
#include "DescribeArgs.h"
#include "DispatchRegistry.h"
#include "LaunchArgs.h"
#include "LaunchPlanSteps.h"
#include "PlanKey.h"
#include "TorchCApi.h"

#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;
using fly::runtime::CUstream;
using fly::runtime::CUtensorMap;
using fly::runtime::Function;
using fly::runtime::TiledTensorMapSpec;

namespace fly::python {

namespace {

//===----------------------------------------------------------------------===//
// Recordings.
//===----------------------------------------------------------------------===//


struct Recording;
thread_local std::vector<Recording *> activeRecordings;


/// A launch from its parts (`cluster` null: none); `fn` null: the test hook's.
RecordedLaunch recordedLaunch(const Function *fn, std::string name, const unsigned grid[3],
                              const unsigned block[3], const unsigned *cluster, unsigned shared,
                              uint64_t stream, std::string signature) {
  RecordedLaunch l;
  if (fn)
    l.fn = *fn;
  l.name = std::move(name);
  std::copy(grid, grid + 3, l.grid);
  std::copy(block, block + 3, l.block);
  l.hasCluster = cluster != nullptr;
  if (cluster)
    std::copy(cluster, cluster + 3, l.cluster);
  l.shared = shared;
  l.stream = stream;
  l.signature = std::move(signature);
  l.slots.assign(l.signature.size(), 0);
  return l;
}

/// A test hook's launch: its parameters as bytes, 8 per signature code (a
/// tensor map's: its global address, from which a test map is made).
RecordedLaunch testLaunch(const std::string &name, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                          std::optional<std::array<unsigned, 3>> cluster, unsigned shared, uint64_t stream,
                          const std::string &signature, nb::bytes params) {
  if (params.size() != signature.size() * kSlotBytes)
    throw nb::value_error("params: expected 8 bytes per signature code");
  RecordedLaunch l = recordedLaunch(nullptr, name, grid.data(), block.data(), cluster ? cluster->data() : nullptr,
                                    shared, stream, signature);
  std::memcpy(l.slots.data(), params.c_str(), params.size());
  for (size_t i = 0; i < signature.size(); ++i)
    if (signature[i] == 'm') {
      TiledTensorMapSpec spec;
      spec.globalAddress = l.slots[i];
      l.maps.push_back({uint32_t(i), spec});
      l.slots[i] = 0;
    }
  return l;
}


/// The byte range of a tensor argument's elements.
struct ArgumentRange {
  uint32_t arg;
  uint64_t low, high; // [low, high); high == low for a tensor without elements
  PyObject *obj;      // borrowed from the arguments
};

bool argumentRange(uint32_t index, PyObject *obj, const TensorFacts &t, ArgumentRange &out) {
  nb::object size = nb::steal(callMethod0(obj, registry().elementSize));
  long long bytes;
  if (!size.is_valid() || !readLongLong(size.ptr(), bytes) || bytes <= 0)
    return decline();
  uint64_t span = 0;
  bool empty = false;
  for (size_t r = 0; r < t.rank; ++r) {
    empty |= t.extents[r] == 0;
    if (t.strides[r] < 0)
      return false;
    span += uint64_t(t.extents[r] - 1) * uint64_t(t.strides[r]);
  }
  out = {index, t.pointer, empty ? t.pointer : t.pointer + (span + 1) * uint64_t(bytes), obj};
  return true;
}

/// How many arguments the address lands in (0, 1, or 2 for "more than one"),
/// and the one in `target`. The same object as an argument and as a scratch
/// value (a scratch function returning a given output), or twice as a
/// scratch value, counts once (as the argument): a function of the call's
/// key returns it again. Two arguments count twice even when they are one
/// object (aliased now, maybe not later).
int landsIn(const std::vector<ArgumentRange> &ranges, uint64_t address, size_t nargs,
            const ArgumentRange *&target) {
  if (address == 0)
    return 0;
  const ArgumentRange *arg = nullptr, *extra = nullptr;
  int args = 0;
  for (const ArgumentRange &r : ranges) {
    if (!(address == r.low || (r.low <= address && address < r.high)))
      continue;
    if (r.arg < nargs) {
      ++args;
      arg = &r;
    } else if (!extra) {
      extra = &r;
    } else if (extra->obj != r.obj) { // one object returned twice by the scratch function counts once
      return 2;
    }
  }
  if (args > 1)
    return 2;
  if (arg && extra && extra->obj != arg->obj)
    return 2;
  target = arg ? arg : extra;
  return target ? 1 : 0;
}

struct Recording {
  std::vector<RecordedLaunch> launches;
  // Tensors inner replays made meanwhile, each with how (explicit shape and dtype): memory the plan may make.
  std::vector<std::pair<nb::object, MadeTensor>> made;

  ~Recording() { stop(); }

  void start() {
    if (std::find(activeRecordings.begin(), activeRecordings.end(), this) == activeRecordings.end())
      activeRecordings.push_back(this);
  }
  void stop() {
    activeRecordings.erase(std::remove(activeRecordings.begin(), activeRecordings.end(), this),
                           activeRecordings.end());
  }

  /// A LaunchPlan replaying the launches on `args` of the same key, or the
  /// reason why they cannot be replayed (a str).
  nb::object plan(nb::tuple args, nb::handle fallback, nb::handle scratch, std::optional<size_t> nargs,
                  nb::handle made) {
    std::string why;
    auto plan = std::make_unique<LaunchPlan>();
    plan->nargs = nargs.value_or(args.size());
    if (plan->nargs > args.size())
      throw nb::value_error("nargs: more than the arguments given");
    if (!made.is_none() && torchCApiOn())
      plan->made = madeTensors(made, plan->nargs, args.size() - plan->nargs);
    if (!build(args, *plan, why))
      return nb::str(why.c_str());
    plan->fallback = nb::borrow(fallback);
    plan->scratch = nb::borrow(scratch);
    return nb::cast(plan.release(), nb::rv_policy::take_ownership);
  }

  /// Test hook: a launch as if made (no function: a replay launches nothing).
  void add(const std::string &name, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
           std::optional<std::array<unsigned, 3>> cluster, unsigned shared, uint64_t stream,
           const std::string &signature, nb::bytes params) {
    launches.push_back(testLaunch(name, grid, block, cluster, shared, stream, signature, params));
  }

private:
  /// `made` (per scratch value: (like, shape or None, dtype or None[, name held per stream])) as MadeTensors;
  /// none where a dtype is not one torch's C API has learnt (the scratch function makes them then).
  static std::vector<MadeTensor> madeTensors(nb::handle made, size_t nargs, size_t count) {
    std::vector<MadeTensor> out;
    nb::tuple items = nb::tuple(nb::borrow(made));
    if (items.size() != count)
      throw nb::value_error("made: one (like, shape, dtype) per scratch value expected");
    for (nb::handle item : items) {
      nb::tuple spec = nb::cast<nb::tuple>(item);
      if (spec.size() != 3 && spec.size() != 4)
        throw nb::value_error("made: expected (like, shape or None, dtype or None[, a name or None])");
      MadeTensor m;
      if (spec.size() == 4 && !spec[3].is_none()) {
        if (!nb::isinstance<nb::str>(spec[3]) || !(m.held = nb::cast<std::string>(spec[3])).size())
          throw nb::value_error("made: the fourth item names memory held per stream (a str) or is None");
        if (spec[1].is_none() || spec[2].is_none())
          throw nb::value_error("made: memory held per stream needs its shape and dtype");
      }
      m.like = nb::cast<uint32_t>(spec[0]);
      if (m.like >= nargs)
        throw nb::value_error("made: like: an index of the caller's arguments expected");
      if (!spec[1].is_none()) {
        nb::tuple shape = nb::tuple(nb::borrow(spec[1]));
        if (shape.size() > kMaxRank)
          throw nb::value_error("made: shape: too many dims");
        m.rank = int32_t(shape.size());
        for (size_t i = 0; i < shape.size(); ++i)
          m.sizes[i] = nb::cast<int64_t>(shape[i]);
      }
      if (!spec[2].is_none() && (m.dtype = dtypeCodeOf(spec[2].ptr())) < 0)
        return {};
      out.push_back(m);
    }
    return out;
  }

  bool build(nb::tuple args, LaunchPlan &plan, std::string &why) {
    if (launches.empty())
      return why = "no launch was recorded", false;
    size_t arity = args.size();
    if (arity > kMaxLaunchValues)
      return why = "too many arguments", false;
    std::vector<ArgumentRange> ranges;
    for (size_t i = 0; i < arity; ++i) {
      PyObject *obj = PyTuple_GET_ITEM(args.ptr(), i);
      if (!isTensorType(Py_TYPE(obj)))
        continue;
      TensorFacts t;
      ArgumentRange range;
      if (!readTensor(obj, t) || !argumentRange(uint32_t(i), obj, t, range))
        return why = "argument " + std::to_string(i) + ": its tensor facts cannot be read", false;
      if (!plan.device.is_valid())
        plan.device = nb::int_(t.device);
      ranges.push_back(range);
    }
    if (!plan.device.is_valid())
      return why = "no torch tensor among the arguments", false;
    // What the inner replays' memory is made like: a caller's argument of the type they made (plain torch tensors;
    // torch's C API refuses subclasses), else the one the device was read from.
    uint32_t deviceArg = ranges.front().arg;
    for (const ArgumentRange &r : ranges)
      if (!made.empty() && r.arg < plan.nargs && Py_TYPE(r.obj) == Py_TYPE(made.front().first.ptr())) {
        deviceArg = r.arg;
        break;
      }
    // Memory inner replays made meanwhile is the plan's to make where its own scratch is made natively too (or
    // there is none): each such tensor a launch points into becomes a made value past the scratch.
    plan.returned = plan.made.size();
    if (plan.made.size() == arity - plan.nargs)
      for (size_t k = 0; k < made.size(); ++k) {
        TensorFacts t;
        ArgumentRange range;
        if (readTensor(made[k].first.ptr(), t) && argumentRange(uint32_t(arity + k), made[k].first.ptr(), t, range))
          ranges.push_back(range);
        else
          PyErr_Clear();
      }
    DispatchRegistry &reg = registry();
    if (!reg.streamGetter)
      return why = "no stream getter registered", false;
    uint64_t stream;
    if (!torchCurrentStream(nb::cast<long long>(plan.device), stream))
      return decline(), why = "the arguments' current stream cannot be read", false;
    std::vector<bool> pointerArg(arity + made.size(), false);
    for (const RecordedLaunch &l : launches) {
      PlanStep step{l, {}};
      std::string where = "launch of " + l.name + ", parameter ";
      if (l.stream != stream)
        return why = "launch of " + l.name + ": on another stream than the arguments' current one", false;
      if (l.slots.size() > kMaxLaunchValues)
        return why = "launch of " + l.name + ": more parameters than a replay packs", false;
      for (size_t j = 0; j < l.slots.size(); ++j) {
        char code = l.signature[j];
        uint64_t v = l.slots[j];
        if (code == 'm') {
          const RecordedLaunch::Map *map = nullptr;
          for (const RecordedLaunch::Map &m : l.maps)
            if (m.param == j)
              map = &m;
          if (!map || !map->spec)
            return why = where + std::to_string(j) + ": a TMA descriptor given as bytes (not encoded again)", false;
          if (step.mapPatches.size() >= kMaxTensorMaps)
            return why = where + std::to_string(j) + ": more TMA descriptors than a launch takes", false;
          uint64_t address = map->spec->globalAddress;
          const ArgumentRange *target = nullptr;
          int found = landsIn(ranges, address, plan.nargs, target);
          if (found != 1)
            return why = where + std::to_string(j) +
                         (found == 0 ? ": a TMA descriptor of memory no argument holds"
                                     : ": a TMA descriptor of memory in more than one argument"),
                   false;
          PlanStep::MapPatch patch;
          patch.slot = uint32_t(j);
          patch.arg = target->arg;
          patch.offset = address - target->low;
          patch.spec = *map->spec;
          step.mapPatches.push_back(patch);
          pointerArg[target->arg] = true;
          continue;
        }
        const ArgumentRange *target = nullptr;
        int found = landsIn(ranges, v, plan.nargs, target);
        if (code != 'p') {
          if (found != 0 && (code == 'l' || code == 'L'))
            return why = where + std::to_string(j) + ": an integer that holds an argument's address", false;
          continue;
        }
        if (v == 0)
          continue;
        if (found != 1)
          return why = where + std::to_string(j) +
                       (found == 0 ? ": a pointer into no argument (scratch or a buffer the plan keeps)"
                                   : ": a pointer into more than one argument (aliased arguments)"),
                 false;
        step.patches.push_back({uint32_t(j), target->arg, v - target->low});
        pointerArg[target->arg] = true;
      }
      plan.steps.push_back(std::move(step));
    }
    // The inner replays' tensors the launches use, renumbered after the scratch, made by the plan as they were.
    std::vector<uint32_t> position(made.size(), 0);
    size_t used = 0;
    for (size_t k = 0; k < made.size(); ++k)
      if (pointerArg[arity + k]) {
        position[k] = uint32_t(arity + used++);
        MadeTensor m = made[k].second;
        m.like = deviceArg;
        plan.made.push_back(m);
      }
    auto renumber = [&](uint32_t &arg) {
      if (arg >= arity)
        arg = position[arg - arity];
    };
    for (PlanStep &step : plan.steps) {
      for (PlanStep::Patch &q : step.patches)
        renumber(q.arg);
      for (PlanStep::MapPatch &q : step.mapPatches)
        renumber(q.arg);
    }
    plan.arity = arity + used;
    plan.alignment.assign(plan.arity, 0);
    for (ArgumentRange r : ranges) {
      if (r.arg >= arity && !pointerArg[r.arg])
        continue;
      renumber(r.arg);
      plan.alignment[r.arg] = uint8_t(r.low & 15);
    }
    for (size_t i = 0; i < arity; ++i)
      if (pointerArg[i])
        plan.pointerArgs.push_back(uint32_t(i));
    for (size_t i = arity; i < plan.arity; ++i)
      plan.pointerArgs.push_back(uint32_t(i));
    return true;
  }
};

} // namespace

/// A buffer held per device and stream (MadeTensor::held, memory.held).
struct HeldBuffer {
  int64_t device;
  uint64_t stream;
  std::string name;
  nb::object dtype; // a torch.dtype
  int64_t elements;
  nb::object tensor;
};
/// The held buffers: few (a name per kind of scratch, per device and stream); never destroyed (their tensors
/// would be released after the interpreter is gone), emptied by release_held.
std::vector<HeldBuffer> &heldBuffers() {
  static auto *buffers = new std::vector<HeldBuffer>();
  return *buffers;
}

PyObject *heldBuffer(PyObject *like, const std::string &name, PyObject *dtype, int64_t elements, int64_t device,
                     uint64_t stream, bool viaPython) {
  HeldBuffer *slot = nullptr;
  for (HeldBuffer &b : heldBuffers())
    if (b.device == device && b.stream == stream && b.dtype.ptr() == dtype && b.name == name)
      slot = &b;
  if (slot && slot->elements >= elements)
    return slot->tensor.ptr();
  int64_t size = std::max<int64_t>(elements, slot ? slot->elements : 0);
  int32_t code = dtypeCodeOf(dtype);
  nb::object made = nb::steal(code < 0 ? nullptr : emptyFor(like, 1, &size, code));
  if (made.is_valid()) {
    if (!nb::steal(PyObject_CallMethod(made.ptr(), "zero_", nullptr)).is_valid())
      return nullptr; // (zero_ runs on the current stream: `stream`)
  } else if (PyErr_Occurred() || !viaPython) {
    return nullptr;
  } else { // torch's C API cannot make it (off, or a dtype it has not learnt): through Python
    nb::object newZeros = nb::steal(PyObject_GetAttrString(like, "new_zeros"));
    if (!newZeros.is_valid())
      return nullptr;
    nb::dict keywords;
    keywords["dtype"] = nb::borrow(dtype);
    made = nb::steal(PyObject_Call(newZeros.ptr(), nb::make_tuple(nb::make_tuple(size)).ptr(), keywords.ptr()));
    if (!made.is_valid())
      return nullptr;
  }
  if (!slot)
    slot = &heldBuffers().emplace_back(HeldBuffer{device, stream, name, nb::borrow(dtype), 0, nb::object()});
  slot->elements = size;
  slot->tensor = made;
  return made.ptr();
}

PyObject *heldTensor(PyObject *like, const MadeTensor &m, int64_t device, uint64_t stream) {
  PyObject *dtype = dtypeOfCode(m.dtype);
  if (!dtype)
    return nullptr;
  int64_t elements = 1;
  for (int32_t i = 0; i < m.rank; ++i)
    elements *= m.sizes[i];
  return heldBuffer(like, m.held, dtype, elements, device, stream, false);
}

void noteMade(PyObject *tensor, const MadeTensor &spec) {
  if (activeRecordings.empty())
    return;
  MadeTensor m = spec; // its shape and dtype explicit: the plan that adopts it sets `like` to one of its own
  if (!m.held.empty()) { // (a held buffer: its name, shape and dtype as asked)
    for (Recording *recording : activeRecordings)
      recording->made.emplace_back(nb::borrow(tensor), m);
    return;
  }
  TensorFacts t;
  if (!readTensor(tensor, t) || (m.dtype = dtypeCodeOf(t.dtype)) < 0) {
    PyErr_Clear(); // not noted: a plan recorded around it declines, as for any memory it cannot make
    return;
  }
  m.rank = int32_t(t.rank);
  for (size_t r = 0; r < t.rank; ++r)
    m.sizes[r] = t.extents[r];
  for (Recording *recording : activeRecordings)
    recording->made.emplace_back(nb::borrow(tensor), m);
}

void noteRecorded(RecordedLaunch &&l) {
  for (size_t i = 0; i + 1 < activeRecordings.size(); ++i)
    activeRecordings[i]->launches.push_back(l);
  activeRecordings.back()->launches.push_back(std::move(l));
}

bool recordingLaunches() { return !activeRecordings.empty(); }

void noteLaunch(const Function &fn, const unsigned grid[3], const unsigned block[3],
                const unsigned *cluster, unsigned sharedBytes, CUstream stream, const char *signature,
                size_t numParams, void *const *params, const PyTensorMap *const *tensorMaps) {
  if (activeRecordings.empty())
    return;
  RecordedLaunch l = recordedLaunch(&fn, fn.name(), grid, block, cluster, sharedBytes,
                                    uint64_t(reinterpret_cast<uintptr_t>(stream)),
                                    std::string(signature, numParams));
  for (size_t i = 0; i < numParams; ++i) {
    if (signature[i] != 'm') { // every other kind sits in an 8-byte slot
      std::memcpy(&l.slots[i], params[i], sizeof(uint64_t));
      continue;
    }
    const PyTensorMap *map = tensorMaps ? tensorMaps[i] : nullptr;
    l.maps.push_back({uint32_t(i), map ? map->spec : std::nullopt});
  }
  noteRecorded(std::move(l));
}

void noteDispatchedLaunch(const Function &fn, const unsigned grid[3], const unsigned block[3],
                          const unsigned *cluster, unsigned sharedBytes, CUstream stream,
                          const char *signature, size_t numParams, void *const *params,
                          const LaunchValue *values) {
  if (activeRecordings.empty())
    return;
  const PyTensorMap *tensorMaps[kMaxLaunchValues] = {};
  for (size_t i = 0; i < numParams && i < kMaxLaunchValues; ++i)
    if (signature[i] == 'm')
      tensorMaps[i] = nb::inst_ptr<PyTensorMap>(values[i].o);
  noteLaunch(fn, grid, block, cluster, sharedBytes, stream, signature, numParams, params, tensorMaps);
}

void bindLaunchPlans(nb::module_ &rt) {
  rt.def("plan_key", &planKey, "args"_a,
         "The plan key of a call's arguments (bytes), or None where one cannot be keyed: per torch "
         "tensor its type, dtype, shape, strides, address mod 16 and device; None, bools, ints, "
         "floats (their bits), strs, lists and tuples of ints by value; torch dtypes by identity.");
  rt.def("portable_plan_key", &portablePlanKey, "key"_a,
         "plan_key's bytes as text that another process builds alike for the same call (types and dtypes by name "
         "instead of address), or None where the key holds something the text cannot name.");
  bindKeptPlan(rt);
  rt.def("_register_key_type_learner", [](nb::handle learner) {
    auto &reg = registry();
    Py_XINCREF(learner.ptr());
    Py_XDECREF(reg.keyTypeLearner);
    reg.keyTypeLearner = learner.is_none() ? nullptr : learner.ptr();
  }, "learner"_a.none(), "plan_key: learner(value) -> whether value's type is now registered.");
  rt.def("_register_key_type", [](nb::handle type) {
    if (!PyType_Check(type.ptr()))
      throw nb::type_error("expected a type");
    auto &types = registry().keyTypes;
    auto *t = reinterpret_cast<PyTypeObject *>(type.ptr());
    if (std::find(types.begin(), types.end(), t) == types.end()) {
      Py_INCREF(t);
      types.push_back(t);
    }
  }, "type"_a, "plan_key: instances of this type are keyed by identity (torch.dtype).");

  nb::class_<LaunchPlan> plans(rt, "LaunchPlan",
                               "Recorded launches replayed on new arguments of the same plan key: each "
                               "pointer parameter is the argument it pointed into (at the same offset), "
                               "the stream the device's current one; arguments aligned otherwise than "
                               "when recorded go to the fallback.");
  plans.def("__call__", &LaunchPlan::call)
      .def("_dry_run", &LaunchPlan::dryRun,
           "Test hook: per launch, what a call passes to the driver ('fallback' where the fallback would run).")
      .def("__len__", [](const LaunchPlan &p) { return p.steps.size(); })
      .def("__repr__", [](const LaunchPlan &p) {
        std::string names;
        for (const PlanStep &s : p.steps)
          names += (names.empty() ? "" : ", ") + s.launch.name;
        return "<LaunchPlan of " + std::to_string(p.arity) + " arguments: " + names + ">";
      });
  bindPlanBytes(plans);
  bindNativeReplay(rt, plans);

  nb::class_<Recording>(rt, "LaunchRecording",
                        "Within `with`, notes every launch this thread makes; plan(args) replays them.")
      .def(nb::init<>())
      .def("__enter__", [](Recording &r) -> Recording & { r.start(); return r; }, nb::rv_policy::reference)
      .def("__exit__", [](Recording &r, nb::args) { r.stop(); })
      .def("__len__", [](const Recording &r) { return r.launches.size(); })
      .def("plan", &Recording::plan, "args"_a, "fallback"_a.none() = nb::none(), "scratch"_a.none() = nb::none(),
           "nargs"_a.none() = nb::none(), "made"_a.none() = nb::none(),
           "A LaunchPlan replaying the launches on arguments of args' plan key, or why not (a str); "
           "fallback(*args) runs instead of a replay whose arguments are aligned otherwise. With a scratch "
           "function, args are the caller's nargs arguments and then what scratch(*arguments) returned: a replay "
           "calls it again and returns its tuple. made: where the scratch values are only fresh tensors, per value "
           "(like, shape or None, dtype or None[, name]): a replay makes them through torch's C API "
           "(contiguous, on argument like's device, of its shape and dtype unless given; named, the buffer of that "
           "name held per device and stream for every plan, grown as needed, zero when made), the scratch "
           "function only where it cannot.")
      .def("_add", &Recording::add, "name"_a, "grid"_a, "block"_a, "cluster"_a.none(), "shared_mem"_a,
           "stream"_a, "signature"_a, "params"_a, "Test hook: notes a launch as if made.");
  rt.def(
      "held",
      [](nb::handle like, const std::string &name, int64_t elements, nb::handle dtype, int64_t device,
         uint64_t stream) -> nb::object {
        if (name.empty() || elements < 0)
          throw nb::value_error("held: a name and a count of elements (>= 0) expected");
        PyObject *t = heldBuffer(like.ptr(), name, dtype.ptr(), elements, device, stream, true);
        if (!t)
          raisePending();
        return nb::borrow(t);
      },
      "like"_a, "name"_a, "elements"_a, "dtype"_a, "device"_a, "stream"_a,
      "The buffer `name` of torch dtype `dtype` held for (device, stream): a 1-D tensor of at least `elements`, "
      "made like `like` (on its device), zero when made, grown (made again) where smaller; the same buffer a "
      "replay's made value of that name gets (memory.held).");
  rt.def(
      "held_buffers",
      []() {
        nb::list out;
        for (const HeldBuffer &b : heldBuffers())
          out.append(nb::make_tuple(b.name, b.device, b.stream, b.dtype, b.tensor));
        return out;
      },
      "The held buffers, as (name, device, stream, dtype, tensor).");
  rt.def(
      "release_held",
      []() {
        size_t count = heldBuffers().size();
        heldBuffers().clear();
        return count;
      },
      "Drops every held buffer (a later call makes its own again); returns how many were held.");
  rt.def("_note_launch", [](const std::string &name, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                            std::optional<std::array<unsigned, 3>> cluster, unsigned shared, uint64_t stream,
                            const std::string &signature, nb::bytes params) {
    if (!activeRecordings.empty())
      noteRecorded(testLaunch(name, grid, block, cluster, shared, stream, signature, params));
  }, "name"_a, "grid"_a, "block"_a, "cluster"_a.none(), "shared_mem"_a, "stream"_a, "signature"_a, "params"_a,
  "Test hook: notes a launch (8 bytes of params per signature code) in this thread's active recordings, as "
  "if made; a replay of it launches nothing (host-time measurements without a GPU).");
}

} // namespace fly::python

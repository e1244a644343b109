//===- LaunchPlan.cpp - Call keys, launch recordings and replays ----------===//
//
// See LaunchPlan.h. A replay is only as right as the recording it came from,
// so LaunchRecording.plan refuses (returns the reason) whatever it cannot
// prove to be a function of the arguments alone: a pointer or a TMA
// descriptor's address that lands in no argument (scratch, a buffer the plan
// keeps) or in more than one (aliased arguments), an integer parameter
// holding an argument's address, a descriptor given as bytes, a launch on
// another stream than the arguments' current one. A replay encodes each TMA
// descriptor again for its argument's address (the last few kept). What the Python side must add (no torch operation
// ran beside the launches) is flydsl.kernels.plans's part.
//
//===----------------------------------------------------------------------===//

#include "LaunchPlan.h"
#include "DescribeArgs.h"
#include "DispatchRegistry.h"
#include "LaunchArgs.h"
#include "PlanKey.h"

#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
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

struct RecordedLaunch {
  std::optional<Function> fn; // none: added by the test hook (dry runs only)
  std::string name;
  unsigned grid[3], block[3], cluster[3];
  bool hasCluster = false;
  unsigned shared = 0;
  uint64_t stream = 0;
  std::string signature;
  std::vector<uint64_t> slots; // one per parameter; a tensor map's is 0
  struct Map {
    uint32_t param;
    std::optional<TiledTensorMapSpec> spec; // none: TensorMap.from_bytes (cannot be encoded again)
  };
  std::vector<Map> maps; // the tensor map parameters
};

struct Recording;
thread_local std::vector<Recording *> activeRecordings;

void noteRecorded(RecordedLaunch &&l);

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

/// A launch's tensor maps as a replay passes them: 64-byte aligned.
struct alignas(64) MapSlots {
  unsigned char bytes[kMaxTensorMaps][kTensorMapBytes];
};

struct PlanStep {
  RecordedLaunch launch;
  struct Patch {
    uint32_t slot, arg;
    uint64_t offset;
  };
  std::vector<Patch> patches;
  /// A tensor map encoded again for its argument's address; the last few
  /// addresses' maps kept (weights stay put, activations often alternate).
  struct MapPatch {
    uint32_t slot, arg;
    uint64_t offset;
    TiledTensorMapSpec spec;
    static constexpr size_t kKept = 4;
    mutable uint64_t addresses[kKept] = {};
    mutable CUtensorMap encoded[kKept];
    mutable size_t kept = 0, next = 0;

    const CUtensorMap &at(uint64_t address) const {
      for (size_t i = 0; i < kept; ++i)
        if (addresses[i] == address)
          return encoded[i];
      TiledTensorMapSpec moved = spec;
      moved.globalAddress = address;
      size_t i = next;
      encoded[i] = fly::runtime::encodeTiled(moved);
      addresses[i] = address;
      next = (next + 1) % kKept;
      kept = std::max(kept, i + 1);
      return encoded[i];
    }
  };
  std::vector<MapPatch> mapPatches;
};

/// Recorded launches replayed on new arguments of the same plan key.
class LaunchPlan {
public:
  size_t nargs = 0;   // the caller's arguments
  size_t arity = 0;   // and the scratch's after them
  nb::object scratch; // scratch(*args) -> the tuple of tensors the launches use beyond args (None: none)
  std::vector<uint32_t> pointerArgs; // the arguments whose data_ptr() a replay reads
  std::vector<uint8_t> alignment;    // per argument: its address mod 16 when recorded
  nb::object fallback;               // called instead where an address's alignment differs
  nb::object device;                 // the stream's device (a Python int)
  std::vector<PlanStep> steps;

  /// Launches the recorded steps on `args`; where an argument's address is
  /// aligned otherwise than when recorded (a fact the plan key holds for
  /// every argument it was given; outputs allocated per call are not keyed),
  /// calls the fallback (the Python plan) instead and returns its result.
  nb::object call(nb::args args) {
    uint64_t pointers[kMaxLaunchValues];
    nb::object extra;
    nb::tuple all = withScratch(args, extra);
    CUstream stream = prepare(all, pointers);
    if (!aligned(pointers)) {
      if (!fallback.is_valid() || fallback.is_none())
        raise(PyExc_ValueError, "LaunchPlan: an argument's address is aligned otherwise than when recorded");
      return fallback(*args);
    }
    for (const PlanStep &step : steps) {
      const RecordedLaunch &l = step.launch;
      uint64_t slots[kMaxLaunchValues];
      void *params[kMaxLaunchValues];
      MapSlots maps;
      // The test hook's steps (no function) run everything but the driver's part.
      fill(step, pointers, slots, params, maps, l.fn.has_value());
      if (l.fn)
        l.fn->launch(l.grid, l.block, params, l.shared, stream, l.hasCluster ? l.cluster : nullptr);
      if (!activeRecordings.empty()) {
        RecordedLaunch again = l;
        std::memcpy(again.slots.data(), slots, l.slots.size() * sizeof(uint64_t));
        for (size_t k = 0; k < step.mapPatches.size(); ++k) {
          const PlanStep::MapPatch &m = step.mapPatches[k];
          again.slots[m.slot] = 0;
          for (RecordedLaunch::Map &map : again.maps)
            if (map.param == m.slot && map.spec)
              map.spec->globalAddress = pointers[m.arg] + m.offset;
        }
        again.stream = uint64_t(reinterpret_cast<uintptr_t>(stream));
        noteRecorded(std::move(again));
      }
    }
    return extra.is_valid() ? extra : nb::none();
  }

  /// Test hook: per step, what `call` would pass to the driver.
  nb::object dryRun(nb::args args) {
    uint64_t pointers[kMaxLaunchValues];
    nb::object extra;
    nb::tuple all = withScratch(args, extra);
    CUstream stream = prepare(all, pointers);
    if (!aligned(pointers))
      return nb::str("fallback");
    nb::list out;
    for (const PlanStep &step : steps) {
      uint64_t slots[kMaxLaunchValues];
      void *params[kMaxLaunchValues];
      MapSlots maps;
      fill(step, pointers, slots, params, maps, false);
      const RecordedLaunch &l = step.launch;
      nb::dict d;
      d["name"] = l.name;
      d["grid"] = nb::make_tuple(l.grid[0], l.grid[1], l.grid[2]);
      d["block"] = nb::make_tuple(l.block[0], l.block[1], l.block[2]);
      d["cluster"] = l.hasCluster ? nb::object(nb::make_tuple(l.cluster[0], l.cluster[1], l.cluster[2]))
                                  : nb::none();
      d["shared_mem"] = l.shared;
      d["stream"] = uint64_t(reinterpret_cast<uintptr_t>(stream));
      d["params"] = nb::bytes(reinterpret_cast<const char *>(slots), l.slots.size() * kSlotBytes);
      nb::list addresses; // where each tensor map would point, in parameter order
      for (const PlanStep::MapPatch &m : step.mapPatches)
        addresses.append(pointers[m.arg] + m.offset);
      d["tensor_maps"] = addresses;
      out.append(d);
    }
    return out;
  }

private:
  /// The caller's arguments, then (with a scratch function) what it returns
  /// for them, kept in `extra`.
  nb::tuple withScratch(nb::args &args, nb::object &extra) const {
    if (size_t(args.size()) != nargs)
      raise(PyExc_TypeError, "LaunchPlan: expected %zu arguments, got %zd", nargs, args.size());
    if (!scratch.is_valid() || scratch.is_none())
      return nb::borrow<nb::tuple>(args);
    extra = scratch(*args);
    if (!PyTuple_Check(extra.ptr()) || size_t(PyTuple_GET_SIZE(extra.ptr())) != arity - nargs)
      raise(PyExc_TypeError, "LaunchPlan: the scratch function must return a tuple of %zu, got %R", arity - nargs,
            extra.ptr());
    PyObject *all = PySequence_Concat(args.ptr(), extra.ptr());
    if (!all)
      raisePending();
    return nb::steal<nb::tuple>(all);
  }

  bool aligned(const uint64_t *pointers) const {
    for (uint32_t i : pointerArgs)
      if ((pointers[i] & 15) != alignment[i])
        return false;
    return true;
  }

  /// The pointers of the arguments (indexed by position) and the current stream.
  CUstream prepare(const nb::tuple &args, uint64_t *pointers) const {
    DispatchRegistry &reg = registry();
    for (uint32_t i : pointerArgs) {
      nb::object p = nb::steal(callMethod0(PyTuple_GET_ITEM(args.ptr(), i), reg.dataPtr));
      if (!p.is_valid())
        raisePending();
      pointers[i] = PyLong_AsUnsignedLongLong(p.ptr());
      if (pointers[i] == (uint64_t)-1 && PyErr_Occurred())
        raisePending();
    }
    if (!reg.streamGetter)
      raise(PyExc_RuntimeError, "LaunchPlan: no stream getter registered");
    nb::object handle = nb::steal(PyObject_CallOneArg(reg.streamGetter, device.ptr()));
    if (!handle.is_valid())
      raisePending();
    unsigned long long h = PyLong_AsUnsignedLongLong(handle.ptr());
    if (h == (unsigned long long)-1 && PyErr_Occurred())
      raisePending();
    return reinterpret_cast<CUstream>(uintptr_t(h));
  }

  /// The step's parameters on these pointers; its tensor maps encoded for
  /// their arguments' addresses where `encode` (else left zero).
  static void fill(const PlanStep &step, const uint64_t *pointers, uint64_t *slots, void **params,
                   MapSlots &maps, bool encode) {
    const auto &recorded = step.launch.slots;
    std::memcpy(slots, recorded.data(), recorded.size() * sizeof(uint64_t));
    for (const PlanStep::Patch &p : step.patches)
      slots[p.slot] = pointers[p.arg] + p.offset;
    for (size_t i = 0; i < recorded.size(); ++i)
      params[i] = &slots[i];
    for (size_t k = 0; k < step.mapPatches.size(); ++k) {
      const PlanStep::MapPatch &m = step.mapPatches[k];
      if (encode)
        std::memcpy(maps.bytes[k], &m.at(pointers[m.arg] + m.offset), kTensorMapBytes);
      else
        std::memset(maps.bytes[k], 0, kTensorMapBytes);
      params[m.slot] = maps.bytes[k];
    }
  }
};

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
  nb::object plan(nb::tuple args, nb::handle fallback, nb::handle scratch, std::optional<size_t> nargs) {
    std::string why;
    auto plan = std::make_unique<LaunchPlan>();
    plan->nargs = nargs.value_or(args.size());
    if (plan->nargs > args.size())
      throw nb::value_error("nargs: more than the arguments given");
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
    DispatchRegistry &reg = registry();
    if (!reg.streamGetter)
      return why = "no stream getter registered", false;
    nb::object current = nb::steal(PyObject_CallOneArg(reg.streamGetter, plan.device.ptr()));
    if (!current.is_valid())
      return decline(), why = "the arguments' current stream cannot be read", false;
    uint64_t stream = PyLong_AsUnsignedLongLong(current.ptr());
    if (stream == (uint64_t)-1 && PyErr_Occurred())
      return decline(), why = "the arguments' current stream cannot be read", false;
    std::vector<bool> pointerArg(arity, false);
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
    plan.arity = arity;
    plan.alignment.assign(arity, 0);
    for (const ArgumentRange &r : ranges)
      plan.alignment[r.arg] = uint8_t(r.low & 15);
    for (size_t i = 0; i < arity; ++i)
      if (pointerArg[i])
        plan.pointerArgs.push_back(uint32_t(i));
    return true;
  }
};

} // namespace

namespace {
void noteRecorded(RecordedLaunch &&l) {
  for (size_t i = 0; i + 1 < activeRecordings.size(); ++i)
    activeRecordings[i]->launches.push_back(l);
  activeRecordings.back()->launches.push_back(std::move(l));
}
} // namespace

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

namespace {

//===----------------------------------------------------------------------===//
// A plan as bytes (flydsl.kernels.plans keeps replays on disk beside the
// kernels): everything but the kernels' functions, which the loader finds again
// by their modules' cache keys (LaunchPlan._functions names them).
//===----------------------------------------------------------------------===//

constexpr uint32_t kPlanMagic = 0x50594c46; // "FLYP"
constexpr uint32_t kPlanVersion = 1;
static_assert(std::is_trivially_copyable_v<TiledTensorMapSpec>, "tensor map specs travel as their bytes");

struct Writer {
  std::string out;
  template <typename T> void put(const T &v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char *>(&v), sizeof v);
  }
  void text(const std::string &t) {
    put(uint32_t(t.size()));
    out += t;
  }
  template <typename T> void list(const std::vector<T> &v) {
    put(uint32_t(v.size()));
    for (const T &x : v)
      put(x);
  }
};

struct Reader {
  const char *at, *end;
  template <typename T> T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    if (size_t(end - at) < sizeof(T))
      throw nb::value_error("LaunchPlan._from_bytes: the bytes end early");
    T v;
    std::memcpy(&v, at, sizeof v);
    at += sizeof v;
    return v;
  }
  uint32_t count(size_t most) {
    uint32_t n = get<uint32_t>();
    if (n > most)
      throw nb::value_error("LaunchPlan._from_bytes: a count past what a plan holds");
    return n;
  }
  std::string text() {
    uint32_t n = count(1u << 16);
    if (size_t(end - at) < n)
      throw nb::value_error("LaunchPlan._from_bytes: the bytes end early");
    std::string t(at, n);
    at += n;
    return t;
  }
  template <typename T> std::vector<T> list(size_t most) {
    std::vector<T> v(count(most));
    for (T &x : v)
      x = get<T>();
    return v;
  }
};

/// The plan's bytes; None where it has a scratch function (Python, run per call).
nb::object planBytes(const LaunchPlan &p) {
  if (p.scratch.is_valid() && !p.scratch.is_none())
    return nb::none();
  Writer w;
  w.put(kPlanMagic);
  w.put(kPlanVersion);
  w.put(uint32_t(p.nargs));
  w.put(int64_t(nb::cast<long long>(p.device)));
  w.list(p.pointerArgs);
  w.list(p.alignment);
  w.put(uint32_t(p.steps.size()));
  for (const PlanStep &step : p.steps) {
    const RecordedLaunch &l = step.launch;
    w.text(l.name);
    for (int i = 0; i < 3; ++i)
      w.put(l.grid[i]), w.put(l.block[i]), w.put(l.cluster[i]);
    w.put(uint8_t(l.hasCluster));
    w.put(l.shared);
    w.text(l.signature);
    w.list(l.slots);
    w.put(uint32_t(l.maps.size()));
    for (const RecordedLaunch::Map &m : l.maps) {
      w.put(m.param);
      w.put(uint8_t(m.spec.has_value()));
      w.put(m.spec.value_or(TiledTensorMapSpec{}));
    }
    w.put(uint32_t(step.patches.size()));
    for (const PlanStep::Patch &q : step.patches)
      w.put(q.slot), w.put(q.arg), w.put(q.offset);
    w.put(uint32_t(step.mapPatches.size()));
    for (const PlanStep::MapPatch &q : step.mapPatches)
      w.put(q.slot), w.put(q.arg), w.put(q.offset), w.put(q.spec);
  }
  return nb::bytes(w.out.data(), w.out.size());
}

/// A plan from planBytes' bytes, each step launching `functions[i]` (None: a
/// test hook's step, dry runs only), `fallback` for arguments aligned
/// otherwise than when recorded.
LaunchPlan *planFromBytes(nb::bytes data, std::vector<std::optional<Function>> functions, nb::handle fallback) {
  Reader r{data.c_str(), data.c_str() + data.size()};
  if (r.get<uint32_t>() != kPlanMagic || r.get<uint32_t>() != kPlanVersion)
    throw nb::value_error("LaunchPlan._from_bytes: not a plan of this version");
  auto plan = std::make_unique<LaunchPlan>();
  plan->nargs = plan->arity = r.count(kMaxLaunchValues);
  plan->device = nb::int_(r.get<int64_t>());
  plan->pointerArgs = r.list<uint32_t>(kMaxLaunchValues);
  plan->alignment = r.list<uint8_t>(kMaxLaunchValues);
  if (plan->alignment.size() != plan->arity)
    throw nb::value_error("LaunchPlan._from_bytes: an alignment per argument expected");
  for (uint32_t i : plan->pointerArgs)
    if (i >= plan->arity)
      throw nb::value_error("LaunchPlan._from_bytes: a pointer argument past the arguments");
  uint32_t steps = r.count(kMaxLaunchValues);
  if (steps != functions.size())
    throw nb::value_error("LaunchPlan._from_bytes: one function per step expected");
  for (uint32_t s = 0; s < steps; ++s) {
    PlanStep step;
    RecordedLaunch &l = step.launch;
    l.fn = functions[s];
    l.name = r.text();
    if (l.fn && l.fn->name() != l.name)
      throw nb::value_error("LaunchPlan._from_bytes: a step's function is not the kernel it recorded");
    for (int i = 0; i < 3; ++i)
      l.grid[i] = r.get<unsigned>(), l.block[i] = r.get<unsigned>(), l.cluster[i] = r.get<unsigned>();
    l.hasCluster = r.get<uint8_t>() != 0;
    l.shared = r.get<unsigned>();
    l.signature = r.text();
    l.slots = r.list<uint64_t>(kMaxLaunchValues);
    if (l.slots.size() != l.signature.size())
      throw nb::value_error("LaunchPlan._from_bytes: a slot per parameter expected");
    uint32_t maps = r.count(kMaxTensorMaps);
    for (uint32_t i = 0; i < maps; ++i) {
      RecordedLaunch::Map m;
      m.param = r.get<uint32_t>();
      bool has = r.get<uint8_t>() != 0;
      TiledTensorMapSpec spec = r.get<TiledTensorMapSpec>();
      if (has)
        m.spec = spec;
      l.maps.push_back(m);
    }
    uint32_t patches = r.count(kMaxLaunchValues);
    for (uint32_t i = 0; i < patches; ++i) {
      PlanStep::Patch q;
      q.slot = r.get<uint32_t>(), q.arg = r.get<uint32_t>(), q.offset = r.get<uint64_t>();
      if (q.slot >= l.slots.size() || q.arg >= plan->arity)
        throw nb::value_error("LaunchPlan._from_bytes: a patch past the parameters or arguments");
      step.patches.push_back(q);
    }
    uint32_t mapPatches = r.count(kMaxTensorMaps);
    for (uint32_t i = 0; i < mapPatches; ++i) {
      PlanStep::MapPatch q;
      q.slot = r.get<uint32_t>(), q.arg = r.get<uint32_t>(), q.offset = r.get<uint64_t>();
      q.spec = r.get<TiledTensorMapSpec>();
      if (q.slot >= l.slots.size() || q.arg >= plan->arity)
        throw nb::value_error("LaunchPlan._from_bytes: a tensor map past the parameters or arguments");
      step.mapPatches.push_back(q);
    }
    plan->steps.push_back(std::move(step));
  }
  if (r.at != r.end)
    throw nb::value_error("LaunchPlan._from_bytes: bytes past the plan");
  plan->fallback = nb::borrow(fallback);
  return plan.release();
}

/// Per step, the function it launches (None: a test hook's step).
nb::list planFunctions(const LaunchPlan &p) {
  nb::list out;
  for (const PlanStep &step : p.steps)
    out.append(step.launch.fn ? nb::cast(*step.launch.fn) : nb::none());
  return out;
}

} // namespace

void bindLaunchPlans(nb::module_ &rt) {
  rt.def("plan_key", &planKey, "args"_a,
         "The plan key of a call's arguments (bytes), or None where one cannot be keyed: per torch "
         "tensor its type, dtype, shape, strides, address mod 16 and device; None, bools, ints, "
         "floats (their bits), strs, lists and tuples of ints by value; torch dtypes by identity.");
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

  nb::class_<LaunchPlan>(rt, "LaunchPlan",
                         "Recorded launches replayed on new arguments of the same plan key: each "
                         "pointer parameter is the argument it pointed into (at the same offset), "
                         "the stream the device's current one; arguments aligned otherwise than "
                         "when recorded go to the fallback.")
      .def("__call__", &LaunchPlan::call)
      .def("_dry_run", &LaunchPlan::dryRun,
           "Test hook: per launch, what a call passes to the driver ('fallback' where the fallback would run).")
      .def("__len__", [](const LaunchPlan &p) { return p.steps.size(); })
      .def("_to_bytes", &planBytes, "The plan as bytes but its functions (None where it has a scratch function).")
      .def("_functions", &planFunctions, "Per step, the Function it launches (None: a test hook's step).")
      .def_static("_from_bytes", &planFromBytes, "data"_a, "functions"_a, "fallback"_a.none() = nb::none(),
                  nb::rv_policy::take_ownership,
                  "A plan from _to_bytes' bytes, step i launching functions[i] (None: dry runs only).")
      .def("__repr__", [](const LaunchPlan &p) {
        std::string names;
        for (const PlanStep &s : p.steps)
          names += (names.empty() ? "" : ", ") + s.launch.name;
        return "<LaunchPlan of " + std::to_string(p.arity) + " arguments: " + names + ">";
      });

  nb::class_<Recording>(rt, "LaunchRecording",
                        "Within `with`, notes every launch this thread makes; plan(args) replays them.")
      .def(nb::init<>())
      .def("__enter__", [](Recording &r) -> Recording & { r.start(); return r; }, nb::rv_policy::reference)
      .def("__exit__", [](Recording &r, nb::args) { r.stop(); })
      .def("__len__", [](const Recording &r) { return r.launches.size(); })
      .def("plan", &Recording::plan, "args"_a, "fallback"_a.none() = nb::none(), "scratch"_a.none() = nb::none(),
           "nargs"_a.none() = nb::none(),
           "A LaunchPlan replaying the launches on arguments of args' plan key, or why not (a str); "
           "fallback(*args) runs instead of a replay whose arguments are aligned otherwise. With a scratch "
           "function, args are the caller's nargs arguments and then what scratch(*arguments) returned: a replay "
           "calls it again and returns its tuple.")
      .def("_add", &Recording::add, "name"_a, "grid"_a, "block"_a, "cluster"_a.none(), "shared_mem"_a,
           "stream"_a, "signature"_a, "params"_a, "Test hook: notes a launch as if made.");
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

//===- LaunchPlanSteps.h - A launch plan's recorded steps ----*- C++ -*-===//
//
// The types of LaunchPlan.cpp that PlanBytes.cpp serializes too: a recorded
// launch, a plan's step (the launch and its patches) and the plan.
//
// Nanobind side only.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_LAUNCHPLANSTEPS_H
#define FLY_PYTHON_LAUNCHPLANSTEPS_H

#include "DescribeArgs.h"
#include "DispatchRegistry.h"
#include "LaunchArgs.h"
#include "LaunchPlan.h"
#include "TorchCApi.h"

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace fly::python {

namespace nb = nanobind;
using fly::runtime::CUstream;
using fly::runtime::CUtensorMap;
using fly::runtime::Function;
using fly::runtime::TiledTensorMapSpec;

/// One launch as a recording noted it.
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

/// Notes `l` in this thread's active recordings (LaunchPlan.cpp).
void noteRecorded(RecordedLaunch &&l);

/// A launch's tensor maps as a replay passes them: 64-byte aligned.
struct alignas(64) MapSlots {
  unsigned char bytes[kMaxTensorMaps][kTensorMapBytes];
};

/// A recorded launch, each pointer and tensor map of it as an argument and an offset.
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

/// A tensor a replay makes beyond the caller's arguments: contiguous, on
/// argument `like`'s device, of its shape (rank < 0) or `sizes`, of its dtype
/// (dtype < 0) or that dtype code (TorchCApi.h). Fresh per call (an output),
/// or, `held` naming it, memory held per device and stream (split K's
/// workspace and flags): one buffer of that name and dtype for every plan,
/// grown to the largest asked for, zero when made (the kernels of a stream
/// run one after another, and each leaves it as it found it).
struct MadeTensor {
  uint32_t like = 0;
  int32_t rank = -1;
  int64_t sizes[kMaxRank] = {};
  int32_t dtype = -1;
  std::string held;
};

/// The buffer `name` of `dtype` (a torch.dtype) held for `device` and
/// `stream`: a 1-D tensor of at least `elements` (borrowed), made like `like`
/// (on that device, zero) or grown where needed, through torch's C API or,
/// `viaPython`, through `like.new_zeros` where the C API cannot; null where it
/// cannot be made (an error set only where Python raised). One registry for
/// replays and the Python path (memory.held).
PyObject *heldBuffer(PyObject *like, const std::string &name, PyObject *dtype, int64_t elements, int64_t device,
                     uint64_t stream, bool viaPython);

/// The held buffer a replay's made value `m` names (heldBuffer, C API only).
PyObject *heldTensor(PyObject *like, const MadeTensor &m, int64_t device, uint64_t stream);

/// Notes a tensor a replay just made (`spec`: how) in this thread's active
/// recordings: a plan recorded around that replay may make it itself (so
/// that a plan over plans is replayed whole; LaunchPlan.cpp).
void noteMade(PyObject *tensor, const MadeTensor &spec);

/// Recorded launches replayed on new arguments of the same plan key.
class LaunchPlan {
public:
  size_t nargs = 0;   // the caller's arguments
  size_t arity = 0;   // and the scratch's after them
  nb::object scratch; // scratch(*args) -> the tuple of tensors the launches use beyond args (None: none)
  // Where the scratch is only fresh tensors: made natively through torch's C API (no Python per call), the
  // scratch function then only where the API cannot make them.
  std::vector<MadeTensor> made;
  // The scratch values a call returns: made's first ones. The others stand for memory that inner replays made
  // while the plan was recorded: made for the launches, not returned.
  size_t returned = 0;
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
    CUstream stream = currentStream();
    std::optional<nb::tuple> withMemory = withScratch(args, extra, stream);
    if (!withMemory) { // memory of inner replays that only the C API makes, which cannot make it here
      if (!fallback.is_valid() || fallback.is_none())
        raise(PyExc_RuntimeError, "LaunchPlan: the memory its inner replays made cannot be made here (torch's C "
                                  "API is off, or refuses the tensor it is made like)");
      return fallback(*args);
    }
    nb::tuple all = *withMemory;
    prepare(all, pointers);
    if (!aligned(pointers)) {
      if (!fallback.is_valid() || fallback.is_none())
        raise(PyExc_ValueError, "LaunchPlan: an argument's address is aligned otherwise than when recorded");
      return fallback(*args);
    }
    for (const PlanStep &step : steps) {
      const RecordedLaunch &l = step.launch;
      uint64_t slots[kMaxLaunchValues];
      launchStep(step, pointers, stream, slots);
      if (recordingLaunches()) {
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
    if (!extra.is_valid() || (returned == 0 && (!scratch.is_valid() || scratch.is_none())))
      return nb::none(); // (a plan without scratch of its own returns nothing, whatever it makes)
    if (returned == made.size() || made.empty())
      return extra;
    return nb::steal(PyTuple_GetSlice(extra.ptr(), 0, Py_ssize_t(returned)));
  }

  /// Whether replayHandles can replay the plan: no Python per call (no scratch function beyond the made
  /// tensors, no memory held per stream) and no tensor maps (whose encodings a step caches: Python's calls are
  /// serialized by the GIL, native ones are not).
  bool replaysWithoutPython() const {
    if (returned > made.size() || arity != nargs + made.size() ||
        (made.empty() && scratch.is_valid() && !scratch.is_none()))
      return false;
    for (const PlanStep &step : steps)
      if (!step.mapPatches.empty())
        return false;
    for (const MadeTensor &m : made)
      if (!m.held.empty() || m.like >= nargs)
        return false;
    return true;
  }

  /// `call` without Python, for a caller in C++ on any thread without the GIL (flydsl.torch's autograd node on
  /// autograd's device thread): the caller's `nargs` arguments as torch handles (AtenTensorHandle, an at::Tensor
  /// *; null for an argument that is not a tensor), checked by the caller against the plan's key; the tensors a
  /// call returns (made's first `returned`) as new handles (the caller's) in `madeOut` (`capacity` at least
  /// made.size()); the memory inner replays made is released once launched on (stream-ordered, as torch's
  /// temporaries). False, with nothing launched or kept, where
  /// it needs Python (replaysWithoutPython), the C API cannot read or make a tensor, an address is aligned
  /// otherwise than when recorded, or a recording is active on this thread: the caller takes the Python path.
  bool replayHandles(void *const *args, size_t n, void **madeOut, size_t capacity) const {
    if (n != nargs || capacity < made.size() || !replaysWithoutPython() || recordingLaunches())
      return false;
    uint64_t pointers[kMaxLaunchValues];
    long long device = -1, own;
    for (uint32_t i : pointerArgs)
      if (i < nargs) {
        if (!handleFacts(args[i], pointers[i], own))
          return false;
        device = device < 0 ? own : device;
      }
    uint64_t stream = 0;
    if (device < 0 || !currentStreamNative(device, stream))
      return false;
    size_t count = 0;
    auto drop = [&]() {
      for (size_t i = 0; i < count; ++i)
        deleteHandle(madeOut[i]);
      return false;
    };
    for (const MadeTensor &m : made) {
      void *t = emptyForHandle(args[m.like], m.rank, m.rank < 0 ? nullptr : m.sizes, m.dtype);
      if (!t)
        return drop();
      madeOut[count++] = t;
      if (!handleFacts(t, pointers[nargs + count - 1], own))
        return drop();
    }
    if (!aligned(pointers))
      return drop();
    try {
      for (const PlanStep &step : steps) {
        uint64_t slots[kMaxLaunchValues];
        launchStep(step, pointers, reinterpret_cast<CUstream>(uintptr_t(stream)), slots);
      }
    } catch (...) { // a launch failed: the made tensors are not the caller's
      drop();
      throw;
    }
    for (size_t i = returned; i < count; ++i) { // the inner replays' memory: the stream's allocations keep order
      deleteHandle(madeOut[i]);
      madeOut[i] = nullptr;
    }
    return true;
  }

  /// Test hook: per step, what `call` would pass to the driver.
  nb::object dryRun(nb::args args) {
    uint64_t pointers[kMaxLaunchValues];
    nb::object extra;
    CUstream stream = currentStream();
    std::optional<nb::tuple> withMemory = withScratch(args, extra, stream);
    if (!withMemory)
      return nb::str("fallback");
    nb::tuple all = *withMemory;
    prepare(all, pointers);
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
  /// for them, kept in `extra`; none where memory inner replays made cannot
  /// be made (torch's C API off, or refusing the tensor made like: the
  /// caller falls back to the Python plan).
  std::optional<nb::tuple> withScratch(nb::args &args, nb::object &extra, CUstream stream) {
    if (size_t(args.size()) != nargs)
      raise(PyExc_TypeError, "LaunchPlan: expected %zu arguments, got %zd", nargs, args.size());
    if (!made.empty())
      extra = makeTensors(args, uint64_t(reinterpret_cast<uintptr_t>(stream)));
    if (!extra.is_valid() && returned < made.size())
      return std::nullopt;
    if (!extra.is_valid()) { // no made tensors, or torch's C API cannot make them: the scratch function
      if (!scratch.is_valid() || scratch.is_none()) {
        if (!made.empty())
          raise(PyExc_RuntimeError, "LaunchPlan: its outputs can be made only through torch's C API, which is off");
        return nb::borrow<nb::tuple>(args);
      }
      extra = scratch(*args);
    }
    if (!PyTuple_Check(extra.ptr()) || size_t(PyTuple_GET_SIZE(extra.ptr())) != arity - nargs)
      raise(PyExc_TypeError, "LaunchPlan: the scratch function must return a tuple of %zu, got %R", arity - nargs,
            extra.ptr());
    PyObject *all = PySequence_Concat(args.ptr(), extra.ptr());
    if (!all)
      raisePending();
    return nb::steal<nb::tuple>(all);
  }

  /// The made tensors for `args` (a tuple) on `stream`, or an invalid object where the C API cannot make one.
  nb::object makeTensors(const nb::args &args, uint64_t stream) {
    nb::object out = nb::steal(PyTuple_New(Py_ssize_t(made.size())));
    for (size_t i = 0; i < made.size(); ++i) {
      const MadeTensor &m = made[i];
      PyObject *like = PyTuple_GET_ITEM(args.ptr(), m.like);
      PyObject *t = m.held.empty() ? emptyFor(like, m.rank, m.sizes, m.dtype)
                                   : heldTensor(like, m, PyLong_AsLongLong(device.ptr()), stream);
      if (!t) {
        if (PyErr_Occurred())
          raisePending();
        return nb::object();
      }
      PyTuple_SET_ITEM(out.ptr(), Py_ssize_t(i), m.held.empty() ? t : Py_NewRef(t));
      if (recordingLaunches())
        noteMade(t, m);
    }
    return out;
  }

  bool aligned(const uint64_t *pointers) const {
    for (uint32_t i : pointerArgs)
      if ((pointers[i] & 15) != alignment[i])
        return false;
    return true;
  }

  /// The pointers of the arguments (indexed by position).
  void prepare(const nb::tuple &args, uint64_t *pointers) const {
    DispatchRegistry &reg = registry();
    for (uint32_t i : pointerArgs) {
      PyObject *arg = PyTuple_GET_ITEM(args.ptr(), i);
      if (tensorDataPtrFast(arg, pointers[i]))
        continue;
      nb::object p = nb::steal(callMethod0(arg, reg.dataPtr));
      if (!p.is_valid())
        raisePending();
      pointers[i] = PyLong_AsUnsignedLongLong(p.ptr());
      if (pointers[i] == (uint64_t)-1 && PyErr_Occurred())
        raisePending();
    }
  }

  /// The current stream of the plan's device.
  CUstream currentStream() const {
    uint64_t stream;
    if (!torchCurrentStream(PyLong_AsLongLong(device.ptr()), stream)) {
      if (PyErr_Occurred())
        raisePending();
      raise(PyExc_RuntimeError, "LaunchPlan: no stream getter registered");
    }
    return reinterpret_cast<CUstream>(uintptr_t(stream));
  }

  /// Fills the step's parameters on these pointers (into `slots`) and launches it on `stream`; the test hook's
  /// steps (no function) run everything but the driver's part.
  static void launchStep(const PlanStep &step, const uint64_t *pointers, CUstream stream, uint64_t *slots) {
    const RecordedLaunch &l = step.launch;
    void *params[kMaxLaunchValues];
    MapSlots maps;
    fill(step, pointers, slots, params, maps, l.fn.has_value());
    if (l.fn)
      l.fn->launch(l.grid, l.block, params, l.shared, stream, l.hasCluster ? l.cluster : nullptr);
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

/// LaunchPlan's _to_bytes, _functions and _from_bytes (PlanBytes.cpp).
void bindPlanBytes(nanobind::class_<LaunchPlan> &plans);

/// LaunchPlan's replays_without_python and `_runtime._native_replay`, the capsule through which C++ in other
/// extensions replays a plan without the GIL (NativeReplay.cpp).
void bindNativeReplay(nanobind::module_ &rt, nanobind::class_<LaunchPlan> &plans);

} // namespace fly::python

#endif // FLY_PYTHON_LAUNCHPLANSTEPS_H

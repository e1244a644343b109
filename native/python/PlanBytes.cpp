//===- PlanBytes.cpp - A launch plan as bytes -----------------------------===//
//
// flydsl.kernels.plan_cache keeps replays on disk beside the kernels: a plan's
// bytes hold everything but its kernels' functions, which the loader finds
// again by their modules' cache keys (LaunchPlan._functions names them).
//
//===----------------------------------------------------------------------===//

#include "LaunchPlanSteps.h"
#include "TorchCApi.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <type_traits>

using namespace nanobind::literals;

namespace fly::python {

namespace {

constexpr uint32_t kPlanMagic = 0x50594c46; // "FLYP"
constexpr uint32_t kPlanVersion = 3; // 2: the made tensors; 3: memory held per stream, inner replays' memory
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

/// The plan's bytes; None where its scratch is a Python function's only (run per call, not made natively).
nb::object planBytes(const LaunchPlan &p) {
  if (p.scratch.is_valid() && !p.scratch.is_none() && p.made.empty())
    return nb::none();
  Writer w;
  w.put(kPlanMagic);
  w.put(kPlanVersion);
  w.put(uint32_t(p.nargs));
  w.put(uint32_t(p.made.size())); // the made tensors by dtype name: codes are torch's, names another build's too
  for (const MadeTensor &m : p.made) {
    w.put(m.like), w.put(m.rank), w.text(m.held);
    for (int32_t i = 0; i < m.rank; ++i)
      w.put(m.sizes[i]);
    PyObject *dtype = m.dtype < 0 ? nullptr : dtypeOfCode(m.dtype);
    nb::object name = dtype ? nb::steal(PyObject_Str(dtype)) : nb::object();
    if (dtype && (!name.is_valid() || !PyUnicode_Check(name.ptr())))
      raisePending();
    w.text(dtype ? std::string(PyUnicode_AsUTF8(name.ptr())) : std::string());
  }
  w.put(uint32_t(p.returned));
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
  uint32_t made = r.count(kMaxLaunchValues);
  for (uint32_t i = 0; i < made; ++i) {
    MadeTensor m;
    m.like = r.get<uint32_t>(), m.rank = r.get<int32_t>(), m.held = r.text();
    if (m.like >= plan->nargs || m.rank > int32_t(kMaxRank))
      throw nb::value_error("LaunchPlan._from_bytes: a made tensor past the arguments or dims");
    for (int32_t d = 0; d < m.rank; ++d)
      m.sizes[d] = r.get<int64_t>();
    std::string dtype = r.text();
    if (!dtype.empty() && (m.dtype = dtypeCodeNamed(dtype)) < 0)
      throw nb::value_error(
          ("LaunchPlan._from_bytes: a made tensor's dtype that torch's C API does not know: " + dtype).c_str());
    plan->made.push_back(m);
  }
  plan->returned = r.count(made);
  plan->arity += made;
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

void bindPlanBytes(nb::class_<LaunchPlan> &plans) {
  plans.def("_to_bytes", &planBytes, "The plan as bytes but its functions (None where it has a scratch function).")
      .def("_functions", &planFunctions, "Per step, the Function it launches (None: a test hook's step).")
      .def_static("_from_bytes", &planFromBytes, "data"_a, "functions"_a, "fallback"_a.none() = nb::none(),
                  nb::rv_policy::take_ownership,
                  "A plan from _to_bytes' bytes, step i launching functions[i] (None: dry runs only).");
}

} // namespace fly::python

//===- FlyModule.cpp - the flydsl.compiler._fly extension -----------------===//
//
// Python entry points of the native side: registering the Fly dialect and its
// passes on MLIR contexts (through the C API, so this file can use RTTI and
// exceptions) and the CUDA runtime (launcher, modules, device buffers).
//
//===----------------------------------------------------------------------===//

#include "fly-c/Dialects.h"
#include "runtime/RuntimeBindings.h"

#include "mlir/Bindings/Python/NanobindAdaptors.h"

namespace nb = nanobind;

NB_MODULE(_fly, m) {
  m.doc() = "FlyDSL native extension: the Fly MLIR dialect, its passes and the CUDA launcher.";
  // flydsl.compiler.runtime re-exports these functions and types as module globals, which Python
  // tears down in no particular order at exit; nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  m.def(
      "register_dialect",
      [](MlirContext context, bool load) {
        MlirDialectHandle handle = mlirGetDialectHandle__fly__();
        mlirDialectHandleRegisterDialect(handle, context);
        if (load)
          mlirDialectHandleLoadDialect(handle, context);
      },
      nb::arg("context").none() = nb::none(), nb::arg("load") = true,
      "Registers (and by default loads) the Fly dialect on an mlir.ir.Context "
      "(the current one when omitted).");

  m.def("register_passes", &flyRegisterPasses,
        "Registers the Fly passes (e.g. fly-lower-layouts) with MLIR's pass registry.");

  m.def("is_layout_type", &flyTypeIsALayout, nb::arg("type"));
  m.def(
      "layout_static_size",
      [](MlirType type) -> nb::object {
        if (!flyTypeIsALayout(type))
          throw nb::type_error("layout_static_size: expected a !fly.layout type");
        int64_t size = flyLayoutTypeGetStaticSize(type);
        if (size < 0)
          return nb::none();
        return nb::int_(size);
      },
      nb::arg("type"), "Size of a !fly.layout's domain, or None when a shape leaf is dynamic.");

  flyBindRuntime(m);
}

//===- FlyModule.cpp - the flydsl.compiler._fly extension -----------------===//
//
// Registering the Fly dialect and its passes on MLIR contexts (through the C
// API, so this file can use RTTI and exceptions). The CUDA launcher is the
// separate `_runtime` extension (RuntimeModule.cpp): a launch from the disk
// cache never loads MLIR.
//
//===----------------------------------------------------------------------===//

#include "fly-c/Dialects.h"

#include "mlir/Bindings/Python/NanobindAdaptors.h"

namespace nb = nanobind;

NB_MODULE(_fly, m) {
  m.doc() = "FlyDSL native extension: the Fly MLIR dialect and its passes.";
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
}

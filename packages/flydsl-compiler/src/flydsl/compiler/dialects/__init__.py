"""Python op builders for the Fly dialect, generated from its ODS by ``mlir-tblgen``.

``from flydsl.compiler.dialects import fly`` gives ``fly.MakeLayoutOp``, ``fly.SizeOp``, ``fly.Crd2IdxOp``...
The MLIR Python package finds them through the search prefix registered below.
"""

from mlir._mlir_libs import _mlir as _cext

_cext.globals.append_dialect_search_prefix(__name__)

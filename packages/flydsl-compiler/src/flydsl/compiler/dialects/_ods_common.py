"""The upstream helpers that ``mlir-tblgen``'s generated builders import from their own package."""

from mlir.dialects._ods_common import *  # noqa: F401,F403
from mlir.dialects._ods_common import _cext  # noqa: F401

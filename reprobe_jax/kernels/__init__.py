"""CPU kernels for the decode path that XLA:CPU does not have (docs/kernels.md): a small-M matmul over pre-packed
weights (`packed_matmul`) and the two attention products (`attention`); `build` compiles the C++ source at first
use and registers it with XLA's FFI.
"""

from reprobe_jax.kernels.packed_matmul import (
  MAX_ROWS,
  MIN_MODEL_BYTES,
  PANEL,
  available,
  pack,
  packed_matmul,
  reference_packed_matmul,
  status,
  unavailable_reason,
)

__all__ = [
  "MAX_ROWS",
  "MIN_MODEL_BYTES",
  "PANEL",
  "available",
  "pack",
  "packed_matmul",
  "reference_packed_matmul",
  "status",
  "unavailable_reason",
]

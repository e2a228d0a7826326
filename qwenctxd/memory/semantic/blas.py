"""numpy for the daemon's side of the semantic tier, with its BLAS on one thread.

The daemon's numpy work is matrix-vector products over a project's vectors — memory-bound, a
second BLAS thread adds nothing — and OpenBLAS's idle threads spin after each call: on the
2-core VM they took the core the event loop and the lexical tier's SQLite thread needed
(bench/recall_cost, 10 000 memories: warm recall p50 31 → 21 ms, the lexical tier inside it
8.8 → 5.3 ms). The thread count is read once, when the library loads, so it is set for that
import only and the environment is put back: the daemon's children (tools, shells) inherit
the user's. A thread count the user set stands. The embedding worker sets its own
(:mod:`~qwenctxd.memory.semantic.worker`).
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType

_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_lock = threading.Lock()


def numpy_module() -> ModuleType:
    """``numpy``, imported with one BLAS thread unless something imported it already."""
    found = sys.modules.get("numpy")
    if found is not None:
        return found
    with _lock:
        found = sys.modules.get("numpy")
        if found is not None:
            return found
        saved = {var: os.environ.get(var) for var in _VARS}
        for var in _VARS:
            os.environ.setdefault(var, "1")
        try:
            import numpy
        finally:
            for var, old in saved.items():
                if old is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = old
        return numpy

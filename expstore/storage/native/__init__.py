"""Native: the package's C kernels and their loaders (docs/architecture.md, "Native code").

``native`` is the batch read kernel (``_kernels.c``) and ``step_kernel`` the per-step write
kernel (``_step.c``); either is ``None`` where it was not built (no C compiler at install
time), and every caller then does the same work in numpy (slower, same results).
"""

from . import kernels
from .kernels import copy_into, copy_rows, native, same_bytes, unique_first

try:
    from . import _step as step_kernel
except ImportError:  # pragma: no cover - exercised where no compiler was available
    step_kernel = None



def read_kernel():  # noqa: ANN201 - the extension module, or None
    """The batch kernel module as it is now (``None`` where it was not built, or where a
    test switched it off by setting ``kernels.native``)."""
    return kernels.native


__all__ = ["copy_into", "copy_rows", "kernels", "native", "read_kernel", "same_bytes",
           "step_kernel", "unique_first"]

"""Native: the package's C kernels and their loaders (docs/architecture.md, "Storage rooms" and
"Where to add": which source a new C function goes in).

Two extensions, one per side: the read kernel (``_kernels.c``: batch decoding and reads,
a batch's lookups) is ``native`` / :func:`read_kernel`; the write kernel (``_step.c``: the
per-step ``StepPlan``; ``_write.c``: ``stage_lanes``, ``encode_rows``) is ``step_kernel`` /
:func:`write_kernel`. Either is ``None`` where it was not built (no C compiler at install
time), and every caller then does the same work in numpy (slower, same results).
"""

from . import kernels
from .kernels import (
    READ_DEPTH_ENV,
    apply_read_depth_env,
    copy_into,
    copy_rows,
    native,
    same_bytes,
    set_read_depth,
    unique_first,
)

step_kernel = kernels.write  # (the module: ``StepPlan``, ``RECORD``, ``addresses``)


def read_kernel():  # noqa: ANN201 - the extension module, or None
    """The read kernel module as it is now (``None`` where it was not built, or where a
    test switched it off by setting ``kernels.native``)."""
    return kernels.native


def write_kernel():  # noqa: ANN201 - the extension module, or None
    """The write kernel module as it is now (``None`` where it was not built, or where a
    test switched it off by setting ``kernels.write``)."""
    return kernels.write


__all__ = ["READ_DEPTH_ENV", "apply_read_depth_env", "copy_into", "copy_rows", "kernels",
           "native", "read_kernel", "same_bytes", "set_read_depth", "step_kernel",
           "unique_first", "write_kernel"]

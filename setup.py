"""Build hook for the optional C kernels; all other metadata lives in pyproject.toml.

``expstore.storage.native._kernels`` decodes whole batches of chunks without Python per row;
``expstore.storage.native._step`` stages one env step (every lane of a vector env) with one call;
``expstore.index._rows`` answers a sampler's questions of the row index for a whole batch.
All are optional: without a C compiler (or numpy's headers, for ``_step``) the install
still succeeds and the same work is done in Python (slower, same results).
"""

from setuptools import Extension, setup

ext_modules = [
    Extension(
        "expstore.storage.native._kernels",
        ["expstore/storage/native/_kernels.c"],
        depends=["expstore/storage/native/batch_lookup.h", "expstore/storage/native/shard_reads.h"],
        extra_compile_args=["-O3", "-std=c99"],
        optional=True,
    ),
    Extension(
        "expstore.index._rows",
        ["expstore/index/_rows.c"],
        extra_compile_args=["-O3", "-std=c99"],
        optional=True,
    ),
]
try:
    import numpy
except ImportError:  # no numpy at build time: the per-step path stays in Python
    numpy = None
if numpy is not None:
    ext_modules.append(
        Extension(
            "expstore.storage.native._step",
            ["expstore/storage/native/_step.c"],
            depends=["expstore/storage/native/step_values.h", "expstore/storage/native/step_shards.h"],
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)

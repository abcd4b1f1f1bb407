"""Build hook for the optional C kernels; all other metadata lives in pyproject.toml.

``expstore.storage.native._kernels`` (read side) decodes whole batches of chunks without
Python per row; ``expstore.storage.native._step`` (write side) stages one env step (every lane
of a vector env) with one call (``_step.c``) and encodes/stages batches of rows (``_write.c``);
``expstore.index._rows`` answers a sampler's questions of the row index for a whole batch.
Helpers shared by these sources are headers in ``expstore/_native/`` (``SHARED``).
All are optional: without a C compiler (or numpy's headers, for ``_step``) the install
still succeeds and the same work is done in Python (slower, same results).
"""

from setuptools import Extension, setup

#: the headers every C source may include (buffer helpers, crc32c)
SHARED = "expstore/_native"
SHARED_HEADERS = [f"{SHARED}/buffers.h", f"{SHARED}/crc32c.h"]
ext_modules = [
    Extension(
        "expstore.storage.native._kernels",
        ["expstore/storage/native/_kernels.c"],
        depends=["expstore/storage/native/batch_lookup.h", "expstore/storage/native/hot_gather.h",
                 "expstore/storage/native/shard_reads.h", "expstore/storage/native/shard_maps.h",
                 "expstore/storage/native/read_pool.h",
                 "expstore/storage/native/lz4_block.h", "expstore/storage/native/scalar_codes.h",
                 *SHARED_HEADERS],
        include_dirs=[SHARED],
        extra_compile_args=["-O3", "-std=c99"],
        optional=True,
    ),
    Extension(
        "expstore.index._rows",
        ["expstore/index/_rows.c"],
        depends=SHARED_HEADERS,
        include_dirs=[SHARED],
        extra_compile_args=["-O3", "-std=c99"],
        optional=True,
    ),
]
try:
    import numpy
except ImportError:  # no numpy at build time: the write path stays in Python
    numpy = None
if numpy is not None:
    ext_modules.append(
        Extension(
            "expstore.storage.native._step",
            ["expstore/storage/native/_step.c", "expstore/storage/native/_write.c"],
            depends=["expstore/storage/native/step_values.h",
                     "expstore/storage/native/step_shards.h",
                     "expstore/storage/native/write_kernels.h", *SHARED_HEADERS],
            include_dirs=[numpy.get_include(), SHARED],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)

"""Build hook for the optional C kernel; all other metadata lives in pyproject.toml.

``expstore.storage._kernels`` decodes whole batches of chunks without Python per row. It is
optional: without a C compiler the install still succeeds and the reader decodes through
numcodecs (slower, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "expstore.storage._kernels",
            ["expstore/storage/_kernels.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    ]
)

"""Build configuration beyond setup.cfg: one optional compiled helper.

``sharding_store/_loops.c`` is a plain shared library (no Python API) that
``sharding_store/_native.py`` loads with ctypes: it decodes a whole shard's chunks in one
call, so the GIL is released once per shard. It is optional: without a C compiler the
build goes on without it and reads take the per-chunk path (same bytes, slower on many
small chunks).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sharding_store._loops",
            sources=["sharding_store/_loops.c"],
            optional=True,  # no compiler: installed without it (see _native.loops)
        )
    ]
)

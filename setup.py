"""Build configuration beyond setup.cfg: one optional compiled helper.

``sharding_store/codec/_loops.c`` is a plain shared library (no Python API) that
``sharding_store/codec/_native.py`` loads with ctypes: it decodes a whole shard's chunks in one
call, so the GIL is released once per shard, and reads a local store's index tails of a
run of shards in one call (a virtual migration). It is optional: without a C compiler the
build goes on without it and reads take the per-chunk path (same bytes, slower on many
small chunks).

Being a plain library, it is built as one (``_loops.so``, ``_loops.dll`` on Windows: no
``cpython-311`` tag, no ``PyInit_`` export), and the wheel says what it holds: pure
(``py3-none-any``) when no library was built, ``py3-none-<platform>`` when one was (it
depends on the platform, not on the Python version or ABI), so that pip installs it on
every Python >= 3.11 of that platform.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 70.1 has its own; before, the ``wheel`` package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - depends on the build environment
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel building here (``setup.py build_ext --inplace`` still works)
        bdist_wheel = None

#: the compiled helpers that are plain shared libraries loaded with ctypes, not extension modules
PLAIN_LIBRARIES = {"sharding_store.codec._loops"}
#: their file suffix (what ``_native._loops_path`` looks for first)
LIBRARY_SUFFIX = ".dll" if sys.platform == "win32" else ".so"


class BuildPlainLibraries(build_ext):
    """``build_ext`` that names a plain library ``<name>.so`` (no interpreter tag) and
    exports what its source exports (no ``PyInit_<name>``)."""

    def get_ext_filename(self, fullname: str) -> str:
        # called with the full dotted name, and by distutils' get_ext_fullpath with the last part
        if fullname in PLAIN_LIBRARIES or fullname in {n.rsplit(".", 1)[-1] for n in PLAIN_LIBRARIES}:
            return os.path.join(*fullname.split(".")) + LIBRARY_SUFFIX
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if ext.name in PLAIN_LIBRARIES:
            return list(ext.export_symbols or [])
        return super().get_export_symbols(ext)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:
            # a failed (optional) build leaves no library of an earlier build behind, so
            # that the wheel holds, and is tagged for, what this build made
            stale = self.get_ext_fullpath(ext.name)
            if ext.name in PLAIN_LIBRARIES and os.path.isfile(stale):
                os.remove(stale)
            raise

    def built_libraries(self) -> list[str]:
        """The plain libraries this build produced (empty: no compiler, they were skipped)."""
        return [p for p in (self.get_ext_fullpath(n) for n in sorted(PLAIN_LIBRARIES)) if os.path.isfile(p)]


commands: dict[str, type] = {"build_ext": BuildPlainLibraries}

if bdist_wheel is not None:

    class WheelTaggedByContent(bdist_wheel):
        """A wheel tagged by what it holds: ``py3-none-any`` without a compiled library
        (the optional build failed or was skipped), ``py3-none-<platform>`` with one."""

        def run(self) -> None:
            if not self.skip_build:
                self.run_command("build")  # builds the library when it can (optional)
            self.root_is_pure = not self.get_finalized_command("build_ext").built_libraries()
            super().run()

        def get_tag(self) -> tuple[str, str, str]:
            if self.root_is_pure:
                return super().get_tag()
            return ("py3", "none", super().get_tag()[2])  # a plain library: no Python ABI in it

    commands["bdist_wheel"] = WheelTaggedByContent

setup(
    cmdclass=commands,
    ext_modules=[
        Extension(
            "sharding_store.codec._loops",
            sources=["sharding_store/codec/_loops.c"],
            optional=True,  # no compiler: installed without it (see _native.loops)
        )
    ],
)

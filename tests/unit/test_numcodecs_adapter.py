"""``sharding_store._numcodecs_adapter`` (issue 26, start-up): numcodecs imported without the
entry-point scan of every installed package, the scan run on the first look-up of a codec id
numcodecs does not register itself, so ``get_codec`` answers as it does when numcodecs is
imported the usual way (an entry-point codec is found, an unknown id is refused alike).

Each check runs in a fresh interpreter (numcodecs is imported once per process) with a
distribution on its path announcing a codec under ``numcodecs.codecs``, as a third-party
codec package does; ``importlib.metadata.entry_points`` is counted from before the import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_CODEC = '''
import numpy as np
from numcodecs.abc import Codec


class Fake(Codec):
    """Identity, announced through an entry point only."""

    codec_id = "fakecodec"

    def encode(self, buf):
        return np.ascontiguousarray(buf).tobytes()

    def decode(self, buf, out=None):
        data = bytes(buf)
        if out is not None:
            np.frombuffer(out, dtype="u1")[...] = np.frombuffer(data, dtype="u1")
            return out
        return data
'''


@pytest.fixture()
def codec_site(tmp_path: Path) -> Path:
    return write_codec_site(tmp_path / "site")


def write_codec_site(site: Path) -> Path:
    """A directory holding a distribution ``fakecodec`` whose entry point names ``Fake``."""
    dist = site / "fakecodec-1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "fakecodec_mod.py").write_text(FAKE_CODEC)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakecodec\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[numcodecs.codecs]\nfakecodec = fakecodec_mod:Fake\n")
    return site


#: the start of a child program: ``sys.argv[1]`` on the path, and every call of
#: ``importlib.metadata.entry_points`` recorded in ``calls`` (by the calling module's name)
ENTRY_POINTS_COUNTED = """
import importlib.metadata, json, sys
sys.path.insert(0, sys.argv[1])
calls = []
_real = importlib.metadata.entry_points
def counted(**params):
    calls.append(sys._getframe(1).f_globals.get("__name__"))
    return _real(**params)
importlib.metadata.entry_points = counted
"""
COUNTED = ENTRY_POINTS_COUNTED + """
def refusal(get):
    try:
        get()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
"""


def _run(code: str, site: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNTED + textwrap.dedent(code), str(site)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_load_defers_the_scan_and_resolves_codecs_as_numcodecs_does(codec_site):
    """After ``load``: no scan; numcodecs' own codecs need none; the entry-point codec is found
    (one scan); an unknown id is refused with numcodecs' own exception and message, the same
    as after a plain ``import numcodecs`` (the control, which scans at import)."""
    lazy = _run("""
        from sharding_store import _numcodecs_adapter
        numcodecs = _numcodecs_adapter.load()
        after_import = list(calls)
        restored = importlib.metadata.entry_points is counted
        zlib = type(numcodecs.get_codec({"id": "zlib", "level": 1})).__name__
        after_zlib = list(calls)
        fake = type(numcodecs.get_codec({"id": "fakecodec"})).__name__
        refused = refusal(lambda: numcodecs.get_codec({"id": "no-such-codec"}))
        print(json.dumps(dict(after_import=after_import, restored=restored, zlib=zlib, after_zlib=after_zlib,
                              fake=fake, calls=calls, refused=refused)))
    """, codec_site)
    assert lazy == {"after_import": [], "restored": True, "zlib": "Zlib", "after_zlib": [], "fake": "Fake",
                    "calls": ["numcodecs.registry"], "refused": lazy["refused"]}
    eager = _run("""
        import numcodecs
        fake = type(numcodecs.get_codec({"id": "fakecodec"})).__name__
        refused = refusal(lambda: numcodecs.get_codec({"id": "no-such-codec"}))
        print(json.dumps(dict(fake=fake, calls=calls, refused=refused)))
    """, codec_site)
    assert eager == {"fake": "Fake", "calls": ["numcodecs.registry"], "refused": lazy["refused"]}
    assert lazy["refused"] == "UnknownCodecError: codec not available: ''no-such-codec''"


def test_the_registry_entries_and_an_explicit_rescan_behave_as_before(codec_site):
    """Reading ``registry.entries`` (as a mapping: membership, keys, length) runs the scan once;
    ``run_entrypoints()`` called by a user scans again, as it always did; a later ``load`` (or
    ``import numcodecs``) is the same module, imported once."""
    seen = _run("""
        from sharding_store import _numcodecs_adapter
        numcodecs = _numcodecs_adapter.load()
        from numcodecs import registry
        before = list(calls)
        names = sorted(registry.entries)
        member = "fakecodec" in registry.entries and len(registry.entries) == len(names)
        once = list(calls)
        registry.run_entrypoints()
        twice = list(calls)
        again = _numcodecs_adapter.load() is numcodecs and sys.modules["numcodecs"] is numcodecs
        print(json.dumps(dict(before=before, fake="fakecodec" in names, member=member, once=len(once),
                              twice=len(twice), still="fakecodec" in registry.entries, again=again)))
    """, codec_site)
    assert seen == {"before": [], "fake": True, "member": True, "once": 1, "twice": 2, "still": True, "again": True}


def test_threads_looking_up_an_entry_point_codec_at_once_all_find_it(codec_site):
    """The deferred scan runs once under a lock: threads released together by a barrier, each
    asking for the entry-point codec first, all get it (none sees a half-filled registry)."""
    seen = _run("""
        import threading
        from sharding_store import _numcodecs_adapter
        numcodecs = _numcodecs_adapter.load()
        n = 8
        barrier, got = threading.Barrier(n), []
        def ask():
            barrier.wait()
            try:
                got.append(type(numcodecs.get_codec({"id": "fakecodec"})).__name__)
            except Exception as e:
                got.append(repr(e))
        threads = [threading.Thread(target=ask) for _ in range(n)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps(dict(got=sorted(got), scans=len(calls))))
    """, codec_site)
    assert seen == {"got": ["Fake"] * 8, "scans": 1}


def test_another_caller_of_entry_points_during_the_import_gets_the_real_answer(codec_site):
    """Only the registry's own import-time call is answered with no entry points: a module
    imported with numcodecs that asks ``entry_points`` itself (here: a hook on the first
    numcodecs submodule imported) gets every entry point."""
    seen = _run("""
        import importlib.abc
        found = []
        class Hook(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "numcodecs.zlib" and not found:
                    found.append([e.name for e in importlib.metadata.entry_points(group="numcodecs.codecs")])
                    found.append(list(importlib.metadata.entry_points().select(group="numcodecs.codecs").names))
                return None
        sys.meta_path.insert(0, Hook())
        from sharding_store import _numcodecs_adapter
        _numcodecs_adapter.load()
        print(json.dumps(dict(found=found)))
    """, codec_site)
    assert seen == {"found": [["fakecodec"], ["fakecodec"]]}

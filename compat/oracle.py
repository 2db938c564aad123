"""Project-side access to the zarr-python 2.18.7 test oracle.

Runs in the project venv; never imports zarr 2. Everything zarr-2 happens in a
subprocess running compat/.venv-legacy/bin/python on a script in compat/legacy/.

Main entry points (see compat/README.md):

    ensure_legacy_env() -> Path            # legacy python interpreter
    legacy_corpus() -> Path                # corpus dir (manifest.json, stores/, expected/)
    legacy_dump(store_dir) -> LegacyDump   # what 2.18 reads / its transformer exposes
    legacy_dump_many([dirs]) -> {dir: LegacyDump}   # one subprocess for many stores
    legacy_read_check(store_dir, {path: ndarray}) -> dict   # 2.18 reads values we expect?
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

COMPAT_DIR = Path(__file__).resolve().parent
LEGACY_SCRIPTS = COMPAT_DIR / "legacy"
SETUP_SCRIPT = COMPAT_DIR / "setup_legacy.sh"
LEGACY_VENV = Path(os.environ.get("LEGACY_VENV", COMPAT_DIR / ".venv-legacy"))
CORPUS_ROOT = COMPAT_DIR / ".corpus"

SETUP_TIMEOUT = 1200
CORPUS_TIMEOUT = 600
DUMP_TIMEOUT = 900


class LegacyError(RuntimeError):
    """The legacy environment could not be built, or a legacy script failed."""


# --------------------------------------------------------------------------- env


@contextlib.contextmanager
def _lock(name: str, root: Path | None = None) -> Iterator[None]:
    """Inter-process lock (pytest-xdist workers, parallel sessions), a file in ``root``
    (default: this corpus's directory)."""
    root = CORPUS_ROOT if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def legacy_python() -> Path:
    """Path of the legacy interpreter (may not exist yet: see ensure_legacy_env)."""
    return LEGACY_VENV / "bin" / "python"


_ENV_READY: Path | None = None


def ensure_legacy_env() -> Path:
    """Build compat/.venv-legacy if needed (bash setup_legacy.sh; a no-op when its
    stamp is present) and return the legacy python interpreter's path."""
    global _ENV_READY
    if _ENV_READY is not None:
        return _ENV_READY
    with _lock("setup"):
        env = dict(os.environ, LEGACY_VENV=str(LEGACY_VENV))
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(var, None)
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], env=env, capture_output=True,
                              text=True, timeout=SETUP_TIMEOUT)
    if proc.returncode != 0:
        raise LegacyError(f"setup_legacy.sh failed ({proc.returncode}):\n{proc.stdout}\n"
                          f"{proc.stderr}")
    _ENV_READY = legacy_python()
    return _ENV_READY


def _legacy_env_vars() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(var, None)
    env.update(ZARR_V3_EXPERIMENTAL_API="1", ZARR_V3_SHARDING="1", PYTHONNOUSERSITE="1",
               PYTHONWARNINGS="ignore::FutureWarning")
    return env


def run_legacy(script: str, *args: str | os.PathLike, timeout: float = DUMP_TIMEOUT,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run compat/legacy/<script> with the legacy interpreter."""
    py = ensure_legacy_env()
    cmd = [str(py), str(LEGACY_SCRIPTS / script), *map(str, args)]
    proc = subprocess.run(cmd, env=_legacy_env_vars(), capture_output=True, text=True,
                          timeout=timeout, cwd=str(COMPAT_DIR))
    if check and proc.returncode != 0:
        raise LegacyError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n"
                          f"{proc.stderr}")
    return proc


# --------------------------------------------------------------------------- corpus


def corpus_key() -> str:
    """Hash of everything that determines the corpus bytes: the generator script and
    the pinned legacy requirements (setup_legacy.sh)."""
    h = hashlib.sha256()
    for p in (LEGACY_SCRIPTS / "make_corpus.py", SETUP_SCRIPT):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def legacy_corpus() -> Path:
    """Generate the corpus once into compat/.corpus/<key>/ and return that directory.
    Reused while make_corpus.py and setup_legacy.sh are unchanged."""
    key = corpus_key()
    target = CORPUS_ROOT / key
    if (target / "manifest.json").is_file():
        return target
    ensure_legacy_env()
    with _lock("corpus"):
        if (target / "manifest.json").is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=CORPUS_ROOT))
        try:
            run_legacy("make_corpus.py", tmp, timeout=CORPUS_TIMEOUT)
            if not (tmp / "manifest.json").is_file():
                raise LegacyError("make_corpus.py wrote no manifest.json")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # drop corpora made by older generator versions
        for old in CORPUS_ROOT.iterdir():
            if old.is_dir() and old.name != key and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
    return target


def load_manifest(corpus: Path | None = None) -> dict:
    corpus = corpus or legacy_corpus()
    return json.loads((Path(corpus) / "manifest.json").read_text())


@dataclass
class CorpusArray:
    case: str
    store: Path          # absolute store directory
    path: str            # array path inside the store ("" = root array)
    entry: dict          # the manifest entry (shape, dtype, chunks, chunks_per_shard, ...)
    expected_file: Path

    @property
    def sharded(self) -> bool:
        return self.entry["chunks_per_shard"] is not None

    def expected(self) -> np.ndarray:
        return np.load(self.expected_file, allow_pickle=True)

    @property
    def id(self) -> str:
        return f"{self.case}:{self.path or '<root>'}"


def corpus_arrays(corpus: Path | None = None) -> list[CorpusArray]:
    """Every array of every (non-skipped) corpus case."""
    corpus = Path(corpus or legacy_corpus())
    m = load_manifest(corpus)
    return [CorpusArray(c["name"], corpus / c["store"], a["path"], a, corpus / a["expected"])
            for c in m["cases"] for a in c["arrays"]]


def corpus_stores(corpus: Path | None = None) -> dict[str, Path]:
    """case name -> absolute store directory."""
    corpus = Path(corpus or legacy_corpus())
    return {c["name"]: corpus / c["store"] for c in load_manifest(corpus)["cases"]}


# --------------------------------------------------------------------------- dumps


@dataclass
class LegacyDump:
    """What zarr-python 2.18 sees in one store (see README 'dump format').

    Keys of every mapping are array paths ("" for a root array). Chunk keys are full
    store keys as 2.18 forms them, e.g. "data/root/a/b/c1/0" or "data/root/c0".
    """

    store: Path
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    chunks: dict[str, dict[str, bytes]] = field(default_factory=dict)
    listing: dict[str, list[str]] = field(default_factory=dict)
    list_dir: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    raw_keys: dict[str, list[str]] = field(default_factory=dict)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def assert_ok(self) -> LegacyDump:
        if self.errors:
            msg = "\n".join(f"{p!r}: {e}" for p, e in self.errors.items())
            raise AssertionError(f"zarr 2.18 failed on {self.store}:\n{msg}")
        return self

    def sharded(self, path: str) -> bool:
        return bool(self.info[path].get("sharded"))

    def chunks_per_shard(self, path: str) -> list[int] | None:
        """The effective (padded) chunks_per_shard 2.18 uses, or None if unsharded."""
        return self.info[path].get("effective_chunks_per_shard")

    def data_prefix(self, path: str) -> str:
        return self.info[path]["data_key_prefix"]

    def relative_listing(self, path: str) -> list[str]:
        """Chunk keys with the array's data prefix removed, e.g. ["c0/0", "c1/0"]."""
        n = len(self.data_prefix(path))
        return [k[n:] for k in self.listing[path]]


def _load_dump(out: Path, store: Path) -> LegacyDump:
    raw = json.loads((out / "dump.json").read_text())
    d = LegacyDump(store=store, raw=raw, groups=raw.get("groups", {}))
    for p, a in raw["arrays"].items():
        if a.get("error"):
            d.errors[p] = a["error"]
        if "values" in a:
            d.arrays[p] = np.load(out / a["values"], allow_pickle=True)
        if "listing" in a:
            d.listing[p] = list(a["listing"])
            d.list_dir[p] = (list(a["list_dir"]["keys"]), list(a["list_dir"]["prefixes"]))
            d.raw_keys[p] = list(a["raw_keys"])
        if "chunk_index" in a:
            blob = (out / a["chunks_file"]).read_bytes()
            d.chunks[p] = {k: blob[o:o + n] for k, (o, n) in a["chunk_index"].items()}
        d.info[p] = {k: v for k, v in a.items()
                     if k not in ("chunk_index", "listing", "list_dir", "raw_keys")}
    return d


def _store_signature(store: Path) -> tuple:
    sig = []
    for root, dirs, files in os.walk(store):
        dirs.sort()
        for f in sorted(files):
            st = os.stat(os.path.join(root, f))
            sig.append((os.path.relpath(os.path.join(root, f), store), st.st_size,
                        st.st_mtime_ns))
    return tuple(sig)


_DUMP_CACHE: dict[tuple, LegacyDump] = {}


def legacy_dump_many(store_dirs: Iterable[str | os.PathLike], *, chunks: bool = True,
                     arrays: Iterable[str] | None = None, cache: bool = True
                     ) -> dict[Path, LegacyDump]:
    """Dump several stores with one legacy subprocess. Returns {resolved dir: dump}.

    Results are cached per (store contents signature, options): re-dumping an
    unchanged store is free; a store modified since is dumped again.
    """
    stores = [Path(s).resolve() for s in store_dirs]
    only = tuple(sorted(arrays)) if arrays is not None else None
    result: dict[Path, LegacyDump] = {}
    todo: list[tuple[Path, tuple]] = []
    for s in stores:
        if not (s / "zarr.json").is_file():
            raise FileNotFoundError(f"{s} is not a draft v3 store (no zarr.json)")
        key = (str(s), chunks, only, _store_signature(s))
        if cache and key in _DUMP_CACHE:
            result[s] = _DUMP_CACHE[key]
        else:
            todo.append((s, key))
    if todo:
        with tempfile.TemporaryDirectory(prefix="legacy-dump-") as tmp:
            args: list[str] = []
            outs = []
            for i, (s, _) in enumerate(todo):
                out = Path(tmp) / str(i)
                outs.append(out)
                args += [str(s), str(out)]
            if not chunks:
                args.append("--no-chunks")
            for p in only or ():
                args += ["--array", p]
            run_legacy("dump.py", *args)
            for (s, key), out in zip(todo, outs):
                d = _load_dump(out, s)
                if cache:
                    _DUMP_CACHE[key] = d
                result[s] = d
    return {s: result[s] for s in stores}


def legacy_dump(store_dir: str | os.PathLike, *, chunks: bool = True,
                arrays: Iterable[str] | None = None, cache: bool = True) -> LegacyDump:
    """Read a draft-era store with zarr 2.18 and return everything it sees.

    chunks=False skips the per-chunk byte dump (values and listings only);
    arrays=[...] restricts to some array paths. Never writes to store_dir.
    """
    return next(iter(legacy_dump_many([store_dir], chunks=chunks, arrays=arrays,
                                      cache=cache).values()))


# --------------------------------------------------------------------------- write checks


def legacy_read_check(store_dir: str | os.PathLike, expected: Mapping[str, np.ndarray]
                      ) -> dict[str, Any]:
    """Ask zarr 2.18 to read `store_dir` (e.g. one written by ShardingStore) and compare
    each array path with the expected values (exact dtype, shape, NaN-aware equality).

    Returns the report of legacy/write_check.py:
      {"ok": bool, "arrays": {path: {"ok": bool, "error"?: str, "mismatch"?: str, ...}}}
    """
    with tempfile.TemporaryDirectory(prefix="legacy-check-") as tmp:
        spec = {}
        for i, (p, v) in enumerate(expected.items()):
            v = np.asarray(v)
            f = Path(tmp) / f"{i}.npy"
            np.save(f, v, allow_pickle=(v.dtype == object))
            spec[p] = str(f)
        (Path(tmp) / "expected.json").write_text(json.dumps(spec))
        report = Path(tmp) / "report.json"
        run_legacy("write_check.py", Path(store_dir).resolve(), Path(tmp) / "expected.json",
                   report, check=False)
        if not report.is_file():
            raise LegacyError(f"write_check.py produced no report for {store_dir}")
        return json.loads(report.read_text())


def assert_legacy_reads(store_dir: str | os.PathLike, expected: Mapping[str, np.ndarray]
                        ) -> None:
    """assert that zarr 2.18 reads exactly `expected` from `store_dir`."""
    report = legacy_read_check(store_dir, expected)
    if not report["ok"]:
        bad = {p: r for p, r in report["arrays"].items() if not r["ok"]}
        raise AssertionError(f"zarr 2.18 disagrees on {store_dir}: "
                             f"{json.dumps(bad, indent=1)[:4000]}")


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality incl. dtype (byte order too) and shape; NaN == NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return all(x == y for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
    if a.dtype.fields is not None or a.dtype.kind == "V":
        return a.tobytes() == b.tobytes()
    if a.dtype.kind in "fcmM":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))

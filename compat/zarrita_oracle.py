"""Project-side access to the zarrita 0.2.x corpus (2023 intermediate v3 spelling).

Runs in the project venv; never imports zarrita. zarrita lives in compat/.venv-zarrita
(built by setup_zarrita.sh: one venv, each zarrita version in its own --target directory)
and is run only as a subprocess on the scripts in compat/zarrita/.

    ensure_zarrita_env() -> Path        # the venv's python (builds the venv if needed)
    zarrita_corpus(version) -> Path     # corpus dir: manifest.json, expected.npz, stores/
    corpus_arrays(corpus) -> [ZarritaArray]
    zarrita_read_check(store, {path: ndarray}, version) -> report  # does zarrita read it?
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compat import oracle

COMPAT_DIR = Path(__file__).resolve().parent
SCRIPTS = COMPAT_DIR / "zarrita"
SETUP_SCRIPT = COMPAT_DIR / "setup_zarrita.sh"
ZARRITA_VENV = Path(os.environ.get("ZARRITA_VENV", COMPAT_DIR / ".venv-zarrita"))
CORPUS_ROOT = COMPAT_DIR / ".corpus-zarrita"
#: the zarrita versions setup_zarrita.sh installs (read from it: one place for the fact)
VERSIONS: tuple[str, ...] = tuple(
    re.search(r'^VERSIONS=\(([^)]*)\)', SETUP_SCRIPT.read_text(), re.M).group(1).replace('"', "").split())
#: the stores make_corpus.py writes (a test checks the manifest against this list)
CASES = ("dtypes", "codecs", "sharded", "outer_codec", "index_start_empty", "nonfinite_fill",
         "shapes", "keys", "hierarchy", "implicit_root", "root_array", "final")
#: setup_zarrita.sh exits with this when no Python 3.11 is there to build the venv with
NO_PYTHON_EXIT = 3

SETUP_TIMEOUT = 900
RUN_TIMEOUT = 600


class ZarritaUnavailable(RuntimeError):
    """No Python 3.11 to build the zarrita venv with (tests skip, naming this)."""


class ZarritaError(RuntimeError):
    """The zarrita venv could not be built, or a zarrita script failed."""


def _lock(name: str) -> Any:
    """The oracle's inter-process lock, a file in this corpus's directory."""
    return oracle._lock(name, CORPUS_ROOT)


def _clean_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(var, None)
    env.update(PYTHONNOUSERSITE="1", **extra)
    return env


_READY: Path | None = None


def ensure_zarrita_env() -> Path:
    """Build compat/.venv-zarrita if needed (a no-op when its stamp is there); its python."""
    global _READY
    if _READY is not None:
        return _READY
    with _lock("setup"):
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], env=_clean_env(ZARRITA_VENV=str(ZARRITA_VENV)),
                              capture_output=True, text=True, timeout=SETUP_TIMEOUT)
    if proc.returncode == NO_PYTHON_EXIT:
        raise ZarritaUnavailable(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise ZarritaError(f"setup_zarrita.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    _READY = ZARRITA_VENV / "bin" / "python"
    return _READY


def run_zarrita(version: str, script: str, *args: str | os.PathLike, check: bool = True
                ) -> subprocess.CompletedProcess:
    """Run compat/zarrita/<script> with zarrita ``version`` importable."""
    py = ensure_zarrita_env()
    cmd = [str(py), str(SCRIPTS / script), *map(str, args)]
    proc = subprocess.run(cmd, env=_clean_env(PYTHONPATH=str(ZARRITA_VENV / f"zarrita-{version}")),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=str(COMPAT_DIR))
    if check and proc.returncode != 0:
        raise ZarritaError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def corpus_key() -> str:
    """Hash of what decides the corpus bytes: the generator and the pinned venv."""
    h = hashlib.sha256()
    for p in (SCRIPTS / "make_corpus.py", SETUP_SCRIPT):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def zarrita_corpus(version: str) -> Path:
    """Generate the corpus of one zarrita version once into .corpus-zarrita/<key>/<version>/."""
    if version not in VERSIONS:
        raise ValueError(f"zarrita {version} is not installed by setup_zarrita.sh ({VERSIONS})")
    key = corpus_key()
    target = CORPUS_ROOT / key / version
    if (target / "manifest.json").is_file():
        return target
    ensure_zarrita_env()
    with _lock("corpus"):
        if (target / "manifest.json").is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=target.parent))
        try:
            run_zarrita(version, "make_corpus.py", tmp / "out")
            os.replace(tmp / "out", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in CORPUS_ROOT.iterdir():  # corpora of older generator versions
            if old.is_dir() and old.name != key and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
    return target


def load_manifest(corpus: Path) -> dict:
    return json.loads((corpus / "manifest.json").read_text())


@dataclass
class ZarritaArray:
    version: str
    case: dict          # the manifest's case (generation, implicit_groups, prefinal, ...)
    store: Path
    entry: dict         # the manifest's array (path, key, codec_names, sharded, ...)
    corpus: Path

    @property
    def path(self) -> str:
        return self.entry["path"]

    @property
    def id(self) -> str:
        return f"{self.version}/{self.case['name']}:{self.path or '<root>'}"

    def expected(self) -> np.ndarray:
        with np.load(self.corpus / "expected.npz") as npz:
            return npz[self.entry["key"]]


def corpus_arrays(corpus: Path, case: str | None = None) -> list[ZarritaArray]:
    m = load_manifest(corpus)
    return [ZarritaArray(m["zarrita_version"], c, corpus / c["store"], a, corpus)
            for c in m["cases"] if case is None or c["name"] == case for a in c["arrays"]]


def zarrita_read_check(store: str | os.PathLike, expected: Mapping[str, np.ndarray], version: str
                       ) -> dict[str, Any]:
    """Ask zarrita ``version`` to read each array path of ``store`` and compare with
    ``expected``. Report: {"arrays": {path: {"ok": bool, "error"?: str}}}."""
    with tempfile.TemporaryDirectory(prefix="zarrita-check-") as tmp:
        np.savez(Path(tmp) / "expected.npz", **{f"a{i}": np.asarray(v) for i, v in enumerate(expected.values())})
        (Path(tmp) / "paths.json").write_text(json.dumps(list(expected)))
        report = Path(tmp) / "report.json"
        run_zarrita(version, "read_check.py", Path(store).resolve(), tmp, report)
        return json.loads(report.read_text())

"""The in-place upgrade never overwrites a concurrent writer's change (issue 25 item 2).

A real writer process waits until the upgrade has written its first document, then
appends a shard to one array (a new shard object and its ``zarr.json`` with a larger
shape, still 2023-spelled) and
edits the root's attributes, while ``migrate --in-place`` (a CLI subprocess) rewrites 300
documents. Whatever the interleaving, at the end both documents hold the writer's bytes
(nothing it wrote is lost), and a run that met the change exits 10 naming it, with its
journal kept. The attempts are bounded; at least one of them must meet the change. Local
directories and S3 (moto: ``If-Match`` puts). The store primitive itself
(:meth:`Inner.put_if_unchanged`) is checked on every backend, and locally against a writer
that replaces the document between the compare and the swap.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sharding_store.formats.upgrade_journal import UPGRADE_JOURNAL_KEY
from sharding_store.stores import as_inner
from sharding_store.stores import local as local_mod
from sharding_store.stores.local import LocalInner
from tests.gen2023_writer import write_2023, write_group

from ..s3server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-m", "sharding_store.cli"]
N_ARRAYS = 300
ATTEMPTS = 6
GROWN = json.dumps({
    "zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint16",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0, "codecs": [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2], "codecs": [{"name": "endian", "configuration": {"endian": "little"}}]}}],
}).encode()
ROOT_EDIT = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"edited": "by the writer"}}).encode()


def target(n: int) -> str:
    """The array the writer appends to: late in the upgrade's order (arrays sorted, the root last)."""
    return f"a{n - 20:03d}"


def make_store(root: Path, n: int) -> Path:
    write_group(root, "", {"title": "before"})
    for i in range(n):
        write_2023(root, f"a{i:03d}", np.arange(4, dtype="u2") + i, chunks=(2,), cps=(2,), index="hidden")
    return root


#: the writer: waits until the upgrade wrote its first document, then writes a new shard, the
#: grown document and the root's
WRITER = textwrap.dedent("""
    import os, sys, time
    kind, where, target, grown, root_doc, shard, delay = sys.argv[1:8]
    if kind == "s3":
        import json, s3fs
        fs = s3fs.S3FileSystem(**json.loads(sys.argv[8]))
        exists = lambda k: fs.exists(f"{where}/{k}")
        read = lambda k: fs.cat_file(f"{where}/{k}")
        def put(k, v):
            fs.pipe_file(f"{where}/{k}", v)
    else:
        exists = lambda k: os.path.exists(os.path.join(where, k))
        def read(k):
            with open(os.path.join(where, k), "rb") as f:
                return f.read()
        def put(k, v):  # an atomic writer: a temporary file renamed over the key
            tmp = os.path.join(where, k + ".writer-tmp")
            with open(tmp, "wb") as f:
                f.write(v)
            os.replace(tmp, os.path.join(where, k))
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    # mid-way: once the upgrade has written its first document (the first array's)
    while not (exists(".sharding-store-upgrade.json") and b'"bytes"' in read("a000/zarr.json")):
        if kind == "s3":
            fs.invalidate_cache()
        if time.monotonic() > deadline:
            sys.exit("the upgrade wrote no document")
        time.sleep(0.0005)
    time.sleep(float(delay))
    put(target + "/c/1", bytes.fromhex(shard))
    put(target + "/zarr.json", bytes.fromhex(grown))
    put("zarr.json", bytes.fromhex(root_doc))
    print("wrote", flush=True)
""")


def _shard(values: np.ndarray) -> bytes:
    """The second shard of the grown array (two chunks of 2, a hidden CRC32C after its index)."""
    scratch: dict[str, bytes] = {}
    write_2023(scratch, "x", values, chunks=(2,), cps=(2,), index="hidden")
    return scratch["x/c/0"]


def _race(kind: str, where: str, name: str, upgrade: list[str], delay: float,
          opts: str = "") -> subprocess.CompletedProcess:
    """One trial: the writer started (and ready) first, then the upgrade; both awaited.
    The writer writes ``delay`` seconds after the upgrade wrote its first document."""
    shard = _shard(np.array([7, 8, 9, 10], dtype="u2"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, kind, where, name, GROWN.hex(), ROOT_EDIT.hex(),
                               shard.hex(), str(delay), opts], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    assert writer.stdout.readline().strip() == "ready"
    try:
        done = subprocess.run(upgrade, cwd=REPO, capture_output=True, text=True, timeout=600)
        out, err = writer.communicate(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0 and "wrote" in out, err
    return done


def _check_trial(done: subprocess.CompletedProcess, name: str, docs: dict[str, bytes | None], journal: bool,
                 untouched: bool) -> bool:
    """Nothing the writer wrote is lost; a run that met its change says so (exit 10, the
    document named) and keeps its journal, unless it had written nothing yet (``untouched``:
    every other document its original). True when the run met the change mid-way."""
    assert docs[f"{name}/zarr.json"] == GROWN, "the writer's appended rows were overwritten"
    assert docs["zarr.json"] == ROOT_EDIT, "the writer's root attributes were overwritten"
    assert done.returncode in (0, 10), done.stderr
    if done.returncode == 10:
        assert "another writer" in done.stderr and "zarr.json" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert journal or untouched, "the journal (the only copy of the originals) must be kept"
        return journal
    return False


def test_a_concurrent_writer_is_never_overwritten_locally(tmp_path):
    template = make_store(tmp_path / "template", N_ARRAYS)
    met = 0
    for attempt in range(ATTEMPTS):
        src = tmp_path / f"store{attempt}"
        shutil.copytree(template, src)
        name = target(N_ARRAYS)
        done = _race("file", str(src), name, [*CLI, "migrate", str(src), "--in-place"], 0.005 * attempt)
        docs = {k: (src / k).read_bytes() for k in (f"{name}/zarr.json", "zarr.json")}
        untouched = all((src / p.relative_to(template)).read_bytes() == p.read_bytes()
                        for p in template.glob("a*/zarr.json") if p.parent.name != name)
        met += _check_trial(done, name, docs, (src / UPGRADE_JOURNAL_KEY).exists(), untouched)
        if met:
            break
    assert met, f"no trial of {ATTEMPTS} met the concurrent write (the race was not exercised)"


@pytest.mark.s3
def test_a_concurrent_writer_is_never_overwritten_on_s3(s3, tmp_path):
    template = make_store(tmp_path / "template", 60)
    s3.make_bucket("race")
    opts = json.dumps(s3.storage_options)
    met = 0
    for attempt in range(ATTEMPTS):
        where = f"race/store{attempt}"
        s3.fs.put(str(template) + "/", where, recursive=True)
        name = target(60)
        done = _race("s3", where, name, [*CLI, "migrate", f"s3://{where}", "--in-place", "--storage-options", opts],
                     0.01 * attempt, opts)
        s3.fs.invalidate_cache()
        docs = {k: s3.fs.cat_file(f"{where}/{k}") for k in (f"{name}/zarr.json", "zarr.json")}
        untouched = all(s3.fs.cat_file(f"{where}/{p.parent.name}/zarr.json") == p.read_bytes()
                        for p in template.glob("a*/zarr.json") if p.parent.name != name)
        met += _check_trial(done, name, docs, s3.fs.exists(f"{where}/{UPGRADE_JOURNAL_KEY}"), untouched)
        if met:
            break
    assert met, f"no trial of {ATTEMPTS} met the concurrent write (the race was not exercised)"


# --------------------------------------------------------------------------- the primitive


def _backends(tmp_path):
    yield "local", as_inner(str(tmp_path / "local"))
    yield "mapping", as_inner({})
    import fsspec

    yield "memory", as_inner(fsspec.filesystem("memory").get_mapper(f"/pu-{tmp_path.name}"))


def _semantics(inner) -> None:
    assert inner.put_if_unchanged("d/k", b"new", None) is True  # created where missing
    assert inner.put_if_unchanged("d/k", b"x", None) is False and inner.get("d/k") == b"new"
    assert inner.put_if_unchanged("d/k", b"v2", b"old") is False and inner.get("d/k") == b"new"
    assert inner.put_if_unchanged("d/k", b"v2", b"new") is True and inner.get("d/k") == b"v2"
    assert inner.put_if_unchanged("d/k", None, b"new") is False and inner.get("d/k") == b"v2"
    assert inner.put_if_unchanged("d/k", None, b"v2") is True and inner.get("d/k") is None
    assert inner.put_if_unchanged("d/k", b"v3", b"v2") is False and inner.get("d/k") is None
    assert list(inner.list_prefix("")) == []


def test_put_if_unchanged_semantics(tmp_path):
    for _, inner in _backends(tmp_path):
        _semantics(inner)
    assert not any((tmp_path / "local").rglob("*sharding-store-tmp*"))


@pytest.mark.s3
def test_put_if_unchanged_semantics_on_s3(s3):
    s3.make_bucket("prim")
    inner = as_inner("s3://prim/store", storage_options=s3.storage_options)
    _semantics(inner)
    s3.start_counting()
    inner.set("e", b"one")
    assert inner.put_if_unchanged("e", b"two", b"one")
    conditional = [r for r in s3.requests() if r["method"] == "PUT"]
    assert any("If-Match" in r["headers"] or "if-match" in {h.lower() for h in r["headers"]} for r in conditional)


def test_a_writer_between_the_compare_and_the_swap_is_swapped_back(tmp_path, monkeypatch):
    """Another writer renames its version over the document after the compare: the
    exchange hands that version to us, it is compared, and swapped back to the key."""
    inner = LocalInner(tmp_path)
    inner.set("a/zarr.json", b"original")
    real = local_mod._exchange

    once = []

    def raced(a: str, b: str, *dir_fd: int):  # names in the directory's descriptor
        if not once:
            once.append(True)
            (tmp_path / "a" / "theirs").write_bytes(b"theirs")
            (tmp_path / "a" / "theirs").replace(tmp_path / "a" / "zarr.json")
        return real(a, b, *dir_fd)

    monkeypatch.setattr(local_mod, "_exchange", raced)
    assert inner.put_if_unchanged("a/zarr.json", b"upgraded", b"original") is False
    assert (tmp_path / "a" / "zarr.json").read_bytes() == b"theirs"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["zarr.json"]


def test_a_delete_raced_by_a_writer_puts_its_version_back(tmp_path, monkeypatch):
    inner = LocalInner(tmp_path)
    inner.set("g/zarr.json", b"created")
    real_get = LocalInner.get
    calls = [0]

    def get(self, key):
        out = real_get(self, key)
        calls[0] += 1
        if calls[0] == 1:  # after the compare, before the rename aside: another writer's version
            (tmp_path / "g" / "zarr.json").write_bytes(b"theirs")
        return out

    monkeypatch.setattr(LocalInner, "get", get)
    assert inner.put_if_unchanged("g/zarr.json", None, b"created") is False
    assert (tmp_path / "g" / "zarr.json").read_bytes() == b"theirs"
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["zarr.json"]

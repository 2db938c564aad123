"""``open_v3`` on the 2023 intermediate generation: a final-v3 view of the real stores in
``../shared/fixtures/draft-2023/`` (read, never copied into the repository) and of copies
damaged on purpose.

What is proved: every fixture array reads equal to ``expected.npz`` through the view (also
with the zarrs codec pipeline configured); the documents served are the ones
``meta2023.normalise_node`` makes, the undeclared CRC32C after zarrita's shard indices is
declared (and reading the same bytes with it ignored gives wrong values); data objects are
served byte for byte; an index that fits neither reading, or shards that disagree, raise
ShardCorruptError naming the key; damaged nodes and mixed hierarchies are named; the I/O is
counted (one read per document, no data object read to list or open what declares its index).
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import zarr

import sharding_store as ss
from sharding_store.api.v3view import Draft2023V3Store, DraftV3Store
from sharding_store.errors import DraftMetadataError, ReadOnlyError, ShardCorruptError, StoreNotFoundError
from sharding_store.formats.gen2023 import NODE_KEY, normalise_node
from sharding_store.formats.shard_index import CHECKSUM_NBYTES, ENTRY_NBYTES, index_reading, read_index
from sharding_store.testing import CountingInner

from ... import fixtures
from ...s3server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ZARRJS = fixtures.ZARRJS_ZARRITA_2023
ENDIAN = fixtures.ZARRITAJS_2023_ENDIAN
needs_2023 = fixtures.needs(fixtures.DRAFT_2023)
ZARRS = {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True}
GROUP_DOC = {"zarr_format": 3, "node_type": "group", "attributes": {}}


def _expected() -> list:
    """``(collection, store name, array path)`` of every key of every ``expected.npz``."""
    if not fixtures.available(fixtures.DRAFT_2023):
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023)),
                             id="fixtures-absent")]
    out = []
    for collection in sorted(p for p in fixtures.DRAFT_2023.iterdir() if p.is_dir()):
        with np.load(collection / "expected.npz") as npz:
            for key in sorted(npz.files):
                store, array = key.split("::")
                out.append(pytest.param(collection, store, array.replace("__", "/"), id=f"{collection.name}/{key}"))
    return out


EXPECTED = _expected()


def expected(collection: Path, store: str, path: str) -> np.ndarray:
    with np.load(collection / "expected.npz") as npz:
        return npz[f"{store}::{path.replace('/', '__')}"]


def assert_same(actual: np.ndarray, want: np.ndarray) -> None:
    assert actual.shape == want.shape
    assert actual.dtype == want.dtype, (actual.dtype, want.dtype)
    assert np.array_equal(actual, want, equal_nan=want.dtype.kind in "fc")


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    fixtures.copy_writable(src, dst)
    return dst


def shard_layout(array_dir: Path) -> tuple[tuple[int, ...], int]:
    """(chunks per shard, entries) of a sharded fixture array."""
    doc = json.loads((array_dir / NODE_KEY).read_bytes())
    cfg = doc["codecs"][0]["configuration"]
    grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
    cps = tuple(g // c for g, c in zip(grid, cfg["chunk_shape"]))
    return cps, math.prod(cps)


def objects(array_dir: Path) -> list[Path]:
    return sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != NODE_KEY)


# ------------------------------------------------------------------------ values


@pytest.mark.parametrize("collection, store, path", EXPECTED)
def test_every_fixture_array_reads_as_expected(collection: Path, store: str, path: str) -> None:
    root = collection / store
    want = expected(collection, store, path)
    group = ss.open_v3(str(root))
    assert type(group.store) is DraftV3Store  # one view for every generation
    assert_same(group[path][...], want)
    assert_same(zarr.open_group(store=group.store, mode="r")[path][...], want)
    assert_same(ss.open_v3(str(root), path)[...], want)


@pytest.mark.parametrize("collection, store, path", EXPECTED)
def test_every_fixture_array_reads_as_expected_with_zarrs_configured(collection: Path, store: str, path: str) -> None:
    """zarrs (Rust) reads only the stores it can open itself (local, fsspec, obstore); a
    Python ``Store`` such as the view is read by zarr's own pipeline even in strict mode
    (zarr falls back when zarrs' pipeline raises NotImplementedError for the store). So every
    byte still passes the view's checks, and the values are right; should zarrs learn to read
    Python stores, this test says so (then its codecs are the ones exercised)."""
    want = expected(collection, store, path)
    with zarr.config.set(ZARRS):
        a = ss.open_v3(str(collection / store), path)
        assert_same(a[...], want)
        pipeline = type(a._async_array.codec_pipeline).__name__
    assert pipeline == "BatchedCodecPipeline", f"zarrs now reads the view itself ({pipeline}): drop this note"


@needs_2023
def test_zarrs_reads_the_bytes_the_view_serves(tmp_path: Path) -> None:
    """zarrs itself on the view's output: each served document written beside the untouched
    objects of a copy, read by zarrs from the local store (its own I/O), equals expected.
    This is what the view promises zarrs readers: its documents are valid final v3 for the
    bytes as they are (no object is changed)."""
    read = 0
    for collection in (ZARRJS, ENDIAN):
        for store in sorted(p for p in collection.iterdir() if p.is_dir()):
            dst = copy(store, tmp_path / collection.name)
            view = ss.open_v3(str(store)).store
            for key in sorted(k for k in _keys(view) if k.endswith(NODE_KEY)):
                (dst / key).write_bytes(_get(view, key))
            with zarr.config.set(ZARRS):
                group = zarr.open_group(str(dst), mode="r")
                with np.load(collection / "expected.npz") as npz:
                    for k in npz.files:
                        name, array = k.split("::")
                        if name != store.name:
                            continue
                        a = group[array.replace("__", "/")]
                        if a.dtype.kind == "b" or not a.dtype.isnative:
                            continue  # zarrs-python: no bool reads into numpy here, no non-native order
                        assert type(a._async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
                        assert_same(a[...], npz[k])
                        read += 1
    assert read >= 55, read  # 63 arrays, of which zarrs-python skips the bool and big-endian ones


def _keys(view: DraftV3Store) -> list[str]:
    async def go() -> list[str]:
        return [k async for k in view.list()]

    from zarr.core.sync import sync

    return sync(go())


def _get(view: DraftV3Store, key: str, byte_range=None) -> bytes | None:  # noqa: ANN001
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    buf = sync(view.get(key, default_buffer_prototype(), byte_range))
    return None if buf is None else buf.to_bytes()


# ------------------------------------------------------------------ documents, bytes


@needs_2023
@pytest.mark.parametrize("store", fixtures.stores(ZARRJS, "*.shards.zarr"))
def test_hidden_checksum_is_declared_and_ignoring_it_is_detected(store: Path, tmp_path: Path) -> None:
    """zarrita (May-July 2023) appended a CRC32C after each index without declaring it. The
    view declares it; the same bytes read as the document literally says (plain) are
    refused by our index validation, and zarr-python given the literal reading returns
    wrong values or fails for (nearly) every such store, which the view never does."""
    view = ss.open_v3(str(store)).store
    doc = json.loads(_get(view, "a/zarr.json"))
    sharding = doc["codecs"][0]["configuration"]
    assert sharding["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
    assert "index_codecs" not in json.loads((store / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    cps, n = shard_layout(store / "a")
    for obj in objects(store / "a"):
        data = obj.read_bytes()
        assert index_reading(data[-(ENTRY_NBYTES * n + CHECKSUM_NBYTES):], cps, len(data)) == "crc32c-hidden"
        with pytest.raises(ShardCorruptError):
            read_index(data, cps, checksum=False, key=obj.name)  # the plain reading of the same bytes
    want = expected(ZARRJS, store.name, "a")
    assert_same(ss.open_v3(str(store), "a")[...], want)


@needs_2023
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # zarr's offset arithmetic overflows on the wrong index
def test_the_literal_reading_gives_wrong_values(tmp_path: Path) -> None:
    """The wrong reading is not hypothetical: a copy whose document declares the plain index
    (what a reader that believes the metadata does) reads wrong values through zarr-python."""
    wrong = 0
    stores = fixtures.store_paths(ZARRJS, "*.shards.zarr")
    for store in stores:
        dst = copy(store, tmp_path)
        norm = normalise_node((dst / "a" / NODE_KEY).read_bytes())
        (dst / "a" / NODE_KEY).write_text(json.dumps(norm.document_for("plain")))
        want = expected(ZARRJS, store.name, "a")
        try:
            got = zarr.open_array(str(dst / "a"), mode="r")[...]
        except Exception:  # noqa: BLE001 - failing is also "not the values"
            wrong += 1
            continue
        wrong += not np.array_equal(got, want)
        assert_same(ss.open_v3(str(store), "a")[...], want)  # the view: right
    assert len(stores) >= 10 and wrong >= len(stores) - 1, (wrong, len(stores))


@needs_2023
@pytest.mark.parametrize("collection", [ZARRJS, ENDIAN], ids=["zarrjs", "zarritajs"])
def test_documents_are_the_normalised_ones_and_objects_pass_through(collection: Path) -> None:
    for store in sorted(p for p in collection.iterdir() if p.is_dir()):
        view = ss.open_v3(str(store)).store
        keys = _keys(view)
        docs = {k for k in keys if k.endswith(NODE_KEY)}
        on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()}
        assert NODE_KEY in docs  # an implicit root is served a group document
        if not (store / NODE_KEY).exists():
            assert json.loads(_get(view, NODE_KEY)) == GROUP_DOC
        assert set(keys) - docs == on_disk - {k for k in on_disk if k.endswith(NODE_KEY)}
        for key in docs:
            served = json.loads(_get(view, key))
            if not (store / key).exists():
                assert served == GROUP_DOC
                continue
            norm = normalise_node((store / key).read_bytes(), key)
            if norm.hidden_checksum is None:
                cps, n = shard_layout((store / key).parent)
                shards = objects((store / key).parent)
                readings = {index_reading(p.read_bytes()[-(ENTRY_NBYTES * n + 4):], cps, p.stat().st_size) for p in shards}
                (reading,) = readings
                assert served == norm.document_for(reading)
            else:
                assert served == norm.document
        for key in set(keys) - docs:
            raw = (store / key).read_bytes()
            assert _get(view, key) == raw
            assert _get(view, key, zarr.abc.store.RangeByteRequest(1, 3)) == raw[1:3]


# ------------------------------------------------------------------ shard damage


def _strip_checksums(array_dir: Path, only: str | None = None) -> None:
    for obj in objects(array_dir):
        if only is None or obj.name == only:
            obj.write_bytes(obj.read_bytes()[:-CHECKSUM_NBYTES])


@needs_2023
def test_a_plain_undeclared_index_is_declared_plain(tmp_path: Path) -> None:
    """Shards whose undeclared index has no checksum (zarrita before May 2023): the view
    declares [bytes little] and reads right."""
    dst = copy(ZARRJS / "2d.chunked.ragged.compressed.i2.shards.zarr", tmp_path)
    _strip_checksums(dst / "a")
    view = ss.open_v3(str(dst)).store
    doc = json.loads(_get(view, "a/zarr.json"))
    assert doc["codecs"][0]["configuration"]["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert_same(ss.open_v3(str(dst), "a")[...], expected(ZARRJS, dst.name, "a"))


@needs_2023
@pytest.mark.parametrize("stripped", ["0", "1"])
def test_shards_that_disagree_are_refused_naming_the_shard(tmp_path: Path, stripped: str) -> None:
    dst = copy(ZARRJS / "2d.chunked.ragged.compressed.i2.shards.zarr", tmp_path)
    _strip_checksums(dst / "a", only=stripped)  # a/c/0/0 and a/c/1/0 lose theirs
    a = ss.open_v3(str(dst), "a")
    with pytest.raises(ShardCorruptError, match="disagree") as e:
        a[...]
    assert e.value.key.startswith("a/c/")
    with pytest.raises(ShardCorruptError, match="disagree"):
        zarr.open_group(store=a.store, mode="r")["a"][...]


def _garble_index(obj: Path, n: int) -> None:
    """Overwrite the index and its checksum: neither reading fits (offsets far out)."""
    data = bytearray(obj.read_bytes())
    data[-(ENTRY_NBYTES * n + CHECKSUM_NBYTES):] = b"\x7f" * (ENTRY_NBYTES * n + CHECKSUM_NBYTES)
    obj.write_bytes(bytes(data))


@needs_2023
def test_an_undecidable_index_is_shard_corrupt_never_a_guess(tmp_path: Path) -> None:
    dst = copy(ZARRJS / "1d.chunked.compressed.i2.shards.zarr", tmp_path)  # shards a/c/0, a/c/1
    _, n = shard_layout(dst / "a")
    want = expected(ZARRJS, dst.name, "a")
    _garble_index(dst / "a" / "c" / "0", n)
    a = ss.open_v3(str(dst), "a")  # the next shard decides
    half = want.shape[0] // 2
    assert_same(a[half:], want[half:])
    with pytest.raises(ShardCorruptError, match="fits neither reading") as e:
        a[:half]
    assert e.value.key == "a/c/0"
    _garble_index(dst / "a" / "c" / "1", n)  # no shard decides: the array is refused
    with pytest.raises(ShardCorruptError, match="fits neither reading"):
        ss.open_v3(str(dst), "a")


@needs_2023
def test_a_declared_index_is_validated(tmp_path: Path) -> None:
    """zarritajs' documents declare [endian, crc32c]: a shard whose index no longer fits its
    object is ShardCorruptError naming it, not zarr's bare error."""
    dst = copy(ENDIAN / "data.zarr", tmp_path)
    array = dst / "1d.contiguous.compressed.sharded.i2"
    (shard,) = objects(array)
    data = shard.read_bytes()
    shard.write_bytes(data[:-8])  # truncated
    with pytest.raises(ShardCorruptError) as e:
        ss.open_v3(str(dst), array.name)[...]
    assert e.value.key == f"{array.name}/{shard.relative_to(array).as_posix()}"


# ------------------------------------------------------------------ hierarchy


@needs_2023
def test_a_damaged_node_is_named_and_the_others_read(tmp_path: Path) -> None:
    dst = copy(ENDIAN / "data.zarr", tmp_path)
    bad = dst / "1d.contiguous.i4" / NODE_KEY
    doc = json.loads(bad.read_bytes())
    doc["codecs"] = [{"name": "transpose", "configuration": {"order": "X"}}]
    bad.write_text(json.dumps(doc))
    with pytest.raises(DraftMetadataError, match=r"1d\.contiguous\.i4/zarr\.json.*order") as e:
        ss.open_v3(str(dst), "1d.contiguous.i4")
    assert e.value.key == "1d.contiguous.i4/zarr.json"
    group = ss.open_v3(str(dst))
    names = {name for name, _ in group.members()}
    assert "1d.contiguous.i4" not in names and "1d.contiguous.raw.i2" in names
    assert_same(group["1d.contiguous.raw.i2"][...], expected(ENDIAN, "data.zarr", "1d.contiguous.raw.i2"))


@needs_2023
def test_mixed_generations_are_refused_naming_the_node(tmp_path: Path) -> None:
    dst = copy(ENDIAN / "data.zarr", tmp_path)
    (dst / "old").mkdir()
    (dst / "old" / ".zarray").write_text("{}")
    with pytest.raises(DraftMetadataError, match=r"old/\.zarray.*mixes generations"):
        ss.open_v3(str(dst))


def test_final_v3_and_v2_are_refused_as_before(tmp_path: Path) -> None:
    zarr.create_array(str(tmp_path / "v3"), shape=(2,), dtype="i1", zarr_format=3)
    zarr.create_array(str(tmp_path / "v2"), shape=(2,), dtype="i1", zarr_format=2)
    with pytest.raises(StoreNotFoundError, match="already Zarr v3"):
        ss.open_v3(str(tmp_path / "v3"))
    with pytest.raises(StoreNotFoundError, match="Zarr v2"):
        ss.open_v3(str(tmp_path / "v2"))
    with pytest.raises(StoreNotFoundError):
        DraftV3Store(str(tmp_path / "v3")).node_kind("")
    assert Draft2023V3Store is DraftV3Store  # the old name of the one view


@needs_2023
def test_missing_node_and_read_only(tmp_path: Path) -> None:
    store = str(ZARRJS / "1d.contiguous.compressed.i2.zarr")
    with pytest.raises(StoreNotFoundError, match="no array or group at 'b'"):
        ss.open_v3(store, "b")
    a = ss.open_v3(store, "a")
    with pytest.raises(ReadOnlyError):
        a[0] = 5
    a[...]  # pickled with what reading made (its codec, decided index, cached documents)
    clone = pickle.loads(pickle.dumps(a.store))
    assert clone == a.store and isinstance(clone, DraftV3Store)
    assert_same(ss.open_v3(clone, "a")[...], expected(ZARRJS, "1d.contiguous.compressed.i2.zarr", "a"))


# ------------------------------------------------------------------ I/O counts


def _doc_gets(counting: CountingInner) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, detail in counting.log:
        if name == "get" and detail.endswith(NODE_KEY):
            out[detail] = out.get(detail, 0) + 1
    return out


def _data_reads(counting: CountingInner) -> list:
    out = []
    for name, detail in counting.log:
        if name == "get" and not detail.endswith(NODE_KEY):
            out.append(detail)
        elif name in ("get_ranges", "read_into"):
            out.append(detail)
    return out


@needs_2023
def test_documents_are_read_once_and_listing_reads_no_data(tmp_path: Path) -> None:
    root = ENDIAN / "data.zarr"
    counting = CountingInner(str(root))
    group = ss.open_v3(counting)
    store = group.store
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob(NODE_KEY))
    assert _doc_gets(counting) == {k: 1 for k in on_disk}  # the generation check and the walk share them
    assert _data_reads(counting) == []
    counting.reset()
    keys = _keys(store)
    assert len(keys) > len(on_disk) and counting.reads == 0  # listing: listings only
    members = dict(group.members())  # every document served; all declare their index
    assert len(members) == len(on_disk) - 1
    assert counting.reads == 0
    for _name, a in members.items():
        a[...]
    assert _doc_gets(counting) == {}
    group2 = ss.open_v3(store)  # the same view again: from its cache
    dict(group2.members())
    assert _doc_gets(counting) == {}


@needs_2023
def test_an_undeclared_index_costs_one_tail_read_to_decide(tmp_path: Path) -> None:
    root = ZARRJS / "2d.chunked.ragged.compressed.i2.shards.zarr"
    counting = CountingInner(str(root))
    group = ss.open_v3(counting)
    assert _data_reads(counting) == []  # the implicit root group: nothing to decide
    counting.reset()
    _keys(group.store)
    assert counting.reads == 0
    counting.reset()
    a = group["a"]  # the document: one shard's tail decides (the grid's first: no listing)
    (read,) = _data_reads(counting)
    assert counting.calls["list_prefix"] == counting.calls["list_sized"] == counting.calls["list_dir"] == 0
    cps, n = shard_layout(root / "a")
    assert read == [("a/c/0/0", -(ENTRY_NBYTES * n + CHECKSUM_NBYTES), None)]
    counting.reset()
    assert_same(a[1:2, 1:2], expected(ZARRJS, root.name, "a")[1:2, 1:2])
    # one chunk: the index (checked on the same tail read) and the chunk
    assert counting.reads == 2 and counting.calls["get"] == 0
    assert counting.log[0] == ("get_ranges", [("a/c/0/0", -(ENTRY_NBYTES * n + CHECKSUM_NBYTES), None)])


# ------------------------------------------------------------------ object storage


@needs_2023
def test_the_view_reads_a_2023_store_on_s3(s3) -> None:  # noqa: ANN001
    """The same view over S3 (moto on 127.0.0.1): values right, the hidden checksum declared
    from the first shard's tail (one ranged GET), each document read once."""
    s3.make_bucket("bkt")
    store = ZARRJS / "2d.chunked.ragged.compressed.i2.shards.zarr"
    s3.fs.put(str(store), "bkt/store.zarr", recursive=True)
    s3.start_counting()
    group = ss.open_v3("s3://bkt/store.zarr", storage_options=s3.storage_options)
    a = group["a"]
    assert a.metadata.codecs[0].index_codecs[-1].__class__.__name__ == "Crc32cCodec"
    assert_same(a[...], expected(ZARRJS, store.name, "a"))
    gets = [r for r in s3.requests() if r["method"] == "GET" and "list-type" not in r["url"]
            and "prefix=" not in r["url"]]
    # the implicit root has no zarr.json: asked for once (obstore: a GET, s3fs: a HEAD), then not
    root = [r for r in gets if r["url"].split("?")[0].endswith("/bkt/store.zarr/zarr.json")]
    assert len(root) <= 1
    gets = [r for r in gets if r not in root]
    docs = [r["url"] for r in gets if r["url"].split("?")[0].endswith("/zarr.json")]
    assert len(docs) == 1  # a/zarr.json
    ranges = [{k.lower(): v for k, v in r["headers"].items()}.get("range") for r in gets]
    paths = [r["url"].split("/bkt/store.zarr/")[1] for r in gets]
    assert paths[:2] == ["a/zarr.json", "a/c/0/0"] and ranges[1] == "bytes=-68"  # the first shard's tail decides
    # every other shard's index is read once, by zarr, as one suffix that also covers the checksum
    assert sorted(p for p, r in zip(paths[2:], ranges[2:]) if r == "bytes=-68") == ["a/c/0/1", "a/c/1/0", "a/c/1/1"]
    assert sum(1 for r in ranges if r and r.startswith("bytes=-")) == 4  # the rest: whole shards, chunk ranges


@needs_2023
def test_store_interface_on_a_fixture() -> None:
    """exists, getsize, list_dir, list_prefix and every kind of byte range, against the files."""
    from zarr.abc.store import OffsetByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    root = ENDIAN / "data.zarr"
    view = ss.open_v3(str(root)).store
    key = "1d.contiguous.raw.i2/c/0"
    raw = (root / key).read_bytes()
    assert sync(view.exists(key)) and sync(view.exists("zarr.json"))
    assert not sync(view.exists("1d.contiguous.raw.i2/c/9")) and not sync(view.exists("nowhere/c/0"))
    assert sync(view.getsize(key)) == len(raw)
    assert sync(view.getsize("1d.contiguous.raw.i2/zarr.json")) == len(_get(view, "1d.contiguous.raw.i2/zarr.json"))
    assert _get(view, key, SuffixByteRequest(3)) == raw[-3:]
    assert _get(view, key, OffsetByteRequest(2)) == raw[2:]
    assert _get(view, "1d.contiguous.raw.i2/c/9") is None
    got = sync(view.get_partial_values(default_buffer_prototype(), [(key, None), ("zarr.json", None)]))
    assert got[0].to_bytes() == raw and json.loads(got[1].to_bytes()) == json.loads((root / NODE_KEY).read_bytes())

    async def names(prefix: str) -> list[str]:
        return [k async for k in view.list_dir(prefix)]

    async def listed(prefix: str) -> list[str]:
        return [k async for k in view.list_prefix(prefix)]

    top = sync(names(""))
    assert "zarr.json" in top and "1d.contiguous.raw.i2" in top and len(top) == 34
    assert sync(names("1d.contiguous.raw.i2")) == ["c", "zarr.json"]
    assert sync(names("1d.contiguous.raw.i2/c")) == sorted(p.name for p in (root / "1d.contiguous.raw.i2" / "c").iterdir())
    assert sync(listed("1d.contiguous.raw.i2/")) == sorted(
        p.relative_to(root).as_posix() for p in (root / "1d.contiguous.raw.i2").rglob("*") if p.is_file())
    with pytest.raises(ReadOnlyError):
        sync(view.set(key, default_buffer_prototype().buffer.from_bytes(b"x")))


@needs_2023
def test_without_the_first_shard_the_listing_finds_one_to_decide(tmp_path: Path) -> None:
    dst = copy(ZARRJS / "1d.chunked.compressed.i2.shards.zarr", tmp_path)
    (dst / "a" / "c" / "0").unlink()
    want = expected(ZARRJS, dst.name, "a").copy()
    want[: want.shape[0] // 2] = json.loads((dst / "a" / NODE_KEY).read_bytes())["fill_value"]
    counting = CountingInner(str(dst))
    a = ss.open_v3(counting, "a")
    assert counting.calls["list_prefix"] == 1  # the grid's first shard is absent: the array is listed
    doc = json.loads(_get(a.store, "a/zarr.json"))
    assert doc["codecs"][0]["configuration"]["index_codecs"][-1] == {"name": "crc32c"}
    assert_same(a[...], want)

"""The one walk of a per-node hierarchy (``hierarchy.walk_v3_nodes``) at scale and at its edges:
nothing is cut off below a store that shows it is a v3 hierarchy (issue 25 item 1), only the
search for a first node document below a root without one is bounded, with an error naming
the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sharding_store.api.hierarchy import MAX_EMPTY_LISTINGS, Generation, detect_generation
from sharding_store.cli import main
from sharding_store.formats.gen2023 import NODE_KEY
from sharding_store.stores import as_inner
from tests.gen2023_writer import write_2023, write_group

from ...s3server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PLAIN = MAX_EMPTY_LISTINGS + 4  # document-less directories: more than the old silent cut-off


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sharding_store.cli", *argv], capture_output=True, text=True,
                          timeout=600)


def _array(store: Path, path: str, value: int) -> None:
    write_2023(store, path, np.full(4, value, dtype="<i2"), chunks=(4,))


def _plain_dirs(store: Path, prefix: str) -> None:
    for i in range(PLAIN):
        (store / f"{prefix}{i:05d}").mkdir(parents=True)


def _final_arrays(dst: Path) -> dict[str, dict]:
    return {p.parent.relative_to(dst).as_posix(): json.loads(p.read_bytes()) for p in dst.rglob(NODE_KEY)
            if json.loads(p.read_bytes())["node_type"] == "array"}


@pytest.fixture(scope="module")
def implicit_store(tmp_path_factory) -> Path:
    """No root zarr.json (as zarrita wrote): an implicit group with a 2023 array first, then more
    document-less directories than the old limit, then another implicit group's array."""
    store = tmp_path_factory.mktemp("walk") / "implicit.zarr"
    _array(store, "g0/a", 1)
    _plain_dirs(store, "h")
    _array(store, "z/a", 2)
    return store


def test_migrate_finds_every_array_past_the_old_limit(implicit_store, tmp_path):
    dst = tmp_path / "dst"
    done = _cli("migrate", str(implicit_store), str(dst))
    assert done.returncode == 0, done.stderr
    arrays = _final_arrays(dst)
    assert sorted(arrays) == ["g0/a", "z/a"]  # the old walk stopped before z
    assert _cli("verify", str(implicit_store), str(dst)).returncode == 0


def test_in_place_upgrades_every_array_past_the_old_limit(implicit_store, tmp_path):
    import shutil

    store = tmp_path / "s.zarr"
    shutil.copytree(implicit_store, store)
    done = _cli("migrate", "--in-place", str(store))
    assert done.returncode == 0, done.stderr
    for path in ("g0/a", "z/a"):
        codecs = json.loads((store / path / NODE_KEY).read_bytes())["codecs"]
        assert codecs[0]["name"] == "bytes", (path, codecs)  # "endian" (2023) was left before
    assert detect_generation(as_inner(str(store)))[0] is Generation.FINAL_V3


def test_root_document_walks_every_directory(tmp_path):
    """A final root group, more plain directories than the old limit, then an implicit group of
    a 2023 array: 2023 (it was "already Zarr v3, nothing to migrate", exit 7)."""
    store = tmp_path / "s.zarr"
    write_group(store, "", {})  # final v1.0
    _plain_dirs(store, "p")
    _array(store, "zz/a", 3)
    assert detect_generation(as_inner(str(store))) == (Generation.DRAFT_2023, "zz/a/zarr.json")
    assert main(["info", str(store)]) == 0
    dst = tmp_path / "dst"
    assert main(["migrate", str(store), str(dst)]) == 0
    assert sorted(_final_arrays(dst)) == ["zz/a"]


def test_search_without_evidence_stops_with_an_error_naming_the_limit(tmp_path, capsys):
    """No root zarr.json and no node document in the first MAX_EMPTY_LISTINGS directories: an
    error naming the limit and where it stopped (exit 7), never a wrong generation."""
    store = tmp_path / "s.zarr"
    _plain_dirs(store, "p")
    _array(store, "zz/a", 3)
    for command in (["info", str(store)], ["migrate", str(store), str(tmp_path / "dst")]):
        assert main(command) == 7
        err = capsys.readouterr().err
        assert f"first {MAX_EMPTY_LISTINGS} directories" in err and "MAX_EMPTY_LISTINGS" in err, err
        assert err.count("\n") == 1
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


# --------------------------------------------------------------------------- node names (issue 25 item 11)

ILLEGAL = ("a b", "back\\slash", "new\nline", "\x1b[31mred", 'quo"te')


@pytest.fixture
def named_store(tmp_path) -> Path:
    """A final root group, a valid 2023 array, and 2023 arrays under illegal names (one nested
    below an illegal directory without a document)."""
    store = tmp_path / "names.zarr"
    write_group(store, "", {})
    _array(store, "ok", 1)
    for i, name in enumerate(ILLEGAL):
        _array(store, name, 10 + i)
    _array(store, "g/bad name/deeper", 20)
    return store


def _no_raw_controls(text: str) -> None:
    for line in text.splitlines():
        assert line.isprintable(), repr(line)
    assert "\x1b" not in text


def test_illegal_local_names_are_damaged_nodes(named_store, tmp_path, capsys):
    from sharding_store.api.hierarchy import hierarchy_2023, walk_v3_nodes

    inner = as_inner(str(named_store))
    walk = walk_v3_nodes(inner)
    assert sorted(n.path for n in walk.nodes) == ["", "ok"]
    assert sorted(walk.damaged) == sorted([*ILLEGAL, "g/bad name"])
    assert walk.implicit == ["g"]  # a group holding a damaged node
    h = hierarchy_2023(inner)
    assert h is not None and sorted(h.damaged) == sorted(walk.damaged)
    assert main(["info", str(named_store)]) == 0
    out = capsys.readouterr().out
    _no_raw_controls(out)
    assert '"/new\\nline"' in out and '"/\\u001b[31mred"' in out and '"/back\\\\slash"' in out
    assert sum("damaged (DraftMetadataError)" in line for line in out.splitlines()) == len(ILLEGAL) + 1
    assert main(["info", "--json", str(named_store)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(d["path"] for d in doc["damaged"]) == sorted(walk.damaged)
    assert main(["info", "--strict", str(named_store)]) == 3
    capsys.readouterr()
    dst = tmp_path / "dst"
    assert main(["migrate", str(named_store), str(dst)]) == 3  # refused, nothing written
    err = capsys.readouterr().err
    _no_raw_controls(err)
    assert not dst.exists() or not any(dst.iterdir())
    assert main(["migrate", "--skip-damaged", str(named_store), str(dst)]) == 0
    out = capsys.readouterr().out
    _no_raw_controls(out)
    assert sorted(_final_arrays(dst)) == ["ok"]
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob(NODE_KEY)) == ["g/zarr.json", "ok/zarr.json",
                                                                                  "zarr.json"]


def test_illegal_names_in_place(named_store, capsys):
    """The in-place upgrade refuses them (nothing changed) or leaves them as they are."""
    before = {p: p.read_bytes() for p in named_store.rglob("*") if p.is_file()}
    assert main(["migrate", "--in-place", str(named_store)]) == 3
    assert {p: p.read_bytes() for p in named_store.rglob("*") if p.is_file()} == before
    assert main(["migrate", "--in-place", "--skip-damaged", str(named_store)]) == 0
    out = capsys.readouterr().out
    _no_raw_controls(out)
    for name in ILLEGAL:
        assert (named_store / name / NODE_KEY).read_bytes() == before[named_store / name / NODE_KEY]


@pytest.mark.s3
def test_illegal_s3_names_never_leave_the_destination(s3):  # noqa: F811
    """``s/../zarr.json`` and ``./zarr.json`` are legal S3 keys: damaged nodes, never published as
    ``out/../zarr.json`` or over the destination's root document."""
    objects: dict[str, bytes] = {}
    write_group(objects, "", {"root": True})
    write_2023(objects, "a", np.arange(4, dtype="<i2"), chunks=(4,))
    write_2023(objects, "s/..", np.arange(4, dtype="<i2") + 7, chunks=(4,))
    write_2023(objects, ".", np.arange(4, dtype="<i2") + 9, chunks=(4,))
    s3.make_bucket("src")
    s3.make_bucket("out")
    for key, value in objects.items():
        s3.fs.call_s3("put_object", Bucket="src", Key="store/" + key, Body=value)
    so = json.dumps(s3.storage_options)
    assert main(["migrate", "s3://src/store", "s3://out/dst", "--storage-options", so]) == 3
    listed = s3.fs.call_s3("list_objects_v2", Bucket="out").get("Contents", [])
    assert listed == []
    assert main(["migrate", "--skip-damaged", "s3://src/store", "s3://out/dst", "--storage-options", so]) == 0
    keys = sorted(o["Key"] for o in s3.fs.call_s3("list_objects_v2", Bucket="out")["Contents"]
                  if not o["Key"].startswith("dst/.sharding-store"))  # our record of the migration
    assert keys == ["dst/a/c/0", "dst/a/zarr.json", "dst/s/zarr.json", "dst/zarr.json"], keys
    root = json.loads(s3.fs.cat_file("out/dst/zarr.json"))
    assert root["node_type"] == "group" and root["attributes"] == {"root": True}


# --------------------------------------------------------------------------- depth (issue 25 item 14)

DEPTH = 1000  # a legal ~2000-character path: deeper than Python's recursion limit


def _mkdirs(root: Path, rel: str) -> str:
    """Make ``root/rel`` one level at a time (``os.makedirs`` and ``Path.mkdir`` recurse)."""
    import os

    d = str(root)
    for part in rel.split("/"):
        d = f"{d}/{part}"
        if not os.path.isdir(d):
            os.mkdir(d)
    return d


def _rmtree_deep(top: Path) -> None:
    """Remove ``top`` without recursion (``shutil.rmtree``, which pytest's clean-up uses, recurses
    once per level: a tree deeper than the recursion limit would break the session's end)."""
    import os

    stack = [(str(top), False)]
    while stack:
        path, listed = stack.pop()
        if listed:
            os.rmdir(path)
            continue
        stack.append((path, True))
        with os.scandir(path) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append((e.path, False))
                else:
                    os.unlink(e.path)


@pytest.fixture
def deep_tmp(tmp_path) -> Iterator[Path]:
    """``tmp_path``, removed without recursion afterwards."""
    yield tmp_path
    _rmtree_deep(tmp_path)


def _deep_2022(store: Path, depth: int) -> str:
    """A 2022 draft store: array ``top`` and array ``a/a/.../x`` ``depth`` implicit groups down."""
    import shutil

    from sharding_store.api.arrays import create_draft_array

    create_draft_array(str(store), "top", shape=(4,), chunks=(2,), dtype="<i2", chunks_per_shard=2)[:] = np.arange(4)
    deep = "/".join(["a"] * depth) + "/x"
    doc = json.loads((store / "meta/root/top.array.json").read_bytes())
    doc["attributes"] = {"_ARRAY_DIMENSIONS": ["t"]}
    (store / "meta/root/top.array.json").write_text(json.dumps(doc))
    meta = _mkdirs(store, "meta/root/" + deep.rpartition("/")[0])
    Path(meta, "x.array.json").write_text(json.dumps(doc))
    data = _mkdirs(store, "data/root/" + deep)
    for f in (store / "data/root/top").iterdir():
        shutil.copy(f, f"{data}/{f.name}")
    return deep


def _deep_2023(store: Path, depth: int) -> str:
    """A 2023 store (final root group, implicit groups down to ``a/a/.../x``)."""
    write_group(store, "", {})
    deep = "/".join(["a"] * depth) + "/x"
    for path, value in (("top", 0), (deep, 1)):
        _mkdirs(store, path + "/c")
        write_2023(store, path, np.arange(4, dtype="<i2") + value, chunks=(4,))
        doc = json.loads(Path(f"{store}/{path}/{NODE_KEY}").read_bytes())
        Path(f"{store}/{path}/{NODE_KEY}").write_text(json.dumps({**doc, "dimension_names": ["t"]}))
    return deep


LIMIT = 300  # the recursion limit of the child processes below: any recursion per level fails
SHALLOWER = 400  # deeper than LIMIT: quick (the local store's descriptor cache makes depth costly)


def _limited(code: str) -> subprocess.CompletedProcess:
    """``code`` in a child process whose recursion limit is :data:`LIMIT`."""
    head = f"import sys, warnings; warnings.simplefilter('ignore'); sys.setrecursionlimit({LIMIT})\n"
    return subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=600)


def _cli_limited(*argv: str) -> subprocess.CompletedProcess:
    return _limited(f"from sharding_store.cli import main; sys.exit(main({list(argv)!r}))")


@pytest.fixture(scope="module", params=["2022", "2023"])
def deep_store(request, tmp_path_factory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("deep")
    store = base / f"d{request.param}.zarr"
    deep = (_deep_2022 if request.param == "2022" else _deep_2023)(store, SHALLOWER)
    yield store, deep
    _rmtree_deep(base)


@pytest.mark.slow  # ~5 s a generation; still in CI
@pytest.mark.parametrize("generation", ["2022", "2023"])
def test_info_of_a_hierarchy_1000_levels_deep(generation, deep_tmp):
    """``info`` in a real process with Python's own recursion limit: exit 0 listing the deepest
    array (it exited 70 with RecursionError for the whole store)."""
    store = deep_tmp / "s.zarr"
    deep = (_deep_2022 if generation == "2022" else _deep_2023)(store, DEPTH)
    info = _cli("info", str(store))
    assert info.returncode == 0, info.stderr[-500:]
    assert f"/{deep}" in info.stdout, info.stdout[-500:]


@pytest.mark.slow  # three CLI processes per generation, 400 levels deep
def test_deep_hierarchy_through_the_cli(deep_store, deep_tmp):
    """info, migrate, migrate --skip-damaged and verify deeper than the process's recursion
    limit: exit 0, every node (they exited 70 with RecursionError for the whole store)."""
    store, deep = deep_store
    info = _cli_limited("info", str(store))
    assert info.returncode == 0, info.stderr[-500:]
    assert "RecursionError" not in info.stderr
    import zarr

    for extra in ([], ["--skip-damaged"]):
        dst = deep_tmp / f"dst{len(extra)}"
        done = _cli_limited("migrate", *extra, str(store), str(dst))
        assert done.returncode == 0, done.stderr[-500:]
        np.testing.assert_array_equal(zarr.open_array(str(dst), path=deep, mode="r")[...],
                                      np.arange(4) + (1 if "2023" in store.name else 0))
        assert _cli_limited("verify", str(store), str(dst)).returncode == 0


@pytest.mark.slow  # a child process 400 levels deep; info 1000 levels deep (2022) stays in the fast loop
def test_deep_hierarchy_through_the_api(deep_store):
    """open_draft, the xarray backend's groups and ``xr.open_datatree``, deeper than the
    process's recursion limit: no RecursionError (it was a bare one)."""
    store, deep = deep_store
    code = (
        "import numpy as np, xarray as xr\n"
        "from sharding_store import open_draft\n"
        "from sharding_store.xarray_backend import ShardingStoreBackendEntrypoint as E\n"
        f"print(int(open_draft({str(store)!r}, {deep!r})[...].sum()))\n"
        f"groups = E().open_groups_as_dict({str(store)!r})\n"
        f"print(len(groups), groups[{'/' + deep.rpartition('/')[0]!r}]['x'].dims)\n"
        f"print(len(list(xr.open_datatree({str(store)!r}, engine='sharding_store').subtree)))\n"
    )
    done = _limited(code)
    assert done.returncode == 0, done.stderr[-800:]
    total = 6 + (4 if "2023" in store.name else 0)
    assert done.stdout.splitlines() == [str(total), f"{SHALLOWER + 1} ('t',)", str(SHALLOWER + 1)]

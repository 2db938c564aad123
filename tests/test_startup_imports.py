"""Start-up (issue 15): the command line and the metadata, index and codec modules import
nothing of numcodecs until a codec object is built (``import numcodecs`` loads every codec
module and scans the installed packages' entry points: ~80 ms of a command's start-up).

Each check runs in a fresh interpreter and reads ``sys.modules``; a positive control in the
same process shows that the check sees numcodecs once a codec is parsed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_numcodecs_adapter import ENTRY_POINTS_COUNTED

LIGHT_MODULES = [
    "sharding_store.cli",
    "sharding_store.cli.migrate",
    "sharding_store.cli.reshard",
    "sharding_store.cli.info",
    "sharding_store.errors",
    "sharding_store.formats.keys",
    "sharding_store.formats.draft_metadata",
    "sharding_store.formats.v3_documents",
    "sharding_store.formats.shard_index",
    "sharding_store.formats.v3_layout",
    "sharding_store.codec.chunk_codec",
    "sharding_store.codec._native",
]


def _loaded_after(code: str) -> dict:
    probe = (
        "import sys, json\n"
        + code
        + "\nprint(json.dumps({m: m in sys.modules for m in ('numcodecs', 'numcodecs.blosc', 'numcodecs.zstd', 'numpy')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_cli_parser_imports_neither_numcodecs_nor_numpy():
    seen = _loaded_after("from sharding_store.cli import build_parser\nbuild_parser().parse_args(['migrate', 'a', 'b'])")
    assert seen == {"numcodecs": False, "numcodecs.blosc": False, "numcodecs.zstd": False, "numpy": False}


def test_metadata_index_and_codec_modules_import_numcodecs_only_when_a_codec_is_built():
    imports = "\n".join(f"import {m}" for m in LIGHT_MODULES)
    # importing, binding the native libraries' accessors aside, and parsing an uncompressed array
    doc = {
        "shape": [4], "data_type": "<u2", "chunk_grid": {"type": "regular", "chunk_shape": [2], "separator": "/"},
        "chunk_memory_layout": "C", "fill_value": 0, "extensions": [], "attributes": {}, "compressor": None,
    }
    parse = ("from sharding_store.formats.draft_metadata import parse_array_metadata\n"
             f"parse_array_metadata({json.dumps(doc)!r}.encode(), 'meta/root/a.array.json')")
    assert _loaded_after(imports + "\n" + parse)["numcodecs"] is False
    # the control: a compressor is a numcodecs object, built on first use
    doc["compressor"] = {"codec": "https://purl.org/zarr/spec/codec/zstd/1.0", "configuration": {"level": 1}}
    parse = ("from sharding_store.formats.draft_metadata import parse_array_metadata\n"
             f"m = parse_array_metadata({json.dumps(doc)!r}.encode(), 'meta/root/a.array.json')")
    seen = _loaded_after(imports + "\n" + parse + "\nassert type(m.compressor).__name__ == 'Zstd'")
    assert seen["numcodecs"] is True and seen["numcodecs.zstd"] is True


def test_opening_a_sharded_array_does_not_import_the_lost_transformer_check(tmp_path):
    """``open_draft`` of a sharded array skips ``evidence`` (the lost-transformer check only
    concerns unsharded arrays; importing it cost ~3-5 ms of every open); an unsharded
    array, the control, loads it."""
    from sharding_store.api.arrays import create_draft_array

    create_draft_array(str(tmp_path / "s"), "a", shape=(8,), chunks=(2,), dtype="<u2", chunks_per_shard=(2,))
    create_draft_array(str(tmp_path / "u"), "a", shape=(8,), chunks=(2,), dtype="<u2")
    probe = (
        "import sys\nfrom sharding_store.api.arrays import open_draft\n"
        "open_draft(sys.argv[1], 'a')\nprint('sharding_store.api.evidence' in sys.modules)\n"
    )

    def loaded(path):
        out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1]

    assert loaded(tmp_path / "s") == "False"
    assert loaded(tmp_path / "u") == "True"


#: what a command on a local store must not load (issue 26, start-up): zarr-python 3 (with
#: fsspec and asyncio, ~0.2 s), asyncio itself, and the optional backends and ecosystems
HEAVY = ("zarr", "fsspec", "asyncio", "s3fs", "botocore", "xarray", "dask", "distributed", "tensorstore", "obstore", "icechunk")
SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "zarr-2.18-sharded.zr3"


def _command_loads(argv: list[str], cwd: Path, modules: tuple[str, ...] = HEAVY) -> dict[str, bool]:
    """Run the CLI's ``main(argv)`` in a fresh interpreter; which of ``modules`` it loaded."""
    probe = (
        "import sys, json\nfrom sharding_store.cli import main\ncode = main(sys.argv[1:])\n"
        f"print(json.dumps({{'code': code, **{{m: m in sys.modules for m in {modules!r}}}}}), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True, cwd=cwd)
    return json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
@pytest.mark.slow  # child processes (~2 s)
def test_info_and_migrate_of_a_local_store_load_no_zarr_and_no_backend(tmp_path):
    """The sample (written by zarr-python 2.18) holds a zlib compressor and a datetime64 array:
    what once made the translation ask zarr-python 3. ``info``, ``migrate`` (verified) and
    ``verify`` of local stores load none of :data:`HEAVY`; the control: ``open_v3`` (a zarr-python 3 view) loads zarr."""
    expect = {"code": 0, **dict.fromkeys(HEAVY, False)}
    assert _command_loads(["info", str(SAMPLE)], tmp_path) == expect
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "out")], tmp_path) == expect
    assert _command_loads(["verify", str(SAMPLE), str(tmp_path / "out")], tmp_path) == expect
    # a virtual migration, verified: its reference check reads the file's documents back (a
    # dict handed to ``as_inner``), which once imported zarr to learn it was no zarr Store
    refs = ["migrate", str(SAMPLE), str(tmp_path / "r.json"), "--virtual=references"]
    assert _command_loads(refs, tmp_path) == expect
    probe = f"import sys\nimport sharding_store\nsharding_store.open_v3({str(SAMPLE)!r})\nprint('zarr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"


DRIVERS = ("sharding_store.ops.migration", "sharding_store.ops.resharding", "sharding_store.ops.upgrade",
           "sharding_store.ops.units", "sharding_store.ops.verification")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_info_of_a_2022_store_loads_no_driver(tmp_path):
    """``info`` asks whether an upgrade or a reshard was interrupted, and what they left, from
    the journals' own modules: none of the drivers (~0.1 s of imports) loads. The control:
    ``info`` of a 2023-generation store plans its upgrade, and loads the upgrade driver."""
    assert _command_loads(["info", str(SAMPLE)], tmp_path, DRIVERS) == {"code": 0, **dict.fromkeys(DRIVERS, False)}
    import numpy as np

    from tests.gen2023_writer import write_2023

    write_2023(tmp_path / "g", "a", np.arange(16, dtype="<u2").reshape(4, 4), chunks=(2, 2), cps=(2, 1))
    assert _command_loads(["info", str(tmp_path / "g")], tmp_path, DRIVERS)["sharding_store.ops.upgrade"] is True


CLI_MODULES = tuple(f"sharding_store.cli.{m}" for m in ("info", "migrate", "reshard", "materialize"))


def test_a_command_line_loads_only_its_commands_module(tmp_path):
    """``sharding-store info ...`` imports and builds the parser of ``cli.info`` alone; the
    table naming each command's module lists every command there is; the control: the bare
    command (its help lists every command) loads them all."""
    from sharding_store.cli import COMMANDS, build_parser

    full = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(COMMANDS) == set(full.choices)
    for command in COMMANDS:
        own = next(a for a in build_parser(command)._actions if a.dest == "command")
        assert command in own.choices and set(own.choices) < set(full.choices)
    loaded = _command_loads(["info", str(SAMPLE)], tmp_path, CLI_MODULES)
    assert loaded == {"code": 0, **{m: m.endswith(".info") for m in CLI_MODULES}}
    loaded = _command_loads(["verify", str(tmp_path / "a"), str(tmp_path / "b")], tmp_path, CLI_MODULES)
    assert {m for m in CLI_MODULES if loaded[m]} == {"sharding_store.cli.migrate"} and loaded["code"] != 0
    assert _command_loads([], tmp_path, CLI_MODULES) == {"code": 2, **dict.fromkeys(CLI_MODULES, True)}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_only_a_mistyped_command_line_loads_difflib(tmp_path):
    """The "did you mean" of a mistyped option (:func:`difflib.get_close_matches`) is imported
    when one is mistyped, not by every command's start-up; the control: a mistyped option loads it."""
    assert _command_loads(["info", str(SAMPLE)], tmp_path, ("difflib",)) == {"code": 0, "difflib": False}
    assert _command_loads(["info", str(SAMPLE), "--jsn"], tmp_path, ("difflib",)) == {"code": 2, "difflib": True}


#: what start-up once paid for whatever a command did: the lost-transformer inspector (with
#: chunk decoding), and the crc32c package (its __init__ reads its version through importlib.metadata)
INSPECTOR = ("sharding_store.api.evidence", "crc32c")


def test_migrating_a_sharded_store_loads_neither_the_inspector_nor_the_crc32c_package(tmp_path):
    """A migration (verified) of a store of sharded arrays only, with no layout assumed,
    inspects nothing for lost transformers, and checksums its shard indices with crc32c's
    compiled module alone; the controls: the checksums are right, ``info`` (statistics) loads
    the inspector, and so does migrating an unsharded array (it may have lost its transformer)."""
    import crc32c
    import numpy as np

    from sharding_store.api.arrays import create_draft_array

    a = create_draft_array(str(tmp_path / "s"), "a", shape=(8, 8), chunks=(2, 2), dtype="<u2", chunks_per_shard=(2, 2))
    a[...] = np.arange(64, dtype="<u2").reshape(8, 8)
    loaded = _command_loads(["migrate", str(tmp_path / "s"), str(tmp_path / "d")], tmp_path, INSPECTOR)
    assert loaded == {"code": 0, **dict.fromkeys(INSPECTOR, False)}
    shard = (tmp_path / "d" / "a" / "c" / "0" / "0").read_bytes()
    assert int.from_bytes(shard[-4:], "little") == crc32c.crc32c(shard[-4 - 16 * 4 : -4])
    assert _command_loads(["info", str(tmp_path / "s")], tmp_path, INSPECTOR) == {
        "code": 0, "sharding_store.api.evidence": True, "crc32c": False}
    create_draft_array(str(tmp_path / "u"), "a", shape=(8,), chunks=(2,), dtype="<u2")[...] = 1
    unsharded = _command_loads(["migrate", str(tmp_path / "u"), str(tmp_path / "du")], tmp_path, INSPECTOR)
    assert unsharded == {"code": 0, "sharding_store.api.evidence": True, "crc32c": False}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_commands_without_a_journal_load_no_hashing(tmp_path):
    """``info`` and ``migrate`` ask whether an upgrade journal exists; hashing (OpenSSL's
    start-up, ~11 M instructions) loads with a journal to write or judge, not before. The
    control: a journal's digest loads it."""
    assert _command_loads(["info", str(SAMPLE)], tmp_path, ("hashlib",)) == {"code": 0, "hashlib": False}
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "d")], tmp_path, ("hashlib",)) == {"code": 0, "hashlib": False}
    probe = "import sys\nfrom sharding_store.formats.upgrade_journal import _sha\n_sha(b'')\nprint('hashlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == ["True"]


ENGINE = ("sharding_store.engine.store", "sharding_store.engine.shard_engine")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_info_loads_no_read_write_engine(tmp_path):
    """``info`` reads documents and shard indices: given a path, it does not load the read/write
    engine (``ShardingStore``) to learn that it was not given one. The control: a
    ``ShardingStore`` given to the same entry point is unwrapped to its store."""
    assert _command_loads(["info", str(SAMPLE)], tmp_path, ENGINE) == {"code": 0, **dict.fromkeys(ENGINE, False)}
    probe = ("from sharding_store import ShardingStore\nfrom sharding_store.api.hierarchy import inner_of\n"
             f"s = ShardingStore({str(SAMPLE)!r})\nprint(inner_of(s) is s.inner, inner_of(s.inner) is s.inner)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == ["True", "True"]


ADAPTERS = tuple(f"sharding_store.stores.{m}" for m in ("_obstore", "fsspec_store", "mapping", "zarr_store"))


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_local_store_loads_no_other_store_adapter(tmp_path):
    """``info`` and ``migrate`` of local paths load no adapter of another kind of store
    (obstore, fsspec, a mapping, a zarr-python store); the controls: the package still
    exports each (``from sharding_store.stores import FsspecInner``), and a mapping given to
    ``as_inner`` gets its adapter."""
    expect = {"code": 0, **dict.fromkeys(ADAPTERS, False)}
    assert _command_loads(["info", str(SAMPLE)], tmp_path, ADAPTERS) == expect
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "d")], tmp_path, ADAPTERS) == expect
    probe = ("import sys\nfrom sharding_store.stores import as_inner, FsspecInner, ObstoreInner, MappingInner, ZarrStoreInner\n"
             "print(type(as_inner({})).__name__, FsspecInner.__module__, ZarrStoreInner.__name__, 'zarr' in sys.modules)\n"
             "from zarr.storage import MemoryStore\nprint(type(as_inner(MemoryStore())).__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["MappingInner", "sharding_store.stores.fsspec_store", "ZarrStoreInner", "False", "ZarrStoreInner"]


JOBS = ("sharding_store.ops.jobs", "sharding_store.ops.options", "concurrent.futures")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_info_of_a_zarr_store_loads_no_job_machinery(tmp_path):
    """``info`` asks whether its path is a migration's destination of another kind (a
    reference file, an Icechunk repository) before reading it as Zarr objects; for a directory
    of Zarr objects the answer needs none of the job machinery (thread pools, the options
    classes). The control: ``info`` of a reference file opens it as a destination, and loads
    them (a thread pool's machinery, ``concurrent.futures``, only with a pool: none here)."""
    assert _command_loads(["info", str(SAMPLE)], tmp_path, JOBS) == {"code": 0, **dict.fromkeys(JOBS, False)}
    refs = tmp_path / "refs.json"
    assert _command_loads(["migrate", str(SAMPLE), str(refs), "--virtual=references", "--no-verify"], tmp_path, JOBS)["code"] == 0
    assert _command_loads(["info", str(refs)], tmp_path, JOBS) == {"code": 0, **dict.fromkeys(JOBS[:2], True),
                                                                   "concurrent.futures": False}


REFERENCES = ("sqlite3", "sharding_store.stores.references", "sharding_store.ops.reference_check")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_copy_migration_loads_no_reference_machinery(tmp_path):
    """A migration to a directory of Zarr objects, verified, loads neither the reference file
    (sqlite3) nor the reference check; the control: a virtual migration, verified, does."""
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "d")], tmp_path, REFERENCES) == {
        "code": 0, **dict.fromkeys(REFERENCES, False)}
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "r.json"), "--virtual=references"], tmp_path,
                          REFERENCES) == {"code": 0, **dict.fromkeys(REFERENCES, True)}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_migration_without_verification_loads_no_checker(tmp_path):
    """``migrate --no-verify`` (copy or virtual) does not load the verification driver; the
    control: a verified migration does."""
    checker = ("sharding_store.ops.verification",)
    for dst in ("d", "r.json"):
        argv = ["migrate", str(SAMPLE), str(tmp_path / dst), "--no-verify"] + (["--virtual=references"] if dst.endswith(".json") else [])
        assert _command_loads(argv, tmp_path, checker) == {"code": 0, checker[0]: False}
    assert _command_loads(["migrate", str(SAMPLE), str(tmp_path / "v")], tmp_path, checker) == {"code": 0, checker[0]: True}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_virtual_migration_of_common_documents_loads_no_numcodecs(tmp_path):
    """``migrate --virtual=references`` (verified, and ``--no-verify``) of the zarr-python
    2.18 sample (zstd, blosc, gzip, zlib, lz4; no filters) translates its documents from the
    compressors' configurations (``draft_metadata.KNOWN_COMPRESSORS``): numcodecs (~22 % of a
    command's start-up) is never imported. The control: the same store with one compressor
    outside the table (a gzip level of -1, which numcodecs takes its own way) builds
    numcodecs' codec, and the migration still succeeds with the same document."""
    import shutil  # noqa: PLC0415

    seen = ("numcodecs",)
    for extra in ([], ["--no-verify"]):
        argv = ["migrate", str(SAMPLE), str(tmp_path / f"r{len(extra)}.json"), "--virtual=references", *extra]
        assert _command_loads(argv, tmp_path, seen) == {"code": 0, "numcodecs": False}
    odd = tmp_path / "odd"
    shutil.copytree(SAMPLE, odd)
    doc_path = odd / "meta" / "root" / "images" / "labels.array.json"
    doc = json.loads(doc_path.read_text())
    doc["compressor"]["configuration"]["level"] = -1
    doc_path.write_text(json.dumps(doc))
    argv = ["migrate", str(odd), str(tmp_path / "odd.json"), "--virtual=references"]
    assert _command_loads(argv, tmp_path, seen) == {"code": 0, "numcodecs": True}
    refs = json.loads((tmp_path / "odd.json").read_text())["refs"]
    labels = json.loads(refs["images/labels/zarr.json"])
    assert labels["codecs"][0]["configuration"]["codecs"][-1] == {"name": "gzip", "configuration": {"level": 6}}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_virtual_migration_of_plain_types_loads_no_numpy(tmp_path):
    """The sample's sharded arrays of plain types (float64, uint8, uint16 under zstd, blosc,
    gzip, as zarr-python 2.18 wrote them; without the datetime64 array and the unsharded one,
    whose chunks are decoded to tell whether it lost its sharding transformer): ``migrate --virtual=references``,
    verified and ``--no-verify``, loads neither numpy nor numcodecs (types, fill values and
    codecs from their descriptions; the index checks in Python), and writes the same file
    as with numpy loaded first. The control: the whole sample (a datetime64 array, outside
    the table, and the unsharded array) loads numpy, and succeeds."""
    import shutil  # noqa: PLC0415

    plain = tmp_path / "plain"
    shutil.copytree(SAMPLE, plain)
    for path in ("tables/timestamps", "images/mean"):  # datetime64; unsharded (its chunks are read for evidence)
        (plain / "meta" / "root" / f"{path}.array.json").unlink()
        shutil.rmtree(plain / "data" / "root" / path)
    seen = ("numpy", "numcodecs")
    for extra in ([], ["--no-verify"]):
        argv = ["migrate", str(plain), str(tmp_path / f"r{len(extra)}.json"), "--virtual=references", *extra]
        assert _command_loads(argv, tmp_path, seen) == {"code": 0, "numpy": False, "numcodecs": False}
    probe = "import numpy, sys\nfrom sharding_store.cli import main\nsys.exit(main(sys.argv[1:]))"
    argv = ["migrate", str(plain), str(tmp_path / "with-numpy.json"), "--virtual=references"]
    subprocess.run([sys.executable, "-c", probe, *argv], check=True, cwd=tmp_path, capture_output=True)
    assert (tmp_path / "with-numpy.json").read_bytes() == (tmp_path / "r0.json").read_bytes()
    argv = ["migrate", str(SAMPLE), str(tmp_path / "all.json"), "--virtual=references"]
    assert _command_loads(argv, tmp_path, seen) == {"code": 0, "numpy": True, "numcodecs": False}


#: a command run in a fresh interpreter with ``importlib.metadata.entry_points`` counted (with
#: ``eager``, numcodecs is first imported the usual way: its registry scans at import)
SCAN_PROBE = ENTRY_POINTS_COUNTED + """
if sys.argv[2] == "eager":
    import numcodecs
from sharding_store.cli import main
code = main(sys.argv[3:])
print(json.dumps({"code": code, "calls": calls}), file=sys.stderr)
"""


def _command_scans(argv: list[str], cwd: Path, site: Path, eager: bool = False) -> tuple[dict, str, str]:
    """(exit code and entry-point calls, stdout, the stderr lines before the probe's)."""
    out = subprocess.run([sys.executable, "-c", SCAN_PROBE, str(site), "eager" if eager else "lazy", *argv],
                         capture_output=True, text=True, check=True, cwd=cwd)
    *lines, last = out.stderr.strip().splitlines()
    return json.loads(last), out.stdout, "\n".join(lines)


def _with_filter(path: Path, codec_id: str) -> Path:
    """A draft array (written by this project as zarr-python 2.18 would) whose document names
    the filter ``codec_id``."""
    import numpy as np

    from sharding_store.api.arrays import create_draft_array

    create_draft_array(str(path), "a", shape=(8,), chunks=(4,), dtype="<u2", chunks_per_shard=(2,))[...] = np.arange(8)
    doc_path = path / "meta" / "root" / "a.array.json"
    doc = json.loads(doc_path.read_text())
    doc["attributes"]["filters"] = [{"id": codec_id}]
    doc_path.write_text(json.dumps(doc))
    return path


@pytest.mark.slow  # seven child interpreters (> 3 s)
@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_commands_scan_no_entry_points_and_codecs_resolve_as_before(tmp_path):
    """``info`` and ``migrate`` (verified or not, copy or virtual) never call
    ``importlib.metadata.entry_points`` (numcodecs' registry scans every installed package for
    third-party codecs on import: ~20-30 M instructions, a file read per package). What the scan
    was for still works: a filter announced by a distribution's entry point parses, and an
    unknown one is refused with the same line and exit code as when numcodecs scanned at import
    (the control, ``eager``: numcodecs imported first)."""
    from tests.unit.test_numcodecs_adapter import write_codec_site  # noqa: PLC0415

    site = write_codec_site(tmp_path / "site")
    for argv in (["info", str(SAMPLE)], ["migrate", str(SAMPLE), str(tmp_path / "d")],
                 ["migrate", str(SAMPLE), str(tmp_path / "n"), "--no-verify"],
                 ["migrate", str(SAMPLE), str(tmp_path / "r.json"), "--virtual=references"]):
        assert _command_scans(argv, tmp_path, site)[0] == {"code": 0, "calls": []}, argv
    fake = _with_filter(tmp_path / "fake", "fakecodec")
    lazy, eager = (_command_scans(["info", str(fake)], tmp_path, site, e) for e in (False, True))
    # (the translation then asks zarr-python 3 about the codec: zarr's registry scans too)
    assert lazy[0]["code"] == 0 and lazy[0]["calls"][0] == "numcodecs.registry" and lazy[1:] == eager[1:]
    assert "fakecodec" in lazy[1]
    bad = _with_filter(tmp_path / "bad", "no-such-codec")
    lazy, eager = (_command_scans(["info", str(bad)], tmp_path, site, e) for e in (False, True))
    assert lazy[0]["code"] == eager[0]["code"] == 0 and lazy[1:] == eager[1:]  # info lists it as damaged
    assert "'attributes.filters[0]'" in lazy[1] and "codec not available: ''no-such-codec''" in lazy[1]
    lazy, eager = (_command_scans(["migrate", str(bad), str(tmp_path / f"b{e}")], tmp_path, site, e) for e in (False, True))
    assert lazy[0]["code"] == eager[0]["code"] == 3 and lazy[1:] == eager[1:]  # migrate refuses it
    assert "'attributes.filters[0]'" in lazy[2] and "codec not available: ''no-such-codec''" in lazy[2]


#: what the virtual references path (migrate, verified or not) of a store of plain-typed sharded
#: arrays does not use, and so must not import: socket and uuid (with platform) that only named
#: a lock's holder, a thread pool's machinery (its units run inline; concurrent.futures imports
#: logging), and the codecs and numpy (the ctypes bindings it does use: the index tails' reader)
UNUSED_BY_REFERENCES = ("socket", "uuid", "platform", "concurrent.futures", "logging", "numpy", "numcodecs",
                        "sharding_store.api.evidence", "sharding_store.codec.chunk_codec")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="samples/zarr-2.18-sharded.zr3 is not in this checkout")
def test_a_virtual_migration_loads_no_socket_uuid_or_pool(tmp_path):
    """``migrate --virtual=references`` (verified and ``--no-verify``) of the sample's
    plain-typed sharded arrays loads none of :data:`UNUSED_BY_REFERENCES`, and its lock still
    names this host and a version-4 token as socket and uuid would; the control: a copy
    migration on two jobs loads its pool."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import socket  # noqa: PLC0415
    import uuid  # noqa: PLC0415

    from sharding_store.formats.upgrade_journal import Claim  # noqa: PLC0415

    plain = tmp_path / "plain"
    shutil.copytree(SAMPLE, plain)
    for path in ("tables/timestamps", "images/mean"):
        (plain / "meta" / "root" / f"{path}.array.json").unlink()
        shutil.rmtree(plain / "data" / "root" / path)
    for extra in ([], ["--no-verify"]):
        argv = ["migrate", str(plain), str(tmp_path / f"r{len(extra)}.json"), "--virtual=references", *extra]
        assert _command_loads(argv, tmp_path, UNUSED_BY_REFERENCES) == {"code": 0, **dict.fromkeys(UNUSED_BY_REFERENCES, False)}
    claim = Claim.mine("upgrade")
    assert claim.host == socket.gethostname() and claim.alive() is True
    token = uuid.UUID(hex=claim.token)
    assert token.version == 4 and token.variant == uuid.RFC_4122 and token.hex == claim.token
    assert len({Claim.mine("upgrade").token for _ in range(100)}) == 100
    assert os.getpid() == claim.pid
    pool = ("concurrent.futures",)
    assert _command_loads(["migrate", str(plain), str(tmp_path / "d"), "--jobs=2"], tmp_path, pool) == {
        "code": 0, "concurrent.futures": True}


def test_the_package_and_its_public_names_import():
    """``import sharding_store`` stays light (no driver, no bindings) and every public name
    still resolves, from the package and by ``from sharding_store import X``."""
    probe = ("import sys\nimport sharding_store\n"
             "light = not any(m in sys.modules for m in ('sharding_store.ops.migration', 'sharding_store.codec._native', 'numpy'))\n"
             "names = [getattr(sharding_store, n) for n in sharding_store.__all__]\n"
             "from sharding_store import migrate, verify, MigrateOptions, open_references, ShardingStore\n"
             "print(light, len(names) == len(sharding_store.__all__), migrate is sharding_store.migrate)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True"]

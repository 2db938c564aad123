"""Scenario 6 (``--only gen2023``): the 2023 intermediate generation (issue 14).

(a) ``sharding-store migrate SRC DST`` of a 2023 store (the case's dtype, codec and
    chunks per shard; documents spelled as zarrita.js's August 2023 fixtures: ``endian``
    codecs, ``index_codecs`` without ``index_location``, ``dimension_names: null``, a root
    group without ``attributes``) against ``cp -r`` of the same store. The shards already
    are v1.0 binary with a declared CRC32C, so the migration copies every object verbatim.
(b) ``sharding-store migrate PATH --in-place`` (only documents change) against the number
    of nodes (arrays of one tiny shard each) and against the data size (one array, its
    shards copies of one shard): the time must not grow with the data. Each timed run
    works on a fresh copy of a pristine store (the copy is not timed). Skipped with
    "not available" while the command has no ``--in-place``.

The stores are written here by a small writer of that spelling (numcodecs for the inner
chunks, the index and its CRC32C by hand), outside any timing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # run.py passes itself in (``h``): it runs as __main__, a second import would copy its state
    from run import Bench, Case

PREFIX = "6 gen2023"
#: (b): node counts and data sizes (MiB on disk); the quick run uses the first two of each
NODES = (10, 100, 1000)
SIZES_MIB = (8, 128, 1024)
#: the data-size rows' target: the largest store upgrades within this factor of the smallest
FLAT_FACTOR = 1.5


# ------------------------------------------------------------------ a writer of the 2023 spelling


def _compressor_meta(codec: str, itemsize: int) -> dict:
    if codec == "lz4":  # shuffle as a name, typesize given: as zarrita wrote it
        return {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle",
                                                    "typesize": itemsize, "blocksize": 0}}
    return {"name": "zstd", "configuration": {"level": 1}}  # no checksum field: 2023


def _compressor(codec: str, itemsize: int) -> Any:
    import numcodecs

    if codec == "lz4":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, typesize=itemsize)
    return numcodecs.Zstd(level=1)


def array_doc_2023(shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...], cps: tuple[int, ...],
                   codec: str) -> dict:
    """An array document as zarrita wrote it in August 2023 (before ``bytes`` and
    ``index_location``)."""
    import numpy as np

    endian = {"name": "endian", "configuration": {"endian": "little"}}
    return {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": np.dtype(dtype).name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [c * n for c, n in zip(chunks, cps)]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(chunks),
            "codecs": [endian, _compressor_meta(codec, np.dtype(dtype).itemsize)],
            "index_codecs": [endian, {"name": "crc32c"}]}}],
        "attributes": {}, "dimension_names": None,
    }


def encode_shard(block: Any, chunks: tuple[int, ...], cps: tuple[int, ...], codec: str) -> bytes:
    """One shard: inner chunks (C order, edge chunks padded with 0) then the index of
    little-endian (offset, nbytes) pairs and its CRC32C."""
    import numpy as np
    from crc32c import crc32c

    comp = _compressor(codec, block.dtype.itemsize)
    full = np.zeros([c * n for c, n in zip(chunks, cps)], dtype=block.dtype.newbyteorder("<"))
    full[tuple(slice(0, s) for s in block.shape)] = block
    parts, index, offset = [], np.full((math.prod(cps), 2), 2**64 - 1, dtype="<u8"), 0
    for i, pos in enumerate(np.ndindex(*cps)):
        chunk = full[tuple(slice(p * c, (p + 1) * c) for p, c in zip(pos, chunks))]
        if not block.size or not np.any(chunk):
            continue
        data = bytes(comp.encode(np.ascontiguousarray(chunk)))
        index[i] = (offset, len(data))
        parts.append(data)
        offset += len(data)
    raw = index.tobytes()
    return b"".join(parts) + raw + crc32c(raw).to_bytes(4, "little")


def write_store_2023(dst: Path, x: Any, chunks: tuple[int, ...], cps: tuple[int, ...], codec: str,
                     name: str = "a") -> None:
    """A 2023 store with one array ``name`` holding ``x`` under a root group."""
    import numpy as np

    shutil.rmtree(dst, ignore_errors=True)
    (dst / name).mkdir(parents=True)
    (dst / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    (dst / name / "zarr.json").write_text(json.dumps(array_doc_2023(x.shape, x.dtype.str, chunks, cps, codec)))
    shard = [c * n for c, n in zip(chunks, cps)]
    grid = [math.ceil(s / h) for s, h in zip(x.shape, shard)]
    for pos in np.ndindex(*grid):
        block = np.asarray(x[tuple(slice(p * h, (p + 1) * h) for p, h in zip(pos, shard))])
        if not np.any(block):
            continue
        key = dst / name / "c" / Path(*map(str, pos))
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(encode_shard(block, chunks, cps, codec))


def write_nodes_store(dst: Path, n_arrays: int) -> None:
    """``n_arrays`` tiny arrays (8x8 uint16, one shard each) in groups of 10."""
    import numpy as np

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    (dst / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    x = np.arange(64, dtype="<u2").reshape(8, 8) + 1
    shard = encode_shard(x, (4, 4), (2, 2), "zstd")
    doc = json.dumps(array_doc_2023((8, 8), "<u2", (4, 4), (2, 2), "zstd"))
    for i in range(n_arrays):
        g = dst / f"g{i // 10}"
        if not (g / "zarr.json").exists():
            g.mkdir()
            (g / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
        a = g / f"a{i}"
        (a / "c" / "0").mkdir(parents=True)
        (a / "zarr.json").write_text(doc)
        (a / "c" / "0" / "0").write_bytes(shard)


def write_sized_store(dst: Path, size_mib: int) -> int:
    """One uint16 array of about ``size_mib`` MiB on disk: shards of 1024x1024 (256 inner
    chunks of 64x64, blosc-lz4), every one a copy of the first. Returns the bytes on disk."""
    import numpy as np

    shutil.rmtree(dst, ignore_errors=True)
    rng = np.random.default_rng(6)
    block = (1000 + rng.normal(0, 30, (1024, 1024))).astype("<u2")
    shard = encode_shard(block, (64, 64), (16, 16), "lz4")
    n = max(1, round(size_mib * 2**20 / len(shard)))
    (dst / "a").mkdir(parents=True)
    (dst / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    (dst / "a" / "zarr.json").write_text(json.dumps(array_doc_2023((n * 1024, 1024), "<u2", (64, 64), (16, 16), "lz4")))
    for i in range(n):
        p = dst / "a" / "c" / str(i) / "0"
        p.parent.mkdir(parents=True)
        p.write_bytes(shard)
    return n * len(shard)


# ------------------------------------------------------------------ the scenario


def in_place_available(cli: str) -> str | None:
    """None when ``migrate`` has ``--in-place``, else why not."""
    try:
        out = subprocess.run([cli, "migrate", "--help"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not available ({e})"
    return None if "--in-place" in out else "not available (migrate --in-place not in this tree)"


def _is_final(cli: str, store: Path) -> bool:
    """After an in-place upgrade the store must be final v3: `info` says so (exit 7)."""
    r = subprocess.run([cli, "info", str(store)], capture_output=True, text=True, timeout=600)
    return r.returncode == 7 and "already Zarr v3" in r.stderr


def run(bench: Bench, case: Case, *, first: bool, largest: bool, h: Any) -> None:
    """Rows of scenario 6 for ``case``: (a) for the cases of the largest size in the run,
    (b) once per run (``first``). ``h``: the run.py module (its helpers and state)."""
    Competitor, du_bytes, make_row, measure, run_command = h.Competitor, h.du_bytes, h.make_row, h.measure, h.run_command
    cli = str(h.VENV_BIN / "sharding-store")
    d = bench.data / "gen2023"
    d.mkdir(parents=True, exist_ok=True)
    if largest:
        import numpy as np

        src = d / f"src-{case.key}"
        if not (src / "zarr.json").exists():
            bench.log(f"  writing a 2023 store {src.name}")
            write_store_2023(src, np.load(bench.input_path(case), mmap_mode="r"), (64, 64), case.cps2, case.codec)

        def cmd(argv: list[str], dst: Path, verify: bool) -> dict:
            return bench.timed_command(case, argv, dst, verify)

        comps = [
            Competitor("migrate", lambda v: cmd([cli, "migrate", str(src), str(d / "m-ours")], d / "m-ours", v)),
            Competitor("migrate --no-verify", lambda v: cmd([cli, "migrate", str(src), str(d / "m-nov"),
                                                             "--no-verify"], d / "m-nov", v)),
            Competitor("cp -r", lambda v: cmd(["cp", "-r", str(src), str(d / "m-cp")], d / "m-cp", False)),
        ]
        m = measure(comps, bench.reps(case), not bench.args.quick, bench.log)
        note = (f"2023 store of {du_bytes(src) / 2**20:.0f} MiB on disk (endian codecs, declared CRC32C index, no "
                "index_location): every object copied verbatim; whole commands incl. interpreter start-up")
        bench.rows.append(make_row(f"{PREFIX} copy", case, "sharding-store migrate (verifies)", m["migrate"],
                                   "cp -r", m["cp -r"], note=note))
        bench.rows.append(make_row(f"{PREFIX} copy", case, "sharding-store migrate --no-verify",
                                   m["migrate --no-verify"], "cp -r", m["cp -r"], note=note))
    if not first:
        return
    skip = in_place_available(cli)
    quick = bench.args.quick
    nodes = NODES[:2] if quick else NODES
    sizes = (1, 8) if quick else SIZES_MIB
    stores: list[tuple[str, Path, str]] = []
    for n in nodes:
        p = d / f"nodes-{n}"
        if not (p / "zarr.json").exists():
            write_nodes_store(p, n)
        stores.append(("nodes", p, f"{n} arrays"))
    disk: dict[Path, int] = {}
    for s in sizes:
        p = d / f"size-{s}MiB"
        if not (p / "zarr.json").exists():
            bench.log(f"  writing a {s} MiB 2023 store")
            write_sized_store(p, s)
        disk[p] = du_bytes(p)
        stores.append(("size", p, f"{s} MiB"))

    def in_place(pristine: Path) -> Any:
        def fn(verify: bool) -> dict:
            work = pristine.with_name(pristine.name + "-work")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(pristine, work)
            os.sync()  # untimed: the copy's dirty pages (1 GiB for the largest) are not flushed during the run
            try:
                r = run_command([cli, "migrate", str(work), "--in-place"])
                if verify:
                    r["verified"] = _is_final(cli, work)
                return r
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return fn

    comps = [Competitor(label, in_place(p), skip=skip) for _, p, label in stores]
    m = measure(comps, bench.reps(case), not quick, bench.log)
    for kind in ("nodes", "size"):
        group = [(p, label) for k, p, label in stores if k == kind]
        base_p, base_label = group[0]
        for p, label in group:
            last = kind == "size" and p == group[-1][0] and len(group) > 1
            what = (f"migrate --in-place, {label}" + (f" ({disk[p] / 2**20:.0f} MiB on disk)" if kind == "size" else ""))
            note = ("speedup = the smallest store's time ÷ this one's (1.0: flat); each run upgrades a fresh copy "
                    "(copy not timed), then `info` must call the store final v3")
            row = make_row(f"{PREFIX} in-place {kind}", _label_case(case, label), what, m[label],
                           f"same, {base_label}", m[base_label],
                           target=f"≤ {FLAT_FACTOR}× the {base_label} time" if last else "—",
                           min_speedup=1 / FLAT_FACTOR if last else None, note=note)
            bench.rows.append(row)


def _label_case(case: Case, label: str) -> Any:
    """A stand-in Case for rows that are not of the case matrix (size column = the store)."""
    from types import SimpleNamespace

    return SimpleNamespace(size_label=label, label="2023 store, uint16/blosc-lz4 or zstd",
                           key=f"gen2023-{label.replace(' ', '')}")

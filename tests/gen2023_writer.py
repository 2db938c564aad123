"""A tiny independent writer of 2023-spelled Zarr v3 stores, for tests (numpy, numcodecs and
``crc32c`` only: none of sharding_store's code, so what it writes checks our reader)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import crc32c
import numcodecs
import numpy as np

_V3_NAMES = {"?": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32",
             "u4": "uint32", "i8": "int64", "u8": "uint64", "f2": "float16", "f4": "float32",
             "f8": "float64", "c8": "complex64", "c16": "complex128"}


def _v3_name(dtype: np.dtype) -> str:
    return _V3_NAMES[dtype.str[1:] if dtype.kind != "b" else "?"]


def _fill_json(fill: Any, dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return bool(fill)
    if dtype.kind == "c":
        return [float(np.real(fill)), float(np.imag(fill))]
    if dtype.kind == "f":
        return "NaN" if np.isnan(fill) else float(fill)
    return int(fill)


B2B = {
    "gzip": ({"name": "gzip", "configuration": {"level": 1}}, lambda: numcodecs.GZip(1)),
    "zstd": ({"name": "zstd", "configuration": {"level": 1}}, lambda: numcodecs.Zstd(1)),  # no checksum: 2023
    "blosc": ({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 1, "shuffle": "shuffle"}},  # no typesize
              lambda: numcodecs.Blosc("lz4", 1, shuffle=1)),
    "crc32c": ({"name": "crc32c"}, None),
}


def _b2b_encode(name: str, data: bytes) -> bytes:
    if name == "crc32c":
        return data + crc32c.crc32c(data).to_bytes(4, "little")
    return bytes(B2B[name][1]().encode(data))


def chunk_key(coords: tuple[int, ...], encoding: str, sep: str) -> str:
    if encoding == "default":
        return "c" + "".join(sep + str(c) for c in coords) if coords else "c"
    return sep.join(map(str, coords)) if coords else "0"


def write_2023(
    store: dict | Path,
    path: str,
    data: np.ndarray,
    *,
    chunks: tuple[int, ...],
    cps: tuple[int, ...] | None = None,
    encoding: str = "default",
    sep: str = "/",
    endian: str = "little",
    order: str = "C",
    b2b: tuple[str, ...] = (),
    index: str = "hidden",
    fill: Any = 0,
    spelling: str = "endian",
    absent: frozenset = frozenset(),
) -> None:
    """Write ``data`` as a 2023-spelled array at ``path`` of ``store`` (a dict of key ->
    bytes, or a directory). ``index``: ``"hidden"`` (zarrita May-July 2023: no
    index_codecs, a CRC32C after each index), ``"plain"`` (no index_codecs, no CRC32C),
    ``"crc"`` (``[endian little, crc32c]``), ``"start"`` (final spelling, index first),
    ``"mixed"`` (undeclared; shards alternate hidden and plain: a damaged array).
    ``spelling``: the array->bytes codec as ``endian`` (before 2023-08-23), ``bytes``, or
    ``none`` (no array->bytes codec; little endian only). ``absent``: chunk coordinates
    not written (they read as the fill value)."""
    dtype = data.dtype
    stored = dtype.newbyteorder(">" if endian == "big" else "<") if dtype.itemsize > 1 else dtype
    ab: list[dict] = []
    if order == "F":
        ab.append({"name": "transpose", "configuration": {"order": "F"}})
    if spelling == "endian":
        ab.append({"name": "endian", "configuration": {"endian": endian}})
    elif spelling == "bytes":
        ab.append({"name": "bytes", "configuration": {"endian": endian}} if dtype.itemsize > 1 else {"name": "bytes"})
    inner_codecs = ab + [B2B[n][0] for n in b2b]
    grid = tuple(c * k for c, k in zip(chunks, cps)) if cps is not None else chunks
    if cps is None:
        codecs = inner_codecs
    else:
        cfg: dict[str, Any] = {"chunk_shape": list(chunks), "codecs": inner_codecs}
        if index == "crc":
            cfg["index_codecs"] = [{"name": "endian", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
        elif index == "start":
            cfg["index_codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
            cfg["index_location"] = "start"
        codecs = [{"name": "sharding_indexed", "configuration": cfg}]
    doc = {
        "zarr_format": 3, "node_type": "array", "shape": list(data.shape), "data_type": _v3_name(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid)}},
        "chunk_key_encoding": {"name": encoding, "configuration": {"separator": sep}},
        "fill_value": _fill_json(fill, dtype), "codecs": codecs, "dimension_names": None,
    }
    objects: dict[str, bytes] = {"zarr.json": json.dumps(doc).encode()}

    def payload(c: tuple[int, ...]) -> bytes:
        full = np.full(chunks, fill, dtype=dtype)
        sl = tuple(slice(i * n, min((i + 1) * n, s)) for i, n, s in zip(c, chunks, data.shape))
        full[tuple(slice(0, s.stop - s.start) for s in sl)] = data[sl]
        raw = np.asarray(full, dtype=stored).tobytes(order=order)
        for name in b2b:
            raw = _b2b_encode(name, raw)
        return raw

    n_chunks = tuple(-(-s // c) for s, c in zip(data.shape, chunks))
    wanted = [c for c in np.ndindex(*n_chunks) if c not in absent]
    if cps is None:
        for c in wanted:
            objects[chunk_key(c, encoding, sep)] = payload(c)
    else:
        shards: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for c in wanted:
            shards.setdefault(tuple(i // k for i, k in zip(c, cps)), []).append(c)
        n = math.prod(cps)
        for number, (shard, members) in enumerate(sorted(shards.items())):
            table = np.full((n, 2), 2**64 - 1, dtype="<u8")
            start = 16 * n + 4 if index == "start" else 0
            body = b""
            for c in reversed(members):  # any payload order: the index says where
                p = payload(c)
                local = np.ravel_multi_index(tuple(i % k for i, k in zip(c, cps)), cps) if cps else 0
                table[local] = (start + len(body), len(p))
                body += p
            idx = table.tobytes()
            crc = crc32c.crc32c(idx).to_bytes(4, "little")
            hidden = index in ("hidden", "crc") or (index == "mixed" and number % 2 == 0)
            blob = idx + crc + body if index == "start" else body + idx + (crc if hidden else b"")
            objects[chunk_key(shard, encoding, sep)] = blob
    prefix = f"{path}/" if path else ""
    for k, v in objects.items():
        if isinstance(store, dict):
            store[prefix + k] = v
        else:
            target = store / (prefix + k)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(v)


def write_group(store: dict | Path, path: str, attributes: dict | None = None) -> None:
    doc: dict[str, Any] = {"zarr_format": 3, "node_type": "group"}
    if attributes is not None:
        doc["attributes"] = attributes
    key = f"{path}/zarr.json" if path else "zarr.json"
    if isinstance(store, dict):
        store[key] = json.dumps(doc).encode()
    else:
        (store / key).parent.mkdir(parents=True, exist_ok=True)
        (store / key).write_text(json.dumps(doc))




def shard_blob(payloads: dict[int, bytes], n: int, *, hidden_crc: bool) -> bytes:
    """A shard object: ``payloads`` by flat chunk number, then the index of ``n`` entries
    (and its CRC32C when ``hidden_crc``)."""
    table = np.full((n, 2), 2**64 - 1, dtype="<u8")
    body = b""
    for i, p in sorted(payloads.items()):
        table[i] = (len(body), len(p))
        body += p
    idx = table.tobytes()
    return body + idx + (crc32c.crc32c(idx).to_bytes(4, "little") if hidden_crc else b"")

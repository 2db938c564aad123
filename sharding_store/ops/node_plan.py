"""The node plan of a store walked whole, as ``info`` reports what migrate changes and the
in-place upgrade rewrites it: every node's document in the final spelling (:func:`gen2023.normalise_node`),
each array's chunk objects, its undeclared shard index decided from every shard's tail
(all must agree, else the array is damaged, naming two shards), its declared one checked,
what changes per node; damage recorded per node, never raised.

The copy migration and its verification do not use this module: they read a 2023 store
through the node model (:func:`~sharding_store.api.hierarchy.node_model`, each array's
:class:`~sharding_store.formats.v3_layout.V3ArrayMeta`) with the one driver of every generation
(:mod:`.migrate`, :mod:`.migrate_units`, :mod:`.verify`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.evidence import _batches, decide_reading
from ..api.hierarchy import DraftHierarchy
from ..errors import (
    DraftMetadataError,
    LinkOutsideStoreError,
    ShardCorruptError,
    ShardingStoreError,
)
from ..formats import gen2023
from ..formats.draft_metadata import escape_name
from ..formats.gen2023 import chunk_key_pattern, index_readable, shard_grid, sharding_of
from ..formats.shard_index import entry_lists, index_nbytes, read_index
from ..stores import Inner
from .units import node_key

SKIP_HINT = "--skip-damaged migrates the other nodes and lists the damaged ones"
GROUP_DOCUMENT = {"zarr_format": 3, "node_type": "group", "attributes": {}}
#: "declared": the document declares its index codecs (nothing to decide or append)
Reading = str  # "declared" | "plain" | "crc32c-hidden" | "none" (no shard to read)


def _prefix(path: str) -> str:
    return f"{path}/" if path else ""


@dataclass
class ArrayPlan2023:
    path: str
    normalised: gen2023.Normalised
    objects: list[tuple[str, int | None]]  # chunk keys (full) and sizes
    reading: Reading = "declared"
    n_entries: int = 0

    def document(self, index_checksum: bool) -> dict[str, Any]:
        """The final document once the reading is known."""
        if self.reading == "declared":
            return self.normalised.document
        if self.reading == "crc32c-hidden" or (self.reading in ("plain", "none") and index_checksum):
            return self.normalised.document_for("crc32c-hidden")
        return self.normalised.document_for("plain")

    def appends(self, index_checksum: bool) -> bool:
        """Whether each shard gets the CRC32C of its index appended."""
        return self.reading == "plain" and index_checksum


@dataclass
class Plan2023:
    groups: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (path, final document)
    arrays: list[ArrayPlan2023] = field(default_factory=list)
    damaged: dict[str, ShardingStoreError] = field(default_factory=dict)  # path -> error
    warnings: list[str] = field(default_factory=list)
    #: what a migration changes, per node path (for ``info``); empty: nothing
    changes: dict[str, list[str]] = field(default_factory=dict)
    #: node path -> "array" | "group" | "implicit group" (damaged nodes are in ``damaged``)
    kinds: dict[str, str] = field(default_factory=dict)
    #: groups whose document held ``consolidated_metadata``: left out of the planned
    #: document (never trusted: it may describe other documents than the ones stored)
    consolidated: set[str] = field(default_factory=set)


READING_TEXT = {
    "crc32c-hidden": "every shard index is followed by an undeclared CRC32C (zarrita, 2023-05 to 2023-07): "
                     "declared as index_codecs [bytes little, crc32c], shards copied verbatim",
    "plain": "the shard indices have no checksum: the CRC32C of each index is appended and declared "
             "(--no-index-checksum: declared as [bytes little], shards copied verbatim)",
    "none": "no shard stored: index_codecs [bytes little, crc32c] declared",
}


def check_declared_indices(src: Inner, doc: dict[str, Any], objects: list[tuple[str, int | None]]) -> None:
    """Validate the declared index of every shard (one tail or head read each) when its
    ``index_codecs`` are the plain little-endian entries (with or without a CRC32C): a shard
    whose index is corrupt is refused (:class:`ShardCorruptError`), never copied as valid."""
    cfg = sharding_of(doc)
    if cfg is None or not index_readable(doc):
        return  # the index is inside an encoded object: copied verbatim, the reader checks it
    codecs = cfg["index_codecs"]
    names = [c.get("name") for c in codecs]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        return  # another index chain: copied verbatim, the reader checks it
    if (codecs[0].get("configuration") or {}).get("endian", "little") != "little":
        return
    checksum = names[-1] == "crc32c"
    cps = shard_grid(doc)
    nbytes = index_nbytes(cps, checksum)
    if cfg["index_location"] == "end":
        for (key, size), tail in _bounded_tails(src, objects, nbytes):
            if tail is None:
                raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
            total = tail.size if tail.size is not None else size
            if total is None or total < nbytes or len(tail.data) < nbytes:
                raise ShardCorruptError(f"{key}: shorter than its {nbytes}-byte shard index", key=key)
            # the checks (and the error) of ShardIndex.from_bytes, without numpy's per-call cost
            entry_lists(tail.data[-nbytes:], cps, checksum=checksum, key=key, payload_limit=total - nbytes)
        return
    for key, _ in objects:
        data = src.get(key)
        if data is None:
            raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
        read_index(data, cps, checksum=checksum, index_location="start", key=key)


def _bounded_tails(src: Inner, objects: list[tuple[str, int | None]], nbytes: int) -> Iterator[tuple[tuple[str, int | None], Any]]:
    """Each object with its last ``nbytes``, read in batches of bounded bytes: a caller that
    stops at the first bad shard reads no further, and never holds every tail at once."""
    for batch in _batches(objects, nbytes=nbytes):
        yield from zip(batch, src.get_tails([(k, nbytes) for k, _ in batch]))


def _plan_array(src: Inner, path: str, key: str, norm: gen2023.Normalised, plan: Plan2023,
                left_out: str) -> ArrayPlan2023:
    """One array of :func:`plan_hierarchy`: its chunk objects listed, its undeclared index
    decided (or its declared one checked). Raises what damages this array only: a bad
    shard index, shards that disagree, an object that links out of the store."""
    prefix = _prefix(path)
    pattern = chunk_key_pattern(norm.document)
    objects = []
    for k, size in sorted(src.list_sized(prefix)):
        rest = k[len(prefix):]
        if rest == gen2023.NODE_KEY:
            continue
        if pattern.fullmatch(rest):
            objects.append((k, size))
        else:
            plan.warnings.append(f"{escape_name(k)}: not a chunk key of array '{path or '/'}': {left_out}")
    a = ArrayPlan2023(path, norm, objects)
    if norm.hidden_checksum is None:
        cfg = sharding_of(norm.document)
        if cfg is None or cfg.get("index_location") != "end" or not index_readable(norm.document):
            raise DraftMetadataError(
                f"{key}: an undeclared shard index must be at the end to be decided from the bytes", key=key)
        a.n_entries = math.prod(shard_grid(norm.document))
        a.reading = decide_reading(src, path, objects, a.n_entries)
        plan.changes[path].append(f"shard index: {READING_TEXT[a.reading]}")
    elif sharding_of(norm.document) is not None:
        check_declared_indices(src, norm.document, objects)
    return a


def plan_hierarchy(model: DraftHierarchy, *, left_out: str = "not copied") -> Plan2023:
    """Every node of the walked hierarchy ``model`` (:func:`~sharding_store.api.hierarchy.node_model`
    of a per-node store: one walk, each document normalised once): its final documents, each
    array's chunk objects listed and its undeclared index decided. No second walk: the
    model's nodes, documents and damage are the plan's. Damage is recorded, not raised.
    ``left_out``: what the warning about a key that is no chunk key says happens to it."""
    if not model.walked:
        raise TypeError("plan_hierarchy plans a walked (per-node) node model")
    plan = Plan2023()
    plan.damaged.update(model.damaged)  # illegal names, damaged documents, nodes below them
    for path in sorted(model.nodes, key=lambda p: p.split("/") if p else []):  # the walk's order
        norm = model.nodes[path].spelled
        if norm is None:  # a group without a document
            plan.groups.append((path, dict(GROUP_DOCUMENT)))
            plan.kinds[path] = "implicit group"
            plan.changes[path] = [IMPLICIT_TEXT]
            continue
        plan.kinds[path] = norm.node_type
        plan.changes[path] = list(norm.changes)
        if norm.node_type == "group":
            plan.groups.append((path, _without_consolidated(plan, path, norm.document)))
            continue
        try:
            plan.arrays.append(_plan_array(model.inner, path, norm.key, norm, plan, left_out))
        except (DraftMetadataError, ShardCorruptError, LinkOutsideStoreError) as e:
            plan.damaged[path] = e
    _leave_out_below_damage(plan)
    plan.groups.sort(key=lambda g: (g[0] == "", -g[0].count("/"), g[0]))  # deepest first, the root last
    return plan


#: what ``info`` and the plan say about a group without a document
IMPLICIT_TEXT = "no zarr.json (an implicit group): an explicit group document is written"


#: what ``info`` and the plan say about a group's stale consolidated metadata
CONSOLIDATED_TEXT = ("consolidated_metadata left out (never trusted: it may describe other documents than the "
                     "stored ones); the root's is written again from the migrated documents")


def _without_consolidated(plan: Plan2023, path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A group document without its ``consolidated_metadata`` (recorded in the plan): a
    consolidated block is derived from the documents, so the migrated documents decide it,
    never the block found (zarr-python 3's ``consolidate_metadata`` fills in defaults, and
    a block may simply be stale)."""
    if "consolidated_metadata" not in doc:
        return doc
    plan.consolidated.add(path)
    plan.changes.setdefault(path, []).append(CONSOLIDATED_TEXT)
    return {k: v for k, v in doc.items() if k != "consolidated_metadata"}


def _below(path: str, root: str) -> bool:
    return path != root and (root == "" or path.startswith(root + "/"))


def _leave_out_below_damage(plan: Plan2023) -> None:
    """Nodes below a damaged node (a group whose document is damaged) are left out too: the
    destination would otherwise hold them under a group without a document, which final v3
    does not have. Each is reported as damaged, naming the group."""
    roots = sorted(plan.damaged, key=lambda p: (p.count("/"), p))
    if not roots:
        return

    def top(path: str) -> str | None:
        return next((r for r in roots if _below(path, r)), None)

    for path, _ in list(plan.groups):
        r = top(path)
        if r is not None:
            plan.damaged[path] = DraftMetadataError(
                f"{node_key(path)}: below the damaged node '{r or '/'}' ({plan.damaged[r].key})", key=node_key(path))
    for a in plan.arrays:
        r = top(a.path)
        if r is not None:
            plan.damaged[a.path] = DraftMetadataError(
                f"{node_key(a.path)}: below the damaged node '{r or '/'}' ({plan.damaged[r].key})", key=node_key(a.path))
    plan.groups = [g for g in plan.groups if g[0] not in plan.damaged]
    plan.arrays = [a for a in plan.arrays if a.path not in plan.damaged]
    for path in list(plan.kinds):
        if path in plan.damaged:
            del plan.kinds[path]


def refuse_damage(plan: Plan2023, skip_damaged: bool, consequence: str) -> None:
    """Raise the first damage (its own class, naming its key) unless ``skip_damaged``."""
    if plan.damaged and not skip_damaged:
        path, error = next(iter(plan.damaged.items()))
        raise type(error)(f"{error} (node '{escape_name(path) or '/'}'; {consequence}; {SKIP_HINT})", key=error.key)


__all__: Sequence[str] = ["plan_hierarchy", "refuse_damage", "decide_reading", "check_declared_indices"]

"""Walking a draft-era hierarchy: which nodes exist, and what each one is.

Draft hierarchies have explicit groups (``meta/root/<p>.group.json``), *implicit*
groups (no document; anything lies under ``meta/root/<p>/``) and arrays. Draft
consolidated metadata (``meta/root/consolidated/.zmetadata`` and the
``consolidated`` group document zarr-python 2.x writes beside it) is bookkeeping, not
a user group, and is left out. Only metadata keys are listed: data keys are never
enumerated here, so the walk costs one listing of ``meta/`` plus one get per array.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import draft_metadata as dm
from .errors import ShardingStoreError, StoreNotFoundError, UsageError
from .inner import Inner, as_inner

CONSOLIDATED_PATH = "consolidated"


@dataclass(frozen=True)
class Node:
    path: str  # "" for the root
    kind: Literal["array", "group"]
    explicit: bool = True  # False for implicit groups
    attributes: dict = field(default_factory=dict)
    meta: dm.DraftArrayMeta | None = None  # arrays only

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


def inner_of(store_or_url: Any, storage_options: Mapping[str, Any] | None = None) -> Inner:
    """The raw store below anything our API accepts (a ``ShardingStore`` is unwrapped)."""
    from .store import ShardingStore

    if isinstance(store_or_url, ShardingStore):
        return store_or_url.inner
    return as_inner(store_or_url, storage_options=storage_options)


class DraftHierarchy:
    """The nodes of one draft-era hierarchy, read once from its metadata keys.

    ``strict=False`` records nodes whose documents are invalid in ``damaged``
    (path -> error) instead of raising, so the rest of a hierarchy can still be
    inspected or migrated.
    """

    def __init__(self, inner: Inner, *, location: str = "store", strict: bool = True) -> None:
        self.inner = inner
        self.strict = strict
        self.damaged: dict[str, ShardingStoreError] = {}
        raw = inner.get(dm.ENTRY_POINT_KEY)
        if raw is None:
            raise StoreNotFoundError(
                f"{location}: no draft-era hierarchy here (no 'zarr.json' entry point)", key=dm.ENTRY_POINT_KEY
            )
        self.entry_point = dm.parse_entry_point(raw)
        self.suffix = self.entry_point.metadata_key_suffix
        self.nodes: dict[str, Node] = self._read_nodes()

    def _read_nodes(self) -> dict[str, Node]:
        docs: dict[str, tuple[str, str]] = {}  # path -> (kind, key)
        implicit: set[str] = {""}
        has_consolidated = False
        for key in self.inner.list_prefix("meta/"):
            if key == dm.CONSOLIDATED_KEY:
                has_consolidated = True
                continue
            parsed = dm.path_from_meta_key(key, self.suffix)
            if parsed is None:
                continue
            path, kind = parsed
            docs[path] = (kind, key)
            parts = path.split("/") if path else []
            implicit.update("/".join(parts[:i]) for i in range(len(parts)))
        if has_consolidated and docs.get(CONSOLIDATED_PATH, ("", ""))[0] == "group":
            if not any(p.startswith(CONSOLIDATED_PATH + "/") for p in docs):
                del docs[CONSOLIDATED_PATH]
        nodes: dict[str, Node] = {}
        for path, (kind, key) in docs.items():
            raw = self.inner.get(key)
            if raw is None:  # vanished between list and get
                continue
            try:
                if kind == "array":
                    meta = dm.parse_array_metadata(raw, key, path)
                    nodes[path] = Node(path, "array", True, meta.attributes, meta)
                else:
                    nodes[path] = Node(path, "group", True, dm.parse_group_metadata(raw, key))
            except ShardingStoreError as e:
                if self.strict:
                    raise
                self.damaged[path] = e
        for path in implicit:
            nodes.setdefault(path, Node(path, "group", explicit=False))
        return dict(sorted(nodes.items(), key=lambda kv: (kv[0].count("/") if kv[0] else -1, kv[0])))

    def assume_sharded(self, assume: Mapping[str, int | Sequence[int]] | None) -> None:
        """Treat unsharded arrays as sharded with the given ``chunks_per_shard`` (path -> cps).

        For arrays whose metadata lost its ``storage_transformers`` to zarr-python 2.x's
        ``resize()``/``append()`` while their objects are still shards; ``cps`` is read as
        the draft document spelled it (a shorter list is padded with 1s). Only the in-memory
        metadata changes; an unknown path, a group, or an array that is already sharded is
        refused (:class:`UsageError`), so a typo cannot silently do nothing.
        """
        for raw_path, cps in (assume or {}).items():
            path = dm.normalize_path(raw_path)
            option = f"--assume-chunks-per-shard {raw_path}"
            if path in self.damaged:
                raise UsageError(f"{option}: array '{path or '/'}' is damaged ({self.damaged[path]})", key=path)
            node = self.nodes.get(path)
            if node is None or node.meta is None:
                what = "no array" if node is None else "a group, not an array"
                raise UsageError(f"{option}: '{path or '/'}' is {what}", key=path)
            if node.meta.is_sharded:
                raise UsageError(
                    f"{option}: array '{path or '/'}' is sharded already (chunks_per_shard {list(node.meta.chunks_per_shard or ())})",
                    key=path,
                )
            values = (cps,) if isinstance(cps, int) else tuple(cps)
            try:  # as the draft metadata said it: a shorter list is padded with 1s
                meta = node.meta.with_chunks_per_shard(values)
            except ShardingStoreError as e:
                raise UsageError(f"{option}: {e}", key=path) from None
            self.nodes[path] = replace(node, meta=meta)

    def node(self, path: str) -> Node:
        path = dm.normalize_path(path)
        try:
            return self.nodes[path]
        except KeyError:
            raise StoreNotFoundError(f"no array or group at '{path or '/'}'", key=path) from None

    def arrays(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.kind == "array")

    def groups(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.kind == "group")

    def children(self, path: str) -> list[Node]:
        path = dm.normalize_path(path)
        return [n for p, n in self.nodes.items() if p and p.rpartition("/")[0] == path]

    def tree(self) -> str:
        """A one-node-per-line tree, arrays with shape and dtype."""
        lines = []
        for path in sorted(self.nodes, key=lambda p: p.split("/") if p else []):  # depth-first
            n = self.nodes[path]
            depth = path.count("/") + 1 if path else 0
            name = n.name or "/"
            if n.kind == "array" and n.meta is not None:
                m = n.meta
                shard = f" shards {m.chunks_per_shard}" if m.is_sharded else ""
                lines.append(f"{'  ' * depth}{name} {m.shape} {m.dtype.str} chunks {m.chunks}{shard}")
            else:
                lines.append(f"{'  ' * depth}{name}{'' if n.explicit else ' (implicit)'}")
        return "\n".join(lines)


def open_hierarchy(
    store_or_url: Any,
    *,
    storage_options: Mapping[str, Any] | None = None,
    strict: bool = True,
    assume_chunks_per_shard: Mapping[str, int | Sequence[int]] | None = None,
) -> DraftHierarchy:
    location = store_or_url if isinstance(store_or_url, str) else type(store_or_url).__name__
    h = DraftHierarchy(inner_of(store_or_url, storage_options), location=str(location), strict=strict)
    h.assume_sharded(assume_chunks_per_shard)
    return h

"""Walking a draft-era hierarchy: which nodes exist, and what each one is.

Before anything else, :func:`detect_generation` looks at the root documents: a final
Zarr v3 or a Zarr v2 store given where a draft-era one is expected is refused with what it
is (exit 7), not reported as invalid draft metadata.

Draft hierarchies have explicit groups (``meta/root/<p>.group.json``), *implicit*
groups (no document; anything lies under ``meta/root/<p>/``) and arrays. Draft
consolidated metadata (``meta/root/consolidated/.zmetadata`` and the
``consolidated`` group document zarr-python 2.x writes beside it) is bookkeeping, not
a user group, and is left out. Only metadata keys are listed: data keys are never
enumerated here, so the walk costs one listing of ``meta/`` plus one get per array.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Literal

from ..errors import DraftMetadataError, OtherGenerationError, ShardingStoreError, StoreNotFoundError, UsageError
from ..formats import draft_metadata as dm
from ..formats import gen2023
from ..formats.v3_layout import V3ArrayMeta, geometry_from_v3, layout_from_v3
from ..stores import Inner, as_inner

CONSOLIDATED_PATH = "consolidated"
#: Root documents of a Zarr v2 store, in the order they are looked for.
V2_ROOT_KEYS = (".zgroup", ".zarray", ".zmetadata", ".zattrs")


class Generation(Enum):
    """Which generation of Zarr a store's root documents belong to."""

    #: ``zarr.json`` is a draft entry point (``zarr_format`` = the 2022 protocol URL)
    DRAFT_2022 = "draft-era Zarr v3 (2022)"
    #: per-node ``zarr.json`` documents (``zarr_format: 3``, ``node_type``) of which at least one
    #: is spelled as in 2023, before v1.0 (``gen2023``), or no ``zarr.json`` at the root but
    #: node documents below it (an implicit root group)
    DRAFT_2023 = "draft-era Zarr v3 (2023 intermediate)"
    #: ``zarr.json`` is a Zarr v3.0 node document (``zarr_format: 3`` and a ``node_type``),
    #: and so is every node below it
    FINAL_V3 = "Zarr v3"
    #: no ``zarr.json``, but ``.zgroup``/``.zarray``/``.zmetadata``/``.zattrs`` at the root
    ZARR_V2 = "Zarr v2"
    #: a ``zarr.json`` of no known generation (damaged, or newer than this code)
    UNKNOWN = "unknown"
    #: no Zarr document at the root: a missing or empty location, or not a Zarr store
    NONE = "none"


_UNREAD: Any = object()

#: the documents of a Zarr v2 node (in a per-node v3 hierarchy: another generation)
V2_NODE_KEYS = (".zarray", ".zgroup")
#: directories without a node document listed, below a root without a ``zarr.json``, before
#: the search for a first node document gives up with an error naming this limit (a store
#: given at a directory that is no Zarr store at all); once a node is found, nothing is cut off
MAX_EMPTY_LISTINGS = 4096


@dataclass(frozen=True)
class V3Node:
    """One node document of a per-node (2023 or final v3) hierarchy."""

    path: str  # "" for the root
    key: str  # its ``zarr.json``
    raw: bytes
    spelling: gen2023.NodeClass  # "final", "2023" or "unknown" (damaged: its own node only)
    node_type: str | None


@dataclass
class V3Walk:
    """Every node document of a per-node hierarchy, found in one walk (:func:`walk_v3_nodes`)."""

    nodes: list[V3Node]
    #: groups without a document that have nodes below them ("" when the root has none)
    implicit: list[str]
    #: nodes whose path breaks the node-name rules (path as written -> the error naming it)
    damaged: dict[str, ShardingStoreError] = field(default_factory=dict)

    @property
    def generation(self) -> Generation:
        return Generation.DRAFT_2023 if self.first_2023() is not None else Generation.FINAL_V3

    def first_2023(self) -> str | None:
        """The key that makes this hierarchy 2023: the first node spelled as in 2023, or the
        first node below an implicit group (v1.0 has none); None for a final hierarchy."""
        implicit = set(self.implicit)
        for n in self.nodes:
            if n.spelling == "2023" or any(a in implicit for a in _ancestors(n.path)):
                return n.key
        return None


def _mixed(key: str, what: str) -> DraftMetadataError:
    return DraftMetadataError(
        f"{key}: the hierarchy mixes generations: {what} inside a hierarchy of per-node zarr.json "
        "documents (Zarr v3 / 2023); migrate or remove that part first",
        key=key,
    )


def walk_v3_nodes(inner: Inner, root_raw: bytes | None = _UNREAD,
                  root_class: tuple[gen2023.NodeClass, str | None] | None = None) -> V3Walk:
    """Walk a per-node hierarchy once: list each group's directory (never below an array:
    chunk keys are not enumerated), read each ``zarr.json`` and classify it once
    (:func:`gen2023.classify`). ``root_raw``: the root's ``zarr.json`` when the caller has
    read it (None: absent); ``root_class``: its classification when the caller has made it.
    Iterative: any depth.

    Every directory below a group is walked: nothing is cut off once the store has shown it is
    a v3 hierarchy (a root ``zarr.json``, or a node document found). Only the search for a
    first node document below a root without one is bounded: after :data:`MAX_EMPTY_LISTINGS`
    document-less directories it raises :class:`StoreNotFoundError` naming the limit and the
    directory (a store given at a directory that is no Zarr store at all).

    A node whose path breaks the node-name rules (:func:`~sharding_store.formats.draft_metadata.normalize_path`:
    ``A-Za-z0-9._-`` segments, no ``.``/``..``, no empty segment) is damaged: it is recorded
    in ``damaged`` under its path as written (the first illegal one above a document), never
    listed as a node, and nothing below it is.

    A hierarchy that mixes generations raises :class:`DraftMetadataError` naming the first
    node (in walk order: depth first, by name) of the other one: a Zarr v2 node
    (``.zarray``/``.zgroup``) or a 2022 draft document (an entry point below the root, a
    ``meta/root`` tree). 2023-spelled and final-spelled nodes do not mix generations:
    a final v1.0 document is also how a 2023 writer spelled many nodes (groups, and arrays of
    late 2023), so they are one hierarchy, DRAFT_2023 if any node is 2023.
    """
    state = _WalkState(root_raw is not _UNREAD and root_raw is not None, root_class)
    stack: list[tuple[str, str, str | None]] = [("", "", None)]  # (key prefix, node path, illegal path above)
    while stack:
        prefix, path, illegal = stack.pop()
        keys, prefixes = inner.list_dir(prefix)
        names = {k[len(prefix):] for k in keys}
        given = path == "" and state.evidence and root_raw is not _UNREAD
        if gen2023.NODE_KEY in names or given:
            raw = root_raw if given else inner.get(prefix + gen2023.NODE_KEY)
            if raw is None:  # vanished between list and get
                continue
            if not state.node(path, prefix, names, bytes(raw), illegal):
                continue  # an array (or an unreadable or damaged node): its directory holds chunks
        else:
            state.directory(inner, path, prefix, keys, prefixes)
        for sub in sorted(prefixes, reverse=True):  # popped in name order
            name = sub[len(prefix):]
            name = name[:-1] if name.endswith("/") else name
            child = f"{path}/{name}" if path else name
            stack.append((sub, child, illegal if illegal is not None or _legal_name(name) else child))
    return state.result()


def _legal_name(name: str) -> bool:
    """Whether ``name`` is a legal node name (one path segment; draft_metadata's rules)."""
    return name not in ("", ".", "..") and dm.LEGAL_NAME.fullmatch(name) is not None


class _WalkState:
    """What :func:`walk_v3_nodes` has found so far."""

    def __init__(self, evidence: bool, root_class: tuple[gen2023.NodeClass, str | None] | None = None) -> None:
        self.evidence = evidence  # a root zarr.json, or a node document found: walk everything
        self.root_class = root_class  # the given root document's classification, if made
        self.searched = 0  # document-less directories listed while there was no evidence
        self.nodes: list[V3Node] = []
        self.damaged: dict[str, ShardingStoreError] = {}
        self.pending: dict[str, bool] = {}  # implicit candidate path -> has a node below

    def node(self, path: str, prefix: str, names: set[str], raw: bytes, illegal: str | None) -> bool:
        """Record the node document at ``prefix``; True when the walk goes on below it (a group)."""
        doc_key = prefix + gen2023.NODE_KEY
        known = self.root_class if path == "" else None
        spelling, node_type = known if known is not None else gen2023.classify(raw, doc_key)
        if spelling == "draft-2022":
            raise _mixed(doc_key, "a draft-era (2022) entry point")
        for v2 in V2_NODE_KEYS:
            if v2 in names:
                raise _mixed(prefix + v2, "a Zarr v2 node document")
        self.evidence = True
        self._found_below(illegal if illegal is not None else path)
        if illegal is not None:
            if illegal not in self.damaged:
                self.damaged[illegal] = _illegal_name(illegal, doc_key)
            return False
        self.nodes.append(V3Node(path, doc_key, raw, spelling, node_type))
        return node_type == "group"

    def directory(self, inner: Inner, path: str, prefix: str, keys: list[str], prefixes: list[str]) -> None:
        """Record a directory without a node document (an implicit group if nodes lie below)."""
        for v2 in V2_NODE_KEYS:
            if prefix + v2 in keys:
                raise _mixed(prefix + v2, "a Zarr v2 node document")
        if path == "meta" and _draft_2022_tree(inner, keys, prefixes):
            raise _mixed("meta/root", "a draft-era (2022) metadata tree")
        self.pending.setdefault(path, False)
        if self.evidence:
            return
        self.searched += 1
        if self.searched > MAX_EMPTY_LISTINGS:
            raise StoreNotFoundError(
                f"{dm.escape_name(prefix) or '/'}: no Zarr node document (zarr.json) in the first {MAX_EMPTY_LISTINGS} "
                "directories of a store without a root zarr.json: the search stops there (the limit "
                "MAX_EMPTY_LISTINGS); give the hierarchy's own directory, or add its root zarr.json",
                key=prefix or dm.ENTRY_POINT_KEY,
            )

    def _found_below(self, path: str) -> None:
        """Mark the legal ancestors of ``path`` as groups with a node below them."""
        for anc in _ancestors(path):
            if anc in self.pending:
                self.pending[anc] = True

    def result(self) -> V3Walk:
        implicit = sorted((p for p, found in self.pending.items() if found and p not in self.damaged),
                          key=lambda p: (p.count("/") if p else -1, p))
        return V3Walk(self.nodes, implicit, self.damaged)


def _illegal_name(path: str, key: str) -> DraftMetadataError:
    """The damage of a node whose path breaks the node-name rules (named escaped)."""
    try:
        dm.normalize_path(path)
        reason = "illegal node name"
    except DraftMetadataError as e:
        reason = str(e)
    return DraftMetadataError(f"{dm.escape_name(key)}: illegal node name: {reason}", key=key)


def _draft_2022_tree(inner: Inner, keys: list[str], prefixes: list[str]) -> bool:
    """Whether ``meta/`` (a directory without a node document) holds draft (2022) metadata:
    ``meta/root.group.json`` or a ``*.array.json``/``*.group.json`` below ``meta/root/``
    (not just a v3 group that happens to be called ``meta/root``)."""
    if "meta/root.group.json" in keys or "meta/root.array.json" in keys:
        return True
    if "meta/root/" not in prefixes:
        return False
    return any(k.endswith((".array.json", ".group.json")) for k in inner.list_prefix("meta/root/"))


def _ancestors(path: str) -> list[str]:
    if not path:
        return []
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts))]


def _generation_of(spelling: gen2023.NodeClass) -> Generation:
    """The generation a root ``zarr.json`` of this classification says (before the walk)."""
    if spelling == "draft-2022":
        return Generation.DRAFT_2022
    if spelling in ("final", "2023"):
        return Generation.FINAL_V3 if spelling == "final" else Generation.DRAFT_2023
    return Generation.UNKNOWN


def _entry_point_generation(raw: bytes) -> Generation:
    return _generation_of(gen2023.classify_node(raw, dm.ENTRY_POINT_KEY))


@dataclass(frozen=True)
class Detection:
    """What a store is (:func:`detect`): its generation, the key that told (None for NONE),
    and the walk of a per-node hierarchy when one was made (the node model is built from it:
    each node is listed, read and classified once per operation)."""

    generation: Generation
    key: str | None
    walk: V3Walk | None = None

    @property
    def per_node(self) -> bool:
        """Whether the root is not a 2022 entry point (a per-node store, or none): one an
        in-place upgrade may have left half done."""
        return self.generation is not Generation.DRAFT_2022


def detect_generation(
    inner: Inner, entry_point: bytes | None = _UNREAD, *, deep: bool = True
) -> tuple[Generation, str | None]:
    """The store's generation and the key that told: :func:`detect` without its walk."""
    found = detect(inner, entry_point, deep=deep)
    return found.generation, found.key


def detect(inner: Inner, entry_point: bytes | None = _UNREAD, *, deep: bool = True) -> Detection:
    """The store's generation, and the key that told (None for NONE).

    ``entry_point``: the ``zarr.json`` bytes when the caller has read them already (None:
    absent). A 2022 entry point, a Zarr v2 root or a ``zarr.json`` of no known generation
    decide at once (up to four existence checks for v2). A v3 node document at the root,
    or none at all, is decided by the nodes below (:func:`walk_v3_nodes`, one listing per
    group and one get per node): FINAL_V3 when every one is final v1.0 (the key: the root
    ``zarr.json``), DRAFT_2023 when one is spelled as in 2023 or the root has no document
    and nodes lie below it (the key: that node's ``zarr.json``), NONE when there is no
    Zarr document at all. A hierarchy mixing generations raises
    :class:`DraftMetadataError` naming the first node of the other one.

    ``deep=False`` decides a v3 root from its own document, without walking the nodes
    below (for a destination whose every node is compared afterwards anyway). A store
    holding nothing but a draft (2022) ``meta/root`` tree and ``data/`` is NONE: its
    ``zarr.json`` entry point is missing (the defect to report), nothing is mixed.
    """
    raw = inner.get(dm.ENTRY_POINT_KEY) if entry_point is _UNREAD else entry_point
    if raw is not None:
        root_class = gen2023.classify(raw, dm.ENTRY_POINT_KEY)
        generation = _generation_of(root_class[0])
        if generation in (Generation.DRAFT_2022, Generation.UNKNOWN) or not deep:
            return Detection(generation, dm.ENTRY_POINT_KEY)
        walk = walk_v3_nodes(inner, raw, root_class)
        key = walk.first_2023()
        if key is not None:
            return Detection(Generation.DRAFT_2023, key, walk)
        return Detection(Generation.FINAL_V3, dm.ENTRY_POINT_KEY, walk)
    for key in V2_ROOT_KEYS:
        if inner.exists(key):
            return Detection(Generation.ZARR_V2, key)
    top = set(inner.list_dir("")[1])
    if "meta/" in top and top <= {"meta/", "data/"} and _draft_2022_tree(inner, *inner.list_dir("meta/")):
        return Detection(Generation.NONE, None)  # only a 2022 layout is here: its entry point is missing
    walk = walk_v3_nodes(inner, None)
    if walk.nodes:
        return Detection(Generation.DRAFT_2023, walk.nodes[0].key, walk)
    return Detection(Generation.NONE, None, walk)


def is_draft_2023(inner: Inner, raw: bytes | None = _UNREAD) -> bool:
    """Whether ``inner`` holds a hierarchy of the 2023 intermediate generation (for the drivers'
    one hook; ``raw``: the root ``zarr.json`` when the caller has read it, None: absent). A
    2022 entry point decides at once; otherwise the node documents decide
    (:func:`detect_generation`; a mixed hierarchy raises :class:`DraftMetadataError`)."""
    if raw is _UNREAD:
        raw = inner.get(dm.ENTRY_POINT_KEY)
    if raw is not None and _entry_point_generation(raw) in (Generation.DRAFT_2022, Generation.UNKNOWN):
        return False
    return detect_generation(inner, raw)[0] is Generation.DRAFT_2023


def draft_entry_point(inner: Inner, raw: bytes | None, location: str,
                      detected: Detection | None = None) -> dm.EntryPoint:
    """The entry point of the draft-era hierarchy in ``inner`` (``raw``: its ``zarr.json``;
    ``detected``: what :func:`detect` said of it, when the caller asked).

    A store of another generation raises :class:`StoreNotFoundError` (exit 7) saying what
    it is (:class:`OtherGenerationError` for final v3 and v2: it names the generation); a
    ``zarr.json`` of no known generation is parsed as a draft entry point, so its defect is
    reported as invalid metadata (exit 3) naming the field.
    """
    generation, key = (detected.generation, detected.key) if detected is not None else detect_generation(inner, raw)
    if generation is Generation.DRAFT_2022 or (generation is Generation.UNKNOWN and raw is not None):
        return dm.parse_entry_point(raw)  # type: ignore[arg-type]
    if generation is Generation.FINAL_V3:
        raise OtherGenerationError(location, generation.value, "already Zarr v3 (its zarr.json has zarr_format 3)",
                                   "nothing to migrate; open it with zarr-python 3", key=key or dm.ENTRY_POINT_KEY)
    if generation is Generation.ZARR_V2:
        raise OtherGenerationError(location, generation.value, f"Zarr v2 ({key} at the root)", "nothing to migrate; "
                                   "sharding-store reads draft-era (2022) Zarr v3 stores", key=key or dm.ENTRY_POINT_KEY)
    if generation is Generation.DRAFT_2023:
        message = (
            f"{location}: a draft-era Zarr v3 hierarchy of the 2023 intermediate generation ({key} is "
            "spelled as before v1.0), not the 2022 layout this command reads"
        )
    else:
        message = f"{location}: no draft-era hierarchy here (no 'zarr.json' entry point)"
    raise StoreNotFoundError(message, key=key or dm.ENTRY_POINT_KEY)


def require_final_v3(inner: Inner, location: str, *, deep: bool = True) -> None:
    """Raise :class:`StoreNotFoundError` (exit 7) unless ``inner`` holds a final Zarr v3
    hierarchy (or array), saying what it holds instead (for a migration's destination;
    ``deep``: see :func:`detect_generation`)."""
    generation, key = detect_generation(inner, deep=deep)
    if generation is Generation.FINAL_V3:
        return
    what = {
        Generation.DRAFT_2022: "a draft-era (2022) hierarchy",
        Generation.DRAFT_2023: f"a draft-era (2023 intermediate) hierarchy ({key} is spelled as before v1.0)",
        Generation.ZARR_V2: f"a Zarr v2 store ({key} at the root)",
        Generation.UNKNOWN: "a zarr.json of no known Zarr version",
        Generation.NONE: "no zarr.json (missing or empty, or not a Zarr store)",
    }[generation]
    raise StoreNotFoundError(f"{location}: not a Zarr v3 hierarchy: {what}", key=key or dm.ENTRY_POINT_KEY)


@dataclass(frozen=True)
class Node:
    path: str  # "" for the root
    kind: Literal["array", "group"]
    explicit: bool = True  # False for implicit groups
    attributes: dict[str, Any] = field(default_factory=dict[str, Any])
    meta: dm.DraftArrayMeta | None = None  # arrays only
    #: the node's own document in the final v1.0 spelling, where its generation writes one
    #: (per-node hierarchies); None: the final document is translated from ``meta``/``attributes``
    spelled: gen2023.Normalised | None = None

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


def inner_of(store_or_url: Any, storage_options: Mapping[str, Any] | None = None) -> Inner:
    """The raw store below anything our API accepts (a ``ShardingStore`` is unwrapped).
    A ``ShardingStore`` exists only once its module is loaded: a command given a path or URL
    does not load the read/write engine to learn that it was not given one."""
    engine = sys.modules.get(f"{__package__.rpartition('.')[0]}.engine.store")
    if engine is not None and isinstance(store_or_url, engine.ShardingStore):
        return store_or_url.inner
    return as_inner(store_or_url, storage_options=storage_options)


class DraftHierarchy:
    """The nodes of one draft-era hierarchy, read once from its metadata keys.

    ``strict=False`` records nodes whose documents are invalid in ``damaged``
    (path -> error) instead of raising, so the rest of a hierarchy can still be
    inspected or migrated. A damaged document damages its own node only: that includes
    a metadata key whose path is illegal (``meta/root/bad name.array.json``), recorded
    under the path as written (never used to build another key).
    """

    #: which generation's reader read it, as a destination's record names it
    label = "2022"
    #: the generation's name, as ``info`` prints it
    era = Generation.DRAFT_2022.value
    #: whether ``open_draft`` may write its nodes (else it names ``generation`` and asks for mode='r')
    writable = True
    #: the generation, as refusals name it
    generation = "draft-era Zarr v3 (2022)"
    #: whether its nodes come from one walk of the whole store, so a node is opened from the
    #: model; otherwise one node is opened with a batched read of its own documents
    walked = False
    #: whether ``upgrade_in_place`` applies (the node documents are rewritten where they are)
    upgradable_in_place = False

    def __init__(self, inner: Inner, *, location: str = "store", strict: bool = True, entry_point: bytes | None = _UNREAD,
                 detected: Detection | None = None) -> None:
        """``entry_point``: the ``zarr.json`` bytes when the caller has read them (None: absent);
        ``detected``: what :func:`detect` said of the store, when the caller asked."""
        self.inner = inner
        self.strict = strict
        self.damaged: dict[str, ShardingStoreError] = {}
        self.unreadable: dict[str, ShardingStoreError] = {}  # arrays listed with meta None: why
        raw = inner.get(dm.ENTRY_POINT_KEY) if entry_point is _UNREAD else entry_point
        self.entry_point = draft_entry_point(inner, raw, location, detected)
        self.suffix = self.entry_point.metadata_key_suffix
        self.nodes: dict[str, Node] = self._read_nodes()

    def _read_nodes(self) -> dict[str, Node]:
        docs: dict[str, tuple[Literal["array", "group"], str]] = {}  # path -> (kind, key)
        implicit: set[str] = {""}
        has_consolidated = False
        for key in self.inner.list_prefix("meta/"):
            if key == dm.CONSOLIDATED_KEY:
                has_consolidated = True
                continue
            try:
                parsed = dm.path_from_meta_key(key, self.suffix)
            except DraftMetadataError as e:  # a node key with an illegal path: that node only
                self._damage(_written_path(key, self.suffix), e)
                implicit.update(_legal_ancestors(_written_path(key, self.suffix)))
                continue
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
                self._damage(path, e)
        for path in implicit:
            nodes.setdefault(path, Node(path, "group", explicit=False))
        return dict(sorted(nodes.items(), key=lambda kv: (kv[0].count("/") if kv[0] else -1, kv[0])))

    def _damage(self, path: str, error: ShardingStoreError) -> None:
        if self.strict:
            raise error
        self.damaged[path] = error

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

    def copy_meta(self, node: Node) -> dm.DraftArrayMeta:
        """What copying the array ``node`` needs of it: its meta (an array our reader cannot
        decode: its geometry, copied as it is, see :func:`~sharding_store.formats.v3_layout.geometry_from_v3`).
        Raises the array's damage when even that cannot be had."""
        assert node.meta is not None
        return node.meta

    def arrays(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.kind == "array")

    def groups(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.kind == "group")

    def children(self, path: str) -> list[Node]:
        path = dm.normalize_path(path)
        return [n for p, n in self.nodes.items() if p and p.rpartition("/")[0] == path]

    def subtree(self, path: str = "") -> list[Node]:
        """The node at ``path`` and every node below it, depth-first (parents before
        children, siblings by name). StoreNotFoundError if there is no node at ``path``."""
        root = self.node(path).path
        below = [p for p in self.nodes if in_subtree(p, root)]
        return [self.nodes[p] for p in sorted(below, key=lambda p: p.split("/") if p else [])]

    def tree(self, path: str = "") -> str:
        """The subtree at ``path``, one node per line, indented by depth below ``path``;
        arrays with shape and dtype."""
        return "\n".join(line for _, line in self.tree_lines(path))

    def tree_lines(self, path: str = "") -> list[tuple[Node, str]]:
        """:meth:`tree`'s lines, each with its node (for callers that add to a node's line)."""
        nodes = self.subtree(path)
        base = nodes[0].path.count("/") + 1 if nodes[0].path else 0
        lines = []
        for n in nodes:
            indent = "  " * ((n.path.count("/") + 1 if n.path else 0) - base)
            name = dm.escape_name(n.name) or "/"
            if n.kind == "array" and n.meta is not None:
                m = n.meta
                shard = f" chunks per shard {m.chunks_per_shard}" if m.is_sharded else ""
                lines.append((n, f"{indent}{name} {m.shape} {m.dtype.str} chunks {m.chunks}{shard}"))
            elif n.kind == "array":
                lines.append((n, f"{indent}{name} (an array sharding-store does not decode)"))
            else:
                lines.append((n, f"{indent}{name}{'' if n.explicit else ' (implicit)'}"))
        return lines


class Hierarchy2023(DraftHierarchy):
    """The nodes of a 2023 intermediate hierarchy, from one walk (:func:`walk_v3_nodes`).

    Each document is respelled in the final v1.0 spelling (:func:`gen2023.normalise_node`)
    and each array's translated for our reader (:func:`~sharding_store.formats.v3_layout.layout_from_v3`).
    A damaged document damages its own node (``damaged``: not listed, opening it raises);
    an array whose valid layout the reader cannot map is listed with ``meta`` None and its
    error in ``unreadable`` (opening it raises, naming the field). Documentless directories
    with nodes below them are implicit groups (the root too)."""

    label = "2023"
    era = Generation.DRAFT_2023.value
    writable = False
    generation = "draft-era Zarr v3 hierarchy of the 2023 intermediate generation"
    walked = True
    upgradable_in_place = True

    def __init__(self, inner: Inner, walk: V3Walk) -> None:
        self.inner = inner
        self.strict = False
        self.damaged = dict(walk.damaged)  # nodes with illegal names
        self.unreadable: dict[str, ShardingStoreError] = {}
        self.opaque: dict[str, V3ArrayMeta] = {}  # unreadable arrays as a copy sees them
        self.uncopyable: dict[str, ShardingStoreError] = {}  # unreadable arrays a copy cannot take either
        self.walk = walk
        self.entry_point = None  # type: ignore[assignment]
        self.suffix = gen2023.NODE_KEY
        nodes: dict[str, Node] = {}
        for n in walk.nodes:
            try:
                norm = gen2023.normalise_node(n.raw, n.key)
            except ShardingStoreError as e:
                self.damaged[n.path] = e
                continue
            attributes = dict(norm.document.get("attributes") or {})
            if norm.node_type != "array":
                nodes[n.path] = Node(n.path, "group", True, attributes, spelled=norm)
                continue
            try:
                meta = layout_from_v3(norm.document, n.path, key=n.key, hidden_checksum=norm.hidden_checksum)
            except ShardingStoreError as e:
                self.unreadable[n.path] = e
                meta = None
                try:  # copied as it is: the geometry is enough
                    self.opaque[n.path] = geometry_from_v3(norm.document, n.path, key=n.key, reason=str(e),
                                                           hidden_checksum=norm.hidden_checksum)
                except ShardingStoreError as damage:
                    self.uncopyable[n.path] = damage
            nodes[n.path] = Node(n.path, "array", True, attributes, meta, spelled=norm)
        for path in walk.implicit:
            nodes.setdefault(path, Node(path, "group", explicit=False))
        self._below_damage(nodes)
        self.nodes = dict(sorted(nodes.items(), key=lambda kv: (kv[0].count("/") if kv[0] else -1, kv[0])))

    def _below_damage(self, nodes: dict[str, Node]) -> None:
        """A node below a damaged node (a group whose document is damaged) is damaged too,
        naming that node: final v3 has no node below a group without a document."""
        roots = sorted(self.damaged, key=lambda p: (p.count("/"), p))
        for path in [p for p in nodes if p]:
            top = next((r for r in roots if r != path and (r == "" or path.startswith(r + "/"))), None)
            if top is not None:
                key = f"{path}/{gen2023.NODE_KEY}"
                self.damaged[path] = DraftMetadataError(
                    f"{key}: below the damaged node '{top or '/'}' ({self.damaged[top].key})", key=key)
                del nodes[path]

    def assume_sharded(self, assume: Mapping[str, int | Sequence[int]] | None) -> None:
        """Nothing to assume: every document of this generation declares its codecs."""
        if assume:
            raise UsageError("--assume-chunks-per-shard does not apply to a 2023-generation store (its documents "
                             "declare their codecs)")

    def node(self, path: str) -> Node:
        path = path.strip("/")
        if path in self.damaged:
            raise self.damaged[path]
        return super().node(path)

    def copy_meta(self, node: Node) -> dm.DraftArrayMeta:
        if node.meta is not None:
            return node.meta
        if node.path in self.uncopyable:
            raise self.uncopyable[node.path]
        return self.opaque[node.path]


def hierarchy_2023(inner: Inner, raw: bytes | None = _UNREAD) -> Hierarchy2023 | None:
    """The 2023 intermediate hierarchy in ``inner`` (``raw``: the root ``zarr.json`` when the
    caller has read it, None: absent); None when the store is of another generation (the
    caller reports it). A 2022 entry point decides at once; a hierarchy mixing generations
    raises :class:`DraftMetadataError` naming the first node of the other one. One walk."""
    found = detect(ReadCache(inner), raw)
    return Hierarchy2023(inner, found.walk) if found.generation is Generation.DRAFT_2023 and found.walk else None


def reader_label(inner: Inner) -> str | None:
    """The ``label`` of the generation reader a store's root calls for (a shallow check: no
    walk), None when no draft-era reader reads it (final v3, v2, nothing)."""
    generation = detect_generation(inner, deep=False)[0]
    if generation is Generation.DRAFT_2022:
        return DraftHierarchy.label
    return Hierarchy2023.label if generation is Generation.DRAFT_2023 else None


def walked_model(inner: Inner, raw: bytes | None = _UNREAD) -> DraftHierarchy | None:
    """The node model of a store whose reader walks it whole (``walked``: a node is opened
    from the model), None when its nodes are read on demand (the caller opens one node
    with a batched read, and reports any other generation). ``raw``: the root
    ``zarr.json`` when the caller has read it (None: absent)."""
    return hierarchy_2023(inner, raw)


def refuse_in_place_upgrade(inner: Inner, location: str, root_raw: bytes | None,
                            detected: Detection | None = None) -> None:
    """Raise unless the store is (by its root) a candidate for the in-place upgrade (the
    generation readers decide which generations rewrite their documents where they are;
    ``detected``: :func:`detect` of the store, when the caller made it)."""
    found = detected if detected is not None else detect(inner, root_raw, deep=False)
    generation, key = found.generation, found.key
    if generation in (Generation.DRAFT_2023, Generation.FINAL_V3):
        return
    if generation is Generation.NONE and root_raw is None:
        return  # an implicit root: the walk decides
    if generation is Generation.DRAFT_2022:
        raise UsageError(
            f"{location}: a draft-era (2022) store ({dm.ENTRY_POINT_KEY} entry point, meta/root layout): its chunk keys "
            "and shards change in a migration, so it cannot be upgraded in place; migrate it to a destination: "
            f"`sharding-store migrate {location} DST`", key=dm.ENTRY_POINT_KEY)
    if generation is Generation.ZARR_V2:
        raise OtherGenerationError(location, generation.value, f"Zarr v2 ({key} at the root)", "nothing to upgrade",
                                   key=key or dm.ENTRY_POINT_KEY)
    if generation is Generation.UNKNOWN:
        raise StoreNotFoundError(f"{location}: {dm.ENTRY_POINT_KEY} is of no known Zarr generation: nothing to upgrade",
                                 key=dm.ENTRY_POINT_KEY)
    raise StoreNotFoundError(f"{location}: no Zarr hierarchy here (no zarr.json)", key=dm.ENTRY_POINT_KEY)


class ReadCache:
    """Remembers what the generation check reads (documents, listings), so that the walk that
    follows is served from memory: every node document is read once."""

    def __init__(self, inner: Inner) -> None:
        self._inner = inner
        self._gets: dict[str, bytes | None] = {}
        self._dirs: dict[str, tuple[list[str], list[str]]] = {}

    def get(self, key: str) -> bytes | None:
        if key not in self._gets:
            self._gets[key] = self._inner.get(key)
        return self._gets[key]

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix not in self._dirs:
            self._dirs[prefix] = self._inner.list_dir(prefix)
        return self._dirs[prefix]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def node_model(inner: Inner, raw: bytes | None = _UNREAD, *, location: str = "store",
               detected: Detection | None = None) -> DraftHierarchy:
    """The nodes of a draft-era store of any generation (damaged ones recorded, not raised),
    from whichever generation reader matches (``raw``: the root ``zarr.json`` when the
    caller has read it, None: absent; ``detected``: :func:`detect` of the store when the
    caller made it): a per-node hierarchy of the 2023 generation from the detection's one
    walk (each document listed, read and classified once), else the 2022 drafts' (which
    names any other generation: final v3, v2, nothing). A hierarchy mixing generations
    raises :class:`DraftMetadataError` naming the first node of the other one."""
    if raw is _UNREAD:
        raw = inner.get(dm.ENTRY_POINT_KEY)
    found = detected if detected is not None else detect(ReadCache(inner), raw)
    if found.generation is Generation.DRAFT_2023 and found.walk is not None:
        return Hierarchy2023(inner, found.walk)
    return DraftHierarchy(inner, location=location, strict=False, entry_point=raw, detected=found)


def in_subtree(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it (``"a/bc"`` is not below ``"a/b"``)."""
    return root == "" or path == root or path.startswith(root + "/")


def _written_path(key: str, suffix: str) -> str:
    """The node path a node-shaped metadata key spells, legal or not."""
    stem = key[len(dm.META_ROOT) + 1 :] if key.startswith(dm.META_ROOT + "/") else key
    for kind in ("array", "group"):
        tail = f".{kind}{suffix}"
        if stem.endswith(tail):
            return stem[: -len(tail)]
    return stem


def _legal_ancestors(path: str) -> set[str]:
    """The ancestors of ``path`` up to its first illegal segment (implicit groups)."""
    out: set[str] = set()
    parts = path.split("/")
    for i in range(1, len(parts)):
        try:
            out.add(dm.normalize_path("/".join(parts[:i])))
        except DraftMetadataError:
            break
    return out


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

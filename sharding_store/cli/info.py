"""``sharding-store info`` and ``sharding-store ls``: what a draft-era store holds.

``info`` prints the tree and, per array, its layout, codec chain, storage statistics
(shards, live inner chunks, bytes stored, dead bytes) and whether every v3 reader could
decode its codecs; ``--json`` gives the same as one JSON document. ``ls`` prints one
node per line, for scripts.

Damaged input does not stop either: nodes whose documents are invalid are listed with
the reason, arrays with damaged shard indices or with a lost storage transformer (zarr
2.x ``resize()``) get a ``problem:`` line, and the command exits 0 so that the rest of
the store can be inspected. ``info --strict`` exits with the first problem's code
instead (3 for metadata, 4 for a shard), after printing the report. Chunk payloads are
not decoded, so an undecodable payload is not a problem ``info`` sees.

An in-place ``reshard`` that was interrupted hides its array until ``reshard --resume``
completes it: ``info`` lists every such array (text and ``--json``, from the reshard
journal, one listing) and ``info --strict`` exits 10 naming them. What an interrupted
run left with no journal accounting for it (temporary files next to node documents or
under ``__reshard__/``, staged objects) is listed as ``leftover:`` (``--json``:
``leftovers``) and ``info --strict`` exits 10 naming the first. A wrong
``--assume-chunks-per-shard`` guess is refused (exit 3) with the evidence against it.

A destination's lock (``.sharding-store-lock.json``, in DST or beside a reference file
or an Icechunk repository) is reported (``lock:``; ``--json``: ``lock``): who holds it,
whether the holder still runs (when on this host) and what to do, in ``migrate``'s words
when it refuses (exit 8); a DST holding nothing else yet (a run just started, or killed
before it wrote) is reported as that, not as "no draft hierarchy".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ShardingStoreError
from ..ops.progress import human_bytes, plural, progress_bar
from .options import add_assume_option, add_progress_option, assumed, storage_options
from .output import print_json, print_result

if TYPE_CHECKING:  # the machinery loads when a command runs (numpy and numcodecs with it)
    from ..api.evidence import ArrayStats
    from ..api.hierarchy import DraftHierarchy, Node
    from ..formats.reshard_journal import Journal
    from ..ops.destination import LockState


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="PATH_OR_URL", help="draft-era store (directory or fsspec URL)")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec storage options as a JSON object")
    p.add_argument("--path", default="", metavar="P", help="only the node at P and below")


def register(subparsers: Any) -> None:
    info = subparsers.add_parser(
        "info", help="tree, layout, codecs and storage statistics of each array",
        description="Describe a draft-era store: its generation and what `migrate` changes in it, the tree with "
                    "each node's attributes, and per array its layout, codecs, storage statistics (shards, chunks, "
                    "bytes, dead bytes) and whether every v3 reader decodes it. Damaged nodes are reported, and the "
                    "command exits 0 unless --strict.")
    _add_common(info)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--strict", action="store_true",
                      help="exit with the error code of the first damaged node or shard (default: report it, exit 0)")
    add_assume_option(info)
    add_progress_option(info)
    info.set_defaults(func=run_info)
    ls = subparsers.add_parser(
        "ls", help="list nodes: path, kind, shape and dtype",
        description="List every node of a draft-era store (or of --path and below), one per line for scripts: "
                    "path, kind (array, group, damaged, interrupted-reshard), then an array's shape and dtype or "
                    "what is wrong; --json gives the same rows as one JSON document.")
    _add_common(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=run_ls)


# --------------------------------------------------------------------------- formatting

#: attributes shown per node, and characters per key and per value, before "…"
MAX_ATTRIBUTES = 8
MAX_ATTRIBUTE_CHARS = 60
#: what ``migrate`` does to a store of each generation ``info`` describes (its header line)
MIGRATE_DOES = {
    "2022": "`sharding-store migrate` translates it to final Zarr v3 (shard indices rebuilt, chunk payloads "
            "copied verbatim)",
    "2023": "`sharding-store migrate` rewrites it as final Zarr v3 (documents respelled, chunks and shards "
            "copied verbatim)",
}


def display_path(path: str) -> str:
    """A node path as printed: ``/a/b``; escaped when it holds what could forge a line
    (:func:`~sharding_store.formats.draft_metadata.escape_name`)."""
    from ..formats.draft_metadata import escape_name

    return escape_name("/" + path)


def header(store: str, generation: str, migrate_does: str) -> str:
    """``info``'s first line: the store (escaped: a line break in its name cannot forge a
    line), its generation, what ``migrate`` does to it."""
    from ..formats.draft_metadata import escape_name

    return f"{escape_name(store)}: {generation}; {migrate_does}"


def _shorten(text: str, width: int = MAX_ATTRIBUTE_CHARS) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _printable(value: Any, *, quote: bool = True) -> str:
    """``value`` as JSON (a key: as it is) on one line of plain text: a line break, a
    terminal escape or another unprintable character in a store's attributes is shown
    escaped, never written to the terminal."""
    text = json.dumps(value, ensure_ascii=False, default=str) if quote else value
    return text if text.isprintable() else json.dumps(value, ensure_ascii=True, default=str)


def attributes_text(attributes: Any, *, keys: int = MAX_ATTRIBUTES, width: int = MAX_ATTRIBUTE_CHARS) -> str:
    """A node's attributes on one line: ``key=JSON value``, each shortened to ``width``
    characters, at most ``keys`` of them, then ``… (+k more)``; "" when there are none."""
    if not isinstance(attributes, dict) or not attributes:
        return ""
    shown = [f"{_shorten(_printable(str(k), quote=False), width)}={_shorten(_printable(v), width)}"
             for k, v in list(attributes.items())[:keys]]
    more = len(attributes) - len(shown)
    return ", ".join(shown) + (f", … (+{more} more)" if more > 0 else "")


def _attributes_line(attributes: Any, indent: str = "  ") -> list[str]:
    text = attributes_text(attributes)
    return [f"{indent}attributes {text}"] if text else []


def _dims(values: tuple[int, ...] | None) -> str:
    if values is None:
        return "-"
    return " x ".join(map(str, values)) or "scalar"


def _in_subtree(path: str, root: str) -> bool:
    return root == "" or path == root or path.startswith(root + "/")


def _nodes(h: DraftHierarchy, root: str) -> list[Node]:
    root = h.node(root).path  # StoreNotFoundError for a missing --path
    return [n for p, n in h.nodes.items() if _in_subtree(p, root)]


def format_array(s: ArrayStats, changes: Sequence[str] = ()) -> str:
    """A short human-readable block for one array; ``changes``: what ``migrate`` changes in
    its document (shown as ``will change:`` lines)."""
    from ..api.evidence import codec_chain_text
    from ..formats.draft_metadata import escape_name

    m = s.meta
    lines = [
        display_path(m.path),
        f"  shape {_dims(m.shape)}  dtype {m.dtype.str}  order {m.order}",
        f"  inner chunks {_dims(m.chunks)}"
        + (f"  chunks per shard {_dims(m.chunks_per_shard)}  shard shape {_dims(m.shard_shape)}" if m.is_sharded else "  (unsharded)"),
        f"  codecs {codec_chain_text(m)}",
        f"  fill value {_printable(m.raw.get('fill_value'))}",
        *_attributes_line(m.attributes),
        f"  stored {_stored_text(s)}",
    ]
    if s.portable is None:
        lines.append("  portable unknown")
    else:
        lines.append("  portable yes" if s.portable else f"  portable no: {'; '.join(s.portability_problems)}")
    if s.stray_keys:
        lines.append(f"  stray keys {len(s.stray_keys)} (e.g. {escape_name(s.stray_keys[0])})")
    lines += [f"  will change: {c}" for c in changes]
    lines += [f"  problem: {p}" for p in s.problems]
    return "\n".join(lines)


def _stored_text(s: ArrayStats) -> str:
    """``4 shards, 16 inner chunks, 1.2 KiB, dead 0 B``: the objects (shards, or chunk objects
    when unsharded; the shards of an array that lost its storage transformer said so), the
    live inner chunks they hold, the bytes stored."""
    m = s.meta
    if s.lost_chunks_per_shard is not None:
        objects = (f"{plural(s.n_objects, 'shard')} (chunks per shard {_dims(s.lost_chunks_per_shard)} by the "
                   "evidence: the metadata lost its storage transformer)")
    else:
        objects = plural(s.n_objects, "shard" if m.is_sharded else "chunk object")
    dead = f", dead {human_bytes(s.dead_bytes)}" if m.is_sharded or s.lost_chunks_per_shard is not None else ""
    return f"{objects}, {plural(s.n_chunks, 'inner chunk')}, {human_bytes(s.bytes_stored)}{dead}"


def _subtree_text(h: DraftHierarchy, root: str) -> str:
    """The hierarchy's own tree of ``root`` and below (indented from ``root``), each group's
    attributes after its name (an array's are in its block)."""
    lines = []
    for node, line in h.tree_lines(root):  # by node, not by splitting text (a name may hold a line break)
        text = attributes_text(node.attributes) if node.kind != "array" else ""
        lines.append(f"{line}  attributes {text}" if text else line)
    return "\n".join(lines)


def _damaged(h: DraftHierarchy, root: str) -> dict[str, ShardingStoreError]:
    """Nodes at or below ``root`` whose documents are invalid."""
    return {p: e for p, e in h.damaged.items() if _in_subtree(p, root)}


def _interrupted(h: DraftHierarchy, root: str, unreadable: list[ShardingStoreError] | None = None) -> list[Journal]:
    """Interrupted in-place reshards of arrays at or below ``root`` (one listing); journals
    that cannot be read go to ``unreadable`` (reported; ``--strict`` fails on them)."""
    from ..formats.reshard_journal import interrupted_reshards

    bad: list[Any] = []
    found = [j for j in interrupted_reshards(h.inner, bad) if _in_subtree(j.path, root)]
    if unreadable is not None:
        unreadable += bad
    return found


def _interrupted_text(j: Journal, location: str) -> str:
    from ..formats.reshard_journal import resume_command

    return f"{display_path(j.path)}\n  interrupted reshard: {j.describe()}; complete it with `{resume_command(location)}`"


def info_document(
    location: str, h: DraftHierarchy, nodes: list[Node], stats: list[ArrayStats], root: str = "",
    reshards: list[Journal] | None = None, unreadable_journals: list[ShardingStoreError] | None = None,
) -> dict[str, Any]:
    """``info --json``: the same report as the text, for every generation."""
    from ..formats.reshard_journal import resume_command

    by_path = {s.path: s for s in stats}
    return {
        "source": location,
        "generation": h.era,
        "metadata_key_suffix": h.suffix,
        "nodes": [_node_json(h, n, by_path.get(n.path)) for n in nodes],
        "arrays": [s.to_json() for s in stats],
        "damaged": [
            {"path": p, "key": e.key, "error": type(e).__name__, "reason": str(e)} for p, e in _damaged(h, root).items()
        ],
        "interrupted_reshards": [{**j.to_json(), "resume": resume_command(location)} for j in reshards or ()]
        + [{"journal": e.key, "error": type(e).__name__, "reason": str(e)} for e in unreadable_journals or ()],
        "warnings": [],
    }


def _node_json(h: DraftHierarchy, n: Node, s: ArrayStats | None) -> dict[str, Any]:
    """One node of ``info --json``: what it is, its attributes, what ``migrate`` changes in its
    document; an array also its shape, data type, objects and shard index reading."""
    doc: dict[str, Any] = {"path": n.path, "kind": n.kind, "explicit": n.explicit, "attributes": n.attributes,
                           "changes": node_changes(h, n, s)}
    if n.kind == "array":
        try:
            m = n.meta if n.meta is not None else h.copy_meta(n)
        except ShardingStoreError:
            return doc
        doc.update(shape=list(m.shape), data_type=m.raw.get("data_type", m.dtype.str),
                   fill_value=m.raw.get("fill_value"), objects=None if s is None else s.n_objects,
                   index_reading=None if s is None else s.index_reading)
    return doc


# --------------------------------------------------------------------------- commands


LEFTOVER_TEXT = "left by an interrupted run (a temporary file or a staged object no journal accounts for)"


def leftover_error(keys: list[str], location: str, remedy: str = "") -> ShardingStoreError:
    """``info --strict``: leftovers of an interrupted run are exit 10, the first one named."""
    from ..errors import MigrationError

    how = remedy or "no journal needs them: delete them"
    return MigrationError(f"{keys[0]}: {LEFTOVER_TEXT} ({len(keys)} such keys in {location}); {how}", key=keys[0])


def _info_upgrade(args: argparse.Namespace, opts: dict[str, Any] | None) -> bool:
    """An interrupted in-place upgrade (``migrate --in-place``): its documents are a mix of
    old and new, so that is what ``info`` says (``--strict``: exit 10); False when none."""
    from ..api.hierarchy import inner_of
    from ..formats.upgrade_journal import interrupted_upgrade, interrupted_upgrade_error, upgrade_status

    inner = inner_of(args.store, opts)
    status = upgrade_status(inner, args.store)
    if status is None:
        return False
    if args.json:
        print_json(args.command, {"source": args.store, "interrupted_upgrade": status})
    else:
        print(f"{args.store}: interrupted in-place upgrade: {len(status['upgraded'])} of {status['documents']} "
              f"documents upgraded; finish it with `{status['resume']}` or roll it back with `{status['undo']}`")
        if status["held_by"] is not None:
            running = {True: "still running", False: "no longer running",
                       None: "on another host"}[status["holder_running"]]
            print(f"  held by {status['held_by']}: {running}")
        for key in status["changed_by_others"]:
            print(f"  {key}: changed by another writer since the upgrade began")
    journal = interrupted_upgrade(inner)
    if args.strict and journal is not None:
        raise interrupted_upgrade_error(journal, args.store)
    return True


def _info_destination(args: argparse.Namespace, opts: dict[str, Any] | None, lock: LockState | None = None) -> bool:
    """``info`` of a migration's destination (a copy, a reference file, an Icechunk repository,
    local or remote): which kind it is, what it was migrated from, its nodes and objects
    (issue 24). False when ``args.store`` is none of them."""
    from ..formats.draft_metadata import escape_name, json_object
    from ..ops.destination import DESTINATION_KINDS, copied_by_us, open_destination, read_record, resolve_target

    target = resolve_target(args.store, None, False, opts or {})  # a remote one looked at, a local path by stat
    if target == "zarr" and not copied_by_us(args.store, opts):
        return False  # the usual case: a draft store; the job machinery (ops.jobs, ops.options) is not loaded
    from ..ops.options import StoreOptions
    dst = open_destination(args.store, target, False, StoreOptions(src=opts, dst=opts), read_only=True)
    record = read_record(dst) or {}  # none, or not a JSON object: nothing taken from it
    source = record.get("src") if isinstance(record.get("src"), str) else None
    virtual = target == "references" or (target == "icechunk" and bool(record.get("virtual")))
    kind = DESTINATION_KINDS[(target, virtual)]
    arrays = groups = objects = 0
    for key in dst.list_prefix(""):
        if key.rpartition("/")[2] == "zarr.json":
            node = (json_object(dst.get(key) or b"{}") or {}).get("node_type")  # a damaged one is neither
            arrays, groups = arrays + (node == "array"), groups + (node == "group")
        elif not key.startswith(".sharding-store"):
            objects += 1
    doc = {"destination": args.store, "destination_kind": kind, "virtual": virtual, "source": source,
           "arrays": arrays, "groups": groups, "objects": objects, "lock": None if lock is None else lock.to_json()}
    if args.json:
        print_json(args.command, doc)
        return True
    what = "references to objects of" if virtual else "objects copied from"
    print(f"{escape_name(args.store)}: {kind} (Zarr v3, migrated by sharding-store)")
    origin = escape_name(source) if source else "an unrecorded source"
    print(f"  {plural(arrays, 'array')}, {plural(groups, 'group')}: {objects} {what} {origin}")
    if lock is not None:
        print(f"  {escape_name(lock.text())}")
    return True


def _info_lock_only(args: argparse.Namespace, lock: LockState) -> None:
    """``info`` of a destination that holds nothing but a run's lock (yet): that run, and what to do."""
    from ..formats.draft_metadata import escape_name

    if args.json:
        print_json(args.command, {"destination": args.store, "destination_kind": None, "lock": lock.to_json()})
        return
    print(f"{escape_name(args.store)}: a destination a run of sharding-store holds (nothing else there yet)")
    print(f"  {escape_name(lock.text())}")


def _open_model(args: argparse.Namespace, opts: dict[str, Any] | None, assume: Any) -> DraftHierarchy:
    """The node model of the store (any generation: :func:`~sharding_store.api.hierarchy.node_model`);
    a location inside a hierarchy is refused saying so, with the ``--path`` that reaches it."""
    from ..api.hierarchy import inner_of, node_model
    from ..errors import OtherGenerationError, StoreNotFoundError

    try:
        h = node_model(inner_of(args.store, opts), location=args.store)
    except StoreNotFoundError as e:
        hint = None if isinstance(e, OtherGenerationError) else enclosing_hierarchy(args.store, opts)
        if hint is None:
            raise
        raise StoreNotFoundError(f"{e}; {hint}", key=e.key) from None
    h.assume_sharded(assume)
    return h


#: parent directories looked at for the hierarchy a location is inside of (``info``'s hint)
MAX_PARENTS = 32


def enclosing_hierarchy(location: str, opts: dict[str, Any] | None) -> str | None:
    """When ``location`` holds no ``zarr.json`` but lies inside a hierarchy (``store.zr3/meta``,
    a group or array of a 2022 store): what to run instead (``info ROOT --path P``), else
    None. Looks at up to :data:`MAX_PARENTS` parents for a ``zarr.json`` (one get each)."""
    from ..api.hierarchy import inner_of

    try:
        if inner_of(location, opts).get(ENTRY_POINT) is not None:
            return None  # a hierarchy's root itself (of another generation): not inside one
    except ShardingStoreError:
        return None
    scheme, sep, rest = location.rpartition("://")
    parts = rest.rstrip("/").split("/")
    for i in range(len(parts) - 1, max(0, len(parts) - 1 - MAX_PARENTS), -1):
        root = scheme + sep + "/".join(parts[:i])
        if not "/".join(parts[:i]).strip("/"):
            return None
        try:
            if inner_of(root, opts).get(ENTRY_POINT) is None:
                continue
        except ShardingStoreError:
            return None
        path = _deepest_node(root, opts, _node_path("/".join(parts[i:])))
        return (f"{location} is inside the hierarchy at {root}: run `sharding-store info {root}"
                + (f" --path {path}`" if path else "`") + " for it")
    return None


ENTRY_POINT = "zarr.json"
#: the 2022 layout's folders a location inside a hierarchy may name (not node paths themselves)
_LAYOUT_FOLDERS = ("meta/root", "data/root", "meta", "data")


def _deepest_node(root: str, opts: dict[str, Any] | None, path: str) -> str:
    """The deepest node of the hierarchy at ``root`` on ``path`` ("" when none is, or the
    hierarchy cannot be read): a location inside an array's chunk folders names the array."""
    from ..api.hierarchy import inner_of, node_model

    if not path:
        return ""
    try:
        nodes = node_model(inner_of(root, opts), location=root).nodes
    except ShardingStoreError:
        return ""
    parts = path.split("/")
    return next(("/".join(parts[:k]) for k in range(len(parts), 0, -1) if "/".join(parts[:k]) in nodes), "")


def _node_path(below: str) -> str:
    """The node path a location below a hierarchy's root names in the 2022 layout
    (``meta/root/a/b.array.json``, ``data/root/a/b``: ``a/b``); "" for anything else (the
    root itself, or a folder inside a per-node node: its chunks)."""
    for folder in _LAYOUT_FOLDERS:
        if below == folder:
            return ""
        if below.startswith(folder + "/") and folder.endswith("/root"):
            below = below[len(folder) + 1:]
            for suffix in (".array.json", ".group.json"):
                below = below.removesuffix(suffix)
            return below
    return ""


def _scan(args: argparse.Namespace, h: DraftHierarchy, root: str, assume: Any) -> _Info:
    """What ``info`` reports about the subtree at ``root`` of the model ``h`` (a scan: one
    listing and one index read per shard of every array, counted by the progress bar)."""
    from ..api.evidence import hierarchy_stats, stats_nodes
    from ..formats.reshard_journal import staging_leftovers

    found = _Info(root)
    found.reshards = _interrupted(h, root, found.unreadable_journals)
    if not (found.reshards or found.unreadable_journals):
        found.leftovers = staging_leftovers(h.inner)
        found.remedy = bool(found.leftovers)
    if h.upgradable_in_place:  # temporary files an interrupted upgrade left next to the documents
        from ..ops.upgrade import upgrade_leftovers  # only then: info of a 2022 store loads no driver

        found.leftovers += upgrade_leftovers(h.inner, [*h.nodes, *h.damaged])
    if root not in h.damaged and not (root not in h.nodes and found.reshards):
        # else only its damage (or the interrupted reshard that hides it) is shown
        found.nodes = _nodes(h, root)
        with progress_bar(len(stats_nodes(h, root)), "info", "array", args.progress) as bar:
            found.stats = hierarchy_stats(args.store, root, hierarchy=h, assumed=assume,
                                          on_array=lambda s: bar.advance(1, s.bytes_stored or 0))[1]
    found.damaged = _damaged(h, root)
    return found


@dataclass
class _Info:
    """What ``info`` found in a subtree (its text and JSON render this, for every generation)."""

    root: str
    nodes: list[Node] = field(default_factory=list)
    stats: list[ArrayStats] = field(default_factory=list)
    damaged: dict[str, ShardingStoreError] = field(default_factory=dict)
    reshards: list[Journal] = field(default_factory=list)
    unreadable_journals: list[ShardingStoreError] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    remedy: bool = False  # the leftovers are a reshard's staging: `reshard --resume` removes them


def node_changes(h: DraftHierarchy, node: Node, stats: ArrayStats | None = None) -> list[str]:
    """What ``migrate`` changes in the document of ``node`` beyond the translation the header
    names: its respellings (a per-node document), the document an implicit group of a walked
    model gets, a stale consolidated block left out, an undeclared shard index as its shards read."""
    if node.spelled is None and not (h.walked and not node.explicit):
        return []  # (before the import: info of a 2022 store loads no driver)
    from ..ops.node_plan import CONSOLIDATED_TEXT, IMPLICIT_TEXT, READING_TEXT

    if node.spelled is None:
        return [IMPLICIT_TEXT]
    changes = list(node.spelled.changes)
    if node.kind == "group" and "consolidated_metadata" in node.spelled.document:
        changes.append(CONSOLIDATED_TEXT)
    if stats is not None and stats.index_reading is not None:
        changes.append(f"shard index: {READING_TEXT[stats.index_reading]}")
    return changes


def run_info(args: argparse.Namespace) -> int:
    from ..errors import StoreNotFoundError
    from ..formats.draft_metadata import escape_name, normalize_path
    from ..formats.reshard_journal import interrupted_error, resume_command
    from ..ops.destination import find_lock

    opts = storage_options(args.storage_options)
    assume = assumed(args)
    lock = find_lock(args.store, opts)
    try:
        if _info_destination(args, opts, lock):
            return 0
        if _info_upgrade(args, opts):
            return 0
        h = _open_model(args, opts, assume)
    except StoreNotFoundError:
        if lock is None:
            raise
        _info_lock_only(args, lock)  # a run that just began, or was killed before it wrote
        return 0
    found = _scan(args, h, normalize_path(args.path), assume)
    if args.json:
        doc = info_document(args.store, h, found.nodes, found.stats, found.root, found.reshards,
                            found.unreadable_journals)
        doc["leftovers"] = found.leftovers
        doc["lock"] = None if lock is None else lock.to_json()
        print_result(args, doc, "")
    else:
        text = _info_text(args.store, h, found)
        print_result(args, {}, text if lock is None else f"{text}\n{escape_name(lock.text())}")
    problems = [*found.unreadable_journals, *found.damaged.values(),
                *(s.damage for s in found.stats if s.damage is not None)]
    if found.reshards:  # a hidden array outweighs any other problem
        problems.insert(0, interrupted_error(found.reshards, args.store))
    elif found.leftovers:
        remedy = f"`{resume_command(args.store)}` removes them" if found.remedy else ""
        problems.append(leftover_error(found.leftovers, args.store, remedy))
    if args.strict and problems:
        raise problems[0]
    return 0


def _info_text(location: str, h: DraftHierarchy, found: _Info) -> str:
    """``info``'s text: the header, the tree, one block per array (and per node whose document
    ``migrate`` changes), damage, interrupted reshards, leftovers -- for every generation."""
    blocks = [header(location, h.era, MIGRATE_DOES[h.label])]
    if found.nodes:
        blocks.append(_subtree_text(h, found.root))
    stats = {s.path: s for s in found.stats}
    for node in found.nodes:
        changes = node_changes(h, node, stats.get(node.path))
        if node.path in stats:
            blocks.append(format_array(stats[node.path], changes))
        elif node.kind == "array":
            blocks.append(_undecoded_text(h, node, changes))
        elif changes:
            blocks.append("\n".join([display_path(node.path), *(f"  will change: {c}" for c in changes)]))
    blocks += [f"{display_path(p)}\n  damaged ({type(e).__name__}): {e}" for p, e in found.damaged.items()]
    blocks += [_interrupted_text(j, location) for j in found.reshards]
    blocks += [f"{e.key}\n  damaged reshard journal ({type(e).__name__}): {e}" for e in found.unreadable_journals]
    text = "\n\n".join(blocks)
    leftovers = [f"leftover: {key}: {LEFTOVER_TEXT}" for key in found.leftovers]
    return "\n".join([text, *leftovers])


def _undecoded_text(h: DraftHierarchy, node: Node, changes: Sequence[str]) -> str:
    """The block of an array our reader cannot decode (``migrate`` copies its objects as they
    are, or names why it cannot)."""
    lines = [display_path(node.path)]
    try:
        m = h.copy_meta(node)
        lines.append(f"  shape {_dims(m.shape)}  dtype {m.dtype.str}  fill value {_printable(m.raw.get('fill_value'))}")
        lines.append(f"  not decoded by sharding-store ({h.unreadable.get(node.path)}): migrate copies its objects as they are")
    except ShardingStoreError as e:
        lines.append(f"  problem: {e}")
    lines += _attributes_line(node.attributes)
    lines += [f"  will change: {c}" for c in changes]
    return "\n".join(lines)


def ls_rows(h: DraftHierarchy, path: str) -> list[dict[str, Any]]:
    """``ls``'s rows: every node at ``path`` and below (arrays with their shape and dtype),
    then the damaged nodes, the arrays an interrupted reshard hides and the reshard journals
    that cannot be read; the text columns and the ``--json`` entries are these rows."""
    rows: list[dict[str, Any]] = []
    for n in _nodes(h, path):
        if n.kind == "array" and n.meta is not None:
            rows.append({"path": n.path, "kind": "array", "shape": list(n.meta.shape), "dtype": n.meta.dtype.str})
        else:  # a group, or an array our reader does not decode (no shape said)
            rows.append({"path": n.path, "kind": n.kind})
    root = h.node(path).path
    rows += [{"path": p, "kind": "damaged", "error": type(e).__name__} for p, e in _damaged(h, root).items()]
    unreadable: list[ShardingStoreError] = []
    rows += [{"path": j.path, "kind": "interrupted-reshard", "phase": j.phase} for j in _interrupted(h, root, unreadable)]
    rows += [{"key": e.key, "kind": "damaged-reshard-journal", "error": type(e).__name__} for e in unreadable]
    return rows


def ls_line(row: dict[str, Any]) -> str:
    """One row as ``ls`` prints it: tab-separated path (escaped), kind, then shape and dtype,
    the error class or the reshard's phase."""
    where = display_path(row["path"]) if "path" in row else str(row["key"])
    extra = ([_dims(tuple(row["shape"])), row["dtype"]] if "shape" in row
             else [row[k] for k in ("error", "phase") if k in row])
    return "\t".join([where, row["kind"], *extra])


def run_ls(args: argparse.Namespace) -> int:
    from ..api.hierarchy import inner_of, node_model

    h = node_model(inner_of(args.store, storage_options(args.storage_options)), location=args.store)
    rows = ls_rows(h, args.path)
    print_result(args, {"source": args.store, "nodes": rows}, "\n".join(ls_line(r) for r in rows))
    return 0

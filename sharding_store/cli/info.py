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
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ..errors import ShardingStoreError
from ..ops.progress import human_bytes, plural, progress_bar
from .options import add_assume_option, add_progress_option, assumed, storage_options
from .output import print_json, print_result, warn

if TYPE_CHECKING:  # the machinery loads when a command runs (numpy and numcodecs with it)
    from ..api.evidence import ArrayStats
    from ..api.hierarchy import DraftHierarchy, Node
    from ..formats.reshard_journal import Journal


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
    """``info``'s first line: the store, its generation, what ``migrate`` does to it."""
    return f"{store}: {generation}; {migrate_does}"


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


def format_array(s: ArrayStats) -> str:
    """A short human-readable block for one array."""
    from ..api.evidence import codec_chain_text
    from ..formats.draft_metadata import escape_name

    m = s.meta
    objects = ("shard" if m.is_sharded else "chunk object") + ("" if s.n_objects == 1 else "s")
    lines = [
        display_path(m.path),
        f"  shape {_dims(m.shape)}  dtype {m.dtype.str}  order {m.order}",
        f"  inner chunks {_dims(m.chunks)}"
        + (f"  chunks per shard {_dims(m.chunks_per_shard)}  shard shape {_dims(m.shard_shape)}" if m.is_sharded else "  (unsharded)"),
        f"  codecs {codec_chain_text(m)}",
        *_attributes_line(m.attributes),
        f"  stored {s.n_objects} {objects}, {s.n_chunks} inner chunk{'' if s.n_chunks == 1 else 's'}, {human_bytes(s.bytes_stored)}"
        + (f", dead {human_bytes(s.dead_bytes)}" if m.is_sharded else ""),
    ]
    if s.portable is None:
        lines.append("  portable unknown")
    else:
        lines.append("  portable yes" if s.portable else f"  portable no: {'; '.join(s.portability_problems)}")
    if s.stray_keys:
        lines.append(f"  stray keys {len(s.stray_keys)} (e.g. {escape_name(s.stray_keys[0])})")
    lines += [f"  problem: {p}" for p in s.problems]
    return "\n".join(lines)


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
    from ..formats.reshard_journal import resume_command

    return {
        "source": location,
        "metadata_key_suffix": h.suffix,
        "nodes": [
            {"path": n.path, "kind": n.kind, "explicit": n.explicit, "attributes": n.attributes} for n in nodes
        ],
        "arrays": [s.to_json() for s in stats],
        "damaged": [
            {"path": p, "key": e.key, "error": type(e).__name__, "reason": str(e)} for p, e in _damaged(h, root).items()
        ],
        "interrupted_reshards": [{**j.to_json(), "resume": resume_command(location)} for j in reshards or ()]
        + [{"journal": e.key, "error": type(e).__name__, "reason": str(e)} for e in unreadable_journals or ()],
    }


# --------------------------------------------------------------------------- commands


LEFTOVER_TEXT = "left by an interrupted run (a temporary file or a staged object no journal accounts for)"


def leftover_error(keys: list[str], location: str, remedy: str = "") -> ShardingStoreError:
    """``info --strict``: leftovers of an interrupted run are exit 10, the first one named."""
    from ..errors import MigrationError

    how = remedy or "no journal needs them: delete them"
    return MigrationError(f"{keys[0]}: {LEFTOVER_TEXT} ({len(keys)} such keys in {location}); {how}", key=keys[0])


def _info_2023(args: argparse.Namespace, opts: dict[str, Any] | None, assume: Any) -> bool:
    """``info`` of a store of the 2023 intermediate generation: the generation, every node and
    what ``migrate`` changes in it (the shard index decided from the shards' tails), damaged
    nodes; False (nothing printed) for any other generation."""
    from ..api.hierarchy import inner_of, walked_model
    from ..errors import StoreNotFoundError, UsageError
    from ..formats.draft_metadata import normalize_path

    inner = inner_of(args.store, opts)
    model = walked_model(inner)
    if model is None or not model.upgradable_in_place:
        return False
    from ..ops.node_plan import plan_hierarchy  # a 2023 store only: the drivers load here
    from ..ops.upgrade import upgrade_leftovers
    if assume:
        raise UsageError("--assume-chunks-per-shard does not apply to a 2023-generation store")
    root = normalize_path(args.path)
    plan = plan_hierarchy(inner)
    kinds = {p: k for p, k in plan.kinds.items() if _in_subtree(p, root)}
    damaged = {p: e for p, e in plan.damaged.items() if _in_subtree(p, root)}
    if not kinds and not damaged:
        raise StoreNotFoundError(f"{args.store}: no node at '{root}'", key=root)
    arrays = {a.path: a for a in plan.arrays}
    leftovers = upgrade_leftovers(inner, [*plan.kinds, *plan.damaged])
    if args.json:
        doc = {
            "source": args.store,
            "generation": model.era,
            "leftovers": leftovers,
            "nodes": [
                {"path": p, "kind": k, "changes": plan.changes.get(p, []),
                 **({"shape": arrays[p].normalised.document["shape"], "data_type": arrays[p].normalised.document["data_type"],
                     "objects": len(arrays[p].objects), "index_reading": arrays[p].reading} if p in arrays else {})}
                for p, k in sorted(kinds.items())
            ],
            "damaged": [{"path": p, "key": e.key, "error": type(e).__name__, "reason": str(e)} for p, e in damaged.items()],
            "warnings": plan.warnings,
        }
        print_json(args.command, doc)
    else:
        print(header(args.store, model.era, MIGRATE_DOES[model.label]))
        groups = dict(plan.groups)
        for p, k in sorted(kinds.items()):
            print()
            head = f"{display_path(p)}  {k}"
            doc = groups.get(p, {})
            if p in arrays:
                doc = arrays[p].normalised.document
                head += f"  shape {_dims(tuple(doc['shape']))}  {doc['data_type']}  {len(arrays[p].objects)} objects"
            print("\n".join([head, *_attributes_line(doc.get("attributes"))]))
            changes = plan.changes.get(p, [])
            print("  unchanged (already final v1.0)" if not changes else "\n".join(f"  will change: {c}" for c in changes))
        for p, e in damaged.items():
            print()
            print(f"{display_path(p)}\n  damaged ({type(e).__name__}): {e}")
        warn(plan.warnings)
        for key in leftovers:
            print(f"leftover: {key}: {LEFTOVER_TEXT}")
    if args.strict and damaged:
        raise next(iter(damaged.values()))
    if args.strict and leftovers:
        raise leftover_error(leftovers, args.store)
    return True


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


def _info_destination(args: argparse.Namespace, opts: dict[str, Any] | None) -> bool:
    """``info`` of a migration's destination that is no directory of Zarr objects (a reference
    file, an Icechunk repository): which kind it is, what it was migrated from, its nodes and
    objects (issue 24). False when ``args.store`` is neither."""
    from ..ops.destination import RECORD_KEY, open_destination, resolve_target
    from ..ops.options import StoreOptions

    target = resolve_target(args.store, None, False)
    if target == "zarr":
        return False
    dst = open_destination(args.store, target, False, StoreOptions(src=opts, dst=opts), read_only=True)
    raw = dst.get(RECORD_KEY)
    record = json.loads(raw) if raw else {}
    virtual = target == "references" or bool(record.get("virtual"))
    kind = {"references": "reference file"}.get(target, "Icechunk virtual" if virtual else "Icechunk materialised")
    arrays = groups = objects = 0
    for key in dst.list_prefix(""):
        if key.rpartition("/")[2] == "zarr.json":
            node = json.loads(dst.get(key) or b"{}").get("node_type")
            arrays, groups = arrays + (node == "array"), groups + (node == "group")
        elif not key.startswith(".sharding-store"):
            objects += 1
    doc = {"destination": args.store, "destination_kind": kind, "virtual": virtual, "source": record.get("src"),
           "arrays": arrays, "groups": groups, "objects": objects}
    if args.json:
        print_json(args.command, doc)
        return True
    what = "references to objects of" if virtual else "objects copied from"
    print(f"{args.store}: {kind} (Zarr v3, migrated by sharding-store)")
    print(f"  {plural(arrays, 'array')}, {plural(groups, 'group')}: {objects} {what} {record.get('src') or 'an unrecorded source'}")
    return True


def run_info(args: argparse.Namespace) -> int:
    from ..api.evidence import hierarchy_stats, stats_nodes
    from ..api.hierarchy import open_hierarchy
    from ..formats.draft_metadata import normalize_path
    from ..formats.reshard_journal import interrupted_error, resume_command, staging_leftovers

    opts = storage_options(args.storage_options)
    assume = assumed(args)
    if _info_destination(args, opts):
        return 0
    if _info_upgrade(args, opts):
        return 0
    if _info_2023(args, opts, assume):
        return 0
    h = open_hierarchy(args.store, storage_options=opts, strict=False, assume_chunks_per_shard=assume)
    root = normalize_path(args.path)
    unreadable: list[ShardingStoreError] = []
    reshards = _interrupted(h, root, unreadable)
    leftovers = [] if reshards or unreadable else staging_leftovers(h.inner)
    nodes: list[Node] = []
    stats: list[ArrayStats] = []
    if root not in h.damaged and not (root not in h.nodes and reshards):
        # else only its damage (or the interrupted reshard that hides it) is shown
        nodes = _nodes(h, root)
        # a scan: one tail read per shard of every array, counted by the bar (with the bytes stored)
        with progress_bar(len(stats_nodes(h, root)), "info", "array", args.progress) as bar:
            stats = hierarchy_stats(args.store, root, hierarchy=h, assumed=assume,
                                    on_array=lambda s: bar.advance(1, s.bytes_stored or 0))[1]
    damaged = _damaged(h, root)
    if args.json:
        doc = info_document(args.store, h, nodes, stats, root, reshards, unreadable)
        doc["leftovers"] = leftovers
        print_json(args.command, doc)
    else:
        print(header(args.store, h.era, MIGRATE_DOES[h.label]))
        if nodes:
            print()
            print(_subtree_text(h, root))
        for s in stats:
            print()
            print(format_array(s))
        for path, e in damaged.items():
            print()
            print(f"{display_path(path)}\n  damaged ({type(e).__name__}): {e}")
        for j in reshards:
            print()
            print(_interrupted_text(j, args.store))
        for e in unreadable:
            print()
            print(f"{e.key}\n  damaged reshard journal ({type(e).__name__}): {e}")
        for key in leftovers:
            print(f"leftover: {key}: {LEFTOVER_TEXT}")
    problems = [*unreadable, *damaged.values(), *(s.damage for s in stats if s.damage is not None)]
    if reshards:  # a hidden array outweighs any other problem
        problems.insert(0, interrupted_error(reshards, args.store))
    elif leftovers:
        problems.append(leftover_error(leftovers, args.store, f"`{resume_command(args.store)}` removes them"))
    if args.strict and problems:
        raise problems[0]
    return 0


def ls_rows(h: DraftHierarchy, path: str) -> list[dict[str, Any]]:
    """``ls``'s rows: every node at ``path`` and below (arrays with their shape and dtype),
    then the damaged nodes, the arrays an interrupted reshard hides and the reshard journals
    that cannot be read; the text columns and the ``--json`` entries are these rows."""
    rows: list[dict[str, Any]] = []
    for n in _nodes(h, path):
        if n.kind == "array" and n.meta is not None:
            rows.append({"path": n.path, "kind": "array", "shape": list(n.meta.shape), "dtype": n.meta.dtype.str})
        else:
            rows.append({"path": n.path, "kind": "group"})
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
    extra = ([_dims(tuple(row["shape"])), row["dtype"]] if row["kind"] == "array"
             else [row[k] for k in ("error", "phase") if k in row])
    return "\t".join([where, row["kind"], *extra])


def run_ls(args: argparse.Namespace) -> int:
    from ..api.hierarchy import open_hierarchy

    h = open_hierarchy(args.store, storage_options=storage_options(args.storage_options), strict=False)
    rows = ls_rows(h, args.path)
    print_result(args, {"source": args.store, "nodes": rows}, "\n".join(ls_line(r) for r in rows))
    return 0

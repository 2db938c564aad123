"""The xarray backend: ``xr.open_dataset(path, engine="sharding_store")`` over draft-era stores.

Registered under the entry point group ``xarray.backends`` as ``sharding_store``
(``setup.cfg``), so ``xr.open_dataset``, ``xr.open_datatree`` and ``xr.open_mfdataset``
read draft data with the project's own reader (:func:`sharding_store.open_draft`) at its
speed, never through the zarr-python 3 view.

* **Lazy**: every variable is a :class:`DraftBackendArray` (numpy basic indexing over a
  :class:`~sharding_store.DraftArray`, ``IndexingSupport.BASIC``: xarray turns other
  indexers into a bounding slice and indexes the result in memory). With ``chunks={}``
  (or ``"auto"``) dask chunks default to the **shard** shape (``preferred_chunks``), so
  each task reads whole shards in one request.
* **CF decoding by xarray** (times, ``scale_factor``/``add_offset``, fill values), as
  ``xr.open_zarr`` does. Fill values: xarray wrote draft (2022) stores over zarr-python
  2.x, putting ``_FillValue`` into the zarr ``fill_value`` and reading it back from there;
  so in a draft (2022) array xarray wrote (it has ``_ARRAY_DIMENSIONS``) the fill value is
  the CF ``_FillValue`` (values equal to it read as NaN), as xarray 2024 read it. In an
  array zarr-python or a microscope wrote, the fill value only says what unwritten chunks
  hold (a ``uint16`` image stays ``uint16``). Per-node (2023 / final v3) stores follow
  ``xr.open_zarr``'s v3 rule: only a ``_FillValue`` attribute masks.
  ``use_zarr_fill_value_as_mask=True``/``False`` decides for every array.
* **Dimension names**: ``dimension_names`` of a v3 / 2023 array, else xarray's
  ``_ARRAY_DIMENSIONS`` attribute (hidden from ``attrs``); ``dimension_names={path:
  [names]}`` names (or renames) them; an array with none is refused naming it and the hint.
* **Stores**: a path, an fsspec URL with ``storage_options``, or any store object
  ``open_draft`` accepts. Variables opened by path or URL pickle (a dask cluster's
  workers reopen the store once per process); the lost-transformer and shard-index
  checks of ``open_draft`` apply to every array.

Top layer of its own: it imports the package's public reader and the jobs layer's
``StoreRef``; nothing in the package imports it. xarray is optional
(``pip install 'sharding-store[xarray]'``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict, Unpack

import numpy as np

try:
    from xarray.backends import BackendArray, BackendEntrypoint
    from xarray.backends.common import AbstractDataStore
    from xarray.backends.store import StoreBackendEntrypoint
    from xarray.core import indexing
    from xarray.core.variable import Variable
except ImportError as e:  # pragma: no cover - exercised in a venv without xarray
    raise ImportError(
        f"sharding_store.xarray_backend needs xarray ({e}): pip install 'sharding-store[xarray]'", name="xarray"
    ) from e

try:  # xarray >= 2024.11: closes every group's store when the tree is closed
    from xarray.backends.common import datatree_from_dict_with_io_cleanup
except ImportError:  # pragma: no cover - older xarray: nothing of ours needs closing
    def datatree_from_dict_with_io_cleanup(groups_dict: Mapping[str, Any]) -> Any:  # type: ignore[misc]
        from xarray import DataTree

        return DataTree.from_dict(groups_dict)

from .api.arrays import DraftArray, DraftGroup, open_draft
from .api.hierarchy import DraftHierarchy, reader_label
from .errors import UsageError
from .formats import draft_metadata as dm
from .formats import gen2023
from .ops.jobs import StoreRef

__all__ = ["DraftBackendArray", "DraftDataStore", "ShardingStoreBackendEntrypoint"]

#: xarray's attribute holding dimension names in Zarr v2 and in draft stores it wrote
DIMENSION_KEY = "_ARRAY_DIMENSIONS"
#: the draft entry point / node document ``guess_can_open`` reads (at most this many bytes)
GUESS_MAX_BYTES = 1 << 20
#: arrays of one group opened at once (each open is one small read plus a tail read)
OPEN_THREADS = 8


# --------------------------------------------------------------------------- lazy arrays


class DraftBackendArray(BackendArray):
    """One draft array for xarray: basic indexing, reads through ``open_draft``'s reader.

    Pickles as (store reference, node path) when it was opened by path or URL: the
    unpickled copy reopens the array on its first read (a dask worker's first task)."""

    def __init__(self, array: DraftArray, ref: StoreRef | None) -> None:
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.path = array.path
        self._array: DraftArray | None = array
        self._ref = ref

    @property
    def array(self) -> DraftArray:
        if self._array is None:
            assert self._ref is not None
            node = open_draft(self._ref.open(), self.path)
            if not isinstance(node, DraftArray):
                raise UsageError(f"'/{self.path}' is no longer an array (the store changed)", key=self.path)
            self._array = node
        return self._array

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self._getitem)

    def _getitem(self, key: tuple[Any, ...]) -> np.ndarray:
        return np.asarray(self.array[key])

    def __getstate__(self) -> dict[str, Any]:
        if self._ref is None:
            raise TypeError(
                f"array '/{self.path}' was opened from a store object, which cannot be sent to another "
                "process: open the dataset by path or URL (with storage_options) instead"
            )
        return {"shape": self.shape, "dtype": self.dtype, "path": self.path, "ref": self._ref}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.shape, self.dtype, self.path, self._ref = state["shape"], state["dtype"], state["path"], state["ref"]
        self._array = None


# --------------------------------------------------------------------------- one group


def _dims_from_metadata(array: DraftArray) -> Any:
    """The dimension names the array's own metadata holds, if any: a ``dimension_names``
    property or field (per-node v3 / 2023 documents), else ``_ARRAY_DIMENSIONS``."""
    names = getattr(array, "dimension_names", None)
    meta = getattr(array, "meta", None)
    if names is None and meta is not None:
        names = getattr(meta, "dimension_names", None)
        raw = getattr(meta, "raw", None)
        if names is None and isinstance(raw, Mapping) and raw.get("zarr_format") == 3:
            names = raw.get("dimension_names")
    if names is None:
        names = array.attrs.get(DIMENSION_KEY)
    return names


class _Hints:
    """The ``dimension_names={path: names}`` option: keys are node paths from the store's
    root or from the opened group; every key must name an array that was opened."""

    def __init__(self, hints: Mapping[str, Sequence[str]] | None, base: str) -> None:
        self.base = base
        self.hints: dict[str, tuple[str, ...]] = {}
        for key, names in (hints or {}).items():
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise UsageError(f"dimension_names[{key!r}]: expected a list of names, got {names!r}", key=str(key))
            self.hints[dm.normalize_path(key)] = tuple(names)
        self.used: set[str] = set()

    def relative(self, path: str) -> str:
        """``path`` from the opened group (as a hint may spell it)."""
        return path[len(self.base) + 1 :] if self.base and path.startswith(self.base + "/") else path

    def lookup(self, path: str) -> tuple[str, ...] | None:
        for key in (path, self.relative(path)):
            if key in self.hints:
                self.used.add(key)
                return self.hints[key]
        return None

    def check_all_used(self) -> None:
        unused = sorted(set(self.hints) - self.used)
        if unused:
            where = f"below '/{self.base}'" if self.base else "in the store"
            raise UsageError(f"dimension_names: no array {', '.join(repr(u) for u in unused)} {where}", key=unused[0])


def _example(arrays: Sequence[DraftArray], hints: _Hints) -> str:
    """The ``dimension_names={...}`` that names every one of ``arrays`` (``dim_0``, ...)."""
    items = [f"{hints.relative(a.path)!r}: [{', '.join(repr(f'dim_{i}') for i in range(a.ndim))}]" for a in arrays]
    return f"dimension_names={{{', '.join(items)}}}"


def require_dimensions(arrays: Iterable[DraftArray], hints: _Hints) -> None:
    """Every array that neither its metadata nor ``hints`` names, in one :class:`UsageError`
    with the whole ``dimension_names={...}`` to pass: a group of several unnamed arrays then
    fails once, not once per array."""
    unnamed = [a for a in arrays if hints.lookup(a.path) is None and _dims_from_metadata(a) is None]
    if len(unnamed) > 1:
        paths = ", ".join(f"'/{a.path}'" for a in unnamed)
        raise UsageError(
            f"{len(unnamed)} arrays have no dimension names (no 'dimension_names', no '{DIMENSION_KEY}' attribute: "
            f"not written by xarray): {paths}; name them with {_example(unnamed, hints)}", key=unnamed[0].path)
    for a in unnamed:
        dimensions_of(a, hints)


def dimensions_of(array: DraftArray, hints: _Hints) -> tuple[str, ...]:
    """The array's dimension names (a hint first), or :class:`UsageError` naming the array."""
    names = hints.lookup(array.path)
    given = names is not None
    if names is None:
        names = _dims_from_metadata(array)
    example = _example([array], hints)
    if names is None:
        raise UsageError(
            f"array '/{array.path}' has no dimension names (no 'dimension_names', no '{DIMENSION_KEY}' "
            f"attribute: not written by xarray): name them with {example}",
            key=array.path,
        )
    if isinstance(names, str) or len(names) != array.ndim or not all(isinstance(n, str) and n for n in names):
        source = "dimension_names option" if given else "metadata"
        raise UsageError(
            f"array '/{array.path}': its {source} gives dimension names {list(names) if not isinstance(names, str) else names!r}, "
            f"expected {array.ndim} non-empty names; name them with {example}",
            key=array.path,
        )
    return tuple(names)


class DraftDataStore(AbstractDataStore):
    """The arrays and attributes of one draft group, as xarray's decoding expects them."""

    def __init__(
        self,
        group: DraftGroup,
        arrays: Mapping[str, DraftArray],
        *,
        hints: _Hints,
        mask: bool | None,
        xarray_era: bool,
        ref: StoreRef | None,
    ) -> None:
        """``mask``: whether the zarr fill value is the CF ``_FillValue`` (None: where xarray
        of the draft era wrote the array, ``xarray_era``)."""
        self.group = group
        self.arrays = arrays
        self.hints = hints
        self.mask = mask
        self.xarray_era = xarray_era
        self.ref = ref

    def open_store_variable(self, name: str, array: DraftArray) -> Variable:
        dims = dimensions_of(array, self.hints)
        attributes = {k: v for k, v in array.attrs.items() if k != DIMENSION_KEY}
        grid = array.shard_shape or array.chunks
        encoding: dict[str, Any] = {
            "chunks": tuple(array.chunks),
            "preferred_chunks": dict(zip(dims, grid)),
        }
        if array.shard_shape is not None:
            encoding["shards"] = tuple(array.shard_shape)
        mask = self.mask if self.mask is not None else self.xarray_era and DIMENSION_KEY in array.attrs
        if mask:
            if array.fill_value is not None:
                attributes["_FillValue"] = array.fill_value
        elif "_FillValue" in attributes and np.dtype(array.dtype).kind in "fc":
            attributes["_FillValue"] = _decode_fill_attribute(attributes["_FillValue"], array.dtype)
        data = indexing.LazilyIndexedArray(DraftBackendArray(array, self.ref))
        return Variable(dims, data, attributes, encoding)

    def get_variables(self) -> dict[str, Variable]:
        return {name: self.open_store_variable(name, a) for name, a in self.arrays.items()}

    def get_attrs(self) -> dict[str, Any]:
        return dict(self.group.attrs)

    def get_dimensions(self) -> dict[str, int]:
        dims: dict[str, int] = {}
        for a in self.arrays.values():
            dims.update(zip(dimensions_of(a, self.hints), a.shape))
        return dims

    def close(self) -> None:
        pass  # nothing is held open: reads open and close what they need

    def __getstate__(self) -> dict[str, Any]:
        # a pickled Dataset carries its close callback (this store): the variables travel
        # by themselves (DraftBackendArray), so the store travels empty
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # an emptied store (see __getstate__): nothing of it is read again
        self.group, self.arrays, self.hints, self.mask, self.xarray_era, self.ref = None, {}, None, None, False, None  # type: ignore[assignment]


def _decode_fill_attribute(value: Any, dtype: np.dtype) -> Any:
    """A ``_FillValue`` attribute as xarray writes it to Zarr v3 (base64 of a float64) or
    as a plain number; anything else is left for xarray's CF decoding to judge."""
    if isinstance(value, str):
        try:
            from xarray.backends.zarr import FillValueCoder

            return FillValueCoder.decode(value, dtype)
        except Exception:  # noqa: BLE001 - "NaN" and other spellings: xarray decides
            return value
    return value


# --------------------------------------------------------------------------- opening


def _normalize(filename_or_obj: Any) -> Any:
    """A local path made absolute (workers may run elsewhere in the tree); URLs and store
    objects as given."""
    if isinstance(filename_or_obj, os.PathLike):
        filename_or_obj = os.fspath(filename_or_obj)
    if isinstance(filename_or_obj, str) and "://" not in filename_or_obj and "::" not in filename_or_obj:
        return os.path.abspath(os.path.expanduser(filename_or_obj))
    return filename_or_obj


def _store_ref(store: Any, storage_options: Mapping[str, Any] | None) -> StoreRef | None:
    """How another process reaches ``store``; None when it cannot (a store object, or
    storage options that are not JSON)."""
    if not isinstance(store, str):
        return None
    try:
        return StoreRef.of(store, storage_options)
    except (TypeError, ValueError):
        return None


class _Opened:
    """The group asked for, how it was reached, and the per-open settings."""

    def __init__(
        self,
        filename_or_obj: Any,
        group: str | None,
        storage_options: Mapping[str, Any] | None,
        dimension_names: Mapping[str, Sequence[str]] | None,
        use_zarr_fill_value_as_mask: bool | None,
    ) -> None:
        if isinstance(filename_or_obj, DraftGroup):
            root: Any = filename_or_obj if not group else filename_or_obj[group]
            self.ref = None
        else:
            store = _normalize(filename_or_obj)
            root = open_draft(store, dm.normalize_path(group or ""), storage_options=storage_options)
            self.ref = _store_ref(store, storage_options)
        if isinstance(root, DraftArray) and not root.path:
            raise UsageError("the store's root is an array, not a group: xarray opens groups; read it with open_draft",
                             key="")
        if isinstance(root, DraftArray):
            parent = root.path.rpartition("/")[0]
            raise UsageError(
                f"'/{root.path}' is an array, not a group: open its group (group={parent!r}) and take the variable "
                f"{root.path.rpartition('/')[2]!r}",
                key=root.path,
            )
        self.root: DraftGroup = root
        self.hints = _Hints(dimension_names, root.path)
        self.mask = use_zarr_fill_value_as_mask
        # xarray of the draft era stored _FillValue as the zarr fill_value (see the module doc)
        self.xarray_era = False
        if use_zarr_fill_value_as_mask is None:
            self.xarray_era = reader_label(root.inner) == DraftHierarchy.label

    def members(self, group: DraftGroup) -> tuple[dict[str, DraftArray], dict[str, DraftGroup]]:
        """The group's child arrays and groups, each opened by ``open_draft``'s rules (the
        lost-transformer refusal included), several at once: each is a small read."""
        names = list(group)
        if len(names) > 1:
            with ThreadPoolExecutor(min(OPEN_THREADS, len(names))) as pool:
                nodes = list(pool.map(group.__getitem__, names))
        else:
            nodes = [group[n] for n in names]
        arrays = {n: node for n, node in zip(names, nodes) if isinstance(node, DraftArray)}
        groups = {n: node for n, node in zip(names, nodes) if isinstance(node, DraftGroup)}
        return arrays, groups

    def store(self, group: DraftGroup, arrays: Mapping[str, DraftArray]) -> DraftDataStore:
        return DraftDataStore(group, arrays, hints=self.hints, mask=self.mask, xarray_era=self.xarray_era, ref=self.ref)


class CFDecoding(TypedDict, total=False):
    """xarray's CF decoding switches, passed on to its decoder as ``xr.open_zarr`` does."""

    mask_and_scale: bool
    decode_times: Any  # a bool, or xarray's CFDatetimeCoder in recent versions
    concat_characters: bool
    decode_coords: Any  # a bool or "coordinates"/"all"
    use_cftime: bool | None
    decode_timedelta: Any


#: xarray's defaults for :class:`CFDecoding` (its ``open_dataset`` passes every one it knows)
_CF_DEFAULTS: dict[str, Any] = {"mask_and_scale": True, "decode_times": True, "concat_characters": True,
                                "decode_coords": True, "use_cftime": None, "decode_timedelta": None}


def _cf_decoding(given: Mapping[str, Any], method: str = "open_dataset") -> dict[str, Any]:
    """The CF switches with xarray's defaults; an unknown keyword is refused as Python
    refuses one (:class:`TypeError`), naming it."""
    for name in given:
        if name not in _CF_DEFAULTS:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
    return {**_CF_DEFAULTS, **given}


def _kept(arrays: Mapping[str, DraftArray], drop_variables: Any) -> list[DraftArray]:
    """The arrays of a group that ``drop_variables`` leaves (as :func:`_decode` drops them)."""
    drop = set() if drop_variables is None else {drop_variables} if isinstance(drop_variables, str) else set(drop_variables)
    return [a for name, a in arrays.items() if name not in drop]


def _decode(store: DraftDataStore, drop_variables: Any, decode: Mapping[str, Any]) -> Any:
    """xarray's CF decoding of one group (the same code path as ``xr.open_zarr``)."""
    if drop_variables is not None:
        drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables)
        store.arrays = {k: v for k, v in store.arrays.items() if k not in drop}
    return StoreBackendEntrypoint().open_dataset(store, drop_variables=drop_variables, **decode)


class ShardingStoreBackendEntrypoint(BackendEntrypoint):
    """Open draft-era Zarr v3 stores (2022 ``meta/root`` layout, zarr-python 2.14-2.18 and
    xarray 2023-2024) with sharding-store's reader: ``engine="sharding_store"``."""

    description = "Open draft-era (2022-2024) sharded Zarr v3 stores with sharding-store"
    url = "https://github.com/sharding-store/sharding-store#xarray"
    supports_groups = True
    open_dataset_parameters = (
        "filename_or_obj", "mask_and_scale", "decode_times", "concat_characters", "decode_coords",
        "drop_variables", "use_cftime", "decode_timedelta", "group", "storage_options", "dimension_names",
        "use_zarr_fill_value_as_mask",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """True for a local path whose ``zarr.json`` is a draft (2022) entry point or a node
        document spelled as in 2023. One small read; URLs and objects are never guessed
        (pass ``engine="sharding_store"``); a 2023 store whose root document is already
        spelled final is left to the ``zarr`` engine's guess as well."""
        if isinstance(filename_or_obj, os.PathLike):
            filename_or_obj = os.fspath(filename_or_obj)
        if not isinstance(filename_or_obj, str):
            return False
        path = filename_or_obj[len("file://") :] if filename_or_obj.startswith("file://") else filename_or_obj
        if "://" in path or "::" in path:
            return False
        raw = _read_small_file(os.path.join(os.path.expanduser(path), dm.ENTRY_POINT_KEY))
        return raw is not None and gen2023.classify_node(raw, dm.ENTRY_POINT_KEY) in ("draft-2022", "2023")

    def open_dataset(
        self,
        filename_or_obj: Any,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        dimension_names: Mapping[str, Sequence[str]] | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        **decode: Unpack[CFDecoding],
    ) -> Any:
        """The group ``group`` (default: the root) as a Dataset: its child arrays are the
        variables, its attributes the Dataset's. ``dimension_names``: ``{path: [names]}``
        for arrays without (paths from the root or from ``group``)."""
        opened = _Opened(filename_or_obj, group, storage_options, dimension_names, use_zarr_fill_value_as_mask)
        arrays, _ = opened.members(opened.root)
        require_dimensions(_kept(arrays, drop_variables), opened.hints)
        store = opened.store(opened.root, arrays)
        ds = _decode(store, drop_variables, _cf_decoding(decode))
        opened.hints.check_all_used()
        return ds

    def open_groups_as_dict(
        self,
        filename_or_obj: Any,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        dimension_names: Mapping[str, Sequence[str]] | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        **decode: Unpack[CFDecoding],
    ) -> dict[str, Any]:
        """Every group at and below ``group`` as ``{"/", "/a", "/a/b", ...: Dataset}`` (paths
        relative to ``group``), parents before children."""
        cf = _cf_decoding(decode, "open_groups_as_dict")
        opened = _Opened(filename_or_obj, group, storage_options, dimension_names, use_zarr_fill_value_as_mask)
        base = opened.root.path
        walked: list[tuple[DraftGroup, dict[str, DraftArray]]] = []
        todo = [opened.root]
        while todo:  # every group's arrays first: the unnamed ones of all groups are named in one error
            g = todo.pop(0)
            arrays, groups = opened.members(g)
            walked.append((g, arrays))
            todo.extend(groups[name] for name in sorted(groups))
        require_dimensions([a for _, arrays in walked for a in _kept(arrays, drop_variables)], opened.hints)
        out: dict[str, Any] = {}
        for g, arrays in walked:
            rel = g.path[len(base) :].lstrip("/") if base else g.path
            out["/" + rel] = _decode(opened.store(g, arrays), drop_variables, cf)
        opened.hints.check_all_used()
        return out

    def open_datatree(
        self,
        filename_or_obj: Any,
        **kwargs: Any,
    ) -> Any:
        """The hierarchy at and below ``group`` as a DataTree (arguments: :meth:`open_groups_as_dict`)."""
        return datatree_from_dict_with_io_cleanup(self.open_groups_as_dict(filename_or_obj, **kwargs))


def _read_small_file(path: str) -> bytes | None:
    """A regular file's first bytes, never following a final link nor blocking on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, GUESS_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)

"""The one place that uses zarr-python 3's private API (issue 23: one adapter per library).

Written against zarr 3.1 (setup.cfg: ``zarr>=3.1``). What zarr does not make public:
``zarr.core.sync.sync`` (run a coroutine on zarr's event loop), ``zarr.core.dtype``
(``get_data_type_from_native_dtype``, ``HasEndianness``), ``zarr.core.array_spec``
(``ArraySpec``, ``ArrayConfig``: what a codec is evaluated with),
``zarr.core.metadata.v3.ArrayV3Metadata``, and of ``zarr.abc.store.Store`` its
``_open()`` (the base opening a subclass extends) and ``_is_open`` (the flag a copy of a
store must reset). Public names are used where zarr has them (``zarr.buffer``,
``zarr.abc.buffer``). Importing this module imports nothing of zarr: each function imports
what it needs. ``tests/unit/stores/test_adapters.py`` fails when one of these changes.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PRIVATE_MODULES",
    "array_spec",
    "array_v3_metadata",
    "dtype_from_numpy",
    "has_endianness",
    "open_base_store",
    "sync",
    "unopened_state",
]

#: the private modules of zarr this module imports, and the names it takes from each
PRIVATE_MODULES = {
    "zarr.core.sync": ("sync",),
    "zarr.core.dtype": ("get_data_type_from_native_dtype",),
    "zarr.core.dtype.common": ("HasEndianness",),
    "zarr.core.array_spec": ("ArrayConfig", "ArraySpec"),
    "zarr.core.metadata.v3": ("ArrayV3Metadata",),
}


def sync(coro: Any) -> Any:
    """Run ``coro`` on zarr's event loop thread and return its result (zarr's own ``sync``)."""
    from zarr.core.sync import sync as zarr_sync

    return zarr_sync(coro)


def dtype_from_numpy(dtype: Any) -> Any:
    """zarr-python 3's data type object (``ZDType``) for a numpy dtype."""
    from zarr.core.dtype import get_data_type_from_native_dtype

    return get_data_type_from_native_dtype(dtype)


def has_endianness(zdtype: Any) -> bool:
    """Whether a zarr data type has a byte order (its JSON names it)."""
    from zarr.core.dtype.common import HasEndianness

    return isinstance(zdtype, HasEndianness)


def array_spec(shape: tuple[int, ...], zdtype: Any) -> Any:
    """The ``ArraySpec`` zarr evaluates a codec with: ``shape`` of ``zdtype``, its default
    fill value, the default array configuration and buffer prototype."""
    from zarr.buffer import default_buffer_prototype
    from zarr.core.array_spec import ArrayConfig, ArraySpec

    return ArraySpec(shape=shape, dtype=zdtype, fill_value=zdtype.default_scalar(),
                     config=ArrayConfig.from_dict({}), prototype=default_buffer_prototype())


def array_v3_metadata() -> Any:
    """zarr's ``ArrayV3Metadata`` class (``from_dict`` checks a final ``zarr.json``)."""
    from zarr.core.metadata.v3 import ArrayV3Metadata

    return ArrayV3Metadata


async def open_base_store(store: Any) -> None:
    """What ``zarr.abc.store.Store._open`` does for ``store`` (a subclass's ``_open`` runs
    this first, then its own checks)."""
    from zarr.abc.store import Store

    await Store._open(store)


def unopened_state(state: dict[str, Any]) -> dict[str, Any]:
    """A store's pickled state as an unopened store's (a clone opens itself again)."""
    return {**state, "_is_open": False}

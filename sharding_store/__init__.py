"""sharding-store: read, write and migrate draft-era (2022-2024) sharded Zarr v3 data."""

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, see _EXPORTS
    from .api.arrays import DraftArray, DraftGroup, create_draft_array, create_draft_group, open_draft
    from .api.v3view import open_v3
    from .engine.store import ShardingStore
    from .errors import (
        ChunkDecodeError,
        ChunkKeyError,
        DestinationExistsError,
        DraftMetadataError,
        MigrationError,
        ReadOnlyError,
        ShardCorruptError,
        ShardingStoreError,
        SourceChangedError,
        StoreNotFoundError,
        UsageError,
        VerificationError,
    )
    from .formats.shard_index import ShardIndex, decode_chunk, decode_shard, encode_shard
    from .ops.migration import migrate
    from .ops.options import MigrateOptions, ReshardOptions, RunOptions, StoreOptions, UpgradeOptions, VerifyOptions
    from .ops.resharding import reshard, shard, unshard
    from .ops.upgrade import upgrade_in_place
    from .ops.verification import verify
    from .stores.references import open_references

from ._version import __version__ as __version__  # the one place it is written

#: public name -> the module that defines it, imported on first use: the CLI and
#: ``from sharding_store.ops.migration import ...`` then load only what they need (zarr-python
#: 3, for ``open_v3``, is never loaded until asked for)
_EXPORTS = {
    **dict.fromkeys(["DraftArray", "DraftGroup", "create_draft_array", "create_draft_group", "open_draft"], "api.arrays"),
    **dict.fromkeys(
        ["ChunkDecodeError", "ChunkKeyError", "DestinationExistsError", "DraftMetadataError", "MigrationError",
         "ReadOnlyError", "ShardCorruptError", "ShardingStoreError", "SourceChangedError", "StoreNotFoundError", "UsageError",
         "VerificationError"],
        "errors",
    ),
    **dict.fromkeys(["ShardIndex", "decode_chunk", "decode_shard", "encode_shard"], "formats.shard_index"),
    **dict.fromkeys(["reshard", "shard", "unshard"], "ops.resharding"),
    "migrate": "ops.migration",
    "upgrade_in_place": "ops.upgrade",
    **dict.fromkeys(["MigrateOptions", "ReshardOptions", "RunOptions", "StoreOptions", "UpgradeOptions", "VerifyOptions"],
                    "ops.options"),
    "verify": "ops.verification",
    "ShardingStore": "engine.store",
    "open_v3": "api.v3view",
    "open_references": "stores.references",
}


class _Package(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        types.ModuleType.__setattr__(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_EXPORTS))


sys.modules[__name__].__class__ = _Package


__all__ = [
    "ChunkDecodeError",
    "DraftArray",
    "DraftGroup",
    "ChunkKeyError",
    "DestinationExistsError",
    "DraftMetadataError",
    "MigrationError",
    "ReadOnlyError",
    "ShardCorruptError",
    "ShardIndex",
    "ShardingStore",
    "ShardingStoreError",
    "SourceChangedError",
    "StoreNotFoundError",
    "UsageError",
    "VerificationError",
    "create_draft_array",
    "create_draft_group",
    "decode_chunk",
    "decode_shard",
    "encode_shard",
    "migrate",
    "MigrateOptions",
    "open_draft",
    "open_references",
    "open_v3",
    "reshard",
    "shard",
    "unshard",
    "upgrade_in_place",
    "verify",
    "ReshardOptions",
    "RunOptions",
    "StoreOptions",
    "UpgradeOptions",
    "VerifyOptions",
]

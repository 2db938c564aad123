"""sharding-store: read, write and migrate draft-era (2022-2024) sharded Zarr v3 data."""

from .array import DraftArray, DraftGroup, create_draft_array, create_draft_group, open_draft
from .errors import (
    ChunkDecodeError,
    ChunkKeyError,
    DestinationExistsError,
    DraftMetadataError,
    MigrationError,
    ReadOnlyError,
    ShardCorruptError,
    ShardingStoreError,
    StoreNotFoundError,
    UsageError,
    VerificationError,
)
from .shard_index import ShardIndex, decode_chunk, decode_shard, encode_shard
from .reshard import reshard, shard, unshard
from .migrate import migrate
from .verify import verify
from .store import ShardingStore

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # open_v3 needs zarr-python 3; import it on first use so `import sharding_store`
    # (and the CLI) stays fast for everything else.
    if name == "open_v3":
        from .v3view import open_v3

        return open_v3
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "StoreNotFoundError",
    "UsageError",
    "VerificationError",
    "create_draft_array",
    "create_draft_group",
    "decode_chunk",
    "decode_shard",
    "encode_shard",
    "open_draft",
    "open_v3",
    "reshard",
    "shard",
    "unshard",
]

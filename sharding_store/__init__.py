"""sharding-store: read, write and migrate draft-era (2022-2024) sharded Zarr v3 data."""

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
from .store import ShardingStore

__version__ = "0.1.0"

__all__ = [
    "ChunkDecodeError",
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
    "decode_chunk",
    "decode_shard",
    "encode_shard",
]

"""Exception classes of sharding-store.

Every error the package raises on bad input derives from :class:`ShardingStoreError`,
names the key (or field, or path) at fault and says what is wrong. The CLI maps each
class to its own exit code (``exit_code``) and prints one line, never a traceback.
"""

from __future__ import annotations


class ShardingStoreError(Exception):
    """Base class of all sharding-store errors."""

    exit_code = 1

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class DraftMetadataError(ShardingStoreError, ValueError):
    """A draft metadata document (entry point, array, group) is invalid."""

    exit_code = 3


class ShardCorruptError(ShardingStoreError, ValueError):
    """A shard object is damaged: its index or payload ranges cannot be trusted."""

    exit_code = 4


class ChunkKeyError(ShardingStoreError, KeyError):
    """A key under an array's data prefix is not a valid chunk key for that array."""

    exit_code = 5

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ChunkDecodeError(ShardingStoreError, ValueError):
    """An inner chunk payload cannot be decoded with the array's codecs."""

    exit_code = 6


class StoreNotFoundError(ShardingStoreError, FileNotFoundError):
    """There is no draft-era hierarchy (no ``zarr.json``) or no node at a path."""

    exit_code = 7


class OtherGenerationError(StoreNotFoundError):
    """The store is data of another Zarr generation (final v3, Zarr v2), not draft-era: exit 7,
    saying which. ``generation`` names it (``"Zarr v3"``, ``"Zarr v2"``), ``what`` says how it
    was told, ``advice`` what to do instead; the command line words the advice for the
    command that was given (``cli.output.other_generation``)."""

    def __init__(self, location: str, generation: str, what: str, advice: str, *, key: str) -> None:
        super().__init__(f"{location}: {what}, not draft-era: {advice}", key=key)
        self.location, self.generation, self.what, self.advice = location, generation, what, advice


class DestinationExistsError(ShardingStoreError, FileExistsError):
    """A migration or reshard destination exists and ``overwrite`` was not given."""

    exit_code = 8


class VerificationError(ShardingStoreError):
    """A migrated store differs from its source."""

    exit_code = 9


class MigrationError(ShardingStoreError):
    """A migration could not complete (e.g. damaged arrays, retries exhausted)."""

    exit_code = 10


class ReadOnlyError(ShardingStoreError, PermissionError, ValueError):
    """A write was attempted through a read-only view (a ValueError, as zarr's stores raise)."""

    exit_code = 11


class UsageError(ShardingStoreError, ValueError):
    """Arguments that contradict each other or the data (e.g. a bad chunks_per_shard)."""

    exit_code = 2


class StoreIOError(ShardingStoreError, OSError):
    """A store cannot be reached or read (unreachable endpoint, refused connection): exit 12, as
    every other I/O error. Named after the URL, never a traceback."""

    exit_code = 12


class ObjectChangedError(ShardingStoreError):
    """An object was replaced between two reads that must see the same version of it (its
    index, then its chunks): the read is refused rather than mixing two versions. Reading
    again sees the new version consistently. Exit 12 (I/O), as the README's table says."""

    exit_code = 12


class LinkOutsideStoreError(ShardingStoreError, PermissionError):
    """A key of a local store resolves, through a symbolic link, to a file outside the store's
    directory: refused, so a store can never be made to read (and copy elsewhere) another file
    on the machine. Exit 13."""

    exit_code = 13


class SourceChangedError(ShardingStoreError):
    """A virtual destination (a reference file, an Icechunk repository of virtual chunks) refers
    to a source object that changed, shrank or was deleted since the references were taken:
    the read is refused rather than return other bytes. The message names the object's URL
    and what changed. Exit 14."""

    exit_code = 14


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, or SIGTERM (the CLI's handler raises it), with what was running when it came:
    ``phase`` is ``"verify"`` once a migration had written everything and was verifying it
    (the CLI then advises ``verify``, not ``--resume``). Exit 130, like any interruption."""

    exit_code = 130

    def __init__(self, phase: str = "") -> None:
        super().__init__(phase)
        self.phase = phase

"""The window agent's local checkpoints: window state and input offset, per partition.

One RocksDB (rocksdict) store per worker under ``<data_dir>/window-checkpoints``.
A checkpoint of a launches partition is one value holding the windowing state of
the partition's stream keys *and* the offset of the next launch batch to process
(packed with :mod:`agents.logic.snapshot_codec`), so state and position can never
disagree; the checkpoints of all partitions are written in one atomic write batch.
The process, not the machine, is what crashes in a ``kill -9``: RocksDB's write-ahead
log (in the OS page cache) is enough to find the last write after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["CheckpointStore", "CheckpointStoreError"]


class CheckpointStoreError(RuntimeError):
    """The checkpoint store cannot be opened (another worker uses the same directory)."""


class CheckpointStore:
    """Atomic per-partition checkpoints in a local RocksDB."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict

        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(str(path), options=Options(raw_mode=True))
        except Exception as ex:  # rocksdict raises a bare Exception for a held lock
            raise CheckpointStoreError(
                f"cannot open the window checkpoint store {path}: {ex}. Every worker needs "
                "its own KERNELSTREAM_DATA_DIR; stop the other worker or give this one another"
            ) from ex

    @staticmethod
    def _key(topic: str, partition: int) -> bytes:
        return f"{topic}/{partition}".encode()

    def load(self, topic: str, partition: int) -> bytes | None:
        value = self._db.get(self._key(topic, partition))
        return None if value is None else bytes(value)

    def save(self, topic: str, records: Mapping[int, bytes]) -> None:
        """Write the checkpoints of several partitions at once (all or none)."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for partition, value in records.items():
            batch.put(self._key(topic, partition), value)
        self._db.write(batch)

    def delete(self, topic: str, partitions: Iterable[int]) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for partition in partitions:
            batch.delete(self._key(topic, partition))
        self._db.write(batch)

    def close(self) -> None:
        self._db.close()

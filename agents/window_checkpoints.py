"""The window agent's local checkpoints: window state and input offset, per partition.

One directory per worker, ``<data_dir>/window-state``, one file per launches
partition (``<topic>/<partition>.ckpt``). A checkpoint of a partition holds the
windowing state of the partition's stream keys *and* the offset of the next launch
batch to process (packed with :mod:`agents.logic.snapshot_codec`), so state and
position can never disagree. Each file is replaced atomically (written beside it,
then renamed over it), so a reader finds the previous checkpoint or the new one,
never a mix. Partitions need no atomicity *across* each other: each record names
its own offset, and offsets are committed only after their records are written, so
a crash between two partitions' writes leaves the older one still consistent.

Why files and not RocksDB (the store until 2026-11-22): a checkpoint is a few large
values (the open windows' columns, ~16 bytes per launch), rewritten whole every
``checkpoint_interval_s``. rocksdict copies each value into a write batch and then
into its log and memtable while holding the GIL: about 100 ms for 25 MB on this
machine, 8-14% of the worker's time at full speed (``kernelstream bench pipeline``,
stage ``checkpoint``). A file write is one copy into the page cache, made with the
GIL released, so the window agent runs it on a thread while it goes on consuming.

The process, not the machine, is what crashes in a ``kill -9``: the page cache keeps
what was written. Nothing is fsynced (RocksDB's log was not synced either); after a
power loss a partition may fall back to the state handed over on the
``<launches>.window-state`` topic or be counted as lost (``window.state_lost``).
A lock file keeps a second worker from using the same directory.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["CheckpointStore", "CheckpointStoreError"]


class CheckpointStoreError(RuntimeError):
    """The checkpoint store cannot be used (another worker holds the same directory)."""


class CheckpointStore:
    """Atomically replaced per-partition checkpoint files under one locked directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock = (path / "LOCK").open("a+b")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as ex:
            self._lock.close()
            raise CheckpointStoreError(
                f"cannot open the window checkpoint store {path}: another worker holds it "
                f"({ex.strerror}). Every worker needs its own KERNELSTREAM_DATA_DIR; stop the "
                "other worker or give this one another"
            ) from ex

    def _file(self, topic: str, partition: int) -> Path:
        if not topic or "/" in topic or topic.startswith("."):
            raise ValueError(f"not a topic name: {topic!r}")
        return self.path / topic / f"{int(partition)}.ckpt"

    def load(self, topic: str, partition: int) -> bytes | None:
        try:
            return self._file(topic, partition).read_bytes()
        except FileNotFoundError:
            return None

    def save(self, topic: str, records: Mapping[int, bytes | Sequence[bytes | memoryview]]) -> None:
        """Replace the checkpoints of these partitions, each atomically. A record is its
        bytes or their consecutive parts (:func:`agents.logic.snapshot_codec.pack_parts`:
        the open windows' columns written from their own buffers, not joined first).

        Safe to call from a thread: the writes release the GIL.
        """
        for partition, value in records.items():
            final = self._file(topic, partition)
            final.parent.mkdir(exist_ok=True)
            tmp = final.with_name(final.name + ".tmp")
            with tmp.open("wb") as f:
                if isinstance(value, bytes):
                    f.write(value)
                else:
                    f.writelines(value)
            tmp.replace(final)

    def delete(self, topic: str, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._file(topic, partition).unlink(missing_ok=True)

    def close(self) -> None:
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()

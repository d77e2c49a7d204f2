"""The window agent's checkpoint files: replace, load, delete, one worker per directory."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kernelstream.agents.window_checkpoints import CheckpointStore, CheckpointStoreError


def test_save_load_replace_delete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    assert store.load("ks.launches", 0) is None
    store.save("ks.launches", {0: b"a" * 10, 3: b"three"})
    assert store.load("ks.launches", 0) == b"a" * 10
    assert store.load("ks.launches", 3) == b"three"
    assert store.load("other", 0) is None
    store.save("ks.launches", {0: b"newer"})
    assert store.load("ks.launches", 0) == b"newer"
    assert store.load("ks.launches", 3) == b"three"  # untouched
    store.delete("ks.launches", [3, 7])  # 7: never written
    assert store.load("ks.launches", 3) is None
    assert not list((tmp_path / "ck").rglob("*.tmp"))
    store.close()
    reopened = CheckpointStore(tmp_path / "ck")  # survives a restart
    assert reopened.load("ks.launches", 0) == b"newer"
    reopened.close()


def test_a_second_worker_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = CheckpointStore(tmp_path / "ck")
    with pytest.raises(CheckpointStoreError, match="KERNELSTREAM_DATA_DIR"):
        CheckpointStore(tmp_path / "ck")
    first.close()
    CheckpointStore(tmp_path / "ck").close()  # free again once closed


def test_readers_see_the_old_or_the_new_record_never_a_mix(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    old, new = b"o" * (4 << 20), b"n" * (4 << 20)
    store.save("t", {0: old})
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            value = store.load("t", 0)
            assert value is not None
            seen.add(value[:1] + value[-1:] + bytes([len(value) == len(old)]))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(20):
        store.save("t", {0: new if i % 2 else old})
    done.set()
    reader.join()
    assert seen <= {b"oo\x01", b"nn\x01"}
    store.close()


def test_bad_topic_names_are_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    for bad in ("", "a/b", "..", ".hidden"):
        with pytest.raises(ValueError, match="topic"):
            store.save(bad, {0: b"x"})
    store.close()

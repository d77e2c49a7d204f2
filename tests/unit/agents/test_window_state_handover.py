"""A partition's window state crosses the handover topic whole, however large it is."""

from __future__ import annotations

import os

from kernelstream.agents.window_agent import StateReassembler, state_messages


def _replay(reader: StateReassembler, partition: int, msgs: list[tuple[bytes, bytes]]) -> None:
    for key, value in msgs:
        reader.add(partition, key, value)


def test_a_record_that_fits_is_one_state_message() -> None:
    assert state_messages(b"x" * 100, 100) == [(b"state", b"x" * 100)]


def test_a_large_record_is_chunked_and_reassembled_byte_for_byte() -> None:
    record = os.urandom(10_001)
    msgs = state_messages(record, 1000)
    assert len(msgs) == 11 and all(len(v) <= 1000 for _, v in msgs)
    reader = StateReassembler()
    _replay(reader, 3, msgs)
    assert reader.latest == {3: record}


def test_the_newest_complete_record_wins_and_markers_are_ignored() -> None:
    old, new = os.urandom(2500), os.urandom(3100)
    reader = StateReassembler()
    _replay(reader, 0, state_messages(old, 1000))
    reader.add(0, b"marker", b"abc")
    _replay(reader, 0, state_messages(new, 1000))
    assert reader.latest[0] == new
    _replay(reader, 0, [(b"state", b"small and newer")])  # an older version's whole record
    assert reader.latest[0] == b"small and newer"


def test_an_interrupted_handover_leaves_the_previous_record() -> None:
    old, cut = os.urandom(2500), os.urandom(5000)
    reader = StateReassembler()
    _replay(reader, 1, state_messages(old, 1000))
    _replay(reader, 1, state_messages(cut, 1000)[:3])  # its worker died here
    assert reader.latest[1] == old
    # A later complete handover still reassembles, even right after a broken one.
    newer = os.urandom(4200)
    _replay(reader, 1, state_messages(newer, 1000))
    assert reader.latest[1] == newer


def test_chunks_of_two_handovers_interleaved_are_not_mixed() -> None:
    a, b = state_messages(os.urandom(3000), 1000), state_messages(os.urandom(3000), 1000)
    reader = StateReassembler()
    _replay(reader, 2, [a[0], b[1], a[1], a[2]])  # b's chunk 1 without its chunk 0
    assert 2 not in reader.latest  # a was broken by a foreign chunk: nothing half-made
    reader.add(2, b"chunk:zz:x:3", b"")  # malformed keys are skipped, not fatal
    reader.add(2, None, b"")
    assert reader.latest == {}


def test_partitions_are_independent() -> None:
    r0, r1 = os.urandom(2048), os.urandom(4096)
    m0, m1 = state_messages(r0, 1000), state_messages(r1, 1000)
    reader = StateReassembler()
    for i in range(max(len(m0), len(m1))):
        if i < len(m0):
            reader.add(0, *m0[i])
        if i < len(m1):
            reader.add(1, *m1[i])
    assert reader.latest == {0: r0, 1: r1}

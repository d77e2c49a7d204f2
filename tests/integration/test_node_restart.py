"""A node killed with SIGKILL while the broker is unreachable loses nothing it had batched.

The first node process runs against a port where no broker listens, so every batch
waits in its outbox; it is then killed with SIGKILL. A second process with the same
node id and state directory, now pointed at the broker, sends the backlog and goes on.
On the topic: no sequence number is used twice (a restarted node continues its
numbering), and every batch waiting in the killed process's outbox arrives; the only launches
lost are those the killed process had not yet closed into a batch (at most
``batch_max_delay_s`` of them, never written to the outbox).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.node.outbox import NodeStore, Outbox
from kernelstream.app.settings import Settings
from kernelstream.schemas import LaunchBatch
from tests.integration.conftest import settings_env
from tests.integration.helpers import TopicReader

pytestmark = pytest.mark.integration


def _node(s: Settings, bootstrap: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = settings_env(s) | {"KAFKA_BOOTSTRAP": bootstrap}
    return subprocess.Popen(
        [sys.executable, "-m", "kernelstream.app.cli", "node", *extra],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def _read(s: Settings, until_batches: int) -> list[LaunchBatch]:
    async with TopicReader(str(s.bootstrap), s.topic_launches) as r:
        await r.until(
            lambda: len(r.raw[s.topic_launches]) >= until_batches, 60, "the node's launches"
        )
        await asyncio.sleep(1.0)
        await r.poll()
        return [b for b in r.records[s.topic_launches] if isinstance(b, LaunchBatch)]


def test_killed_node_resends_its_outbox_and_never_reuses_a_sequence_number(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(
        update={"workloads": ("matmul", "reduction"), "max_launches_per_s": 2000.0}
    )
    asyncio.run(ensure_topics(s, str(s.bootstrap)))
    log = tmp_path / "node.log"

    offline = _node(s, f"127.0.0.1:{free_port()}", log)  # no broker there
    time.sleep(6.0)
    assert offline.poll() is None, log.read_text()
    os.kill(offline.pid, signal.SIGKILL)
    offline.wait()
    store = NodeStore(s.node_dir())  # what the killed process left on disk
    backlog = {
        (e.key.decode(), e.seq_start, e.count)
        for e in Outbox(store).entries()
        if e.topic == s.topic_launches and e.key
    }
    resume = store.next_seqs()
    store.close()
    assert backlog, "the offline node should have queued its batches"

    online = _node(s, str(s.bootstrap), log, "--duration", "4")
    assert online.wait(60) == 0, log.read_text()
    batches = asyncio.run(_read(s, until_batches=len(backlog) + 4))

    got = {(b.stream_key, b.seq_start, len(b.t_end)) for b in batches}
    assert backlog <= got, f"{len(backlog - got)} batches of the killed node's outbox were lost"
    by_stream: dict[str, dict[int, LaunchBatch]] = defaultdict(dict)
    for b in batches:
        old = by_stream[b.stream_key].setdefault(b.seq_start, b)
        assert old == b, f"{b.stream_key}: seq {b.seq_start} used for two different batches"
    assert set(by_stream) == set(resume)
    for stream, bs in by_stream.items():
        ranges = sorted((start, start + len(b.t_end)) for start, b in bs.items())
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert start >= end, f"{stream}: sequence ranges overlap: a number was reused"
        # The restarted process continues exactly where the killed one had numbered to;
        # the killed one's launches not yet batched (<= batch_max_delay_s) are the only loss.
        assert min(start for start in bs if start >= resume[stream]) == resume[stream]
        assert all(end <= resume[stream] for start, end in ranges if start < resume[stream])

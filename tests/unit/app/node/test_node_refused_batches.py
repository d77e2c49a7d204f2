"""A launch batch the schema refuses: dead-lettered by the node, which goes on."""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from kernelstream.app.node.outbox import NodeStore
from kernelstream.app.node.runtime import _Node
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, decode
from kernelstream.schemas.columnar import decode_launch_columns


@pytest.mark.parametrize(("bad", "code"), [(float("nan"), "non_finite"), (-3.0, "out_of_range")])
def test_a_refused_batch_is_dead_lettered_and_the_node_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: float, code: str
) -> None:
    settings = Settings(
        bootstrap="127.0.0.1:9", node_id="n1", node_state_dir=tmp_path / "n", backend="sim"
    )
    store = NodeStore(settings.node_dir())
    node = _Node(settings, "127.0.0.1:9", store, None)
    try:
        now = time.time()
        node.runner.tick(now - 0.2)
        caplog.set_level(logging.ERROR, logger="kernelstream")
        for k in range(3):
            chunks = node.runner.tick(now + 0.2 * k)
            chunks[0].duration_us[0] = bad  # one kernel's device reports a broken duration
            node.launches(chunks, now + 0.2 * k)  # past the batch delay: a batch a tick
        node.publish_batches(node.batcher.flush())
        entries = node.outbox.entries()
        dead = [e for e in entries if e.topic == settings.topic_deadletter]
        sent = [e for e in entries if e.topic == settings.topic_launches]
        assert dead and sent
        assert node.report.refused == {code: len(dead)}
        broken = chunks[0].kernel
        kernels = set()
        for e in dead:
            value = node.outbox.value(e)
            assert value is not None
            dl = decode(value, DeadLetter)
            assert (dl.stage, dl.reason_code) == ("node.telemetry", code)
            assert "duration_us" in dl.reason and dl.reason.startswith("node n1: ")
            refused = orjson.loads(base64.b64decode(dl.value_b64))  # the batch, as JSON
            kernels.add(refused["kernel"])
            assert len(refused["duration_us"]) == len(refused["t_end"])
        # Every other batch went out whole, those of the broken kernel included.
        for e in sent:
            value = node.outbox.value(e)
            assert value is not None
            assert np.isfinite(decode_launch_columns(value).duration_us).all()
        assert kernels == {broken}
        # Said once for the stream and reason, not once per batch.
        said = [r for r in caplog.records if "refused by the launch batch schema" in r.message]
        assert len(said) == 1 and len(dead) >= 2
    finally:
        node.audit.close()
        store.close()

"""``kernelstream watch``: follow a topic as a human table or JSON lines."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson

from app.settings import Settings
from schemas import SchemaError, decode_any

__all__ = ["format_row", "watch_topic"]

_COLUMNS = (
    "node",
    "device_model",
    "kernel",
    "config_id",
    "classification",
    "status",
    "duration_mean_us",
    "expected_gain",
    "reason",
)


def format_row(record: dict[str, Any]) -> str:
    """One line per record with the fields a person scans for."""
    parts = []
    for col in _COLUMNS:
        if col in record and record[col] is not None:
            v = record[col]
            parts.append(f"{col}={v:.4g}" if isinstance(v, float) else f"{col}={v}")
    return "  ".join(parts)


async def watch_topic(
    settings: Settings,
    topic: str,
    *,
    node: str | None = None,
    kernel: str | None = None,
    as_json: bool = False,
    from_beginning: bool = False,
    limit: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Print matching records of ``topic`` until ``limit`` or interruption; return the count."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **settings.kafka_client_kwargs(),
    )
    await consumer.start()
    shown = 0
    try:
        async for msg in consumer:
            try:
                rec = decode_any(msg.value).to_wire()
            except SchemaError as exc:
                print(
                    f"# undecodable record at {msg.topic}[{msg.partition}]@{msg.offset}: {exc}",
                    file=out,
                )
                continue
            if (node and rec.get("node") != node) or (kernel and rec.get("kernel") != kernel):
                continue
            print(orjson.dumps(rec).decode() if as_json else format_row(rec), file=out, flush=True)
            shown += 1
            if limit is not None and shown >= limit:
                break
    finally:
        await consumer.stop()
    return shown

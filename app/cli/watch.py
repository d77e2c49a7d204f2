"""``kernelstream watch``: follow a topic as a human table or JSON lines.

The table has one aligned row per record with the columns that matter for its type
(a recommendation's from/to configuration and expected gain, a finding's
classification and summary, an outcome's status and speedup, ...), and prints its
header again whenever the record type changes. ``--json`` prints each record as one
JSON line, exactly as it is on the wire, for ``jq`` and friends.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import orjson

from kernelstream.app.settings import Settings
from kernelstream.schemas import SchemaError, decode_any

__all__ = ["TableFormatter", "format_row", "matches", "watch_topic"]

Column = tuple[str, int, Callable[[dict[str, Any]], Any]]


def _time(field: str) -> Callable[[dict[str, Any]], str]:
    def get(r: dict[str, Any]) -> str:
        t = r.get(field)
        if not isinstance(t, (int, float)):
            return "-"
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S.%f")[:-3]

    return get


def _f(field: str, fmt: str) -> Callable[[dict[str, Any]], str]:
    def get(r: dict[str, Any]) -> str:
        v = r.get(field)
        return "-" if v is None else format(v, fmt)

    return get


def _k(field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: r.get(field, "-")


def _device(r: dict[str, Any]) -> str:
    return f"{r.get('node')}:{r.get('device_index')}"


_WINDOW_COLUMNS: Sequence[Column] = (
    ("window", 12, _time("window_start")),
    ("device", 18, _device),
    ("kernel", 14, _k("kernel")),
    ("count", 7, _k("count")),
    ("mean us", 9, _f("duration_mean_us", ".1f")),
    ("bw", 6, _f("bw_fraction", ".0%")),
    ("config", 0, _k("config_id")),
)

_ALERT_COLUMNS: Sequence[Column] = (
    ("at", 12, _time("at")),
    ("state", 10, _k("state")),
    ("series", 30, _k("key")),
    ("lead s", 7, _f("lead_s", ".0f")),
    ("conf", 6, _f("confidence", ".3f")),
    ("summary", 0, _k("summary")),
)

_FINDING_COLUMNS: Sequence[Column] = (
    ("window", 12, _time("window_start")),
    ("device", 18, _device),
    ("model", 15, _k("device_model")),
    ("kernel", 14, _k("kernel")),
    ("class", 18, _k("classification")),
    ("mean us", 9, _f("duration_mean_us", ".1f")),
    ("summary", 0, _k("summary")),
)

_RECONFIG_COLUMNS: Sequence[Column] = (
    ("at", 12, _time("at")),
    ("device", 18, _device),
    ("kernel", 14, _k("kernel")),
    ("status", 11, _k("status")),
    ("speedup", 7, _f("speedup", ".2f")),
    ("to config", 48, _k("after_config_id")),
    ("reason", 0, _k("reason")),
)

_COLUMNS: dict[str, Sequence[Column]] = {
    "ks.recommendation/1": (
        ("issued", 12, _time("issued_at")),
        ("device", 18, _device),
        ("model", 15, _k("device_model")),
        ("kernel", 14, _k("kernel")),
        ("gain", 7, _f("expected_gain", ".1%")),
        ("to config", 48, _k("config_id")),
        ("reason", 0, _k("reason")),
    ),
    "ks.finding/1": _FINDING_COLUMNS,
    "ks.finding/2": _FINDING_COLUMNS,
    "ks.window/1": _WINDOW_COLUMNS,
    "ks.window/2": _WINDOW_COLUMNS,
    "ks.reconfig/1": _RECONFIG_COLUMNS,
    "ks.reconfig/2": _RECONFIG_COLUMNS,
    "ks.alert/1": _ALERT_COLUMNS,
    "ks.alert/2": _ALERT_COLUMNS,
    "ks.deadletter/1": (
        ("at", 12, _time("at")),
        ("stage", 14, _k("stage")),
        ("topic", 20, _k("topic")),
        ("code", 16, _k("reason_code")),
        ("reason", 0, _k("reason")),
    ),
}


def _cell(value: Any, width: int) -> str:
    text = str(value)
    if width == 0:
        return text
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "~"


class TableFormatter:
    """Aligned rows; a header line before the first row of each record type."""

    def __init__(self) -> None:
        self._last_schema: str | None = None

    def lines(self, record: dict[str, Any]) -> list[str]:
        schema = str(record.get("schema"))
        cols = _COLUMNS.get(schema)
        if cols is None:
            return [format_row(record)]
        out = []
        if schema != self._last_schema:
            self._last_schema = schema
            out.append("  ".join(_cell(name, w) for name, w, _ in cols).rstrip())
        out.append("  ".join(_cell(get(record), w) for _, w, get in cols).rstrip())
        return out


_ANY_COLUMNS = (
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
    """One ``key=value`` line for a record type the table does not know."""
    parts = []
    for col in _ANY_COLUMNS:
        if col in record and record[col] is not None:
            v = record[col]
            parts.append(f"{col}={v:.4g}" if isinstance(v, float) else f"{col}={v}")
    return "  ".join(parts)


def matches(record: dict[str, Any], node: str | None, kernel: str | None) -> bool:
    """Whether a record passes the ``--node`` and ``--kernel`` filters."""
    return (node is None or record.get("node") == node) and (
        kernel is None or record.get("kernel") == kernel
    )


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

    from kernelstream.agents.first_offset import seek_to_first

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **settings.kafka_client_kwargs(),
    )
    table = TableFormatter()
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # else aiokafka reports an unclosed consumer
        raise
    shown = 0
    started: set[Any] = set()  # partitions sought to their first record
    try:
        while limit is None or shown < limit:
            if from_beginning and (new := consumer.assignment() - started):
                # From offset 0, not the broker's "beginning", which the embedded broker
                # can answer one too high (kernelstream.agents.first_offset); records
                # fetched from there before this seek are dropped by the consumer.
                seek_to_first(consumer, new)
                started |= new
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for msg in msgs:
                    if limit is not None and shown >= limit:
                        break
                    shown += _show(msg, node, kernel, as_json, table, out)
    finally:
        await consumer.stop()
    return shown


def _show(
    msg: Any,
    node: str | None,
    kernel: str | None,
    as_json: bool,
    table: TableFormatter,
    out: TextIO,
) -> int:
    """Print ``msg`` if it passes the filters; 1 if it was shown."""
    try:
        rec = decode_any(msg.value).to_wire()
    except SchemaError as exc:
        print(f"# undecodable record at {msg.topic}[{msg.partition}]@{msg.offset}: {exc}", file=out)
        return 0
    if not matches(rec, node, kernel):
        return 0
    if as_json:
        print(orjson.dumps(rec).decode(), file=out, flush=True)
    else:
        print("\n".join(table.lines(rec)), file=out, flush=True)
    return 1

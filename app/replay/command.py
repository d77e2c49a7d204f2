"""``kernelstream replay``: read a recorded topic range, analyse it offline or republish it.

Sources. A Kafka cluster (``KAFKA_BOOTSTRAP``), or a *recording*: a directory of
``<topic>.jsonl`` files (one message a line: partition, offset, timestamp, key and
value in base64), which ``kernelstream demo`` writes before its embedded broker
stops (the embedded broker keeps nothing across restarts). Both answer the same
four questions (:class:`Source`), so range selection is one algorithm.

Ranges. By offsets (the same bounds for every partition) or by record time
(Kafka timestamps, milliseconds). The end of a partition is not taken from
ListOffsets, which the embedded broker answers wrongly (ARCHITECTURE.md): it is
the high watermark of a fetch that returned records. The first offset at or after
a time is the broker's answer (``offsets_for_times``) where two single-record
fetches confirm it (the record there is at or after the time, the one before it
earlier): Apache Kafka's answers pass, the embedded broker's (which ignore the
time) fail and fall back to a binary search over offsets, fetching single
records and reading their timestamps. Timestamps of one partition
may be slightly out of order (several producers' clocks): the search starts
``slack`` earlier, the scan filters every record by its own timestamp and stops only
at the first record ``slack`` past the end, so the range is exact as long as
producers' clocks disagree by less than ``slack``.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import heapq
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from kernelstream.app.errors import ConfigError, NothingToReplayError, RecordingError
from kernelstream.app.replay.analysis import RecordedMessage

__all__ = [
    "KafkaSource",
    "PartitionRange",
    "RangeSpec",
    "RecordingSource",
    "Source",
    "confirmed_broker_offset",
    "offset_for_time",
    "read_range",
    "record_topics",
    "republish",
    "select_ranges",
]

_FETCH_TIMEOUT_MS = 1500
_FETCH_TRIES = 3


class Source(Protocol):
    """Where recorded messages come from: a broker or a recording directory."""

    async def partitions(self, topic: str) -> list[int]: ...

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """First offset and end offset (one past the last record)."""

    async def broker_offset_for_time(self, topic: str, partition: int, t_ms: int) -> int | None:
        """The broker's first offset at or after ``t_ms`` (unverified); None: cannot ask."""
        ...

    async def first_at_or_after(
        self, topic: str, partition: int, offset: int
    ) -> RecordedMessage | None:
        """The record with the smallest offset ``>= offset``, or None past the end."""
        ...

    def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> AsyncIterator[list[RecordedMessage]]:
        """Records of offsets ``[start, end)`` in offset order, a fetch at a time."""
        ...


@dataclass(frozen=True)
class RangeSpec:
    """What to read: offsets ``[start_offset, end_offset)`` and/or times ``[since, until)``.

    Times are Unix milliseconds of the records' Kafka timestamps; ``slack_ms`` is how
    far out of order they may be within a partition.
    """

    start_offset: int | None = None
    end_offset: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    slack_ms: int = 10_000

    @property
    def by_time(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    def in_time(self, ts_ms: int) -> bool:
        return (self.since_ms is None or ts_ms >= self.since_ms) and (
            self.until_ms is None or ts_ms < self.until_ms
        )


@dataclass
class PartitionRange:
    """The offsets of one partition to scan; time filtering happens while scanning.

    ``start_by``: how ``start`` was found for a time range: ``"broker"`` (the
    broker's time lookup, confirmed), ``"search"`` (binary search), or
    ``"offsets"`` (no time bound).
    """

    topic: str
    partition: int
    start: int
    end: int
    start_by: str = "offsets"

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


# -- range selection ------------------------------------------------------------------


async def offset_for_time(
    source: Source, topic: str, partition: int, t_ms: int, lo: int, hi: int
) -> int:
    """First offset in ``[lo, hi)`` whose record's timestamp is ``>= t_ms`` (``hi`` if none).

    Binary search on record timestamps read one record at a time (about
    ``log2(hi - lo)`` fetches); assumes timestamps do not decrease along the partition
    (callers widen the search by the allowed disorder).
    """
    while lo < hi:
        mid = (lo + hi) // 2
        rec = await source.first_at_or_after(topic, partition, mid)
        if rec is None or rec.offset >= hi or rec.timestamp_ms >= t_ms:
            hi = mid
        else:
            lo = rec.offset + 1
    return lo


async def confirmed_broker_offset(
    source: Source, topic: str, partition: int, t_ms: int, lo: int, hi: int
) -> int | None:
    """The broker's offset for ``t_ms`` if two fetches confirm it within ``[lo, hi]``.

    Confirmed: the record at the offset is at or after ``t_ms`` (or the offset is
    ``hi``) and the record just before it, unless the offset is ``lo``, is earlier.
    """
    guess = await source.broker_offset_for_time(topic, partition, t_ms)
    if guess is None:
        return None
    guess = min(guess, hi)
    if guess < lo:
        return None
    if guess < hi:
        at = await source.first_at_or_after(topic, partition, guess)
        if at is None or at.offset != guess or at.timestamp_ms < t_ms:
            return None
    if guess > lo:
        before = await source.first_at_or_after(topic, partition, guess - 1)
        if before is None or before.offset != guess - 1 or before.timestamp_ms >= t_ms:
            return None
    return guess


async def _start_for_time(
    source: Source, topic: str, partition: int, t_ms: int, lo: int, hi: int
) -> tuple[int, str]:
    found = await confirmed_broker_offset(source, topic, partition, t_ms, lo, hi)
    if found is not None:
        return found, "broker"
    return await offset_for_time(source, topic, partition, t_ms, lo, hi), "search"


async def select_ranges(
    source: Source, topics: Sequence[str], spec: RangeSpec
) -> list[PartitionRange]:
    """The offset range of every partition of ``topics`` that may hold selected records."""
    out = []
    for topic in topics:
        for p in await source.partitions(topic):
            first, end = await source.bounds(topic, p)
            start = max(first, spec.start_offset or 0)
            start_by = "offsets"
            if spec.end_offset is not None:
                end = min(end, spec.end_offset)
            if spec.since_ms is not None and start < end:
                start, start_by = await _start_for_time(
                    source, topic, p, spec.since_ms - spec.slack_ms, start, end
                )
            out.append(PartitionRange(topic, p, start, max(start, end), start_by))
    return out


async def read_range(
    source: Source, r: PartitionRange, spec: RangeSpec
) -> AsyncIterator[list[RecordedMessage]]:
    """The records of one partition range that lie in ``spec``'s time range."""
    if r.size == 0:
        return
    stop_ms = None if spec.until_ms is None else spec.until_ms + spec.slack_ms
    async for chunk in source.read(r.topic, r.partition, r.start, r.end):
        if not spec.by_time:
            yield chunk
            continue
        kept = [m for m in chunk if spec.in_time(m.timestamp_ms)]
        if kept:
            yield kept
        if stop_ms is not None and any(m.timestamp_ms >= stop_ms for m in chunk):
            return


# -- sources ------------------------------------------------------------------------


class KafkaSource:
    """A broker, read with one plain (group-less) consumer: nothing is committed."""

    def __init__(self, bootstrap: str, client_kwargs: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.client_kwargs = client_kwargs or {}
        self._consumer: Any = None
        self._ends: dict[tuple[str, int], int] = {}

    async def __aenter__(self) -> KafkaSource:
        from aiokafka import AIOKafkaConsumer

        from kernelstream.app.kafka import zstd_decode

        zstd_decode.install()  # as the worker reads launch batches
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Every seek restarts a fetch, and the broker may hold a fetch this long.
            fetch_max_wait_ms=20,
            max_partition_fetch_bytes=8 << 20,
            fetch_max_bytes=32 << 20,
            **self.client_kwargs,
        )
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()  # else aiokafka reports an unclosed consumer
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def partitions(self, topic: str) -> list[int]:
        # The consumer's own metadata covers only its assignment: ask for everything.
        cluster = await self._consumer._client.fetch_all_metadata()
        parts = cluster.partitions_for_topic(topic)
        if not parts:
            raise LookupError(f"topic {topic!r} does not exist on {self.bootstrap}")
        return sorted(parts)

    def _tp(self, topic: str, partition: int) -> Any:
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)
        if self._consumer.assignment() != {tp}:
            self._consumer.assign([tp])
        return tp

    async def _fetch_one(self, topic: str, partition: int, offset: int) -> Any:
        tp = self._tp(topic, partition)
        self._consumer.seek(tp, offset)
        # Short polls: an empty answer with a high watermark at or below where the
        # consumer reads (``offset``, or the log's start it was reset to) says "nothing
        # there" at once, where one long poll would wait out its timeout.
        deadline = time.monotonic() + _FETCH_TRIES * _FETCH_TIMEOUT_MS / 1000.0
        while time.monotonic() < deadline:
            got = await self._consumer.getmany(tp, timeout_ms=50, max_records=1)
            if got.get(tp):
                return got[tp][0]
            hw = self._consumer.highwater(tp)
            if hw is not None and hw <= max(offset, await self._consumer.position(tp)):
                return None
        return None

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        tp = self._tp(topic, partition)
        # From offset 0, not the broker's beginning offset, which the embedded broker can
        # answer one too high (kernelstream.agents.first_offset); on Kafka a log whose
        # start was deleted resets the fetch to it. End offsets come from a fetch's high
        # watermark, never from ListOffsets.
        msg = await self._fetch_one(topic, partition, 0)
        if msg is None:
            first = (await self._consumer.beginning_offsets([tp]))[tp]
            return first, first
        end = int(self._consumer.highwater(tp) or msg.offset + 1)
        end = max(end, msg.offset + 1)
        self._ends[(topic, partition)] = end
        return msg.offset, end

    async def broker_offset_for_time(self, topic: str, partition: int, t_ms: int) -> int | None:
        tp = self._tp(topic, partition)
        try:
            found = (await self._consumer.offsets_for_times({tp: t_ms}))[tp]
        except Exception:  # a broker without time lookups: the caller searches instead
            return None
        if found is None:  # no record at or after t_ms: the end
            return self._ends.get((topic, partition))
        return int(found.offset)

    async def first_at_or_after(
        self, topic: str, partition: int, offset: int
    ) -> RecordedMessage | None:
        end = self._ends.get((topic, partition))
        if end is not None and offset >= end:
            return None
        msg = await self._fetch_one(topic, partition, offset)
        return None if msg is None else _recorded(msg)

    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> AsyncIterator[list[RecordedMessage]]:
        tp = self._tp(topic, partition)
        self._consumer.seek(tp, start)
        pos, empty = start, 0
        while pos < end and empty < _FETCH_TRIES:
            got = (await self._consumer.getmany(tp, timeout_ms=_FETCH_TIMEOUT_MS)).get(tp)
            if not got:
                empty += 1  # a hole at the end of the range (e.g. aborted records)
                continue
            empty = 0
            chunk = [_recorded(m) for m in got if m.offset < end]
            pos = got[-1].offset + 1
            if chunk:
                yield chunk


def _recorded(msg: Any) -> RecordedMessage:
    return RecordedMessage(
        msg.topic, msg.partition, msg.offset, int(msg.timestamp), msg.key, msg.value
    )


class RecordingSource:
    """A recording directory written by :func:`record_topics` (``<topic>.jsonl``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._data: dict[str, dict[int, list[RecordedMessage]]] = {}

    async def __aenter__(self) -> RecordingSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _topic(self, topic: str) -> dict[int, list[RecordedMessage]]:
        if topic not in self._data:
            path = self.directory / f"{topic}.jsonl"
            if not path.is_file():
                raise LookupError(f"topic {topic!r} is not in the recording {self.directory}")
            parts: dict[int, list[RecordedMessage]] = {}
            with path.open("rb") as fh:
                for number, line in enumerate(fh, 1):
                    m = _from_line(topic, line, path, number)
                    parts.setdefault(m.partition, []).append(m)
            for msgs in parts.values():
                msgs.sort(key=lambda m: m.offset)
            self._data[topic] = parts
        return self._data[topic]

    async def partitions(self, topic: str) -> list[int]:
        return sorted(self._topic(topic))

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        msgs = self._topic(topic).get(partition, [])
        return (msgs[0].offset, msgs[-1].offset + 1) if msgs else (0, 0)

    async def broker_offset_for_time(self, topic: str, partition: int, t_ms: int) -> int | None:
        return None  # no broker: the binary search over the recording is exact

    def _index(self, topic: str, partition: int, offset: int) -> int:
        msgs = self._topic(topic).get(partition, [])
        return bisect.bisect_left([m.offset for m in msgs], offset)

    async def first_at_or_after(
        self, topic: str, partition: int, offset: int
    ) -> RecordedMessage | None:
        msgs = self._topic(topic).get(partition, [])
        i = self._index(topic, partition, offset)
        return msgs[i] if i < len(msgs) else None

    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> AsyncIterator[list[RecordedMessage]]:
        msgs = self._topic(topic).get(partition, [])
        i = self._index(topic, partition, start)
        while i < len(msgs) and msgs[i].offset < end:
            j = i
            while j < len(msgs) and j - i < 1000 and msgs[j].offset < end:
                j += 1
            yield msgs[i:j]
            i = j


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def _line(m: RecordedMessage) -> bytes:
    return orjson.dumps(
        {
            "p": m.partition,
            "o": m.offset,
            "ts": m.timestamp_ms,
            "k": _b64(m.key),
            "v": _b64(m.value),
        }
    )


def _from_line(topic: str, line: bytes, path: Path, number: int) -> RecordedMessage:
    try:
        d = orjson.loads(line)
        return RecordedMessage(
            topic, int(d["p"]), int(d["o"]), int(d["ts"]), _unb64(d["k"]), _unb64(d["v"])
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as ex:
        raise RecordingError(
            f"{path}:{number} is not a recorded message ({type(ex).__name__}: {ex}); "
            "record the run again or remove that file"
        ) from ex


async def record_topics(source: Source, topics: Iterable[str], directory: Path) -> dict[str, int]:
    """Write every record of ``topics`` to ``directory/<topic>.jsonl``; return the counts.

    Used by ``kernelstream demo`` so a run can be replayed after its embedded broker
    (memory storage) is gone: ``kernelstream replay --recording DIR --report OUT``.
    """
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    everything = RangeSpec()
    for topic in topics:
        n = 0
        with (directory / f"{topic}.jsonl").open("wb") as fh:
            for r in await select_ranges(source, [topic], everything):
                async for chunk in read_range(source, r, everything):
                    fh.write(b"".join(_line(m) + b"\n" for m in chunk))
                    n += len(chunk)
        counts[topic] = n
    return counts


# -- republishing -------------------------------------------------------------------


@dataclass
class RepublishStats:
    messages: int = 0
    partitions: dict[int, int] = field(default_factory=dict)


async def _merged(
    source: Source, ranges: Sequence[PartitionRange], spec: RangeSpec
) -> AsyncIterator[RecordedMessage]:
    """All partitions' records merged by timestamp (each partition stays in offset order)."""
    # Ranges are read one partition at a time (a source holds one position), so the
    # merge works on materialized partitions; a replay into a topic is bounded by the
    # range the user chose.
    parts: list[list[RecordedMessage]] = []
    for r in ranges:
        msgs: list[RecordedMessage] = []
        async for chunk in read_range(source, r, spec):
            msgs.extend(chunk)
        parts.append(msgs)
    for m in heapq.merge(*parts, key=lambda m: (m.timestamp_ms, m.partition)):
        yield m


async def republish(
    source: Source,
    ranges: Sequence[PartitionRange],
    spec: RangeSpec,
    target: str,
    producer: Any,
    *,
    speed: float = 0.0,
    keep: Callable[[RecordedMessage], bool] = lambda m: True,
    progress: Callable[[int], None] = lambda n: None,
) -> RepublishStats:
    """Send the selected records to ``target``, each to its original partition number.

    ``speed`` 0 sends as fast as the broker takes them; ``N > 0`` keeps the recorded
    gaps between records divided by N (recorded pace x N).
    """
    stats = RepublishStats()
    t0_rec: int | None = None
    t0_wall = time.monotonic()
    pending = []
    async for m in _merged(source, ranges, spec):
        progress(1)
        if not keep(m):
            continue
        if speed > 0:
            if t0_rec is None:
                t0_rec = m.timestamp_ms
            due = t0_wall + (m.timestamp_ms - t0_rec) / 1000.0 / speed
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        pending.append(await producer.send(target, m.value, key=m.key, partition=m.partition))
        stats.messages += 1
        stats.partitions[m.partition] = stats.partitions.get(m.partition, 0) + 1
        if len(pending) >= 1000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return stats


# -- offline analysis --------------------------------------------------------------


@dataclass
class ReplayInput:
    """The replay range that was read: per partition offsets and message counts."""

    ranges: list[PartitionRange]
    read: dict[str, int] = field(default_factory=dict)  # topic -> messages in range

    def as_dict(self) -> dict[str, Any]:
        return {
            "ranges": [
                {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end}
                for r in self.ranges
            ],
            "messages": dict(sorted(self.read.items())),
        }


async def analyse(
    source: Source,
    topics: dict[str, str],
    spec: RangeSpec,
    analysis: Any,
    *,
    progress: Callable[[int, int], None] = lambda offsets, launches: None,
    on_ranges: Callable[[list[PartitionRange]], None] = lambda r: None,
) -> ReplayInput:
    """Feed the selected records of ``topics`` (role -> name) to an :class:`OfflineAnalysis`.

    Roles: ``launches`` (windowed, classified, tuned), ``recommendations`` and
    ``reconfig`` (what the live tuner recommended and what the nodes measured). A
    missing recommendations or reconfig topic is skipped; a missing launches topic
    is an error. Partitions are read one after another, each in offset order: the
    window state of a stream key lives in one partition, so this is the order the
    worker saw.
    """
    ranges: list[PartitionRange] = []
    for role, name in topics.items():
        try:
            ranges += await select_ranges(source, [name], spec)
        except LookupError:
            if role == "launches":
                raise
    on_ranges(ranges)
    info = ReplayInput(ranges)
    kinds = {topics.get("recommendations"): "recommendation", topics.get("reconfig"): "outcome"}
    for r in ranges:
        n, pos = 0, r.start
        async for chunk in read_range(source, r, spec):
            n += len(chunk)
            launches_before = analysis.result.launches
            if r.topic == topics["launches"]:
                analysis.add_launch_messages(chunk)
            else:
                for m in chunk:
                    analysis.add_recorded(m, kinds[r.topic])
            progress(chunk[-1].offset + 1 - pos, analysis.result.launches - launches_before)
            pos = chunk[-1].offset + 1
        progress(max(0, r.end - pos), 0)  # a time range may end before its offsets do
        info.read[r.topic] = info.read.get(r.topic, 0) + n
    return info


# -- the command ---------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    """What ``kernelstream replay`` was asked to do."""

    spec: RangeSpec
    flt: Any  # app.report_analysis.LaunchFilter
    recording: Path | None = None
    report_dir: Path | None = None
    to_topic: str | None = None
    source_role: str = "launches"
    speed: float = 0.0
    trace_files: tuple[Path, ...] = ()
    progress: bool = True


def _range_description(spec: RangeSpec) -> str:
    parts = []
    if spec.start_offset is not None or spec.end_offset is not None:
        parts.append(f"offsets [{spec.start_offset or 0}, {spec.end_offset or 'end'})")
    if spec.by_time:
        parts.append(
            f"record time [{spec.since_ms or 'start'}, {spec.until_ms or 'end'}) ms "
            f"(slack {spec.slack_ms} ms)"
        )
    return ", ".join(parts) or "everything recorded"


class _Progress:
    """A rich progress bar over offsets (messages), with rate, ETA and launches seen."""

    def __init__(self, enabled: bool, what: str) -> None:
        self.enabled, self.what = enabled, what
        self.launches = 0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                MofNCompleteColumn(),
                TextColumn("msgs"),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[launches]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=None, rate="", launches="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def total(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=n)

    def advance(self, offsets: int, launches: int = 0) -> None:
        self.launches += launches
        if self._bar is not None:
            task = self._bar.tasks[0]
            speed = task.speed or 0.0
            self._bar.update(
                self._task,
                advance=offsets,
                rate=f"{speed:,.0f} msg/s",
                launches=f"{self.launches:,} launches" if self.launches else "",
            )


async def run_replay(settings: Any, opts: ReplayOptions) -> dict[str, Any]:
    """Replay into a report directory or a topic; return what was done (for the CLI)."""
    source: Any = (
        RecordingSource(opts.recording)
        if opts.recording is not None
        else KafkaSource(str(settings.bootstrap), settings.kafka_client_kwargs())
    )
    async with source:
        if opts.to_topic is not None:
            return await _to_topic(settings, source, opts)
        return await _to_report(settings, source, opts)


async def _to_report(settings: Any, source: Source, opts: ReplayOptions) -> dict[str, Any]:
    from kernelstream.agents.alert_agent import forecaster_from_settings
    from kernelstream.agents.context import LaunchLimits
    from kernelstream.agents.logic.sequencing import SeqLimits
    from kernelstream.agents.tuner_agent import tuner_from_settings
    from kernelstream.agents.window_agent import window_spec
    from kernelstream.app.replay.analysis import OfflineAnalysis
    from kernelstream.app.replay.report import build_summary, write_report
    from kernelstream.app.replay.whatif import trace_files_in
    from kernelstream.kernels.resolve import SpaceResolver

    assert opts.report_dir is not None
    started, t0 = time.time(), time.perf_counter()
    resolver = SpaceResolver(settings.tuning_spaces_dir)
    known: dict[tuple[str, tuple[int, ...]], bool] = {}

    def space_for(workload: str, size: tuple[int, ...], config: Any = None) -> Any:
        return resolver.space_for(workload, size, config)

    def known_workload(workload: str, size: Any) -> bool:
        key = (workload, tuple(size))
        if key not in known:
            try:
                resolver.space_for(*key)
                known[key] = True
            except Exception:  # LookupError, or ValueError for a size it refuses
                known[key] = False
        return known[key]

    analysis = OfflineAnalysis(
        window_spec(settings),
        known_workload=known_workload,
        space_for=space_for,
        limits=LaunchLimits(
            settings.max_event_future_s, settings.max_event_age_s, settings.max_event_disorder_s
        ),
        seq_limits=SeqLimits(settings.max_stream_launches_per_s, settings.seq_slack_launches),
        flt=opts.flt,
        tuner=tuner_from_settings(settings),
        forecaster=forecaster_from_settings(settings),
    )
    topics = {
        "launches": settings.topic_launches,
        "recommendations": settings.topic_recommendations,
        "reconfig": settings.topic_reconfig,
    }
    with _Progress(opts.progress, "replay") as bar:
        info = await analyse(
            source,
            topics,
            opts.spec,
            analysis,
            progress=bar.advance,
            on_ranges=lambda rs: bar.total(sum(r.size for r in rs)),
        )
    t_read = time.perf_counter() - t0
    res = analysis.finish()
    if res.launches == 0:
        raise NothingToReplayError(
            _nothing_selected(opts, res.launch_messages + res.skipped_messages)
        )
    traces = list(opts.trace_files) or trace_files_in(
        settings.tuning_spaces_dir or _default_spaces()
    )
    flt = opts.flt
    input_info = info.as_dict() | {"description": _range_description(opts.spec)}
    options = {
        "filters": {"node": flt.node, "device": flt.device, "kernel": flt.kernel},
        "range": {
            "start_offset": opts.spec.start_offset,
            "end_offset": opts.spec.end_offset,
            "since_ms": opts.spec.since_ms,
            "until_ms": opts.spec.until_ms,
            "slack_ms": opts.spec.slack_ms,
        },
        "window": {
            "size_s": settings.window_s,
            "out_of_orderness_s": settings.out_of_orderness_s,
            "allowed_lateness_s": settings.allowed_lateness_s,
        },
        "trace_files": [p.name for p in traces],
    }
    summary = build_summary(res, input_info=input_info, options=options, trace_paths=traces)
    t_analysed = time.perf_counter() - t0
    run_info = {
        "started_at": started,
        "source": str(opts.recording) if opts.recording else str(settings.bootstrap),
        "read_and_window_s": t_read,
        "analysis_s": t_analysed - t_read,
    }
    page = write_report(opts.report_dir, res, summary, run_info)
    run_info["total_s"] = time.perf_counter() - t0
    (opts.report_dir / "run.json").write_bytes(
        orjson.dumps(run_info, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    )
    return {
        "report": str(page),
        "launches": res.launches,
        "windows": len(res.windows),
        "findings": len(res.findings),
        "seconds": run_info["total_s"],
    }


def _nothing_selected(opts: ReplayOptions, messages: int, what: str = "no launch to report") -> str:
    """One line: the range, how many messages it holds, and the filters none matched."""
    flt = opts.flt
    given = [
        f"--{name} {value}"
        for name, value in (("node", flt.node), ("device", flt.device), ("kernel", flt.kernel))
        if value is not None
    ]
    return (
        f"{what}: the range ({_range_description(opts.spec)}) holds {messages} messages "
        f"and none matches {' '.join(given) or 'the range'}; widen the range "
        "or fix the filter"
    )


def _default_spaces() -> Path | None:
    from kernelstream.kernels import default_tuning_spaces_dir

    return default_tuning_spaces_dir()


def record_fields(value: bytes) -> dict[str, Any]:
    """A record's top-level fields, JSON or a binary launch batch (its header only).

    >>> record_fields(b'{"node": "n1", "kernel": "k"}')["node"]
    'n1'
    """
    from kernelstream.schemas.binary import is_binary, read_launch_batch

    if is_binary(value):
        return read_launch_batch(value).meta()
    d = orjson.loads(value)
    if not isinstance(d, dict):
        raise TypeError(f"a record is a JSON object, not {type(d).__name__}")
    return d


async def _to_topic(settings: Any, source: Source, opts: ReplayOptions) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    from kernelstream.app.kafka.topics import topic_specs
    from kernelstream.app.replay.analysis import key_matches

    assert opts.to_topic is not None
    if opts.recording is None and opts.to_topic == getattr(settings, f"topic_{opts.source_role}"):
        raise ConfigError("--to-topic must differ from the topic being replayed")
    name = getattr(settings, f"topic_{opts.source_role}")
    ranges = await select_ranges(source, [name], opts.spec)
    partitions = max((r.partition for r in ranges), default=0) + 1
    spec = next((s for s in topic_specs(settings) if s.name == name), None)
    await _create_topic(settings, opts.to_topic, partitions, spec)
    producer = AIOKafkaProducer(
        bootstrap_servers=str(settings.bootstrap),
        acks="all",
        linger_ms=5,
        max_request_size=16 << 20,
        compression_type=settings.producer_compression(),
        **settings.kafka_client_kwargs(),
    )
    flt = opts.flt

    def keep(m: RecordedMessage) -> bool:
        if flt.device is None and opts.source_role == "launches":
            return key_matches(m.key, flt)  # launches are keyed by series: no parsing
        try:
            d = record_fields(m.value or b"")
            return bool(flt.keeps(d["node"], d["device_index"], d["device_model"], d["kernel"]))
        except (ValueError, KeyError, TypeError):  # SchemaError and JSONDecodeError included
            return True  # not ours to judge: the pipeline's edge check will

    await producer.start()
    try:
        with _Progress(opts.progress, f"-> {opts.to_topic}") as bar:
            bar.total(sum(r.size for r in ranges))
            stats = await republish(
                source,
                ranges,
                opts.spec,
                opts.to_topic,
                producer,
                speed=opts.speed,
                keep=keep,
                progress=lambda n: bar.advance(n),
            )
    finally:
        await producer.stop()
    if stats.messages == 0:
        raise NothingToReplayError(
            _nothing_selected(
                opts, sum(r.size for r in ranges), f"nothing republished to {opts.to_topic}"
            )
        )
    return {"topic": opts.to_topic, "messages": stats.messages}


async def _create_topic(settings: Any, name: str, partitions: int, spec: Any) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(
        bootstrap_servers=str(settings.bootstrap), **settings.kafka_client_kwargs()
    )
    await admin.start()
    try:
        if name not in set(await admin.list_topics()):
            configs = spec.configs() if spec is not None else {}
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    finally:
        await admin.close()

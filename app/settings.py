"""One settings object for every kernelstream process.

Read from environment variables with the ``KERNELSTREAM_`` prefix (and the bare
``KAFKA_BOOTSTRAP`` for the broker address), optionally from a TOML file named by
``KERNELSTREAM_CONFIG``. Built once by the CLI and passed down; nothing reads the
environment at import time.

>>> s = Settings(bootstrap="broker:9092")
>>> s.topic_launches, s.embedded
('ks.launches', False)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kernelstream.agents.context import LaunchLimits
from kernelstream.agents.logic.sequencing import SeqLimits
from kernelstream.kernels.backends.sim_drift import DeviceDrift
from kernelstream.kernels.transfers import HOST_KNOB_VALUES, HostPattern
from kernelstream.schemas.codec import MAX_MESSAGE_BYTES

__all__ = ["LONG_FETCH_WAIT_MS", "SHORT_FETCH_WAIT_MS", "Settings", "load_settings"]

# How long a consumer's fetch may wait for data where the settings leave it unset
# (Settings.fetch_max_wait_ms; the broker decides which: kafka.capabilities). Tansu answers
# a waiting fetch only when its wait runs out: every hop of the pipeline waits up to this
# long, so it is short, and an idle consumer sends twenty fetches a second. Apache Kafka
# answers one as soon as a record arrives: the wait costs no latency, and a long one spares
# the cluster the idle fetches (an idle worker 6% of a core at 50 ms, 2.5% at 500, and its
# broker 3-6% more than idle at 50; bench/results/kafka-idle-fetch-wait-2026-11-29.txt).
SHORT_FETCH_WAIT_MS = 50
LONG_FETCH_WAIT_MS = 500


class _Broker(Protocol):
    """What :meth:`Settings.for_broker` reads of a broker's answers
    (:class:`~kernelstream.app.kafka.capabilities.BrokerCapabilities`)."""

    @property
    def fetch_wait_ms(self) -> int: ...


class Settings(BaseSettings):
    """Every setting, its environment name (``KERNELSTREAM_<NAME>``), type and default."""

    model_config = SettingsConfigDict(
        env_prefix="KERNELSTREAM_", frozen=True, extra="forbid", populate_by_name=True
    )

    # --- broker -----------------------------------------------------------------
    bootstrap: str | None = Field(
        default=None,
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "KERNELSTREAM_BOOTSTRAP", "bootstrap"),
        description="Kafka bootstrap servers (host:port,...). Unset: start the embedded broker.",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = Field(
        default=None, description="Password of an encrypted ssl_keyfile."
    )
    ssl_check_hostname: bool = Field(
        default=True, description="Check the broker's certificate matches its host name."
    )

    # --- topics (names and partition counts) ------------------------------------
    topic_launches: str = "ks.launches"
    topic_windows: str = "ks.windows"
    topic_findings: str = "ks.findings"
    topic_recommendations: str = "ks.recommendations"
    topic_reconfig: str = "ks.reconfig"
    topic_late: str = "ks.late"
    topic_deadletter: str = "ks.deadletter"
    topic_alerts: str = "ks.alerts"
    partitions: int = Field(default=4, ge=1, description="Partitions of the keyed topics.")

    # --- worker -----------------------------------------------------------------
    app_id: str = Field(default="kernelstream", description="Faust app id = consumer group.")
    data_dir: Path = Field(default=Path("var/worker"), description="RocksDB state directory.")
    window_s: float = Field(default=1.0, gt=0)
    # A stream (node/device/kernel) is one device's launches in completion order, sent
    # in order by one node, so the watermark need not trail (ooo 0); its event times
    # only ever go back by the few ms two CUDA streams of one device may finish out of
    # order, which 50 ms of allowed lateness absorbs (counted as late_accepted). Mixing
    # several sources into one key would need more (latency grows by the sum).
    out_of_orderness_s: float = Field(
        default=0.0, ge=0, description="The watermark trails the newest event time by this."
    )
    allowed_lateness_s: float = Field(
        default=0.05, ge=0, description="A window closes once the watermark passes end + this."
    )
    idle_timeout_s: float = Field(default=3.0, gt=0)
    recommendation_ttl_s: float = Field(default=20.0, gt=0)
    tuner_regression_restart: float = Field(
        default=1.2,
        gt=1,
        description=(
            "A regression finding for a node's config at least this many times the fleet "
            "group's mean of it restarts that mean: the environment changed (README, Tuning)."
        ),
    )
    alert_threshold_factor: float = Field(
        default=1.2,
        gt=1,
        description=(
            "Predictive alerts forecast when a kernel's mean duration reaches this many "
            "times its baseline (the detector's regression factor)."
        ),
    )
    alert_horizon_s: float = Field(
        default=3600.0, gt=0, description="How far ahead predictive alerts forecast a crossing."
    )
    alert_history_s: float = Field(
        default=3600.0,
        gt=0,
        description="Predictive alerts fit trends to the windows of this much event time.",
    )
    tuner_warm_start: bool = Field(
        default=False,
        description=(
            "Warm-start a device model's group from other device models of the same "
            "kernel: their fastest configs are tried first. Off by default: it halves the "
            "evaluations where another GPU's best transfers (dedispersion) and costs those "
            "two evaluations where it does not (convolution)."
        ),
    )
    web_port: int = Field(
        default=6066,
        ge=0,
        le=65535,
        description="Worker web server: /metrics, /healthz, /readyz, /ks/stats/.",
    )
    session_timeout_s: float = Field(default=6.0, gt=0)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    fetch_max_wait_ms: int | None = Field(
        default=None,
        ge=1,
        le=5000,
        description=(
            "Longest a fetch may wait for data, for every consumer of the pipeline (Faust's "
            "included). Unset: by the broker (kafka.capabilities.BrokerCapabilities."
            "fetch_wait_ms): 50 on the embedded Tansu broker, which answers a waiting fetch "
            "only when this runs out, so each hop adds up to this much latency; 500 on "
            "Apache Kafka, which answers as soon as a record arrives, so a longer wait costs "
            "no latency and a tenth of the idle fetch requests."
        ),
    )
    worker_heap_retain_mib: int = Field(
        default=64,
        ge=0,
        le=4096,
        description=(
            "Free heap memory the worker keeps for reuse instead of returning it to the "
            "kernel (glibc's malloc; 0 leaves its defaults). A poll's buffers, megabytes of "
            "decompressed batches and joined columns, come and go every poll; memory given "
            "back and taken again faults in page by page: keeping 64 MiB made the worker "
            "2-4% faster per launch for 5 MiB more peak RSS (bench pipeline-peers)."
        ),
    )
    checkpoint_interval_s: float = Field(
        default=1.0,
        gt=0,
        description=(
            "How often the window agent checkpoints its state with its input offsets "
            "(files under data_dir/window-state) and commits them: a crash replays at most "
            "this much."
        ),
    )
    worker_linger_ms: int = Field(
        default=50,
        ge=0,
        le=1000,
        description=(
            "How long the worker's producer gathers windows, findings and recommendations "
            "into one produce request. Each request costs the worker's event loop a broker "
            "round trip: at 5 ms the worker sent ~370 requests/s at full speed and spent "
            "78-93 ns per launch publishing, at 50 ms 50-53 ns (bench pipeline (c)); each "
            "produce hop of a recommendation waits up to this long (p99 launch -> "
            "recommendation 1.29 s at 5 ms, 1.32 s at 50 ms, with 1 s windows)."
        ),
    )
    window_state_chunk_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        le=900_000,
        description=(
            "Largest message of a window-state handover: a partition's state record "
            "(16 bytes per open launch; megabytes on a busy partition) is split into "
            "chunks of this size, below the producer's max_request_size (1,000,000) and "
            "Kafka's default message.max.bytes (1 MiB). A 4.5 MB record once failed the "
            "handover whole."
        ),
    )
    max_message_bytes: int = Field(
        default=MAX_MESSAGE_BYTES,
        gt=0,
        description="Larger input messages are dead-lettered before parsing.",
    )
    max_event_future_s: float = Field(
        default=LaunchLimits.max_future_s,
        gt=0,
        description="Launches stamped further than this ahead of the worker's clock are refused.",
    )
    max_event_age_s: float = Field(
        default=LaunchLimits.max_age_s,
        gt=0,
        description="Launches older than this (the launches topic's retention) are refused.",
    )
    max_event_disorder_s: float = Field(
        default=LaunchLimits.max_disorder_s,
        ge=0,
        description="A batch whose end times go back by more than this is refused.",
    )
    max_stream_launches_per_s: float = Field(
        default=SeqLimits.max_rate_per_s,
        gt=0,
        description=(
            "Fastest one stream (node, device, kernel) can launch: its sequence numbers may "
            "run ahead of its last counted launch by at most this per second of event time "
            "(plus seq_slack_launches); a larger jump is dead-lettered (implausible_seq)."
        ),
    )
    seq_slack_launches: int = Field(
        default=SeqLimits.slack_launches,
        ge=0,
        description="Sequence-number jump always allowed on top of the rate bound.",
    )
    web_bind: str = Field(
        default="127.0.0.1",
        description=(
            "Address the worker's web server (web_port) listens on; 0.0.0.0 for every "
            "interface (a container that Prometheus scrapes from outside)."
        ),
    )

    # --- node -------------------------------------------------------------------
    node_id: str = Field(default_factory=lambda: os.uname().nodename)
    backend: Literal["sim", "trace", "cupy"] = "sim"
    device_model: str = "A100-SXM4-80GB"
    device_index: int = Field(default=0, ge=0)
    workloads: tuple[str, ...] = ("matmul", "reduction", "transpose", "stencil2d")
    trace_file: Path | None = None
    tuning_spaces_dir: Path | None = Field(
        default=None, description="Kernel Tuner cache files; default ../shared/data/tuning-spaces"
    )
    seed: int = 0
    batch_max_launches: int = Field(default=2000, ge=1)
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="zstd",
        description=(
            "Compression of the node's launch batches on the wire and in the broker (Kafka "
            "record-batch compression; the worker decompresses transparently). zstd keeps a "
            "launch batch at ~0.26 of its JSON size, also in the embedded broker's memory."
        ),
    )
    launch_wire: Literal["binary", "json"] = Field(
        default="binary",
        description=(
            "Wire format of the node's launch batches: 'binary' (per-batch fields as JSON, "
            "columns as little-endian arrays the worker maps without parsing) or 'json' "
            "(readable; what older nodes send). Workers read both, message by message."
        ),
    )
    batch_max_delay_s: float = Field(default=0.1, gt=0)
    max_launches_per_s: float = Field(default=20_000.0, gt=0)
    problem_scale: float = Field(
        default=1.0,
        gt=0,
        le=1.0,
        description="Scale of the built-in workloads' total work on sim and cupy nodes "
        "(e.g. 0.0001 for the microsecond kernels of the transfers demo).",
    )
    host_pattern: str | None = Field(
        default=None,
        description="What a sim node's host does around each launch, as a JSON object with "
        "any of h2d_bytes, d2h_bytes, pinned, streams, batch, sync_every "
        "(kernels.transfers.HostPattern): its batches then carry copies and host gaps.",
    )
    sim_drift: str | None = Field(
        default=None,
        description="How a sim node's SM clock and memory drift over hours, as a JSON object "
        "with any of clock_sag_per_h, clock_step, memory_per_h, memory_step, memory_base, "
        "start_h, stop_h, step_h, clock_cv, memory_cv (kernels.backends.sim_drift.DeviceDrift), "
        'e.g. {"clock_sag_per_h": 0.05}: its device samples then show it.',
    )
    rollback_min_launches: int = Field(default=30, ge=1)
    max_step: int = Field(default=8, ge=1, description="Largest per-parameter move a node accepts.")
    node_state_dir: Path = Field(
        default=Path("var/node"),
        description="Root of the nodes' durable state (outbox, sequence numbers, replay "
        "memory); each node uses <root>/<node_id>.",
    )
    outbox_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="Outbox size bound; oldest launches drop."
    )
    outbox_max_records: int = Field(
        default=100_000, gt=0, description="Outbox message bound; oldest launches drop."
    )
    outbox_drain_s: float = Field(
        default=5.0, ge=0, description="On shutdown, wait this long for the outbox to empty."
    )
    node_metrics_port: int = Field(
        default=6067,
        ge=0,
        le=65535,
        description="Node (`kernelstream node`): port of /metrics, /healthz, /readyz; 0: none.",
    )
    node_metrics_bind: str = Field(
        default="127.0.0.1",
        description="Address the node's metrics server listens on; 0.0.0.0: every interface.",
    )

    # --- control plane (recommendation signing, Ed25519) --------------------------
    signing_private_key: SecretStr | None = Field(
        default=None, description="Tuner: PEM private key that signs recommendations."
    )
    signing_private_key_file: Path | None = Field(
        default=None, description="Tuner: file holding the PEM private key."
    )
    signing_public_key: str | None = Field(
        default=None,
        description="Node: PEM public key of the recommender; recommendations that are "
        "unsigned or not signed by it are rejected. Without one (and without "
        "insecure_accept_unsigned) a node rejects every recommendation.",
    )
    signing_public_key_file: Path | None = Field(
        default=None, description="Node: file holding the recommender's PEM public key."
    )
    insecure_accept_unsigned: bool = Field(
        default=False,
        description=(
            "Node: apply recommendations without checking any signature (anyone who can "
            "write to the recommendations topic then controls the node's kernels). Logged "
            "as a warning at start. Only for a closed test setup."
        ),
    )
    recommendation_max_age_s: float = Field(
        default=600.0,
        gt=0,
        description="Node: a recommendation issued longer ago than this is rejected (stale).",
    )
    recommendation_max_lifetime_s: float = Field(
        default=3600.0,
        gt=0,
        description="Node: a recommendation whose expiry is further than this after its "
        "issue time is rejected.",
    )

    @model_validator(mode="after")
    def _security_complete(self) -> Settings:
        if self.security_protocol.startswith("SASL_"):
            missing = [
                n
                for n in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, n) is None
            ]
            if missing:
                raise ValueError(
                    f"security_protocol={self.security_protocol} needs {', '.join(missing)} "
                    f"(KERNELSTREAM_{missing[0].upper()})"
                )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate)")
        if self.signing_private_key and self.signing_private_key_file:
            raise ValueError("set signing_private_key or signing_private_key_file, not both")
        if self.signing_public_key and self.signing_public_key_file:
            raise ValueError("set signing_public_key or signing_public_key_file, not both")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml = os.environ.get("KERNELSTREAM_CONFIG")
        if toml:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)

    @property
    def embedded(self) -> bool:
        """True when no bootstrap is configured: the CLI starts the embedded broker."""
        return not self.bootstrap

    @model_validator(mode="after")
    def _host_pattern_parses(self) -> Settings:
        if self.host_pattern is not None:
            host_pattern_of(self.host_pattern)
        if self.sim_drift is not None:
            DeviceDrift.parse(self.sim_drift)
        return self

    def fetch_wait(self) -> int:
        """The fetch wait in ms: the setting, else the short one, which suits every broker
        (:meth:`for_broker` sets the broker's own once it has answered)."""
        return SHORT_FETCH_WAIT_MS if self.fetch_max_wait_ms is None else self.fetch_max_wait_ms

    def for_broker(self, capabilities: _Broker) -> Settings:
        """These settings on the broker that answered ``capabilities``: the fetch wait
        unset becomes the broker's (kept where it is set)."""
        if self.fetch_max_wait_ms is not None:
            return self
        return self.model_copy(update={"fetch_max_wait_ms": capabilities.fetch_wait_ms})

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Security keyword arguments shared by aiokafka producers, consumers and admin.

        aiokafka takes the SASL user name and password as ``sasl_plain_*`` for every
        mechanism (PLAIN and SCRAM alike).
        """
        kw: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL_") and self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        ssl_context = self.ssl_context()
        if ssl_context is not None:
            kw["ssl_context"] = ssl_context
        return kw

    def producer_compression(self) -> str | None:
        """``compression_type`` as aiokafka's producer takes it (None: uncompressed)."""
        return None if self.compression_type == "none" else self.compression_type

    def ssl_context(self) -> Any:
        """The TLS context of an ``SSL``/``SASL_SSL`` connection, else None."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        from aiokafka.helpers import create_ssl_context

        ctx = create_ssl_context(
            cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
            certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
            keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
            password=self.ssl_password.get_secret_value() if self.ssl_password else None,
        )
        ctx.check_hostname = self.ssl_check_hostname
        return ctx

    def node_dir(self) -> Path:
        """This node's own state directory."""
        return self.node_state_dir / self.node_id


def load_settings(**overrides: Any) -> Settings:
    """Build the settings from the environment (and TOML file), then explicit overrides."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def host_pattern_of(text: str) -> HostPattern:
    """Parse the ``host_pattern`` setting; ValueError with what is wrong."""
    try:
        fields = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"host_pattern is not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise ValueError("host_pattern must be a JSON object")
    unknown = set(fields) - set(HostPattern.__dataclass_fields__)
    if unknown:
        raise ValueError(f"host_pattern has unknown fields {sorted(unknown)}")
    if any(not isinstance(v, int) or v < 0 for v in fields.values()):
        raise ValueError("host_pattern values must be integers >= 0")
    if "pinned" in fields and fields["pinned"] not in (0, 1):
        raise ValueError("host_pattern pinned must be 0 or 1")
    for name in ("streams", "batch", "sync_every"):
        if name in fields and fields[name] not in HOST_KNOB_VALUES[name]:
            raise ValueError(
                f"host_pattern {name} must be one of {list(HOST_KNOB_VALUES[name])} "
                "(the values a node declares for it)"
            )
    return HostPattern(**fields)

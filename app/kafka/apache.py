"""Apache Kafka (KRaft) brokers on loopback, owned by this process.

The broker is Apache Kafka's own Maven artifact ``org.apache.kafka:kafka_2.13``,
named with its version in ``pom.xml`` beside this module (the version that
docker-compose.yml and deploy/k8s run). :func:`kafka_libs` has Maven copy the
jars into a cache folder once; later starts use that folder and need no network.
:class:`KafkaCluster` formats KRaft storage for 1 or 3 nodes (each both broker
and controller), starts ``java -cp 'libs/*' kafka.Kafka server.properties`` per
node on free loopback ports, waits until every broker is in the cluster's
metadata, and stops them cleanly (SIGTERM, controlled shutdown, then SIGKILL).

Options for the JVM beyond the heap come from ``KAFKA_OPTS``, as Apache Kafka's own
start scripts take them (the test suite runs its brokers with ``-XX:TieredStopAtLevel=1``:
see ``tests/integration/conftest.py``).

Fault drills reach single nodes: :meth:`KafkaCluster.signal` sends SIGKILL,
SIGSTOP or SIGCONT to one node and :meth:`KafkaCluster.start_node` starts a
killed node again on its own storage and ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.embedded import die_with_parent, wait_for_kafka

__all__ = [
    "KafkaCluster",
    "KafkaNode",
    "SecuredListeners",
    "default_cache_dir",
    "distinct_free_ports",
    "kafka_libs",
    "kafka_version",
]

_POM = Path(__file__).with_name("pom.xml")
_HEAP = "-Xmx512m"
_LOG4J = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


def kafka_version() -> str:
    """The Apache Kafka version the project runs (``kafka.version`` in pom.xml)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _POM.read_text())
    if match is None:
        raise BrokerError(f"{_POM} names no <kafka.version>")
    return match.group(1)


def default_cache_dir() -> Path:
    """Where the broker's jars are kept: ``$XDG_CACHE_HOME/kernelstream`` (or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kernelstream"


def _tool(name: str, hint: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BrokerError(f"Apache Kafka needs {name!r} on PATH: {hint}")
    return found


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return _tool("java", "install a Java 17 or newer runtime (e.g. apt-get install openjdk-17-jre)")


def kafka_libs(cache_dir: Path | None = None) -> Path:
    """The folder of the broker's jars, fetched with Maven on first use.

    Concurrent callers (test workers, several CLIs) wait on a lock file; the folder
    appears complete or not at all (Maven writes into a temporary folder that is
    renamed when done).
    """
    root = (cache_dir or default_cache_dir()) / f"kafka-{kafka_version()}"
    libs = root / "libs"
    if libs.is_dir():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not libs.is_dir():
            _fetch(libs)
    return libs


def _fetch(libs: Path) -> None:
    mvn = _tool("mvn", "install Apache Maven (apt-get install maven) to fetch the broker once")
    partial = Path(tempfile.mkdtemp(prefix="libs-", dir=libs.parent))
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(_POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
        shutil.rmtree(partial, ignore_errors=True)
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise BrokerError(
            f"Maven could not fetch Apache Kafka {kafka_version()} "
            f"(exit {done.returncode}): {' | '.join(tail)}"
        )
    partial.rename(libs)


@dataclass
class KafkaNode:
    """One KRaft node (broker and controller in one process)."""

    node_id: int
    port: int
    controller_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    # the SASL_SSL listener's port, where the cluster has one (clients connect there)
    client_port: int | None = None
    # the mutual-TLS (SSL, client certificates) listener's port, where the cluster has one
    mtls_port: int | None = None

    @property
    def address(self) -> str:
        """The PLAINTEXT listener (between brokers, and this module's own readiness checks)."""
        return f"127.0.0.1:{self.port}"

    @property
    def client_address(self) -> str:
        """Where clients connect: the SASL_SSL listener where there is one."""
        return f"127.0.0.1:{self.client_port or self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# A SCRAM user's name or password as the storage tool's --add-scram reads it: its
# characters ",[]=" and quotes would be read as the option's own syntax.
_SCRAM_TEXT = re.compile(r"[A-Za-z0-9._~!@#$%^&*()+-]+")


@dataclass(frozen=True)
class SecuredListeners:
    """Listeners for clients that authenticate, as a production cluster's do.

    A SASL_SSL listener: TLS with the broker's private key and certificate chain from
    ``keystore`` (one PEM file: the key, unencrypted PKCS#8, then the chain; its
    certificate must name 127.0.0.1, where clients connect), and SCRAM (``mechanism``)
    for ``users`` (name -> password), whose credentials are written into each node's
    storage when it is formatted; :attr:`KafkaCluster.bootstrap` names it. With
    ``client_ca``, also a mutual-TLS listener (SSL: the same key, and a client
    certificate signed by that CA required; its principal is ``User:`` and the
    certificate's subject, such as ``User:CN=ks-node``),
    :attr:`KafkaCluster.mtls_bootstrap`. Brokers and this module's readiness checks use
    a PLAINTEXT listener of their own on loopback.

    ``authorize``: ACLs decide what each principal may do (Kafka's StandardAuthorizer:
    where no ACL allows an operation, it is denied); the PLAINTEXT listener's principal
    (``User:ANONYMOUS``, the brokers' own and that of whoever sets the ACLs there) is a
    super user.
    """

    keystore: Path
    users: Mapping[str, str]
    mechanism: str = "SCRAM-SHA-512"
    authorize: bool = False
    client_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise BrokerError(f"a SCRAM mechanism is needed, not {self.mechanism!r}")
        if not self.users:
            raise BrokerError("a SASL_SSL listener needs at least one user")
        for text in (*self.users, *self.users.values()):
            if not _SCRAM_TEXT.fullmatch(text):
                raise BrokerError(
                    "a SCRAM user name or password may hold letters, digits and "
                    f"._~!@#$%^&*()+- only (the storage tool's syntax), not {text!r}"
                )


class KafkaCluster:
    """1 or 3 Apache Kafka nodes on loopback.

    >>> # with KafkaCluster(Path("var"), nodes=3) as kafka: print(kafka.bootstrap)
    """

    def __init__(
        self,
        work_dir: Path,
        nodes: int = 1,
        *,
        first_port: int | None = None,
        cache_dir: Path | None = None,
        heap: str = _HEAP,
        cluster_id: str | None = None,
        secured: SecuredListeners | None = None,
    ) -> None:
        if nodes < 1:
            raise BrokerError(f"a Kafka cluster needs at least one node, not {nodes}")
        self.work_dir = Path(work_dir)
        self.cache_dir = cache_dir
        self.heap = heap
        self.cluster_id = cluster_id or _cluster_id()
        self.root = self.work_dir / f"kafka-{self.cluster_id}"
        self.secured = secured
        # plaintext and controller; SASL_SSL; mutual TLS
        per = 2 + (secured is not None) + (secured is not None and secured.client_ca is not None)
        ports = distinct_free_ports(per * nodes, taken={first_port} if first_port else set())
        self.nodes = [
            KafkaNode(
                node_id=i + 1,
                port=first_port if first_port and i == 0 else ports[per * i],
                controller_port=ports[per * i + 1],
                data_dir=self.root / f"node-{i + 1}",
                log_path=self.root / f"node-{i + 1}.log",
                client_port=ports[per * i + 2] if per > 2 else None,
                mtls_port=ports[per * i + 3] if per > 3 else None,
            )
            for i in range(nodes)
        ]
        # Every node is started from this one thread: the kernel kills a child whose
        # parent *thread* ends (PR_SET_PDEATHSIG), and a node restarted from a
        # short-lived thread (asyncio.to_thread in a drill) died with it.
        self._spawner: ThreadPoolExecutor | None = None

    @property
    def bootstrap(self) -> str:
        """Every node's address, as clients' bootstrap servers (SASL_SSL where the cluster
        has that listener: clients then need the matching security settings)."""
        return ",".join(n.client_address for n in self.nodes)

    @property
    def mtls_bootstrap(self) -> str:
        """Every node's mutual-TLS listener (:class:`SecuredListeners` ``client_ca``)."""
        if not all(n.mtls_port for n in self.nodes):
            raise BrokerError("this cluster has no mutual-TLS listener (no client_ca)")
        return ",".join(f"127.0.0.1:{n.mtls_port}" for n in self.nodes)

    @property
    def plaintext_bootstrap(self) -> str:
        """Every node's PLAINTEXT listener (the same as :attr:`bootstrap` without SASL_SSL)."""
        return ",".join(n.address for n in self.nodes)

    @property
    def log_path(self) -> Path:
        """The first node's log (one log per node, side by side)."""
        return self.nodes[0].log_path

    @property
    def running(self) -> bool:
        return any(n.running for n in self.nodes)

    @property
    def pid(self) -> int | None:
        """The first node's process id while it runs (benchmarks sample its memory)."""
        node = self.nodes[0]
        return node.proc.pid if node.running and node.proc else None

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        """The broker configuration of ``node``: small, and tuned for fast start and tests."""
        n = len(self.nodes)
        voters = ",".join(f"{m.node_id}@127.0.0.1:{m.controller_port}" for m in self.nodes)
        listeners = f"PLAINTEXT://{node.address},CONTROLLER://127.0.0.1:{node.controller_port}"
        advertised = f"PLAINTEXT://{node.address}"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        secured: dict[str, str] = {}
        sec = self.secured
        if sec is not None:
            listeners += f",CLIENT://{node.client_address}"
            advertised += f",CLIENT://{node.client_address}"
            protocols += ",CLIENT:SASL_SSL"
            mechanism = sec.mechanism
            secured = {
                "listener.name.client.sasl.enabled.mechanisms": mechanism,
                f"listener.name.client.{mechanism.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                "listener.name.client.ssl.keystore.type": "PEM",
                "listener.name.client.ssl.keystore.location": str(sec.keystore),
            }
            if sec.client_ca is not None:
                listeners += f",MTLS://127.0.0.1:{node.mtls_port}"
                advertised += f",MTLS://127.0.0.1:{node.mtls_port}"
                protocols += ",MTLS:SSL"
                secured |= {
                    "listener.name.mtls.ssl.keystore.type": "PEM",
                    "listener.name.mtls.ssl.keystore.location": str(sec.keystore),
                    "listener.name.mtls.ssl.truststore.type": "PEM",
                    "listener.name.mtls.ssl.truststore.location": str(sec.client_ca),
                    "listener.name.mtls.ssl.client.auth": "required",
                }
            if sec.authorize:
                secured["authorizer.class.name"] = (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                )
                secured["super.users"] = "User:ANONYMOUS"
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": listeners,
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocols,
            **secured,
            "log.dirs": str(node.data_dir),
            "num.partitions": "1",
            "default.replication.factor": str(min(n, 3)),
            "min.insync.replicas": str(min(n, 2)),
            "offsets.topic.replication.factor": str(min(n, 3)),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(min(n, 3)),
            "transaction.state.log.min.isr": str(min(n, 2)),
            "transaction.state.log.num.partitions": "10",
            # a group forms as soon as its first member joins (tests start workers one by one)
            "group.initial.rebalance.delay.ms": "0",
            # a stopped or killed node leaves the ISR and gives up leadership in seconds
            "replica.lag.time.max.ms": "5000",
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500",
            "controlled.shutdown.enable": "true",
            "log.cleaner.backoff.ms": "1000",
            # as docker-compose.yml runs it: topics are created by kernelstream with their
            # partitions and policies, and nodes send batches of up to 8 MiB
            "auto.create.topics.enable": "false",
            "message.max.bytes": str(8 << 20),
        }

    def _write_config(self, node: KafkaNode) -> Path:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        path = node.data_dir.parent / f"node-{node.node_id}.properties"
        lines = [f"{k}={v}" for k, v in self.server_properties(node).items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def _java_cmd(self, main_class: str, *args: str) -> list[str]:
        libs = kafka_libs(self.cache_dir)
        log4j = self.root / "log4j2.yaml"
        if not log4j.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            log4j.write_text(_LOG4J)
        return [
            _java(),
            "-Xms64m",
            self.heap,
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            # last, so that a user's option overrides any of the above (the JVM takes the
            # last of two equal options)
            *shlex.split(os.environ.get("KAFKA_OPTS", "")),
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _format(self, node: KafkaNode, config: Path) -> None:
        # "=": an id may begin with "-", which the tool's parser would take for an option
        cmd = self._java_cmd("kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}")
        scram: list[str] = []
        if self.secured is not None:
            mechanism = self.secured.mechanism
            for name, password in self.secured.users.items():
                scram.append(f"--add-scram={mechanism}=[name={name},password={password}]")
        done = subprocess.run(
            [*cmd, "-c", str(config), "--ignore-formatted", *scram],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage of node {node.node_id} failed: "
                f"{(done.stdout + done.stderr).strip()[-500:]}"
            )

    def start(self, timeout_s: float = 60.0) -> KafkaCluster:
        """Format (first time) and start every node; block until all serve."""
        try:
            for node in self.nodes:
                self.start_node(node.node_id, wait=False)
            asyncio.run(self._wait_cluster(timeout_s))
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node_id: int, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start one node (again) on its storage and ports; by default wait until it serves."""
        node = self._node(node_id)
        if node.running:
            return
        config = self._write_config(node)
        if not (node.data_dir / "meta.properties").exists():
            self._format(node, config)
        if self._spawner is None:
            self._spawner = ThreadPoolExecutor(1, thread_name_prefix="kafka-nodes")
        node.proc = self._spawner.submit(self._spawn, node, config).result()
        if wait:
            asyncio.run(self._wait_node(node, timeout_s))

    def _spawn(self, node: KafkaNode, config: Path) -> subprocess.Popen[bytes]:
        with node.log_path.open("ab") as log:
            return subprocess.Popen(
                self._java_cmd("kafka.Kafka", str(config)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )

    def signal(self, node_id: int, sig: signal.Signals) -> None:
        """Send ``sig`` (SIGKILL, SIGSTOP, SIGCONT, ...) to one node's process."""
        node = self._node(node_id)
        if node.proc is None:
            raise BrokerError(f"Kafka node {node_id} is not running")
        node.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            node.proc.wait(30)

    def _node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BrokerError(f"no Kafka node {node_id} (nodes 1 to {len(self.nodes)})")

    async def _wait_node(self, node: KafkaNode, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        # a JVM takes seconds to listen; poll the port quietly before a Kafka client asks
        while time.monotonic() < deadline and node.running:
            if _accepts(node.port):
                break
            await asyncio.sleep(0.1)
        try:
            await wait_for_kafka(
                node.address, max(1.0, deadline - time.monotonic()), bootstrap_only=True
            )
        except BrokerError as exc:
            code = node.proc.poll() if node.proc else None
            raise BrokerError(
                f"{exc} (Kafka node {node.node_id} exit code {code}; see its log {node.log_path})"
            ) from exc

    async def _wait_cluster(self, timeout_s: float) -> None:
        from aiokafka import AIOKafkaClient

        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            await self._wait_node(node, max(1.0, deadline - time.monotonic()))
        for node in self.nodes:  # the secured listeners open with the PLAINTEXT one
            for port in (node.client_port, node.mtls_port):
                while port and not _accepts(port):
                    if time.monotonic() > deadline or not node.running:
                        raise BrokerError(
                            f"Kafka node {node.node_id}'s listener on port {port} did not open "
                            f"within {timeout_s:.0f} s (see its log {node.log_path})"
                        )
                    await asyncio.sleep(0.1)
        want = {n.node_id for n in self.nodes}
        client = AIOKafkaClient(bootstrap_servers=self.plaintext_bootstrap, request_timeout_ms=2000)
        await client.bootstrap()
        try:
            while {b.nodeId for b in client.cluster.brokers()} != want:
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"Kafka brokers {sorted(want)} did not all register within "
                        f"{timeout_s:.0f} s (logs: {self.work_dir})"
                    )
                await asyncio.sleep(0.2)
                await client.force_metadata_update()
        finally:
            await client.close()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every node: SIGTERM (controlled shutdown), SIGKILL after ``timeout_s``."""
        live = [n for n in self.nodes if n.running]
        for node in live:
            with contextlib.suppress(ProcessLookupError):
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)  # a stopped JVM cannot shut down
                node.proc.terminate()
        deadline = time.monotonic() + timeout_s
        for node in live:
            assert node.proc is not None
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)
        for node in self.nodes:
            node.proc = None
        if self._spawner is not None:
            self._spawner.shutdown()
            self._spawner = None

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def distinct_free_ports(n: int, taken: set[int] | None = None) -> list[int]:
    """``n`` different loopback ports that were free a moment ago, none in ``taken``.

    All are held open together while they are drawn: one at a time, the kernel may
    hand out the same free port twice.
    """
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if int(s.getsockname()[1]) in (taken or set()):
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")

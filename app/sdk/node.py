"""``kernelstream.Node``: the node of a user's process, over its :class:`TunableKernel` s.

The node runs the same parts as ``kernelstream node`` (:func:`app.node.runtime.run_node`:
outbox, sender, recommendation inbox, reconfiguration agent), on a thread of its own with
its own event loop, over a :class:`kernels.tunable.KernelRunner` instead of the built-in
workload runner. The user's calls only append to each kernel's launch log; the node
drains, times, batches and publishes them, so neither a slow nor a stopped broker ever
blocks a launch, and an error on the telemetry path is logged, never raised in the
user's thread. Recommendations are applied between two calls of a kernel (the safe
point) and rolled back when they make it slower, as on every node.

Given no bootstrap (argument, ``KAFKA_BOOTSTRAP`` or settings), the node starts the
embedded broker and a worker on loopback, with the worker finding the kernels' spaces
in a folder of the node's.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kernelstream.app.node.outbox import NodeStore
from kernelstream.app.node.runtime import NodeReport, _Node, run_node
from kernelstream.app.sdk.local import LocalStack
from kernelstream.app.settings import Settings
from kernelstream.kernels.errors import KernelDefinitionError
from kernelstream.kernels.tunable import (
    KernelNodeDevice,
    KernelRunner,
    TunableKernel,
    live_kernels,
    on_new_kernel,
)
from kernelstream.schemas import Recommendation
from kernelstream.schemas.signing import write_keypair

__all__ = ["Node"]

log = logging.getLogger("kernelstream.sdk")

_STOPPED = object()  # ends the iterators of recommendations()


class _KernelsNode(_Node):
    """The runtime's node over the user's kernels; takes on kernels made while it runs."""

    def __init__(self, owner: Node, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner

    def adopt(self, kernel: TunableKernel) -> None:
        """Run ``kernel`` from now on (called on the node's thread, at a safe point)."""
        self.runner.add(kernel)  # refuses a second kernel of the same name
        self.by_kernel[kernel.name] = kernel.workload
        self.reconf.add_kernel(kernel.name, kernel.space, kernel.config)
        self.report.default_configs[kernel.name] = kernel.config
        state = self.runner.kernels[kernel.name]
        state.seq = self.store.next_seqs().get(self._stream(kernel.name), 0)
        if self.metrics is not None and self.metrics.speed is not None:
            self.metrics.speed.default_config[kernel.name] = kernel.config_id

    def consider_recommendations(self, now: float) -> None:
        self.owner._safe_point(self, now)


def _local_keys(s: Settings, run_dir: Path) -> tuple[Settings, Settings]:
    """(node settings, worker settings) signing with a pair of the run's own, unless keys
    are configured: the local worker's recommendations are signed, and this node verifies
    them, as in any deployment (docs/operate/security.md)."""
    configured = (
        s.signing_private_key,
        s.signing_private_key_file,
        s.signing_public_key,
        s.signing_public_key_file,
    )
    if any(v is not None for v in configured):
        return s, s
    private, public, _ = write_keypair(run_dir / "keys", keep_existing=True)
    node = s.model_copy(update={"signing_public_key_file": public})
    return node, node.model_copy(update={"signing_private_key_file": private})


class Node:
    """The node of this process: publishes its kernels' launches, applies recommendations.

    >>> # with kernelstream.Node() as node:      # embedded broker and worker
    >>> #     for _ in range(10_000): kernel(out, a, b)

    ``node_id`` names the node (default: settings, i.e. the host name). ``bootstrap``
    is a Kafka cluster; without one (and no ``KAFKA_BOOTSTRAP``) the node starts the
    embedded broker and, unless ``worker=False``, a worker. The node writes each kernel's
    declared space to ``spaces_dir`` (its own folder with the embedded broker), which
    must be the workers' ``tuning_spaces_dir``: that is where their tuner learns it.
    ``auto_apply=False`` leaves recommendations to the user: read them with
    :meth:`recommendations` or :meth:`on_recommendation` and pass the ones to apply to
    :meth:`apply`. ``metrics_port`` serves the node's ``/metrics``, ``/healthz`` and
    ``/readyz`` on that port, as ``kernelstream node`` does; without it the library opens
    no port.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        bootstrap: str | None = None,
        settings: Settings | None = None,
        kernels: Sequence[TunableKernel] | None = None,
        auto_apply: bool = True,
        worker: bool | None = None,
        state_dir: str | Path | None = None,
        spaces_dir: str | Path | None = None,
        metrics_port: int | None = None,
    ) -> None:
        s = settings if settings is not None else Settings()
        updates: dict[str, Any] = {}
        if node_id:
            updates["node_id"] = node_id
        if bootstrap:
            updates["bootstrap"] = bootstrap
        self.settings = s.model_copy(update=updates) if updates else s
        self.auto_apply = auto_apply
        self._worker = worker
        self._kernels = list(kernels) if kernels is not None else None
        self._state_dir = Path(state_dir) if state_dir else None
        self._spaces_dir = Path(spaces_dir) if spaces_dir else None
        self._metrics_port = metrics_port
        self.report = NodeReport(self.settings.node_id)
        self.error: BaseException | None = None
        self._new: queue.SimpleQueue[TunableKernel] = queue.SimpleQueue()
        self._to_apply: queue.SimpleQueue[Recommendation] = queue.SimpleQueue()
        self._subscribers: list[queue.SimpleQueue[Any]] = []
        self._callbacks: list[Callable[[Recommendation], Any]] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._local: LocalStack | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> Node:
        """Start the node (and the embedded broker and worker when there is no bootstrap)."""
        if self._thread is not None:
            return self
        kernels = self._kernels if self._kernels is not None else live_kernels()
        if not kernels:
            raise KernelDefinitionError(
                "a node needs at least one TunableKernel: create the kernels, then start it"
            )
        settings = self._prepare_local(kernels)
        runner = KernelRunner(kernels[0].device)
        for k in kernels:
            runner.add(k)
        if self._kernels is None:
            self._unsubscribe = on_new_kernel(self._new.put)
        self.settings = settings
        self._thread = threading.Thread(
            target=self._run, args=(settings, runner), name="kernelstream-node", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        return self

    def _prepare_local(self, kernels: Sequence[TunableKernel]) -> Settings:
        s = self.settings
        if s.bootstrap:
            if self._spaces_dir is not None:
                for k in kernels:
                    k.write_space(self._spaces_dir)
            return s
        if self._state_dir is not None:
            run_dir = self._state_dir
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="kernelstream-node-")
            run_dir = Path(self._tmp.name)
        self._local = LocalStack(run_dir)
        spaces = self._spaces_dir or run_dir / "spaces"
        spaces.mkdir(parents=True, exist_ok=True)
        self._spaces_dir = spaces
        for k in kernels:
            k.write_space(spaces)
        s = s.model_copy(
            update={
                "bootstrap": self._local.start_broker(),
                "node_state_dir": run_dir / "nodes",  # the broker starts empty: so do we
                "tuning_spaces_dir": spaces,
            }
        )
        if self._worker is not False:
            s, worker_settings = _local_keys(s, run_dir)
            self._local.start_worker(worker_settings)
        return s

    def _run(self, settings: Settings, runner: KernelRunner) -> None:
        try:
            asyncio.run(self._main(settings, runner))
        except BaseException as ex:  # the telemetry path never raises in the user's code
            self.error = ex
            log.exception("node %s stopped on an error; kernels keep running", settings.node_id)
        finally:
            runner.detach_all()
            self._ready.set()
            for q in self._subscribers:
                q.put(_STOPPED)

    async def _main(self, settings: Settings, runner: KernelRunner) -> None:
        from kernelstream.app.kafka.topics import ensure_topics
        from kernelstream.app.observability.health import serve_node_endpoints
        from kernelstream.app.observability.metrics import NodeMetrics

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        assert settings.bootstrap is not None
        if self._local is not None:  # our own broker starts empty; a cluster has its topics
            await ensure_topics(settings, settings.bootstrap)

        def make(s: Settings, b: str, store: NodeStore, report: NodeReport | None) -> _Node:
            device = KernelNodeDevice(runner)
            parts = (device, device.workloads(), runner)
            return _KernelsNode(self, s, b, store, report, parts=parts)

        metrics = NodeMetrics()
        # Loopback for a node on its own broker; all interfaces for one in a cluster.
        host = "127.0.0.1" if self._local is not None else "0.0.0.0"
        async with serve_node_endpoints(metrics, host, self._metrics_port or 0) as port:
            await run_node(
                settings,
                settings.bootstrap,
                stop=self._stop,
                report=self.report,
                make_node=make,
                metrics=metrics if port else None,
            )

    def stop(self, timeout_s: float = 30.0) -> NodeReport:
        """Flush what the kernels launched, stop the node; the kernels keep running."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._thread is not None:
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)
            self._thread = None
        if self._local is not None:
            self._local.stop()
            self._local = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return self.report

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str | None:
        return self.settings.bootstrap

    # -- recommendations ----------------------------------------------------------------
    def recommendations(self, timeout_s: float | None = None) -> Iterator[Recommendation]:
        """Every recommendation for this node from now on, until the node stops (or
        ``timeout_s`` passes without one). Applied or not, as ``auto_apply`` says."""
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._subscribers.append(q)
        try:
            while True:
                try:
                    item = q.get(timeout=timeout_s)
                except queue.Empty:
                    return
                if item is _STOPPED:
                    return
                yield item
        finally:
            self._subscribers.remove(q)

    def on_recommendation(self, callback: Callable[[Recommendation], Any]) -> None:
        """Call ``callback(rec)`` on the node's thread for each recommendation (an error
        it raises is logged)."""
        self._callbacks.append(callback)

    def apply(self, rec: Recommendation) -> None:
        """Apply ``rec`` at the kernel's next safe point, checked, measured and rolled
        back when slower, as an automatic one."""
        self._to_apply.put(rec)

    def _safe_point(self, node: _KernelsNode, now: float) -> None:
        """Between two ticks of the node: take on new kernels, hand out and apply."""
        while not self._new.empty():
            kernel = self._new.get()
            try:
                node.adopt(kernel)
                if self._spaces_dir is not None:
                    kernel.write_space(self._spaces_dir)
            except (KernelDefinitionError, OSError) as ex:
                log.error("node %s cannot run kernel %s: %s", node.s.node_id, kernel.name, ex)
        for rec, offset in node.inbox.drain():
            self._hand_out(rec)
            if self.auto_apply:
                node.consider(rec, offset, now)
        while not self._to_apply.empty():
            node.consider(self._to_apply.get(), None, now)

    def _hand_out(self, rec: Recommendation) -> None:
        for q in list(self._subscribers):
            q.put(rec)
        for cb in list(self._callbacks):
            try:
                cb(rec)
            except Exception:
                log.exception("recommendation callback %r failed", cb)

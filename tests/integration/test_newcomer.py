"""The front door works as written: every command README.md and docs/getting-started.md show.

Each ```bash block of those pages is read, command by command, and run the way a newcomer
would, with only what a test must change: the demo runs for a few seconds instead of a
minute, paths under ``var/`` go to a temporary directory, the broker's port is a free one,
``pip install`` is a dry run and ``pytest`` only collects (this suite is already running).
A command of a shape this module does not know fails the test, so a new command on those
pages cannot go unchecked.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kernelstream.app.kafka.embedded import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
DEMO_SECONDS = "8"
# Processes that run until stopped: started in the background, stopped at the end.
LONG_RUNNING = {"broker", "worker", "node"}
DOCS_PORT = "9092"


def bash_commands(text: str) -> list[list[str]]:
    r"""Every command of the page's ```bash blocks, as tokens, comments and continuations gone.

    >>> bash_commands("```bash\nkernelstream demo   # the loop\nls \\\n  -l\n```")
    [['kernelstream', 'demo'], ['ls', '-l']]
    """
    commands: list[list[str]] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                commands.append(tokens)
    return commands


@dataclass
class Newcomer:
    """Runs a page's commands in order, as a user at a terminal in the repository root."""

    tmp: Path
    port: str = field(default_factory=lambda: str(free_port()))
    background: list[subprocess.Popen[str]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KERNELSTREAM_") and k != "KAFKA_BOOTSTRAP"
        }
        env.update(
            PYTHONUNBUFFERED="1",
            # state a user's run would leave under var/, and ports other tests may hold
            KERNELSTREAM_DATA_DIR=str(self.tmp / "worker"),
            KERNELSTREAM_NODE_STATE_DIR=str(self.tmp / "node"),
            KERNELSTREAM_WEB_PORT=str(free_port()),
            KERNELSTREAM_NODE_METRICS_PORT="0",
        )
        return env

    def adapt(self, tokens: list[str]) -> tuple[dict[str, str], list[str]]:
        """Split leading VAR=value words off and make the command fit a test run."""
        env = self.env()
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            name, value = tokens[0].split("=", 1)
            env[name] = value
            tokens = tokens[1:]
        for name in env:
            env[name] = env[name].replace(f"127.0.0.1:{DOCS_PORT}", f"127.0.0.1:{self.port}")
        argv = [self._path(t) for t in tokens]
        argv = [self.port if a == DOCS_PORT else a for a in argv]
        return env, argv

    def _path(self, token: str) -> str:
        return str(self.tmp / token) if token.startswith("var/") else token

    def run(self, tokens: list[str]) -> str:
        env, argv = self.adapt(tokens)
        head = argv[0]
        if head in ("python", "python3") and argv[1:4] == ["-m", "pip", "install"]:
            return self._check([sys.executable, *argv[1:], "--dry-run"], env, 300)
        if head in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
            return self._check([sys.executable, *argv[1:], "--collect-only", "-q"], env, 300)
        if head == "kernelstream":
            return self._kernelstream(argv[1:], env)
        raise AssertionError(f"the newcomer test does not know how to run: {shlex.join(argv)}")

    def _kernelstream(self, args: list[str], env: dict[str, str]) -> str:
        cli = _cli()
        sub = args[0]
        if sub == "demo":
            return self._check([*cli, *_demo_args(args, self.tmp)], env, 240)
        if sub == "watch":
            # a user stops watch with Ctrl-C once lines arrive; the test stops after one
            return self._check([*cli, *args, "--limit", "1"], env, 120)
        if sub in LONG_RUNNING:
            self._start([*cli, *args], env)
            return ""
        return self._check([*cli, *args], env, 300)

    def _check(self, argv: list[str], env: dict[str, str], timeout: float) -> str:
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def _start(self, argv: list[str], env: dict[str, str]) -> None:
        log = (self.tmp / f"{argv[-1]}-{len(self.background)}.log").open("w")
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            # a runner started in the background of a non-interactive shell ignores SIGINT,
            # and children inherit that; these must see Ctrl-C as a user's terminal sends it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.background.append(proc)
        if "broker" in argv:
            _wait_for(log.name, "broker ready", proc)

    def stop(self) -> None:
        """Ctrl-C to everything still running, newest first (the broker last)."""
        for proc in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    # SIGTERM still lets the broker command stop its broker process
                    proc.terminate()
                    proc.wait(20)


def _cli() -> list[str]:
    exe = shutil.which("kernelstream")
    return [exe] if exe else [sys.executable, "-m", "kernelstream.app.cli"]


def _demo_args(args: list[str], tmp: Path) -> list[str]:
    """The page's demo command, run for a few seconds, its state under ``tmp``."""
    out = list(args)
    if "--duration" in out:
        out[out.index("--duration") + 1] = DEMO_SECONDS
    else:
        out += ["--duration", DEMO_SECONDS]
    if "--run-dir" not in out:
        out += ["--run-dir", str(tmp / "demo")]
    if "--no-live" not in out:
        out.append("--no-live")
    return out


def _wait_for(log_path: str, text: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if text in Path(log_path).read_text():
            return
        assert proc.poll() is None, Path(log_path).read_text()
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {log_path}: {Path(log_path).read_text()}")


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[Newcomer]:
    n = Newcomer(tmp_path)
    try:
        yield n
    finally:
        n.stop()


@pytest.mark.parametrize("page", PAGES)
def test_every_command_on_the_page_runs(page: str, newcomer: Newcomer) -> None:
    commands = bash_commands((ROOT / page).read_text())
    assert commands, f"{page} shows no commands"
    outputs = [newcomer.run(tokens) for tokens in commands]
    joined = "\n".join(outputs)
    assert "Would install kernelstream" in joined
    for tokens, out in zip(commands, outputs, strict=True):
        if tokens[:2] == ["kernelstream", "demo"]:
            assert "Summary" in out and "recorded" in out, out
        if "watch" in tokens:
            assert "gpu-1" in out, out
        if "replay" in tokens:
            report = Path(newcomer.adapt(tokens)[1][tokens.index("--report") + 1])
            assert (report / "index.html").stat().st_size > 0


def test_the_pages_show_the_fresh_machine_commands() -> None:
    """The README's three commands stay as they are; getting started installs the same way."""
    readme = bash_commands((ROOT / "README.md").read_text())
    assert readme[:3] == [
        ["python3", "-m", "pip", "install", "-e", ".[embedded,dev]"],
        ["kernelstream", "demo"],
        ["python", "-m", "pytest"],
    ]
    started = bash_commands((ROOT / "docs/getting-started.md").read_text())
    assert started[0] == readme[0]

"""Start and stop real hub processes for tests and benchmarks.

Both hubd and the published reference hub (synapse-channel, AGPL, driven only
as a black box from its own virtual environment) are started as child
processes on loopback ports and stopped by their PID.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import ref_forks
from tests.support.ref_forks import ForkedProgram

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SPEC = "synapse-channel[encryption]==0.99.38"
REFERENCE_EXTRA = ["websockets==17.4"]


def _port_band() -> range:
    """Where free_port() looks: the 12288 ports just below the kernel's
    ephemeral range (32768-60999 by default: 20480-32767), or empty when the
    range starts too low to leave room under it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - 12288), low)


def _worker_slot() -> tuple[int, int]:
    """(this pytest-xdist worker's index, how many workers): (0, 1) when not
    under xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        return int(worker[2:]) % count, count
    return 0, 1


_port_walk: "itertools.cycle | None" = None


def free_port() -> int:
    """A loopback port nothing listens on, for a hub (or peer) a test starts
    next. The port is only checked, not held, so it must stay free until the
    hub binds it. It is therefore taken from below the ephemeral range (no
    bind to port 0 and no outgoing connection, here or in any other process,
    is given it in between), from this xdist worker's own share of that band
    (two workers are never handed the same port), walked in order from a
    random start (one process does not hand a port out twice until it has
    gone round its share), skipping any port something holds."""
    global _port_walk
    band = _port_band()
    index, count = _worker_slot()
    ports = band[index::count]
    if len(ports) < 256:  # no room under the ephemeral range: let the kernel choose
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if _port_walk is None:
        start = random.randrange(len(ports))
        _port_walk = itertools.cycle([*ports[start:], *ports[:start]])
    for _ in range(len(ports)):
        port = next(_port_walk)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): the next one
            return port
    raise RuntimeError(f"no free port in {ports}")


def wait_port(host: str, port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


@dataclass
class HubProcess:
    """A hub running as a child process."""

    argv: list[str]
    port: int
    host: str = "127.0.0.1"
    scheme: str = "ws"
    env: dict[str, str] | None = None
    log_path: Path | None = None
    ready_path: str | None = None  # polled after the port opens, until it answers 200
    # the reference venv's python: argv[0] is its script, forked by its zygote
    # (tests/support/ref_forks.py) instead of started afresh
    forked_by: Path | None = None
    proc: "subprocess.Popen | ForkedProgram | None" = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.scheme == 'wss' else 'http'}://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, ready_timeout: float = 30.0) -> "HubProcess":
        out = open(self.log_path if self.log_path else os.devnull, "ab")
        with out:
            if self.forked_by is not None:
                self.proc = ref_forks.start(self.forked_by, self.argv, self.env or dict(os.environ),
                                            out.fileno())
            else:
                self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True)
        wait_port(self.host, self.port, ready_timeout, self.proc)
        if self.ready_path:
            self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            try:
                self.get_json(self.ready_path, timeout=2.0)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time. A hubd whose log
        shows a handler that raised fails the test: the hub copes, but it is a bug."""
        code = self._stop(timeout)
        if self.ready_path == "/readyz" and "handler failed" in self.log():
            raise AssertionError(f"a handler raised in hub {self.url}:\n{self.log()[-3000:]}")
        return code

    def _stop(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""

    def get_text(self, path: str, timeout: float = 5.0, headers: dict | None = None) -> str:
        import ssl

        req = urllib.request.Request(self.http_url + path, headers=headers or {})
        ctx = None
        if self.scheme == "wss":  # the test PKI's self-signed CA
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.read().decode()

    def get_json(self, path: str, timeout: float = 5.0, headers: dict | None = None):
        import json

        return json.loads(self.get_text(path, timeout, headers))

    def metric(self, sample: str) -> float:
        """One sample of /metrics, as written there (`name{label="v"}`); 0 when absent."""
        import re

        found = re.search(rf"^{re.escape(sample)} (\S+)$", self.get_text("/metrics"), re.M)
        return float(found.group(1)) if found else 0.0


def hubd_process(workdir: Path, *args: str, port: int | None = None, hub_id: str | None = "test-hub",
                 db: Path | None = None, env: dict | None = None, scheme: str = "ws",
                 host: str = "127.0.0.1", timing=None) -> HubProcess:
    """A hubd process (not yet started) with a fresh journal in workdir.
    `timing` (a hubd.timing.Timing) shortens its timers: the fields that
    differ from production's go to the hub in a --timing file."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    db = db or workdir / "hubd.db"
    argv = [sys.executable, "-m", "hubd", "--host", host, "--port", str(port), "--db", str(db)]
    if hub_id:
        argv += ["--hub-id", hub_id]
    if timing is not None:
        argv += ["--timing", str(timing_file(workdir / f"timing-{port}.json", timing))]
    argv += list(args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    return HubProcess(argv, port, host=host, scheme=scheme, env=full_env,
                      log_path=workdir / f"hubd-{port}.log", ready_path="/readyz")


def timing_file(path: Path, timing) -> Path:
    """Write the fields of `timing` that differ from production's as a hubd
    --timing file (docs/architecture.md, "The timing profile")."""
    import json
    from dataclasses import asdict

    from hubd.timing import Timing

    production = asdict(Timing())
    path.write_text(json.dumps({name: value for name, value in asdict(timing).items()
                                if value != production[name]}))
    return path


def broker_files(db: Path) -> tuple[Path, Path]:
    """Where a hubd whose journal is `db` keeps its broker socket and token by
    default (beside the journal, named after it: docs/broker.md)."""
    from hubd.config import broker_files_beside

    return broker_files_beside(db)


async def connect_broker(db: Path):
    """An authenticated broker client of the hubd whose journal is `db`."""
    from tests.support.broker_client import BrokerClient

    sock, token = broker_files(db)
    return await BrokerClient.connect(str(sock), token.read_text().strip())


def reference_venv() -> Path:
    """A virtual environment holding the reference package, built once and cached.

    HUBD_REFERENCE_VENV overrides the location. The package is AGPL: it runs
    only as a separate program and is never imported by hubd or by the tests.
    """
    venv = Path(os.environ.get("HUBD_REFERENCE_VENV", REPO / ".cache" / "reference-venv"))
    marker = venv / ".installed"
    if marker.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (two xdist workers, or two suites, would otherwise
    # --clear each other's half-built venv); the others wait, then reuse it.
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return venv
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", REFERENCE_SPEC,
                        *REFERENCE_EXTRA], check=True)
        marker.write_text(REFERENCE_SPEC + "\n")
    return venv


def reference_env(home: Path) -> dict[str, str]:
    """Environment for the reference CLI with its state kept inside home."""
    env = dict(os.environ)
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(home / var.lower())
    env["HOME"] = str(home)
    env.pop("SYNAPSE_TOKEN", None)
    return env


def reference_hub_process(workdir: Path, *args: str, port: int | None = None, hub_id: str = "ref-hub",
                          db: Path | None = None, scheme: str = "ws") -> HubProcess:
    """A reference hub process (not yet started), durable journal, metrics on."""
    venv = reference_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    db = db or workdir / "ref.db"
    argv = [str(venv / "bin" / "synapse"), "hub", "--host", "127.0.0.1", "--port", str(port),
            "--db", str(db), "--hub-id", hub_id, "--metrics", *args]
    return HubProcess(argv, port, scheme=scheme, env=reference_env(workdir / "home"),
                      log_path=workdir / f"ref-{port}.log", ready_path="/health",
                      forked_by=venv / "bin" / "python" if ref_forks.hubs_too else None)

"""Drive the published reference client (synapse-channel) as a black box.

Everything here runs the reference package as separate programs from its own
virtual environment (see procs.reference_venv); nothing imports it. Three ways in:

* ``RefClient.run(cmd, ...)`` — a one-shot CLI command (``synapse health``,
  ``who``, ``send``, ``dead-letters``, …) with its exit code and output;
* ``RefClient.listen(name)`` — a long-running ``synapse listen`` whose printed
  lines are collected in the background;
* ``RefClient.agent(name, ...)`` — the client library's ``SynapseAgent`` run by
  ``ref_agent_driver.py`` under the reference python, for flows the CLI cannot
  express (mailbox, acks, raw frame inspection, history selectors).

Each program is forked by a zygote that imported the reference package once
(tests/support/ref_forks.py, ref_zygote.py): the same program, its own
process, argv, environment and streams, without ~0.5 CPU-s of imports and
interpreter teardown per start.

All processes share one isolated HOME/XDG tree per ``RefClient``: the reference
client keeps a machine identity key there and signs its registrations with it,
and the reference hub pins a name to the first key it saw (TOFU), so every
reference process of one test must use the same home.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests.support import ref_forks
from tests.support.procs import reference_env, reference_venv
from tests.support.ref_forks import ForkedProgram

DRIVER = Path(__file__).with_name("ref_agent_driver.py")
Frame = dict[str, Any]


@dataclass
class CliResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return (f"$ {' '.join(self.argv[1:])}\n-> exit {self.returncode}\n"
                f"stdout: {self.stdout!r}\nstderr: {self.stderr!r}")


class _LineReader:
    """Collect a child's stdout lines in a thread; wait on them with deadlines."""

    def __init__(self, proc: ForkedProgram, parse: Callable[[str], Any]) -> None:
        self.proc = proc
        self.items: list[Any] = []
        self.eof = False
        self._cond = threading.Condition()
        self._parse = parse
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            item = self._parse(line.rstrip("\n"))
            with self._cond:
                self.items.append(item)
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def wait(self, pred: Callable[[Any], bool], timeout: float, start: int = 0) -> tuple[int, Any] | None:
        """Index and value of the first item at or after ``start`` matching pred."""
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.items):
                    if pred(self.items[i]):
                        return i, self.items[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self._cond.wait(left)

    def snapshot(self) -> list[Any]:
        with self._cond:
            return list(self.items)


def _stop(proc: ForkedProgram, grace: float = 3.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ListenProcess:
    """A background ``synapse listen`` and the lines it prints."""

    def __init__(self, proc: ForkedProgram, name: str) -> None:
        self.proc, self.name = proc, name
        self.reader = _LineReader(proc, lambda s: s)

    def wait_line(self, pattern: str, timeout: float = 10.0) -> str:
        rx = re.compile(pattern)
        hit = self.reader.wait(lambda s: bool(rx.search(s)), timeout)
        if hit is None:
            raise AssertionError(f"listen {self.name}: no line matching {pattern!r} within "
                                 f"{timeout}s; printed: {self.lines()!r}")
        return hit[1]

    def lines(self) -> list[str]:
        return self.reader.snapshot()

    def stop(self) -> None:
        _stop(self.proc)


class RefAgent:
    """A reference ``SynapseAgent`` in its own process (see ref_agent_driver.py)."""

    def __init__(self, proc: ForkedProgram, name: str) -> None:
        self.proc, self.name = proc, name
        self.reader = _LineReader(proc, self._parse)
        self._lock = threading.Lock()
        self._seq = 0

    @staticmethod
    def _parse(line: str) -> Frame:
        try:
            obj = json.loads(line)
            return obj if isinstance(obj, dict) else {"event": "junk", "line": line}
        except ValueError:
            return {"event": "junk", "line": line}

    # -- events ---------------------------------------------------------------------

    def events(self) -> list[Frame]:
        return self.reader.snapshot()

    def frames(self, type_: str | None = None) -> list[Frame]:
        return [e["frame"] for e in self.events()
                if e.get("event") == "frame" and (type_ is None or e["frame"].get("type") == type_)]

    def _wait_event(self, pred: Callable[[Frame], bool], timeout: float, what: str) -> Frame:
        hit = self.reader.wait(pred, timeout, 0)
        if hit is None:
            tail = json.dumps(self.events()[-15:], default=str)[:4000]
            raise AssertionError(f"agent {self.name}: no {what} within {timeout}s "
                                 f"(exit={self.proc.poll()}); last events: {tail}; "
                                 f"stderr: {self._stderr_tail()}")
        return hit[1]

    def _stderr_tail(self) -> str:
        try:
            return self.proc.stderr_path.read_text(errors="replace")[-2000:]  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            return "(unavailable)"

    def wait_ready(self, timeout: float = 10.0) -> Frame:
        ev = self._wait_event(lambda e: e.get("event") in ("ready", "not_ready"), timeout, "ready")
        if ev["event"] != "ready":
            raise AssertionError(f"agent {self.name} got no welcome: {self.events()!r}")
        return ev

    def mark(self) -> int:
        """Index of the next event; pass as ``since`` to see only what comes after now."""
        return len(self.reader.snapshot())

    def wait_frame(self, pred: Callable[[Frame], bool] | None = None, timeout: float = 10.0,
                   what: str = "matching frame", since: int = 0, **match: Any) -> Frame:
        """First frame (at or after event index ``since``) matching pred and match."""
        def ok(e: Frame) -> bool:
            if e.get("event") != "frame":
                return False
            f = e["frame"]
            return all(f.get(k) == v for k, v in match.items()) and (pred is None or pred(f))
        hit = self.reader.wait(ok, timeout, since)
        if hit is None:
            tail = json.dumps(self.events()[max(since, len(self.events()) - 15):], default=str)[:4000]
            raise AssertionError(f"agent {self.name}: no {what} {match or ''} within {timeout}s "
                                 f"(exit={self.proc.poll()}); events since: {tail}; "
                                 f"stderr: {self._stderr_tail()}")
        return hit[1]["frame"]

    def wait_registered(self, timeout: float = 10.0) -> Frame:
        """Ask who and wait for the private who_snapshot listing this agent.

        The hub handles one socket's frames in order, so once the answer to a
        request sent after registration arrives, the name is bound: safe to
        address it from another connection.
        """
        since = self.mark()
        self.command({"op": "who"})
        return self.wait_frame(lambda f: self.name in (f.get("online_agents") or []),
                               timeout, "who_snapshot listing self", since=since,
                               type="who_snapshot")

    def wait_event(self, event: str, timeout: float = 10.0, **match: Any) -> Frame:
        return self._wait_event(
            lambda e: e.get("event") == event and all(e.get(k) == v for k, v in match.items()),
            timeout, f"event {event}")

    def wait_closed(self, timeout: float = 10.0) -> Frame:
        return self.wait_event("closed", timeout)

    # -- commands ---------------------------------------------------------------------

    def command(self, cmd: dict, wait: bool = True, timeout: float = 5.0) -> None:
        """Send a command; wait until the driver reports it carried out."""
        with self._lock:
            self._seq += 1
            cmd = dict(cmd, id=self._seq)
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        if wait:
            ev = self._wait_event(lambda e: e.get("id") == cmd["id"], timeout,
                                  f"completion of {cmd['op']}")
            if ev.get("event") == "error":
                raise AssertionError(f"agent {self.name}: command {cmd} failed: {ev}")

    def chat(self, target: str, payload: str, **extra: Any) -> None:
        self.command({"op": "chat", "target": target, "payload": payload, **extra})

    def send(self, type_: str, target: str = "System", payload: str = "", **fields: Any) -> None:
        self.command({"op": "send", "type": type_, "target": target, "payload": payload,
                      "fields": fields})

    def ack(self, seq: int) -> None:
        self.command({"op": "ack", "seq": seq})

    def advertise(self, **kwargs: Any) -> None:
        """The reference client's advertise() (signed when the agent has a card key)."""
        self.command({"op": "advertise", "kwargs": kwargs})

    def channel(self, method: str, *args: Any, **kwargs: Any) -> None:
        """One of the reference client's channel helpers (agent.channel_create, ...)."""
        self.command({"op": "channel", "method": method, "args": list(args), "kwargs": kwargs})

    def attach(self, type_: str, **fields: Any) -> None:
        """The reference client's attachment API: send_attachment(type_, **fields)."""
        self.command({"op": "attach", "type": type_, "fields": fields})

    def gate(self, open_: bool) -> None:
        self.command({"op": "gate", "open": open_})

    def close(self, timeout: float = 8.0) -> Frame | None:
        """Close the agent's socket normally and wait for the process to end."""
        if self.proc.poll() is None:
            try:
                self.command({"op": "close"}, wait=False)
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _stop(self.proc)
        closed = [e for e in self.events() if e.get("event") == "closed"]
        return closed[-1] if closed else None

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class RefClient:
    """Runs reference-client programs against one hub URL from one isolated home."""

    url: str
    home: Path
    token: str | None = None
    procs: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.venv = reference_venv()
        self.env = reference_env(self.home)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.setdefault("USER", "iop-user")

    @property
    def synapse(self) -> str:
        return str(self.venv / "bin" / "synapse")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def _auth(self, token: str | None) -> list[str]:
        tok = self.token if token is None else token
        return ["--token", tok] if tok else []

    def run(self, cmd: str, *args: str, timeout: float = 20.0, uri: bool = True,
            token: str | None = None, cwd: Path | None = None) -> CliResult:
        argv = [self.synapse, cmd]
        if uri:
            argv += ["--uri", self.url]
        argv += self._auth(token) + list(args)
        try:
            code, out, err = ref_forks.run(self.python, argv, self.env, cwd or self.home, timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"`synapse {cmd}` did not finish in {timeout}s: "
                                 f"{exc.stdout!r} {exc.stderr!r}") from None
        return CliResult(argv, code, out, err)

    # -- convenience one-shots ------------------------------------------------------

    def health(self, ready_timeout: float = 5.0, **kw: Any) -> CliResult:
        # The CLI waits the whole ready timeout even after the hub closed the
        # socket, so negative checks should pass a short one.
        return self.run("health", "--ready-timeout", str(ready_timeout), **kw)

    def who(self, name: str = "iop/who", *args: str, **kw: Any) -> CliResult:
        return self.run("who", "--name", name, *args, **kw)

    def send(self, target: str, message: str, *args: str, name: str | None = None,
             **kw: Any) -> CliResult:
        extra = ["--name", name] if name else []
        return self.run("send", "--target", target, "--wait-seconds", "0", *extra, *args,
                        message, **kw)

    def dead_letters(self, name: str = "iop/dl", **kw: Any) -> CliResult:
        return self.run("dead-letters", "--name", name, **kw)

    # -- background programs ----------------------------------------------------------

    def _popen(self, argv: list[str], label: str, stdin: bool = False) -> ForkedProgram:
        """`argv`: the program (the `synapse` script or the driver) and its arguments."""
        logs = self.home / "logs"
        logs.mkdir(exist_ok=True)
        self._n = getattr(self, "_n", 0) + 1
        err_path = logs / f"{self._n:02d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.stderr"
        with open(err_path, "w") as err:
            proc = ref_forks.popen(self.python, argv, self.env, self.home, err.fileno(), stdin)
        proc.stderr_path = err_path  # type: ignore[attr-defined]
        return proc

    def listen(self, name: str, *args: str, token: str | None = None) -> ListenProcess:
        argv = [self.synapse, "listen", "--uri", self.url, "--name", name,
                *self._auth(token), *args]
        lp = ListenProcess(self._popen(argv, f"listen-{name}"), name)
        self.procs.append(lp)
        return lp

    def agent(self, name: str, *, mailbox: bool = False, since_seq: int = 0,
              manual_ack: bool = False, token: str | None = None, ready: bool = True,
              mailbox_for: str = "", registered: bool = True,
              identity: tuple[Path, str] | None = None,
              mac: tuple[str, str] | None = None,
              card_key: tuple[Path, str, str] | None = None) -> RefAgent:
        """`identity`: (private key PEM, key id) to sign the registration;
        `mac`: (key id, secret) for per-message auth."""
        argv = [str(DRIVER), "--uri", self.url, "--name", name,
                *self._auth(token)]
        if identity is not None:
            argv += ["--identity-key", str(identity[0]), "--identity-key-id", identity[1]]
        if mac is not None:
            argv += ["--mac-kid", mac[0], "--mac-secret", mac[1]]
        if card_key:  # (private key PEM, key id, project): the client signs its cards
            argv += ["--card-key", str(card_key[0]), "--card-key-id", card_key[1],
                     "--card-project", card_key[2]]
        if mailbox:
            argv += ["--mailbox", "--since-seq", str(since_seq)]
        if mailbox_for:
            argv += ["--mailbox-for", mailbox_for]
        if manual_ack:
            argv.append("--manual-ack")
        ag = RefAgent(self._popen(argv, f"agent-{name}", stdin=True), name)
        self.procs.append(ag)
        if ready:
            ag.wait_ready()
            if registered:
                ag.wait_registered()
        return ag

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()


def wait_until(fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.1,
               what: str = "condition") -> Any:
    """Poll fn until it returns something truthy; fail with its last value after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s; last value: {last!r}")
        time.sleep(interval)


__all__ = ["CliResult", "ListenProcess", "RefAgent", "RefClient", "wait_until"]

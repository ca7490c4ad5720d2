"""Start reference-client programs through ref_zygote.py (the test process's side).

A `synapse` command, reference hub or ref_agent_driver.py run cost ~0.4-0.7
CPU-s of imports and teardown when started afresh; ref_zygote.py, under the
reference venv's python, imports the package once and forks each program
from there, with the argv, environment, working directory, umask and standard
streams given here. What runs is the reference's unchanged program; only its
start is cheaper.

One zygote per distinct interpreter configuration (the PYTHON* variables of
the programs' environment, which Python reads at start-up, before any
program code) in each test process, started on first use and stopped at the
end of the session (tests/conftest.py) or of the process."""

from __future__ import annotations

import atexit
import json
import locale
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ZYGOTE = Path(__file__).with_name("ref_zygote.py")
# Reference hubs are forked too only when the test suite says so
# (tests/conftest.py): the benchmarks time a reference hub started afresh.
hubs_too = False
START_TIMEOUT = 120.0  # the zygote's own imports, on a loaded machine


class ForkedProgram:
    """One program a zygote started: the subprocess.Popen calls the tests use
    (pid, poll, wait, send_signal, terminate, kill, returncode, stdin, stdout)."""

    def __init__(self, zygote: "Zygote", conn: socket.socket, argv: list[str]) -> None:
        self.args, self._conn, self._zygote = argv, conn, zygote
        self.returncode: int | None = None
        self.stdin = self.stdout = None
        self._lock = threading.Lock()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            conn.settimeout(1.0)
            try:
                answer = conn.recv(4096)
                break
            except ConnectionError:  # the zygote died before it forked a monitor
                answer = b""
                break
            except socket.timeout:
                if zygote.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the reference zygote did not start {argv}:\n"
                                       f"{zygote.log()[-3000:]}") from None
        if not answer:
            raise RuntimeError(f"the reference zygote failed to start {argv}:\n"
                               f"{zygote.log()[-3000:]}")
        self.pid = int(json.loads(answer)["pid"])

    def _read_exit(self, timeout: float | None) -> None:
        """Take the monitor's exit report if it arrives within timeout (None: wait)."""
        with self._lock:
            if self.returncode is not None:
                return
            self._conn.settimeout(timeout)
            try:
                answer = self._conn.recv(4096)
            except (socket.timeout, BlockingIOError):
                return
            if not answer:
                raise RuntimeError(f"the monitor of {self.args} ended without its exit code")
            self.returncode = int(json.loads(answer)["exit"])
            self._conn.close()

    def poll(self) -> int | None:
        self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_exit(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Through the monitor, the program's parent: never a reused pid."""
        if self.poll() is None:
            try:
                self._conn.send(json.dumps({"signal": int(sig)}).encode())
            except OSError:
                pass  # the monitor just reported the exit: poll() reads it

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self, python: Path, env: dict[str, str]) -> None:
        self.address = f"\0hubd-ref-zygote-{os.getpid()}-{secrets.token_hex(8)}"
        self.home = Path(tempfile.mkdtemp(prefix="hubd-ref-zygote-"))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.address)
        listener.listen(128)
        # its own home: nothing of a test's (the imports read none, but if
        # they did, it would not be a test's folder that a later test removed)
        env = dict(env, HOME=str(self.home))
        for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            env[var] = str(self.home / var.lower())
        with open(self.home / "zygote.log", "wb") as log:
            self.proc = subprocess.Popen(
                [str(python), str(ZYGOTE), str(listener.fileno())], pass_fds=[listener.fileno()],
                env=env, cwd=self.home, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log)
        listener.close()

    def log(self) -> str:
        return (self.home / "zygote.log").read_text(errors="replace")

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path,
              streams: tuple[int, int, int], new_session: bool = False) -> ForkedProgram:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.address)
        request = {"argv": [str(a) for a in argv], "env": env, "cwd": str(cwd),
                   "umask": _umask(), "new_session": new_session}
        socket.send_fds(conn, [json.dumps(request).encode()], list(streams))
        return ForkedProgram(self, conn, argv)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def _umask() -> int:
    """This process's umask, which a program it started would inherit (read
    from /proc: os.umask() can only be read by setting it)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise RuntimeError("no Umask line in /proc/self/status")


_zygotes: dict[tuple, Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote(python: Path, env: dict[str, str]) -> Zygote:
    """The running zygote of this python for programs with env's interpreter settings."""
    key = (str(python), *sorted((k, v) for k, v in env.items() if k.startswith("PYTHON")))
    with _zygotes_lock:
        found = _zygotes.get(key)
        if found is None or found.proc.poll() is not None:
            if found is not None:
                found.stop()
            found = _zygotes[key] = Zygote(python, env)
        return found


def stop_zygotes() -> None:
    with _zygotes_lock:
        for z in _zygotes.values():
            z.stop()
        _zygotes.clear()


atexit.register(stop_zygotes)


def run(python: Path, argv: list[str], env: dict[str, str], cwd: Path,
        timeout: float) -> tuple[int, str, str]:
    """Like subprocess.run(argv, capture_output=True, text=True, stdin=DEVNULL,
    timeout=timeout): (exit code, stdout, stderr); subprocess.TimeoutExpired
    (with what was printed) after killing the program when it outlasts timeout."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        with open(os.devnull, "rb") as devnull:
            program = zygote(python, env).spawn(argv, env, cwd, (devnull.fileno(), out_w, err_w))
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as pipes:
        for fd in chunks:
            pipes.register(fd, selectors.EVENT_READ)
        while pipes.get_map():
            left = deadline - time.monotonic()
            ready = pipes.select(max(left, 0)) if left > 0 else []
            if not ready:
                break
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    pipes.unregister(key.fd)
        timed_out = bool(pipes.get_map())
    os.close(out_r)
    os.close(err_r)
    out, err = (_text(b"".join(chunks[fd])) for fd in (out_r, err_r))
    if not timed_out:
        try:
            return program.wait(max(deadline - time.monotonic(), 0.1)), out, err
        except subprocess.TimeoutExpired:
            pass
    program.kill()
    program.wait()
    raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)


def _text(data: bytes) -> str:
    """As subprocess's text mode decodes: locale encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def popen(python: Path, argv: list[str], env: dict[str, str], cwd: Path, stderr: int,
          stdin: bool) -> ForkedProgram:
    """Like subprocess.Popen(argv, text=True, bufsize=1, stdout=PIPE,
    stdin=PIPE if stdin else DEVNULL, stderr=stderr)."""
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), None)
    try:
        program = zygote(python, env).spawn(argv, env, cwd, (in_r, out_w, stderr))
    except BaseException:
        for fd in (out_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(in_r)
    program.stdout = open(out_r, "r", buffering=1)
    program.stdin = open(in_w, "w", buffering=1) if in_w is not None else None
    return program


def start(python: Path, argv: list[str], env: dict[str, str], output: int) -> ForkedProgram:
    """Like subprocess.Popen(argv, env=env, stdout=output, stderr=STDOUT,
    start_new_session=True): a server (the reference hub) logging to output."""
    with open(os.devnull, "rb") as devnull:
        return zygote(python, env).spawn(argv, env, Path.cwd(), (devnull.fileno(), output, output),
                                         new_session=True)

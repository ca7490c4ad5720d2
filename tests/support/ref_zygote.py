"""Start reference-client programs by fork from one process that imported them once.

Run by the REFERENCE virtual environment's python, never imported by the tests
or by hubd (the reference package is AGPL: a black box in its own processes).
Each `synapse ...` command, reference hub or ref_agent_driver.py run spent
~0.4-0.7 CPU-s importing the reference package and tearing it down again; the
interop tests start hundreds of them. This process imports the package once
(and builds the CLI's parser once, which imports every command's module) and
then, for each request, forks a child that runs the very same program (the
`synapse` console script or the driver, by runpy, as `python SCRIPT ARGS`
would) with the request's argv, environment, working directory, umask and
standard streams. The reference code is unchanged; before the fork only its
imports and its parser construction ran here, and those read no environment
(checked for 0.99.38: no module-level reads of os.environ or the home folder,
no cached lookups of them); the child gets the request's environment before
the program starts.

Protocol (tests/support/ref_forks.py is the other end): the test process makes
the listening AF_UNIX SOCK_SEQPACKET socket and passes its descriptor number as
argv[1]. Per program one connection, one request message
    {"argv": [SCRIPT, ARG...], "env": {...}, "cwd": DIR, "umask": N, "new_session": B}
carrying stdin, stdout and stderr as SCM_RIGHTS descriptors. A monitor process
forked for that connection forks the program, answers {"pid": PID}, passes on
each {"signal": N} it receives to the program (it is the program's parent, so
the pid cannot have been reused), SIGKILLs the program if the connection
closes, and answers {"exit": CODE} (as subprocess reports it: -N for signal
N) once the program ended and was reaped. Every process here reaps its
children (no SIGCHLD ignored), so their CPU time is counted up the chain to
the test process, as for programs it started itself."""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback


def prewarm() -> None:
    """Import what the programs import: the whole CLI (every command's parser
    unit) and the client library the agent driver uses."""
    import importlib

    from synapse_channel import cli

    cli.build_parser(command=None)
    # what the agent, the commands' connections and the hub import as they run
    for module in ("synapse_channel.client.agent",
                   "cryptography.hazmat.primitives.serialization",
                   "cryptography.hazmat.primitives.asymmetric.ed25519",
                   "synapse_channel.core.hub_factory", "synapse_channel.core.hub_handshake",
                   "synapse_channel.core.delivery_replay",
                   "synapse_channel.core.delivery_ownership",
                   "synapse_channel.core.hub_component_normalization"):
        importlib.import_module(module)


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(listener: socket.socket) -> dict:
    """Accept requests forever; returns only in a forked program, with its request."""
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        conn, _ = listener.accept()
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        except OSError:
            conn.close()
            continue
        if len(fds) != 3 or not data:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if os.fork() == 0:  # the monitor of this program
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return monitor(conn, json.loads(data), fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def monitor(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    pid = os.fork()
    if pid == 0:  # the program
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        if request.get("new_session"):
            os.setsid()
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        return request
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    conn.send(json.dumps({"pid": pid}).encode())
    events = selectors.DefaultSelector()
    events.register(conn, selectors.EVENT_READ)
    events.register(pidfd, selectors.EVENT_READ)
    listening = True
    while True:
        for key, _ in events.select():
            if key.fileobj is pidfd:
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                os._exit(0)
            if listening:
                try:
                    message = conn.recv(4096)
                except OSError:
                    message = b""
                if message:
                    os.kill(pid, int(json.loads(message)["signal"]))
                else:  # the test process is gone: so goes its program
                    os.kill(pid, signal.SIGKILL)
                    events.unregister(conn)
                    listening = False


def run_program(script: str) -> int:
    """Run script as __main__ and end as the interpreter would (the exit code
    of SystemExit or 1 after a traceback; non-daemon threads joined, atexit
    functions run, standard streams flushed), less tearing down the zygote's
    module graph: freeing every imported object costs a fresh interpreter
    little but a forked one the copying of every page it touches."""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:  # the interpreter ends by SIGINT then
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise  # not reached: SIGINT ended the process
    except BaseException:  # noqa: BLE001 - reported as the interpreter does, exit 1
        traceback.print_exc()
        code = 1
    _finish()
    return code


BUFFERED = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)


def _finish() -> None:
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first
    atexit._run_exitfuncs()
    # Files the program left open are flushed as their teardown would; all
    # were made after gc.freeze(), so the zygote's objects are not walked.
    for generation in range(3):
        for obj in gc.get_objects(generation):
            if issubclass(type(obj), BUFFERED):  # type(): a dead weak proxy has no class
                try:
                    if not obj.closed and obj.writable():
                        obj.flush()
                except (OSError, ValueError):
                    pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    listening_socket = socket.socket(fileno=int(sys.argv[1]))
    # Import as the `synapse` script would: from its folder, not from this one.
    sys.path[0] = os.path.dirname(sys.executable)
    prewarm()
    gc.freeze()  # the forks' collections leave the imported objects (and their pages) alone
    program = serve(listening_socket)
    # Now the program itself, as `python SCRIPT ARGS...` runs it.
    sys.argv = list(program["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    os._exit(run_program(sys.argv[0]))

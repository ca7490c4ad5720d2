"""A forwarded chat's way through federation crosses no module twice, on
the send path and on the result path. The way is recorded, not asserted by
hand: a profiler (sys.setprofile) notes every call into a federation module
while one chat to PROJ/bob@west goes out from an agent on hub east and its
delivery_receipt comes back. East runs in-process (a real HubServer, its
federation config built by the `hubd` command line's own parser); west is a
real hubd process serving pinned mTLS with a serving policy and a PKI made by
`hubd certs`.

What counts:
- Only the tasks that carry the chat (their outermost hub function is in
  CARRIERS: the sender's Connection, the Router, the JournalWriter, the
  peer's ForwardOutbox actor, the PeerLink's reader). Timers that run on
  their own are left out: the outbox's ticker is its own task and its sweep
  (on Tick) runs under ForwardOutbox._sweep; the link's pings are written
  by its writer task (_write), timed by its _watch task; the hub's
  once-a-second sweep reaches the Router as a Call (Router._call).
- A step of the way is a hop: a fresh call whose caller frame is in another
  hub module. A coroutine resuming after an await is the same call going on,
  not a step (its 'call' event is noted, as `resume`); so an actor's loop
  waking for its own reasons (a pong read by the link, a tick taken by the
  outbox) adds no step. Those turns do run inside the carriers (with the
  profiler held on for 4.4 s around one forward: 9 pong reads in
  PeerLink._read, 10 tick turns of ForwardOutbox.run), so a sequence of every
  call, not of hops, would show link.py and outbox.py twice for no reason.
- Libraries that are called and return (federation/state.py projections,
  clock.py, metrics.py, liveness.py; hubd/state, hubd/wire, hubd/journal)
  are listed but are not steps. hubd modules (the Router's API, route_chat)
  are listed as the ends of hops but the assertion is on federation's modules.

The send path is every recorded call up to the first call of PeerLink.send;
the result path starts at the first hop out of federation/actors/link.py after it
(the link handing on the peer's multihub_message_result) and runs until the
sender has its receipt. Expected:
- send: plugin.py (Federation.forward_chat) > forwarding.py (forward_chat,
  forward_from; the JournalWriter runs its after-release callback, which
  posts the row) > outbox.py (Mailbox.post_rows, then the actor) > link.py
  (PeerLink.send);
- result: link.py (_read) > peers.py > outbox.py > forwarding.py. As built
  the link does not call the outbox itself: federation/actors/peers.py's
  Subscribers.on_result fans a result out to the link's subscribers (the
  ForwardOutbox's _answer_arrived). It is a step of its own (it calls on, it
  is not a library), and the way still crosses no module twice. Then the
  actor settles, reports to Forwarding._reported, which posts to the Router,
  which runs Forwarding.reports/settle (forward_settled, the receipt).

The chat handler makes one call into federation (remote_hubs.forward_chat,
which refuses a hub that is not a message peer): a check first (knows())
and the hand-over after would enter plugin.py and forwarding.py twice, and
this test names the hops that re-enter a module when that happens.
"""

import asyncio
import dis
import os
import sys
from pathlib import Path
from typing import NamedTuple

import hubd
from hubd.cli import build_parser, config_from_args
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.inproc import running_hub
from tests.support.procs import hubd_process
from tests.support.wsprobe import joined

ROOT = Path(hubd.__file__).resolve().parent.parent
_PREFIXES = tuple(str(ROOT / package) + os.sep for package in ("hubd", "federation"))
FEDERATION = "federation/"
LIBRARIES = ("federation/state.py", "federation/clock.py", "federation/metrics.py",
             "federation/liveness.py", "hubd/state/", "hubd/wire/", "hubd/journal/")
# the outermost hub function of each task or callback that carries a forwarded chat
CARRIERS = {("hubd/doors/websocket.py", "run"), ("hubd/doors/websocket.py", "_flush"),
            ("hubd/actors/router.py", "run"), ("hubd/actors/journal_writer.py", "run"),
            ("hubd/actors/journal_writer.py", "_reported"),
            ("federation/actors/outbox.py", "run"), ("federation/actors/link.py", "run")}
# work inside a carrier that is not this chat: the Router's timers fire in its
# _tick; the outbox's sweep runs on its Tick
NOT_THE_CHAT = {("hubd/actors/router.py", "_tick"), ("federation/actors/outbox.py", "_sweep")}

EXPECTED_SEND = ("federation/plugin.py", "federation/handlers/forwarding.py",
                 "federation/actors/outbox.py", "federation/actors/link.py")
EXPECTED_RESULT = ("federation/actors/link.py", "federation/actors/peers.py",
                   "federation/actors/outbox.py", "federation/handlers/forwarding.py")

# A coroutine's 'call' event comes at its start and at every resumption; in
# CPython 3.11+ the frame then stands on RESUME with a nonzero argument
# (0 is the start of the function).
_RESUME = dis.opmap["RESUME"]
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coro, async gen


class Call(NamedTuple):
    module: str
    function: str
    caller: str | None  # the caller frame's hub module, None outside the hub
    caller_function: str
    resume: bool
    forward_id: str | None  # of a result the link hands on

    @property
    def hop(self) -> bool:
        return not self.resume and self.caller is not None and self.caller != self.module

    def __str__(self) -> str:
        start = f"{self.caller}:{self.caller_function}" if self.caller else "(loop)"
        return f"{start} -> {self.module}:{self.function}{' (resume)' if self.resume else ''}"


def hub_module(filename: str) -> str | None:
    if filename.startswith(_PREFIXES):
        return Path(filename).relative_to(ROOT).as_posix()
    return None


def is_library(module: str) -> bool:
    return module.startswith(LIBRARIES)


def is_resume(frame) -> bool:
    if not frame.f_code.co_flags & _GENERATOR_FLAGS:
        return False
    code = frame.f_code.co_code
    return code[frame.f_lasti] == _RESUME and code[frame.f_lasti + 1] != 0


def record(calls: list):
    """A profile function noting, in time order, every call into federation
    (and every call out of it) made in a carrier of the chat."""
    def profile(frame, event, arg):
        if event != "call":
            return
        module = hub_module(frame.f_code.co_filename)
        if module is None:
            return
        back = frame.f_back
        caller = hub_module(back.f_code.co_filename) if back is not None else None
        if not module.startswith(FEDERATION) and not (caller or "").startswith(FEDERATION):
            return
        outermost = None
        current = frame
        while current is not None:
            at = hub_module(current.f_code.co_filename)
            if at is not None:
                outermost = (at, current.f_code.co_name)
                if outermost in NOT_THE_CHAT:
                    return
            current = current.f_back
        if outermost not in CARRIERS:
            return
        forward_id = None
        if caller == "federation/actors/link.py" and isinstance(frame.f_locals.get("frame"), dict):
            forward_id = frame.f_locals["frame"].get("forward_id")
        calls.append(Call(module, frame.f_code.co_name, caller,
                          back.f_code.co_name if caller else "", is_resume(frame), forward_id))
    return profile


def steps(calls: list[Call]) -> list[Call]:
    """The hops of a path that are steps of the way (not into a library)."""
    return [c for c in calls if c.hop and not is_library(c.module)]


def way(calls: list[Call]) -> tuple[str, ...]:
    """Federation's modules along the hops, libraries left out, consecutive
    repeats collapsed."""
    modules: list[str] = []
    for hop in steps(calls):
        for end in (hop.caller, hop.module):
            if end.startswith(FEDERATION) and not is_library(end) and \
                    (not modules or modules[-1] != end):
                modules.append(end)
    return tuple(modules)


def crossings(calls: list[Call]) -> list[str]:
    """The hops that enter a federation module the way had already left."""
    entered: dict[str, Call] = {}  # module -> the hop that first entered it
    last = None
    again = []
    for hop in steps(calls):
        for end in (hop.caller, hop.module):
            if not end.startswith(FEDERATION) or is_library(end) or end == last:
                continue
            if end in entered:
                again.append(f"{hop} re-enters {end}, first entered by {entered[end]}")
            else:
                entered[end] = hop
            last = end
    return again


def split(calls: list[Call]) -> tuple[list[Call], list[Call]]:
    send_end = next((i for i, c in enumerate(calls)
                     if c.module == "federation/actors/link.py" and c.function == "send"
                     and not c.resume), None)
    assert send_end is not None, "no call of PeerLink.send was recorded:\n" + \
        "\n".join(map(str, calls))
    result_start = next((i for i in range(send_end + 1, len(calls))
                         if calls[i].hop and calls[i].caller == "federation/actors/link.py"
                         and calls[i].module.startswith(FEDERATION)
                         and not is_library(calls[i].module)), None)
    assert result_start is not None, "the link handed on no result after the send:\n" + \
        "\n".join(map(str, calls[send_end:]))
    return calls[:send_end + 1], calls[result_start:]


def east_federation(pki, west_port: int):
    """East's FederationConfig, built as `hubd --message-peer ...` builds it."""
    parser = build_parser()
    args = parser.parse_args([
        "--hub-id", "east", "--message-peer", f"west=wss://127.0.0.1:{west_port}/",
        "--message-peer-pin", f"west={pki.server_pin('west')}",
        *site_flags(pki, "east", None).connect])
    return config_from_args(args, parser).federation


def show(name: str, calls: list[Call], modules: tuple[str, ...]) -> None:
    print(f"{name} way:", " > ".join(modules))
    for hop in steps(calls):
        print("   ", hop)
    print("  libraries:", sorted({c.module for c in calls if is_library(c.module)}))


async def test_a_forwarded_chat_crosses_no_federation_module_twice(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss")
    west.start()
    try:
        async with running_hub(tmp_path, hub_id="east", redsyn=False,
                               federation=east_federation(pki, west.port)) as east:
            bob = await joined(west.url, "PROJ/bob")
            try:
                alice = await joined(east.url, "PROJ/alice")
                try:
                    await trace_a_forward(alice, bob)
                finally:
                    await alice.close()
            finally:
                await bob.close()
    finally:
        west.stop()


async def trace_a_forward(alice, bob) -> None:
    # the warm-up also waits out the link's first dial
    await alice.chat("PROJ/alice", "PROJ/bob@west", "warm-up", receipt_requested=True)
    await alice.recv_type("delivery_receipt", forward_state="accepted", timeout=30)
    await bob.recv_type("chat", payload="warm-up", timeout=30)
    await asyncio.sleep(0.05)

    calls: list[Call] = []
    sys.setprofile(record(calls))
    try:
        await alice.chat("PROJ/alice", "PROJ/bob@west", "traced", receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", forward_state="accepted",
                                        timeout=30)
    finally:
        sys.setprofile(None)
    got = await bob.recv_type("chat", payload="traced", timeout=30)
    assert got["forward_id"] == receipt["forward_id"] and receipt["delivered"] is True

    send, result = split(calls)
    send_way, result_way = way(send), way(result)
    show("send", send, send_way)
    show("result", result, result_way)
    assert result[0].forward_id == receipt["forward_id"], result[0]
    assert not crossings(send), "the send path crosses a module twice:\n" + \
        "\n".join(crossings(send))
    assert not crossings(result), "the result path crosses a module twice:\n" + \
        "\n".join(crossings(result))
    assert send_way == EXPECTED_SEND
    assert result_way == EXPECTED_RESULT

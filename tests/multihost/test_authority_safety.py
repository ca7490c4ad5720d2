"""Claim safety across three hubs, each in its own network namespace.

east, west and north agree that east owns PROJ; every hub watches the other
two (1 s interval) and west and north route PROJ claims to east. Agents on all
three hubs claim random, overlapping scopes in PROJ (random task ids from a
small pool, one or two paths from a small tree, 5-10 s TTLs, releasing some)
for about 24 s, while east is SIGKILLed and started again on its journal and,
later, the east-west link is cut and restored.

Afterwards, from the journals (SQLite, read-only):
- west and north journaled no lease at all (only east may grant PROJ);
- every lease interval east journaled (claimed_at to the earliest of its
  release, expiry, handoff or renewal, and lease_expires_at) is compared with
  every other: no two live at the same instant with overlapping scopes (same
  worktree, equal paths or one a directory ancestor of the other);
- every claim_granted an agent received is a lease in east's journal (same
  task, owner, epoch and expiry);
and from the agents' logs: every claim and release made on west or north was
answered by east's verdict relayed (hub_id = the agent's hub, owner_hub_id =
east) or refused naming east; while east was down or cut off, nothing was
granted to west's agents.

Then north is restarted misconfigured (`--namespace-owner PROJ=north`) and
grants a PROJ claim on its own: east journals multihub_partition naming
north, refuses PROJ claims as partitioned, and after north releases journals
multihub_heal and grants again.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_netns
from tests.support.sitecmd import REPO, env, python
from tests.support.waiting import wait_for

PORT = 8876
HUBS = ("east", "west", "north")
LINKS = {("east", "west"): "203.0.113.0/30", ("east", "north"): "203.0.113.4/30",
         ("north", "west"): "203.0.113.8/30"}
STORM_SECONDS = 24.0
KILL_AT, DOWN_FOR = 6.0, 1.0  # east SIGKILLed at T0+6 s, started again 1 s later
CUT_AT, CUT_FOR = 13.0, 5.0  # east-west cut at T0+13 s for 5 s
LEASE_KINDS = ("claim", "handoff", "task_update", "checkpoint")


# -- the safety oracle (independent of hubd.state.scope on purpose)

@dataclass(frozen=True)
class Interval:
    task_id: str
    owner: str
    epoch: int
    worktree: str
    paths: tuple
    start: float
    end: float
    seq: int


def journal(path: Path) -> list[tuple]:
    """[(seq, ts, kind, payload)] of a hub journal, opened read-only."""
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(seq, ts, kind, json.loads(payload)) for seq, ts, kind, payload in db.execute(
            "SELECT seq, ts, kind, payload FROM events ORDER BY seq")]
    finally:
        db.close()


def lease_intervals(rows) -> list[Interval]:
    """Every lease a journal granted, as [start, end): from claimed_at to the
    first of lease_expires_at and whatever ended it (release, lease_expired,
    a handoff or the owner's renewal replacing it)."""
    current: dict[str, tuple[dict, int]] = {}
    out: list[Interval] = []

    def close(task_id: str, at: float) -> None:
        lease, seq = current.pop(task_id)
        out.append(Interval(task_id, lease["owner"], lease["epoch"], lease.get("worktree", ""),
                            tuple(lease.get("paths") or ()), lease["claimed_at"],
                            min(at, lease["lease_expires_at"]), seq))

    for seq, ts, kind, p in rows:
        task_id = p.get("task_id")
        if kind in ("claim", "handoff"):
            if task_id in current:
                close(task_id, p.get("claimed_at", ts))
            current[task_id] = (p, seq)
        elif kind in ("task_update", "checkpoint") and task_id in current:
            lease, first = current[task_id]
            if p.get("epoch") == lease["epoch"]:  # may move the expiry; the start stays
                current[task_id] = ({**p, "claimed_at": lease["claimed_at"]}, first)
        elif kind in ("release", "lease_expired") and task_id in current:
            if p.get("epoch") in (None, current[task_id][0]["epoch"]):
                close(task_id, p.get("released_at") or p.get("expired_at") or ts)
    for task_id in list(current):
        close(task_id, float("inf"))
    return out


def _path_overlap(a: str, b: str) -> bool:
    a, b = a.strip("/"), b.strip("/")
    return a == b or a == "" or b == "" or a.startswith(b + "/") or b.startswith(a + "/")


def scopes_overlap(a: Interval, b: Interval) -> bool:
    if a.worktree != b.worktree:
        return False
    pa, pb = a.paths or ("",), b.paths or ("",)  # no paths: the whole worktree
    return any(_path_overlap(x, y) for x in pa for y in pb)


def violations(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    found = []
    ordered = sorted(intervals, key=lambda i: i.start)
    for n, a in enumerate(ordered):
        for b in ordered[n + 1:]:
            if b.start >= a.end:
                continue  # b starts after a ended (later ones may still overlap a)
            if a.task_id != b.task_id and b.start < a.end and a.start < b.end \
                    and scopes_overlap(a, b):
                found.append((a, b))
    return found


def test_the_oracle_finds_an_overlap():
    """The checker itself: an ancestor path held at the same time is caught;
    a released lease, another worktree and a sibling path are not."""
    rows = [
        (1, 1.0, "claim", {"task_id": "a", "owner": "P/x", "epoch": 1, "worktree": "/r",
                           "paths": ["src"], "claimed_at": 1.0, "lease_expires_at": 10.0}),
        (2, 2.0, "claim", {"task_id": "b", "owner": "P/y", "epoch": 2, "worktree": "/r2",
                           "paths": ["src"], "claimed_at": 2.0, "lease_expires_at": 10.0}),
        (3, 3.0, "claim", {"task_id": "c", "owner": "P/y", "epoch": 3, "worktree": "/r",
                           "paths": ["docs", "srcx"], "claimed_at": 3.0,
                           "lease_expires_at": 10.0}),
        (4, 4.0, "release", {"task_id": "a", "owner": "P/x", "epoch": 1, "released_at": 4.0}),
        (5, 4.0, "claim", {"task_id": "d", "owner": "P/z", "epoch": 4, "worktree": "/r",
                           "paths": ["src/core/a.py"], "claimed_at": 4.0,
                           "lease_expires_at": 12.0}),
        (6, 5.0, "claim", {"task_id": "c", "owner": "P/y", "epoch": 5, "worktree": "/r",
                           "paths": ["src/core"], "claimed_at": 5.0, "lease_expires_at": 6.0}),
    ]
    found = violations(lease_intervals(rows))
    assert [(a.task_id, a.epoch, b.task_id, b.epoch) for a, b in found] == [("d", 4, "c", 5)]


# -- the sites

def link_name(a: str, b: str) -> str:
    return f"{a}-{b}" if (a, b) in LINKS else f"{b}-{a}"


def http_json(topo, site, path, timeout=5.0):
    """GET https://127.0.0.1:PORT/path inside a site, over a socket of this process."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the hub's own certificate, over its loopback
    sock = topo.socket(site)
    try:
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", PORT))
        with context.wrap_socket(sock) as tls:
            tls.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, (json.loads(body) if body.strip().startswith((b"{", b"[")) else body)


def wait_ready(topo, site, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{site} exited with {proc.returncode}"
        try:
            if http_json(topo, site, "/readyz", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{site} not ready after {timeout}s"
        time.sleep(0.1)


class Sites:
    def __init__(self, topo: Topology, tmp: Path):
        self.topo, self.tmp = topo, tmp
        self.pki = make_pki(tmp / "pki", list(HUBS))
        self.procs: dict[str, subprocess.Popen] = {}
        self.policies = {hub: write_serving_policy(
            tmp / f"{hub}-policy", self.pki, {peer: ["PROJ"] for peer in HUBS if peer != hub})
            for hub in HUBS}

    def url(self, hub: str, peer: str) -> str:
        """How `hub` reaches `peer`: over the link between them."""
        return f"wss://{self.topo.addr(peer, link_name(hub, peer))}:{PORT}/"

    def argv(self, hub: str, owner: str = "east", watches: bool = True) -> list[str]:
        site = site_flags(self.pki, hub, self.policies[hub])
        argv = python("-m", "hubd", "--host", "0.0.0.0", "--port", str(PORT), "--db",
                      str(self.db(hub)), "--hub-id", hub, "--lease-min-ttl", "1",
                      *site.serve, *site.connect, "--namespace-owner", f"PROJ={owner}",
                      # these hubs have no use for a broker door
                      "--no-broker")
        if watches:
            for peer in HUBS:
                if peer != hub:
                    argv += ["--multihub-watch", f"{peer}={self.url(hub, peer)}",
                             "--multihub-watch-pin", f"{peer}={self.pki.server_pin(peer)}"]
            argv += ["--multihub-watch-interval", "1"]
        if owner != hub:
            argv += ["--claim-peer", f"{owner}={self.url(hub, owner)}",
                     "--claim-peer-pin", f"{owner}={self.pki.server_pin(owner)}"]
        return argv

    def db(self, hub: str) -> Path:
        return self.tmp / f"{hub}.db"

    def start(self, hub: str, **kw) -> subprocess.Popen:
        log = open(self.tmp / f"{hub}.log", "a")
        proc = self.topo.popen(hub, self.argv(hub, **kw), cwd=REPO, env=env(), stdout=log,
                               stderr=subprocess.STDOUT)
        log.close()
        self.procs[hub] = proc
        return proc

    def driver(self, hub: str, *args, timeout=60) -> dict:
        out = self.topo.run(hub, python("-m", "tests.support.claim_driver", *args, "--url",
                                        f"wss://127.0.0.1:{PORT}/"),
                            cwd=REPO, env=env(), timeout=timeout).stdout
        return json.loads(out.strip().splitlines()[-1])

    def health(self, hub: str) -> dict:
        return http_json(self.topo, hub, "/health")[1]


def records(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def test_claim_safety_across_three_hubs_cut_and_restart(tmp_path):
    require_netns()
    with Topology() as topo:
        for (a, b), subnet in LINKS.items():
            topo.link(a, b, subnet)
        sites = Sites(topo, tmp_path)
        for hub in HUBS:
            sites.start(hub)
        for hub in HUBS:
            wait_ready(topo, hub, sites.procs[hub])
        # the standing watches are up before the storm: every hub has polled both peers
        wait_for(lambda: all(w["last_success"] for hub in HUBS
                             for w in sites.health(hub)["multihub"]["watches"].values()),
                 20, "every watch polled")

        # -- phase 1: the storm, a SIGKILL of east, a cut of east-west
        storms = {}
        for n, hub in enumerate(HUBS):
            storms[hub] = topo.popen(hub, python(
                "-m", "tests.support.claim_driver", "storm", "--url", f"wss://127.0.0.1:{PORT}/",
                "--prefix", f"PROJ/{hub}", "--agents", "3", "--duration", str(STORM_SECONDS),
                "--seed", str(100 + n), "--timeout", "20"), cwd=REPO, env=env(),
                stdout=open(tmp_path / f"storm-{hub}.jsonl", "w"),
                stderr=open(tmp_path / f"storm-{hub}.err", "w"))
        t0 = time.time()

        time.sleep(max(0.0, t0 + KILL_AT - time.time()))
        killed_at = time.time()
        os.kill(sites.procs["east"].pid, signal.SIGKILL)
        sites.procs["east"].wait()
        time.sleep(DOWN_FOR)
        sites.start("east")
        wait_ready(topo, "east", sites.procs["east"])
        east_back = time.time()

        time.sleep(max(0.0, t0 + CUT_AT - time.time()))
        cut_at = time.time()
        topo.cut("east", "east-west")
        time.sleep(CUT_FOR)
        topo.restore("east", "east-west")
        restored_at = time.time()

        for hub, proc in storms.items():
            assert proc.wait(timeout=STORM_SECONDS + 60) == 0, \
                (tmp_path / f"storm-{hub}.err").read_text()[-2000:]
        storm_end = time.time()
        attempts = {hub: records(tmp_path / f"storm-{hub}.jsonl") for hub in HUBS}
        for hub in HUBS:
            assert attempts[hub][-1] == {"event": "done"}, hub
            attempts[hub] = attempts[hub][:-1]

        # -- the journals: only east granted, and east never overlapped
        rows = {hub: journal(sites.db(hub)) for hub in HUBS}
        for hub in ("west", "north"):
            leases = [r for r in rows[hub] if r[2] in LEASE_KINDS]
            assert leases == [], f"{hub} journaled leases although east owns PROJ: {leases[:3]}"
        intervals = lease_intervals(rows["east"])
        bad = violations(intervals)
        assert bad == [], f"{len(bad)} overlapping live grants on east, first: {bad[:3]}"

        # every grant an agent was told of is a lease in east's journal
        journaled = {(p["task_id"], p["owner"], p["epoch"]): p
                     for _s, _t, kind, p in rows["east"] if kind == "claim"}
        grants = {hub: [a for a in attempts[hub] if a["answer"] == "claim_granted"]
                  for hub in HUBS}
        for hub in HUBS:
            epochs = set()
            for a in grants[hub]:
                f = a["frame"]
                lease = journaled.get((f["task_id"], f["owner"], f["epoch"]))
                assert lease is not None, f"{hub}: granted but not in east's journal: {f}"
                assert abs(lease["lease_expires_at"] - f["lease_expires_at"]) < 1e-6
                assert (lease["paths"], lease["worktree"]) == (f["paths"], f["worktree"])
                # forwarded or local, a grant is the scope asked for, under a fresh
                # epoch: a re-claim of a held task renews it
                assert (a["paths"], a["worktree"]) == (f["paths"], f["worktree"]), a
                assert f["epoch"] not in epochs, a
                epochs.add(f["epoch"])

        # west and north: every claim and release answered by east, or refused naming it
        for hub in ("west", "north"):
            for a in attempts[hub]:
                assert a["answer"] is not None, f"{hub}: no answer to {a}"
                f = a["frame"]
                assert f["hub_id"] == hub and f["target"] == a["agent"], a
                assert f["owner_hub_id"] == "east", a
                if a["answer"] == "claim_granted":
                    assert f["owner"] == a["agent"] and isinstance(f["epoch"], int), a

        def asked_and_answered_between(hub, start, end):
            # by when it was asked, not only when the answer came: a claim east
            # granted just before it was killed may be read after, on a busy machine
            return [a for a in attempts[hub] if start < a["sent"] and a["recv"] < end]

        # while east was down: refusals naming east, at once, never a grant
        down = [a for hub in ("west", "north")
                for a in asked_and_answered_between(hub, killed_at + 0.3, east_back - 0.3)]
        assert down, "no claim from west or north was answered while east was down"
        assert all(a["answer"].endswith("_denied") for a in down), down
        # while east-west was cut: nothing granted to west's agents
        cut_answers = asked_and_answered_between("west", cut_at + 0.5, restored_at)
        assert all(a["answer"].endswith("_denied") for a in cut_answers), cut_answers
        assert any(a["sent"] < restored_at and a["recv"] > cut_at + 0.5
                   for a in attempts["west"]), "the cut did not hold up any claim from west"

        # the watches across the cut link came back on their own
        for hub, peer in (("east", "west"), ("west", "east")):
            wait_for(lambda: (sites.health(hub)["multihub"]["watches"][peer]["last_success"]
                              or 0) > restored_at, 15, f"{hub}'s watch of {peer} after the cut")

        # the storm was a real contest, on every hub, across the restart
        for hub in HUBS:
            assert len(grants[hub]) >= 3, (hub, len(grants[hub]))
            assert any(a["event"] == "release" and a["answer"] == "release_granted"
                       for a in attempts[hub]), hub
        conflicts = [a for hub in HUBS for a in attempts[hub] if a["answer"] == "claim_denied"
                     and ("conflicts with" in a["frame"]["payload"]
                          or "already claimed" in a["frame"]["payload"])]
        assert len(conflicts) >= 10, len(conflicts)
        survivors = [i for i in intervals if i.start < killed_at and i.end > east_back]
        assert survivors, "no lease was live across east's restart"
        assert any(a["sent"] > east_back for hub in HUBS for a in grants[hub])
        summary = {hub: {"attempts": len(attempts[hub]), "granted": len(grants[hub]),
                         "denied": sum(a["answer"] == "claim_denied" for a in attempts[hub]),
                         "released": sum(a["answer"] == "release_granted"
                                         for a in attempts[hub])} for hub in HUBS}
        print(f"storm {storm_end - t0:.1f}s: {summary}; east leases {len(intervals)}, "
              f"live across the restart {len(survivors)}, conflicts {len(conflicts)}")

        # -- phase 2: north restarted believing it owns PROJ (and watching nothing)
        topo.stop(sites.procs["north"])
        north = sites.start("north", owner="north", watches=False)
        wait_ready(topo, "north", north)
        north_restart_seq = max((r[0] for r in journal(sites.db("north"))), default=0)
        rogue = sites.driver("north", "claim", "--name", "PROJ/nora", "--task", "rogue-1",
                             "--paths", "docs")
        assert rogue["type"] == "claim_granted" and rogue["hub_id"] == "north", rogue
        assert "owner_hub_id" not in rogue  # granted locally, on north's own (wrong) authority

        def east_rows(kind):
            return [p for _s, _t, k, p in journal(sites.db("east")) if k == kind]

        partition = wait_for(lambda: east_rows("multihub_partition"), 15,
                             "east journals multihub_partition")
        assert partition[0]["namespace"] == "PROJ" and partition[0]["contesting_hubs"] == ["north"]
        assert partition[0]["transition"] == "entered" and partition[0]["owner_hub_id"] == "east"
        refused = sites.driver("east", "claim", "--name", "PROJ/erin", "--task", "p-1",
                               "--paths", "elsewhere")
        assert refused["type"] == "claim_denied" and refused["ownership"] == "partitioned", refused
        assert "PROJ" in sites.health("east")["multihub"]["partitioned"]
        # west watches north too: it refuses PROJ as well, rather than forward into a contest
        wait_for(lambda: any(p["contesting_hubs"] == ["north"] for _s, _t, k, p in
                             journal(sites.db("west")) if k == "multihub_partition"),
                 15, "west journals multihub_partition")

        released = sites.driver("north", "release", "--name", "PROJ/nora", "--task", "rogue-1",
                                "--epoch", str(rogue["epoch"]))
        assert released["type"] == "release_granted", released
        heal = wait_for(lambda: east_rows("multihub_heal"), 15, "east journals multihub_heal")
        assert heal[0]["previous_contesting_hubs"] == ["north"]
        assert heal[0]["observation_refreshed"] is True
        again = sites.driver("east", "claim", "--name", "PROJ/erin", "--task", "p-1",
                             "--paths", "elsewhere")
        assert again["type"] == "claim_granted", again
        assert sites.health("east")["multihub"]["partitioned"] == []
        assert len(east_rows("multihub_partition")) == 1 and len(east_rows("multihub_heal")) == 1

        # east is still safe with the grant after the heal; north's one rogue lease is the
        # only lease any hub but east ever journaled
        assert violations(lease_intervals(journal(sites.db("east")))) == []
        north_leases = [(s, p["task_id"]) for s, _t, k, p in journal(sites.db("north"))
                        if k in LEASE_KINDS]
        assert [t for _s, t in north_leases] == ["rogue-1"]
        assert north_leases[0][0] > north_restart_seq
        for hub in HUBS:
            log = (tmp_path / f"{hub}.log").read_text()
            assert "Traceback" not in log and "handler failed" not in log, hub

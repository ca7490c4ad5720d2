"""Multi-site network topologies for tests, built from Linux network namespaces.

Each *site* is a network namespace with only loopback up. Sites are joined by

* ``link(a, b, subnet)``: a veth pair straight from one site to the other, or
* ``network(name, subnet, sites)``: a shared L2 segment, a bridge living in a
  namespace of its own with one veth port per site (the compose-style form).

A site on several networks gets one interface (``eth0``, ``eth1``, ...) per
network. Every network is exactly one subnet and gets exactly its connected
route: there is no default route and no forwarding, so a site reaches another
site only over a network they share. Only documentation ranges are accepted
(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24), and since each namespace is
empty but for what the topology wires into it, nothing leaves the topology.

Faults:

* ``cut(site, net)`` / ``restore(site, net)`` set the site's interface on that
  network, and its peer end (bridge port or the other site), down / up.
* ``block(a, b)`` / ``unblock(a, b)`` drop all IPv4 traffic between two sites
  with an nftables set inside ``a``'s namespace (input and output), leaving the
  links up. Needs ``nft``; raises :class:`NftUnavailable` otherwise (see
  :func:`require_nft`).

Port-forwards: ``forward_to_loopback(site, port, to_port)`` sends TCP for
``port`` arriving at ``site`` to its 127.0.0.1:``to_port`` (nft dnat), the way
a loopback-bound service sits behind a reverse proxy or tunnel.

Processes: ``popen(site, argv)`` runs ``ip netns exec NS argv...`` in a new
session and tracks it; ``run(site, argv)`` is for short commands. On exit the
topology sends SIGTERM (then SIGKILL) to the process group of every process it
started, then SIGKILLs, by PID, anything still inside its namespaces
(``ip netns pids``), then deletes the namespaces. An ``atexit`` hook closes
topologies left open, and namespaces of earlier runs whose process died without
cleaning up (``hubd-<dead pid>-...``) are removed when a new topology starts.

``/etc/hosts`` and ``/etc/netns`` are never touched: use addresses.

Example::

    with Topology() as topo:
        topo.network("lan", "192.0.2.0/24", ["a", "b", "c"])
        topo.network("wan", "198.51.100.0/24", ["b", "c"])
        srv = topo.popen("a", [sys.executable, "-m", "http.server", "--bind",
                               topo.addr("a", "lan"), "8080"])
        topo.wait_tcp("b", topo.addr("a", "lan"), 8080)
        topo.cut("a", "lan")        # a is off the LAN
        assert topo.probe_tcp("b", topo.addr("a", "lan"), 8080) is not None
        topo.restore("a", "lan")

Pytest: call :func:`require_netns` (skips only when not root or when network
namespaces cannot be created; with ``HUBD_REQUIRE_NETNS=1`` or on CI it fails instead)
and :func:`require_nft` before ``block``.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

__all__ = [
    "DOC_RANGES",
    "NetnsError",
    "NetnsUnavailable",
    "NftUnavailable",
    "Topology",
    "cleanup_stale",
    "netns_available",
    "nft_available",
    "require_netns",
    "require_nft",
]

DOC_RANGES = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)
PREFIX = "hubd"
_STALE_RE = re.compile(rf"^{PREFIX}-(\d+)-(?:\d+|probe)(?:-|$)")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_CLONE_NEWNET = 0x40000000
_NFT_TABLE = "hubd_block"


class NetnsError(RuntimeError):
    """An ``ip``/``nft`` command failed; the message carries the command and stderr."""


class NetnsUnavailable(NetnsError):
    """Network namespaces cannot be used here (not root, no ``ip``, no permission)."""


class NftUnavailable(NetnsError):
    """``nft`` is missing or nftables does not work in a namespace."""


# --------------------------------------------------------------------------- tools

def _which(tool: str) -> str | None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(tool, path=path)


def _ip() -> str:
    ip = _which("ip")
    if ip is None:
        raise NetnsUnavailable(
            "the `ip` command (iproute2) is not installed: apt-get install -y iproute2"
        )
    return ip


def _exec(argv: Sequence[str], *, input: str | None = None, timeout: float = 30.0,
          check: bool = True) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                             timeout=timeout)
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]}: not found") from exc
    if check and res.returncode != 0:
        raise NetnsError(
            f"command failed ({res.returncode}): {' '.join(argv)}\n{res.stderr.strip()}"
        )
    return res


def _unavailable_hint(stderr: str) -> str:
    hints = []
    if os.geteuid() != 0:
        hints.append("network namespaces need root (or CAP_SYS_ADMIN + CAP_NET_ADMIN); "
                     "run the tests as root")
    low = stderr.lower()
    if "operation not permitted" in low or "permission denied" in low:
        hints.append("the kernel refused: in a container this needs --privileged or "
                     "CAP_SYS_ADMIN/CAP_NET_ADMIN and a writable /run")
    if "read-only" in low:
        hints.append("/run/netns is not writable")
    return "; ".join(hints) or "see the error above"


# --------------------------------------------------------------------------- probes

_netns_probe: tuple[bool, str] | None = None
_nft_probe: tuple[bool, str] | None = None
_probe_lock = threading.Lock()


def netns_available() -> tuple[bool, str]:
    """(True, "") if this process can create network namespaces and veths, else (False, why)."""
    global _netns_probe
    with _probe_lock:
        if _netns_probe is None:
            _netns_probe = _probe_netns()
        return _netns_probe


def _probe_netns() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not running as root: network namespaces need root"
    ip = _which("ip")
    if ip is None:
        return False, "iproute2 `ip` is not installed"
    name = f"{PREFIX}-{os.getpid()}-probe"
    res = _exec([ip, "netns", "add", name], check=False)
    if res.returncode != 0:
        return False, f"`ip netns add` failed: {res.stderr.strip()} ({_unavailable_hint(res.stderr)})"
    try:
        res = _exec([ip, "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                    check=False)
        if res.returncode != 0:
            return False, f"cannot create a veth pair in a namespace: {res.stderr.strip()}"
        res = _exec([ip, "-n", name, "link", "add", "br0", "type", "bridge"], check=False)
        if res.returncode != 0:
            return False, f"cannot create a bridge in a namespace: {res.stderr.strip()}"
    finally:
        _exec([ip, "netns", "del", name], check=False)
    return True, ""


def nft_available() -> tuple[bool, str]:
    """(True, "") if nftables rules can be loaded inside a namespace, else (False, why)."""
    global _nft_probe
    ok, why = netns_available()
    if not ok:
        return ok, why
    with _probe_lock:
        if _nft_probe is None:
            _nft_probe = _probe_nft()
        return _nft_probe


def _probe_nft() -> tuple[bool, str]:
    nft = _which("nft")
    if nft is None:
        return False, "`nft` is not installed (apt-get install -y nftables)"
    ip = _ip()
    name = f"{PREFIX}-{os.getpid()}-probe"
    res = _exec([ip, "netns", "add", name], check=False)
    if res.returncode != 0:
        return False, f"`ip netns add` failed: {res.stderr.strip()}"
    try:
        res = _exec([ip, "netns", "exec", name, nft, "-f", "-"], input=_nft_ruleset(), check=False)
        if res.returncode != 0:
            return False, f"nftables does not work in a namespace: {res.stderr.strip()}"
    finally:
        _exec([ip, "netns", "del", name], check=False)
    return True, ""


def require_netns() -> None:
    """pytest: skip unless root and network namespaces can be created.

    With HUBD_REQUIRE_NETNS=1 in the environment, or on CI (tests/support/prereq.py),
    fail instead of skipping.
    """
    from tests.support.prereq import missing

    ok, why = netns_available()
    if not ok:
        if os.environ.get("HUBD_REQUIRE_NETNS") == "1":
            import pytest
            pytest.fail(f"network namespaces required but unavailable: {why}")
        missing(why)


def require_nft() -> None:
    """pytest: require_netns(), then skip unless nftables works in a namespace."""
    from tests.support.prereq import missing

    require_netns()
    ok, why = nft_available()
    if not ok:
        missing(why)


# --------------------------------------------------------------------------- setns

_libc = None


def _setns_fn() -> Callable[[int, int], int]:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.setns


def _in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run fn() in a throwaway thread that has joined namespace ns.

    Only that thread changes namespace (setns(CLONE_NEWNET) is per-thread), and
    it exits afterwards. Sockets created there stay in ns for their lifetime.
    """
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _setns_fn()(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    t = threading.Thread(target=body, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


# --------------------------------------------------------------------------- stale

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _list_netns() -> list[str]:
    res = _exec([_ip(), "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    res = _exec([_ip(), "netns", "pids", ns], check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()]


def cleanup_stale() -> list[str]:
    """Delete namespaces ``hubd-<pid>-...`` left by test processes that are gone.

    Kills (by PID) what still runs inside them first. Namespaces of live
    processes, this one included, are left alone. Returns the names removed.
    """
    removed = []
    for name in _list_netns():
        m = _STALE_RE.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        for p in _netns_pids(name):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if _exec([_ip(), "netns", "del", name], check=False).returncode == 0:
            removed.append(name)
    return removed


# --------------------------------------------------------------------------- model

@dataclass
class _Iface:
    site: str
    network: str
    ifname: str
    addr: ipaddress.IPv4Address
    peer_ns: str  # namespace of the other end of the veth
    peer_ifname: str


@dataclass
class _Network:
    name: str
    subnet: ipaddress.IPv4Network
    kind: str  # "bridge" or "link"
    ns: str | None  # bridge namespace, None for a direct link
    members: dict[str, _Iface] = field(default_factory=dict)
    hosts: Iterable[ipaddress.IPv4Address] | None = None
    used: set[ipaddress.IPv4Address] = field(default_factory=set)
    ports: int = 0


@dataclass
class _Site:
    name: str
    ns: str
    ifaces: dict[str, _Iface] = field(default_factory=dict)  # by network name
    next_if: int = 0
    nft_ready: bool = False
    blocked: dict[str, set[str]] = field(default_factory=dict)  # peer site -> addrs dropped


@dataclass
class _Tracked:
    proc: subprocess.Popen
    group: bool
    site: str


_counter = itertools.count()
_live: set["Topology"] = set()
_live_lock = threading.Lock()
_stale_done = False


def _close_all_at_exit() -> None:
    with _live_lock:
        topos = list(_live)
    for t in topos:
        try:
            t.close()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass


atexit.register(_close_all_at_exit)


def _check_name(kind: str, name: str) -> None:
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{kind} name {name!r}: use 1-32 of letters, digits, '_', '.' and '-', starting "
            "with a letter or digit"
        )


def _doc_subnet(subnet: str | ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(subnet, strict=True)
    if not isinstance(net, ipaddress.IPv4Network) or not any(net.subnet_of(r) for r in DOC_RANGES):
        raise ValueError(
            f"{subnet}: only IPv4 documentation ranges may be used "
            f"({', '.join(map(str, DOC_RANGES))})"
        )
    if net.num_addresses < 4:
        raise ValueError(f"{subnet}: need at least a /30")
    return net


class Topology:
    """A set of sites (network namespaces) joined by links and shared networks.

    Use as a context manager; everything it created is removed on exit, also on
    failure. ``close()`` is idempotent and is called at interpreter exit for a
    topology that was never closed.
    """

    def __init__(self, sites: Iterable[str] = (), *, term_timeout: float = 5.0) -> None:
        ok, why = netns_available()
        if not ok:
            raise NetnsUnavailable(why)
        global _stale_done
        if not _stale_done:
            _stale_done = True
            cleanup_stale()
        self.prefix = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.term_timeout = term_timeout
        self._ip = _ip()
        self._sites: dict[str, _Site] = {}
        self._networks: dict[str, _Network] = {}
        self._namespaces: list[str] = []  # in creation order
        self._procs: list[_Tracked] = []
        self._lock = threading.RLock()
        self._closed = False
        with _live_lock:
            _live.add(self)
        try:
            for s in sites:
                self.add_site(s)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ context manager

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Topology {self.prefix} sites={list(self._sites)} networks={list(self._networks)}>"

    # ------------------------------------------------------------ building

    def _ipcmd(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return _exec([self._ip, *args], input=input)

    def _new_ns(self, suffix: str) -> str:
        ns = f"{self.prefix}-{suffix}"
        if ns in self._namespaces:
            raise ValueError(f"namespace {ns} already exists in this topology")
        res = _exec([self._ip, "netns", "add", ns], check=False)
        if res.returncode != 0:
            raise NetnsUnavailable(
                f"`ip netns add {ns}` failed: {res.stderr.strip()} ({_unavailable_hint(res.stderr)})"
            )
        self._namespaces.append(ns)
        self._ipcmd("-n", ns, "link", "set", "lo", "up")

        # Interfaces created from now on get no IPv6 (no link-local, no DAD, no
        # router solicitations); loopback keeps ::1.
        def quiet() -> None:
            with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
                f.write("1")

        try:
            _in_netns(ns, quiet)
        except OSError:
            pass  # IPv6 disabled in this kernel: nothing to quieten
        return ns

    def add_site(self, name: str) -> str:
        """Create site ``name`` (idempotent); returns its namespace name."""
        _check_name("site", name)
        with self._lock:
            self._check_open()
            if name not in self._sites:
                ns = self._new_ns(name)
                self._sites[name] = _Site(name, ns)
            return self._sites[name].ns

    def _new_network(self, name: str, subnet: str, kind: str) -> _Network:
        _check_name("network", name)
        if name in self._networks:
            raise ValueError(f"network {name!r} already exists")
        net = _doc_subnet(subnet)
        for other in self._networks.values():
            if net.overlaps(other.subnet):
                raise ValueError(f"{net} overlaps network {other.name!r} ({other.subnet})")
        ns = self._new_ns(f"net-{name}") if kind == "bridge" else None
        n = _Network(name, net, kind, ns)
        n.hosts = iter(net.hosts())
        self._networks[name] = n
        return n

    def _pick_addr(self, net: _Network, want: str | None) -> ipaddress.IPv4Address:
        if want is not None:
            a = ipaddress.IPv4Address(want)
            if a not in net.subnet or a in (net.subnet.network_address, net.subnet.broadcast_address):
                raise ValueError(f"{a} is not a host address of {net.subnet}")
            if a in net.used:
                raise ValueError(f"{a} is already used on {net.name!r}")
        else:
            assert net.hosts is not None
            for a in net.hosts:
                if a not in net.used:
                    break
            else:
                raise ValueError(f"no free address left in {net.subnet}")
        net.used.add(a)
        return a

    def _new_ifname(self, site: _Site) -> str:
        name = f"eth{site.next_if}"
        site.next_if += 1
        return name

    def _configure(self, iface: _Iface, net: _Network) -> None:
        ns = self._sites[iface.site].ns
        self._ipcmd("-n", ns, "addr", "add", f"{iface.addr}/{net.subnet.prefixlen}",
                    "dev", iface.ifname)
        self._ipcmd("-n", ns, "link", "set", iface.ifname, "up")

    def network(self, name: str, subnet: str, sites: Iterable[str] = (),
                addrs: dict[str, str] | None = None) -> str:
        """A shared L2 segment (bridge in its own namespace) on ``subnet``.

        Each site (created if needed) gets one interface on it, addresses
        assigned in order from the first host address unless given in
        ``addrs``. Returns the network name.
        """
        with self._lock:
            self._check_open()
            net = self._new_network(name, subnet, "bridge")
            self._ipcmd("-n", net.ns, "link", "add", "br0", "type", "bridge",
                        "stp_state", "0", "forward_delay", "0")
            self._ipcmd("-n", net.ns, "link", "set", "br0", "up")
            sites = list(sites)
            addrs = dict(addrs or {})
            unknown = set(addrs) - set(sites)
            if unknown:
                raise ValueError(f"addrs for sites not on {name!r}: {sorted(unknown)}")
            # Sites with a fixed address first, so automatic ones do not take it.
            for s in sorted(sites, key=lambda s: s not in addrs):
                self.attach(name, s, addrs.get(s))
            return name

    def attach(self, network: str, site: str, addr: str | None = None) -> str:
        """Put ``site`` on the shared ``network``; returns its address there."""
        with self._lock:
            self._check_open()
            net = self._net(network)
            if net.kind != "bridge":
                raise ValueError(f"{network!r} is a point-to-point link; attach() needs a network()")
            self.add_site(site)
            s = self._sites[site]
            if network in s.ifaces:
                raise ValueError(f"site {site!r} is already on {network!r}")
            a = self._pick_addr(net, addr)
            ifname = self._new_ifname(s)
            port = f"p{net.ports}"
            net.ports += 1
            self._ipcmd("-n", net.ns, "link", "add", port, "type", "veth",
                        "peer", "name", ifname, "netns", s.ns)
            self._ipcmd("-n", net.ns, "link", "set", port, "master", "br0")
            self._ipcmd("-n", net.ns, "link", "set", port, "up")
            iface = _Iface(site, network, ifname, a, net.ns, port)
            s.ifaces[network] = iface
            net.members[site] = iface
            self._configure(iface, net)
            return str(a)

    def link(self, a: str, b: str, subnet: str, name: str | None = None,
             addrs: tuple[str, str] | None = None) -> str:
        """A veth pair straight between sites ``a`` and ``b`` on ``subnet``.

        ``a`` gets the first host address, ``b`` the second (or ``addrs``).
        The link is a network named ``name`` (default ``"a-b"``) for addr(),
        cut() and restore(). Returns that name.
        """
        if a == b:
            raise ValueError("a link needs two different sites")
        name = name or f"{a}-{b}"
        with self._lock:
            self._check_open()
            self.add_site(a)
            self.add_site(b)
            sa, sb = self._sites[a], self._sites[b]
            net = self._new_network(name, subnet, "link")
            addr_a = self._pick_addr(net, addrs[0] if addrs else None)
            addr_b = self._pick_addr(net, addrs[1] if addrs else None)
            if_a, if_b = self._new_ifname(sa), self._new_ifname(sb)
            self._ipcmd("-n", sa.ns, "link", "add", if_a, "type", "veth",
                        "peer", "name", if_b, "netns", sb.ns)
            ia = _Iface(a, name, if_a, addr_a, sb.ns, if_b)
            ib = _Iface(b, name, if_b, addr_b, sa.ns, if_a)
            sa.ifaces[name], sb.ifaces[name] = ia, ib
            net.members[a], net.members[b] = ia, ib
            self._configure(ia, net)
            self._configure(ib, net)
            return name

    # ------------------------------------------------------------ lookups

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _site(self, site: str) -> _Site:
        try:
            return self._sites[site]
        except KeyError:
            raise KeyError(f"no site {site!r}; sites: {sorted(self._sites)}") from None

    def _net(self, network: str) -> _Network:
        try:
            return self._networks[network]
        except KeyError:
            raise KeyError(f"no network {network!r}; networks: {sorted(self._networks)}") from None

    def _iface(self, site: str, network: str) -> _Iface:
        s = self._site(site)
        self._net(network)
        try:
            return s.ifaces[network]
        except KeyError:
            raise KeyError(f"site {site!r} is not on network {network!r}; it is on "
                           f"{sorted(s.ifaces)}") from None

    @property
    def sites(self) -> list[str]:
        return list(self._sites)

    @property
    def networks(self) -> list[str]:
        return list(self._networks)

    def ns(self, site: str) -> str:
        """The namespace name of a site (for ``ip netns exec``)."""
        return self._site(site).ns

    def namespaces(self) -> list[str]:
        """Every namespace this topology created (sites and bridges)."""
        return list(self._namespaces)

    def addr(self, site: str, network: str) -> str:
        """The IPv4 address of ``site`` on ``network``."""
        return str(self._iface(site, network).addr)

    def addrs(self, site: str) -> dict[str, str]:
        """The site's addresses by network name."""
        return {n: str(i.addr) for n, i in self._site(site).ifaces.items()}

    def iface(self, site: str, network: str) -> str:
        """The interface name of ``site`` on ``network`` inside its namespace."""
        return self._iface(site, network).ifname

    def subnet(self, network: str) -> str:
        return str(self._net(network).subnet)

    def members(self, network: str) -> list[str]:
        return list(self._net(network).members)

    def describe(self) -> str:
        """A human-readable summary, handy in assertion messages."""
        lines = [repr(self)]
        for n in self._networks.values():
            lines.append(f"  {n.kind} {n.name} {n.subnet}" + (f" ns={n.ns}" if n.ns else ""))
            for site, i in n.members.items():
                lines.append(f"    {site}: {i.ifname} {i.addr}")
        return "\n".join(lines)

    # ------------------------------------------------------------ faults

    def _set_link(self, site: str, network: str, state: str) -> None:
        with self._lock:
            self._check_open()
            i = self._iface(site, network)
            ns = self._sites[site].ns
            self._ipcmd("-n", ns, "link", "set", i.ifname, state)
            self._ipcmd("-n", i.peer_ns, "link", "set", i.peer_ifname, state)

    def cut(self, site: str, network: str) -> None:
        """Take ``site``'s interface on ``network`` and its peer end down.

        The site loses its connected route there (its own connects fail at
        once with ENETUNREACH). Peers see silence: a connect times out when
        they had the site's MAC cached, or fails with EHOSTUNREACH after ~3 s
        of unanswered ARP when not. Established TCP connections are not
        reset: unacknowledged data is retransmitted after restore() (seconds
        later, per TCP backoff). For a ``link`` this cuts the whole link.
        """
        self._set_link(site, network, "down")

    def restore(self, site: str, network: str) -> None:
        """Bring both ends back up (address and route return with the carrier)."""
        self._set_link(site, network, "up")

    def is_up(self, site: str, network: str) -> bool:
        i = self._iface(site, network)
        res = _exec([self._ip, "-n", self._sites[site].ns, "-o", "link", "show", i.ifname])
        return "LOWER_UP" in res.stdout

    def block(self, site_a: str, site_b: str) -> None:
        """Drop all IPv4 traffic between two sites, links staying up.

        An nftables set in ``site_a``'s namespace drops packets from and to
        every address ``site_b`` has (on all networks). Both directions look
        like silence (connects time out; no EPERM or reset), and established
        connections stall rather than break. Raises NftUnavailable when
        nftables cannot be used.
        """
        ok, why = nft_available()
        if not ok:
            raise NftUnavailable(why)
        with self._lock:
            self._check_open()
            a, b = self._site(site_a), self._site(site_b)
            if site_a == site_b:
                raise ValueError("block() needs two different sites")
            nft = _which("nft")
            assert nft is not None
            if not a.nft_ready:
                _exec([self._ip, "netns", "exec", a.ns, nft, "-f", "-"], input=_nft_ruleset())
                a.nft_ready = True
            addrs = {str(i.addr) for i in b.ifaces.values()}
            new = addrs - a.blocked.get(site_b, set())
            if new:
                _exec([self._ip, "netns", "exec", a.ns, nft, "add", "element", "inet", _NFT_TABLE,
                       "peers", "{ " + ", ".join(sorted(new)) + " }"])
            a.blocked.setdefault(site_b, set()).update(new)

    def unblock(self, site_a: str, site_b: str) -> None:
        """Undo block(site_a, site_b); a no-op if they were not blocked."""
        with self._lock:
            self._check_open()
            a = self._site(site_a)
            self._site(site_b)
            addrs = a.blocked.pop(site_b, set())
            if addrs:
                nft = _which("nft")
                assert nft is not None
                _exec([self._ip, "netns", "exec", a.ns, nft, "delete", "element", "inet",
                       _NFT_TABLE, "peers", "{ " + ", ".join(sorted(addrs)) + " }"])

    def forward_to_loopback(self, site: str, port: int, to_port: int) -> None:
        """A kernel port-forward inside ``site``: TCP arriving on any of its
        interfaces for ``port`` goes to 127.0.0.1:``to_port`` (nft dnat in
        prerouting, with ``route_localnet`` so the kernel routes it to loopback).
        This is how a hub bound to loopback sits behind a reverse proxy or an
        ssh tunnel. Raises NftUnavailable when nftables cannot be used."""
        ok, why = nft_available()
        if not ok:
            raise NftUnavailable(why)
        with self._lock:
            self._check_open()
            ns = self._site(site).ns
            nft = _which("nft")
            assert nft is not None
            _exec([self._ip, "netns", "exec", ns, "sysctl", "-q", "-w",
                   "net.ipv4.conf.all.route_localnet=1"])
            _exec([self._ip, "netns", "exec", ns, nft, "-f", "-"], input=f"""
table ip {_NFT_TABLE}_forward_{port} {{
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        tcp dport {port} dnat to 127.0.0.1:{to_port}
    }}
}}
""")

    # ------------------------------------------------------------ processes

    def popen(self, site: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``site``'s namespace; tracked and killed on close().

        Keyword arguments go to subprocess.Popen. The process starts in a new
        session (``start_new_session=True`` unless told otherwise) so close()
        can signal its whole process group; the PID is that of the program
        itself (``ip netns exec`` execs it).
        """
        with self._lock:
            self._check_open()
            ns = self._site(site).ns
            group = "process_group" not in kw and kw.setdefault("start_new_session", True)
            proc = subprocess.Popen([self._ip, "netns", "exec", ns, *map(str, argv)], **kw)
            self._procs.append(_Tracked(proc, bool(group), site))
            return proc

    def run(self, site: str, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            **kw: Any) -> subprocess.CompletedProcess:
        """Run a short command inside ``site`` and wait for it (text output captured)."""
        self._check_open()
        ns = self._site(site).ns
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        res = subprocess.run([self._ip, "netns", "exec", ns, *map(str, argv)], timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise NetnsError(f"in site {site!r}: {' '.join(map(str, argv))} exited "
                             f"{res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}")
        return res

    def stop(self, proc: subprocess.Popen, timeout: float | None = None) -> int:
        """SIGTERM a process started by popen() (its group), SIGKILL after timeout."""
        t = next((t for t in self._procs if t.proc is proc), None)
        if t is None:
            raise ValueError("not a process started by this topology")
        self._terminate([t], self.term_timeout if timeout is None else timeout)
        return proc.returncode

    @staticmethod
    def _signal(t: _Tracked, sig: int) -> None:
        # returncode None means the child is not reaped yet, so its PID (and
        # process group id) cannot have been reused.
        if t.proc.returncode is not None:
            return
        try:
            if t.group:
                os.killpg(t.proc.pid, sig)
            else:
                os.kill(t.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _terminate(self, tracked: list[_Tracked], timeout: float) -> None:
        for t in tracked:
            if t.proc.poll() is None:
                self._signal(t, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for t in tracked:
            try:
                t.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for t in tracked:
            if t.proc.returncode is None:
                self._signal(t, signal.SIGKILL)
                t.proc.wait()

    # ------------------------------------------------------------ sockets in a site

    def socket(self, site: str, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM,
               proto: int = 0) -> socket.socket:
        """A socket of this process that lives in ``site``'s namespace.

        Usable from any thread or event loop (e.g. ``loop.sock_connect`` or
        ``asyncio.open_connection(sock=...)``). Close it before the topology.
        """
        ns = self._site(site).ns
        return _in_netns(ns, lambda: socket.socket(family, type, proto))

    def probe_tcp(self, site: str, host: str, port: int, timeout: float = 3.0) -> str | None:
        """Try one TCP connect from ``site``; None on success, else the reason.

        The reason is an errno name ("ECONNREFUSED", "ENETUNREACH",
        "EHOSTUNREACH", ...) or "timeout".
        """
        with self.socket(site) as s:
            s.settimeout(timeout)
            try:
                s.connect((host, port))
            except socket.timeout:
                return "timeout"
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))
            return None

    def wait_tcp(self, site: str, host: str, port: int, timeout: float = 30.0,
                 proc: subprocess.Popen | None = None) -> None:
        """Poll until a TCP connect from ``site`` to host:port succeeds."""
        deadline = time.monotonic() + timeout
        last: str | None = "never tried"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before "
                                   f"{host}:{port} accepted connections from {site!r}")
            last = self.probe_tcp(site, host, port, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if last is None:
                return
            time.sleep(0.05)
        raise TimeoutError(f"{host}:{port} not reachable from {site!r} after {timeout}s "
                           f"(last: {last})\n{self.describe()}")

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Stop every process, delete every namespace. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            try:
                self._terminate(self._procs, self.term_timeout)
            except Exception as exc:  # keep tearing down
                errors.append(exc)
            # Anything still inside our namespaces (e.g. daemonised grandchildren).
            for ns in self._namespaces:
                for pid in _netns_pids(ns):
                    if pid == os.getpid():
                        continue
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for ns in reversed(self._namespaces):
                res = _exec([self._ip, "netns", "del", ns], check=False)
                if res.returncode != 0 and "No such file" not in res.stderr:
                    errors.append(NetnsError(f"ip netns del {ns}: {res.stderr.strip()}"))
            self._namespaces.clear()
            with _live_lock:
                _live.discard(self)
            if errors:
                raise errors[0]


def _nft_ruleset() -> str:
    return f"""
table inet {_NFT_TABLE} {{
    set peers {{ type ipv4_addr; }}
    chain input {{
        type filter hook input priority -10; policy accept;
        ip saddr @peers drop
    }}
    chain output {{
        type filter hook output priority -10; policy accept;
        ip daddr @peers drop
    }}
}}
"""

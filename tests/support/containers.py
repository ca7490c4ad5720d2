"""Real containers for the deployment tests (tests/deploy), with podman.

What these machines allow, found by trying (docs/operations.md, "Podman"):

* No image can be pulled from a registry, but Debian's packages can be
  installed: the base image is made with
  `debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm`
  and `podman import`. Its root filesystem is cached as a tarball under
  .cache/deploy/ (git-ignored), named by a hash of everything that went into
  it, and the imported image is tagged with the same key, so a second run
  reuses either.
* Containers start only with `--ulimit nproc=4096:4096` (a higher process
  limit is refused: "error setting rlimit type 6") and an open-files limit no
  higher than this process's own; crun refuses this kernel's hybrid cgroup
  layout, runc does not. Both go into a containers.conf of the test's own
  (CONTAINERS_CONF), so every build, run and exec gets them and the machine's
  configuration is left alone.
* podman-compose 1.0.3 (Debian's) cannot run compose/docker-compose.yml: it
  passes an empty `--net` next to `network_mode: none` (the certs service
  fails to start), starts the hubs without waiting for
  `condition: service_completed_successfully`, and ignores network `ipam`.
  So the compose files are run by docker-compose (Debian's 1.29) against
  podman's Docker-compatible API (`podman system service` on a socket of the
  test's own): the compose file as written, with podman as the engine.
* Nothing schedules a HEALTHCHECK without systemd: `podman healthcheck run`
  runs the image's own check and records the result, as the timer would.

The hubd image is built with the network off (`--network none`): its wheels
are built on the host first (`pip wheel` into compose/wheelhouse/).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support.procs import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
DEPLOY_TESTS = REPO / "tests" / "deploy"
CACHE = Path(os.environ.get("HUBD_DEPLOY_CACHE", REPO / ".cache" / "deploy"))
LOCK = Path(tempfile.gettempdir()) / "hubd-deploy-tests.lock"

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ("python3", "python3-venv", "python3-pip", "ca-certificates")
# Bump when the recipe below changes in a way the key does not see.
RECIPE = "1"
IMAGE_PREFIX = "localhost/hubd-deploy-test"
# one tag per test session: two suites on this machine never share it
HUBD_IMAGE = f"{IMAGE_PREFIX}/hubd:session-{os.getpid()}"
NPROC = "nproc=4096:4096"


class ContainersUnavailable(Exception):
    pass


def run(argv, *, timeout=600, check=True, env=None, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                            timeout=timeout, env=env, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def require_containers() -> None:
    """pytest: skip (fail on CI: tests/support/prereq.py) unless this process is
    root and podman, runc, docker-compose and debootstrap are installed."""
    from tests.support import prereq

    prereq.need_root("run rootful podman and debootstrap")
    for tool in ("podman", "runc", "docker-compose", "debootstrap"):
        prereq.need_tool(tool)


@contextlib.contextmanager
def machine_lock():
    """One deployment test at a time on this machine: they publish host
    ports and create podman networks on fixed documentation subnets."""
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- podman

@dataclass
class Podman:
    """podman with the test's own containers.conf."""
    conf: Path

    @classmethod
    def configured(cls, where: Path) -> "Podman":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        conf = where / "containers.conf"
        conf.write_text(
            "# tests/support/containers.py: what containers need to start on this machine\n"
            "[containers]\n"
            f'default_ulimits = ["{NPROC}", "nofile={hard}:{hard}"]\n'
            "[engine]\n"
            'runtime = "runc"\n')
        return cls(conf)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
        return run(["podman", *args], timeout=timeout, check=check, env=self.env, **kw)

    def image_exists(self, ref: str) -> bool:
        return self("image", "exists", ref, check=False).returncode == 0

    def inspect(self, name: str) -> dict:
        return json.loads(self("inspect", name).stdout)[0]


def _mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    override = os.environ.get("HUBD_DEBIAN_MIRROR")
    if override:
        return override
    sources = sorted(Path("/etc/apt").glob("sources.list.d/*.sources")) + \
        [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt").glob("sources.list.d/*.list"))
    for path in sources:
        if not path.exists():
            continue
        text = path.read_text()
        for stanza in re.split(r"\n\s*\n", text):
            if re.search(r"^Suites:.*\bbookworm\b", stanza, re.M):
                uri = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if uri and "security" not in uri.group(1):
                    return uri.group(1)
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line + " ")
            if m:
                return m.group(1)
    raise ContainersUnavailable("no bookworm mirror in /etc/apt (set HUBD_DEBIAN_MIRROR)")


def base_key(mirror: str) -> str:
    spec = json.dumps({"suite": SUITE, "variant": VARIANT, "include": INCLUDE, "mirror": mirror,
                       "arch": os.uname().machine, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def base_image(podman: Podman, log=print) -> str:
    """The debootstrapped bookworm base image, made once per key."""
    mirror = _mirror()
    key = base_key(mirror)
    ref = f"{IMAGE_PREFIX}/base:{key}"
    if podman.image_exists(ref):
        log(f"base image {ref}: in podman's store")
        return ref
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{key}.tar"
    if not tarball.exists():
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            run(["debootstrap", f"--variant={VARIANT}", f"--include={','.join(INCLUDE)}",
                 SUITE, rootfs, mirror], timeout=1200)
            partial = tarball.with_suffix(".partial")
            run(["tar", "--numeric-owner", "-C", rootfs, "-cf", partial, "."], timeout=600)
            partial.rename(tarball)
        log(f"base rootfs debootstrapped in {time.monotonic() - t0:.0f}s: {tarball}")
    t0 = time.monotonic()
    podman("import", "--change", 'CMD ["/bin/bash"]', tarball, ref, timeout=600)
    log(f"base image {ref} imported in {time.monotonic() - t0:.0f}s")
    return ref


def prometheus_image(podman: Podman, base: str, log=print) -> str:
    """Debian's prometheus package on the base (tests/deploy/prometheus.Containerfile)."""
    containerfile = DEPLOY_TESTS / "prometheus.Containerfile"
    key = hashlib.sha256((base + containerfile.read_text()).encode()).hexdigest()[:16]
    ref = f"{IMAGE_PREFIX}/prometheus:{key}"
    if podman.image_exists(ref):
        log(f"prometheus image {ref}: in podman's store")
        return ref
    t0 = time.monotonic()
    # apt-get needs the Debian mirror: host networking, no container bridge
    podman("build", "--format", "docker", "--network", "host", "--build-arg", f"BASE={base}",
           "-f", containerfile, "-t", ref, DEPLOY_TESTS, timeout=900)
    log(f"prometheus image {ref} built in {time.monotonic() - t0:.0f}s")
    return ref


def wheelhouse(log=print) -> Path:
    """Wheels for hubd and its dependencies in compose/wheelhouse/, built on the
    host with this interpreter (it must be the base image's Python version).
    The dependencies' wheels are cached under .cache/deploy/, keyed by
    pyproject.toml's dependency list and this Python; hubd's own is built
    every time."""
    import tomllib

    house = COMPOSE_DIR / "wheelhouse"
    for old in house.glob("*.whl"):
        old.unlink()
    t0 = time.monotonic()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    key = hashlib.sha256(json.dumps([project["dependencies"], sys.version_info[:2],
                                     os.uname().machine]).encode()).hexdigest()[:16]
    deps = CACHE / f"wheels-{key}"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check"]
    if not deps.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=CACHE, prefix="wheels-"))
        run([*pip, "-w", partial, *project["dependencies"]], timeout=900)
        partial.rename(deps)
    for wheel in deps.glob("*.whl"):
        shutil.copy2(wheel, house)
    run([*pip, "--no-deps", "-w", house, REPO], timeout=900)
    log(f"wheelhouse ready in {time.monotonic() - t0:.0f}s ({len(list(house.glob('*.whl')))} wheels)")
    return house


def hubd_image(podman: Podman, base: str, log=print) -> str:
    """compose/Dockerfile on the base, offline, from the wheelhouse."""
    base_python = podman("run", "--rm", "--network", "none", base, "python3", "-c",
                         "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    here = "%d.%d" % sys.version_info[:2]
    assert base_python == here, (f"wheels built with Python {here} would not fit the base's "
                                 f"Python {base_python}")
    wheelhouse(log)
    # session images of test runs that were killed before their teardown
    for ref in podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
        m = re.fullmatch(re.escape(f"{IMAGE_PREFIX}/hubd:session-") + r"(\d+)", ref)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            podman("rmi", ref, check=False)
    t0 = time.monotonic()
    podman("build", "--format", "docker", "--network", "none", "--build-arg", f"BASE={base}",
           "-f", COMPOSE_DIR / "Dockerfile", "-t", HUBD_IMAGE, REPO, timeout=900)
    log(f"hubd image {HUBD_IMAGE} built in {time.monotonic() - t0:.0f}s")
    return HUBD_IMAGE


# --------------------------------------------------------------------------- engine

@dataclass
class Engine:
    """`podman system service` on a socket of the test's own: the Docker API
    that docker-compose drives."""
    podman: Podman
    where: Path
    proc: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.where / "podman.sock"

    def __enter__(self) -> "Engine":
        log = open(self.where / "podman-service.log", "w")
        self.proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
            env=self.podman.env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, (self.where / "podman-service.log").read_text()
            if self.socket.exists():
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(str(self.socket))
                    return self
                except OSError:
                    pass
            assert time.monotonic() < deadline, "podman system service did not listen"
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def env(self) -> dict[str, str]:
        return {**self.podman.env, "DOCKER_HOST": f"unix://{self.socket}"}


def _die_with_parent() -> None:
    """The service ends with the test process even when that is killed (no
    fixture teardown then): PR_SET_PDEATHSIG, SIGTERM."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


@dataclass
class ComposeRun:
    """One compose project: compose FILE plus the test's override, normalised by
    `docker-compose config`, with the host side of every published port moved
    to a free port (so a run never collides with anything else listening
    here). Everything it made is removed by its project name."""
    engine: Engine
    file: Path
    override: dict
    where: Path
    project: str = field(default_factory=lambda: f"hubdtest{os.getpid()}")
    ports: dict[tuple[str, int], int] = field(default_factory=dict)  # (service, container port) -> host port
    normalised: Path = field(init=False)
    anonymous: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        override = self.where / "override.yml"
        override.write_text(yaml.safe_dump(self.override, sort_keys=False))
        config = self.compose_raw(["-f", self.file, "-f", override, "config"]).stdout
        document = yaml.safe_load(config)
        for name, service in document["services"].items():
            published = []
            for port in service.get("ports") or []:
                # docker-compose 1.29 writes them as "IP:HOST:CONTAINER/PROTO"
                m = re.fullmatch(r"(?:([\d.]+):)?(\d+):(\d+)(/\w+)?", str(port))
                assert m, f"{name}: a published port of an unexpected form: {port!r}"
                ip, _, target, proto = m.groups()
                host = self.ports.setdefault((name, int(target)), free_port())
                published.append(f"{ip + ':' if ip else ''}{host}:{target}{proto or ''}")
            if published:
                service["ports"] = published
        self.document = document
        self.normalised = self.where / "compose.normalised.yml"
        self.normalised.write_text(yaml.safe_dump(document, sort_keys=False))

    def compose_raw(self, args, timeout=600, check=True) -> subprocess.CompletedProcess:
        return run(["docker-compose", "--no-ansi", "-p", self.project, *args], cwd=self.file.parent,
                   env=self.engine.env, timeout=timeout, check=check)

    def compose(self, *args, timeout=600, check=True) -> subprocess.CompletedProcess:
        return self.compose_raw(["-f", self.normalised, *args], timeout=timeout, check=check)

    def port(self, service: str, target: int) -> int:
        return self.ports[(service, target)]

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def network(self, name: str) -> str:
        return f"{self.project}_{name}"

    def volume_path(self, name: str) -> Path:
        podman = self.engine.podman
        return Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                           f"{self.project}_{name}").stdout.strip())

    def _note_anonymous_volumes(self) -> None:
        podman = self.engine.podman
        label = f"label=com.docker.compose.project={self.project}"
        for ident in podman("ps", "-a", "-q", "--filter", label, check=False).stdout.split():
            for mount in podman.inspect(ident).get("Mounts", []):
                if mount.get("Type") == "volume" and \
                        not mount.get("Name", "").startswith(f"{self.project}_"):
                    self.anonymous.add(mount["Name"])

    def down(self, *args: str) -> None:
        """`down` keeping the named volumes (the journals)."""
        self._note_anonymous_volumes()
        self.compose("down", *args)

    def remove_everything(self) -> list[str]:
        """`down -v`, then anything still labelled with this project; returns
        what had to be removed by hand (should be nothing).

        An anonymous volume (the image's VOLUME, in a service that mounts
        nothing there, such as certs) survives `down -v` against podman's
        API and carries no project label: those are found through the
        containers before `down` and removed after it."""
        podman = self.engine.podman
        label = f"label=com.docker.compose.project={self.project}"
        self._note_anonymous_volumes()
        self.compose("down", "-v", "--remove-orphans", "-t", "20", check=False)
        leftovers = []
        for name in self.anonymous:
            podman("volume", "rm", "-f", name, check=False)
            if podman("volume", "exists", name, check=False).returncode == 0:
                leftovers.append(f"anonymous volume {name}")
        for kind, list_args, rm_args in (
                ("container", ["ps", "-a", "-q", "--filter", label], ["rm", "-f"]),
                ("volume", ["volume", "ls", "-q", "--filter", label], ["volume", "rm", "-f"]),
                ("network", ["network", "ls", "-q", "--filter", label], ["network", "rm", "-f"])):
            for ident in podman(*list_args, check=False).stdout.split():
                leftovers.append(f"{kind} {ident}")
                podman(*rm_args, ident, check=False)
        return leftovers


# --------------------------------------------------------------------------- http

def http_json(url: str, timeout: float = 5.0):
    import ssl

    context = ssl._create_unverified_context() if url.startswith("https") else None
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
        return json.loads(r.read())


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = predicate()
        except (OSError, ValueError) as e:  # not listening yet, reset, half-written answer
            value, last = None, e
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s: {what} (last: {last!r})"
        time.sleep(interval)


class Prometheus:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict]:
        from urllib.parse import urlencode

        answer = http_json(f"{self.base}/api/v1/query?{urlencode({'query': expr})}")
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def alerts(self, name: str) -> list[dict]:
        answer = http_json(f"{self.base}/api/v1/alerts")
        return [a for a in answer["data"]["alerts"] if a["labels"].get("alertname") == name]

    def rule(self, name: str) -> dict:
        answer = http_json(f"{self.base}/api/v1/rules")
        for group in answer["data"]["groups"]:
            for rule in group["rules"]:
                if rule.get("name") == name:
                    return rule
        raise AssertionError(f"Prometheus has no rule {name}")


# --------------------------------------------------------------------------- scaling

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# An age compared with a number of seconds: the threshold is a duration too.
_AGE_THRESHOLD = re.compile(
    r"((?:_oldest_pending_seconds\)?|time\(\) - \w+_timestamp_seconds)\s*>\s*)(\d+(?:\.\d+)?)")


def seconds(duration: str) -> float:
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNIT[u] for n, u in parts)


def scaled_rules(document: dict, scale: float) -> dict:
    """The alert rules with every `for:` and every age threshold (seconds an
    age is compared with) multiplied by SCALE, whole seconds, at least 1 s."""
    out = json.loads(json.dumps(document))

    def scaled(value: float) -> int:
        return max(1, round(value * scale))

    for group in out["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{scaled(seconds(rule['for']))}s"
            rule["expr"] = _AGE_THRESHOLD.sub(
                lambda m: m.group(1) + str(scaled(float(m.group(2)))), rule["expr"])
    return out


def fast_prometheus_config(document: dict, interval: str = "1s") -> dict:
    out = json.loads(json.dumps(document))
    out.setdefault("global", {})
    out["global"].update(scrape_interval=interval, evaluation_interval=interval,
                         scrape_timeout=interval)
    for job in out.get("scrape_configs", []):
        for key in ("scrape_interval", "scrape_timeout"):
            job.pop(key, None)
    return out


def file_modes(root: Path) -> dict[str, tuple[int, int, int]]:
    """relative path -> (mode bits, uid, gid) for everything under root."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode & 0o7777, st.st_uid, st.st_gid)
    return out

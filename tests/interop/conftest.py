"""Fixtures for the interop suite: the same tests run against the reference hub and hubd.

``hub`` / ``secured_hub`` are parametrized over ``["reference", "hubd"]`` and
start a fresh hub process (fresh journal in tmp_path, hub_id ``iop-east``) per
test. The reference hub (synapse-channel 0.99.38, AGPL) runs from its own
cached virtual environment as a black box; it is started with
``--no-durable-ingress-quota`` (its default shared 100-chats/min bucket on an
open hub is a reference policy, not part of the wire contract under test).

If the reference virtual environment cannot be built (no route to PyPI), the
``reference`` parameter is skipped, and so is every test that needs the
reference *client* (fixture ``ref``); ``hubd`` tests that only use raw probes
do not depend on it. On CI (tests/support/prereq.py) that is a failure instead.
"""

from __future__ import annotations

import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:  # tests.support.* are imported as a package from the repo root
    sys.path.insert(0, _REPO)

from tests.support.procs import (  # noqa: E402
    HubProcess, hubd_process, reference_hub_process, reference_venv)
from tests.support.prereq import missing  # noqa: E402
from tests.support.refclient import RefClient  # noqa: E402

HUB_ID = "iop-east"
TOKEN = "s3cret-token"
KINDS = ["reference", "hubd"]


@dataclass
class Hub:
    """A running hub under test."""

    kind: str
    proc: HubProcess
    token: str | None = None
    hub_id: str = HUB_ID

    @property
    def url(self) -> str:
        return self.proc.url

    def get_json(self, path: str, **kw: Any) -> Any:
        return self.proc.get_json(path, **kw)

    def log(self) -> str:
        return self.proc.log()


@pytest.fixture(scope="session")
def reference_venv_status() -> tuple[Path | None, str]:
    """Build (once per session) the reference venv; (path, "") or (None, why)."""
    try:
        return reference_venv(), ""
    except Exception as exc:  # no network, pip failure, ...
        return None, f"reference client venv unavailable ({type(exc).__name__}: {exc})"


def _need_reference(status: tuple[Path | None, str]) -> Path:
    venv, why = status
    if venv is None:
        missing(why)
    return venv


def _wait_healthy(proc: HubProcess, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if not proc.alive():
            break
        try:
            proc.get_json("/health", timeout=2.0)
            return
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = exc
            time.sleep(0.05)
    raise RuntimeError(f"hub not healthy (alive={proc.alive()}, last={last!r}); log:\n{proc.log()[-3000:]}")


def _start(kind: str, workdir: Path, token: str | None, request: pytest.FixtureRequest) -> Hub:
    extra = ["--token", token] if token else []
    if kind == "reference":
        _need_reference(request.getfixturevalue("reference_venv_status"))
        proc = reference_hub_process(workdir, "--no-durable-ingress-quota", *extra, hub_id=HUB_ID)
    else:
        proc = hubd_process(workdir, *extra, hub_id=HUB_ID)
    try:
        proc.start()
        _wait_healthy(proc)
    except Exception as exc:
        proc.stop()
        pytest.fail(f"{kind} hub did not start: {exc}\n--- log ---\n{proc.log()[-3000:]}",
                    pytrace=False)
    return Hub(kind, proc, token)


# The reference client's own scenarios (tests that drive it through `ref`) also
# run against hubd with a shared --token: the one-secret hub of docs/identity.md
# must serve them unchanged.
SHARED_TOKEN_KIND = "hubd-shared-token"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "hub" in metafunc.fixturenames:
        kinds = list(KINDS)
        if "ref" in metafunc.fixturenames and metafunc.module.__name__.endswith(
                "test_client_interop"):
            kinds.append(SHARED_TOKEN_KIND)
        metafunc.parametrize("hub", kinds, indirect=True)


@pytest.fixture
def hub(request: pytest.FixtureRequest, tmp_path: Path):
    """A fresh open hub (durable journal, hub_id iop-east), or for the
    reference client's scenarios also hubd with a shared --token."""
    kind = request.param
    if kind == SHARED_TOKEN_KIND:
        h = _start("hubd", tmp_path / "hubd-token-hub", TOKEN, request)
    else:
        h = _start(kind, tmp_path / f"{kind}-hub", None, request)
    yield h
    h.proc.stop()


@pytest.fixture(params=KINDS)
def secured_hub(request: pytest.FixtureRequest, tmp_path: Path):
    """A fresh hub that requires ``--token s3cret-token`` on the first frame."""
    h = _start(request.param, tmp_path / f"{request.param}-secured", TOKEN, request)
    yield h
    h.proc.stop()


@pytest.fixture
def make_ref(reference_venv_status, tmp_path: Path) -> Callable[..., RefClient]:
    """Factory: a RefClient for a hub; all its processes stop at teardown.

    All clients made in one test share one home (the reference client signs
    registrations with a machine key kept there, and the reference hub pins
    names to keys on first use).
    """
    _need_reference(reference_venv_status)
    made: list[RefClient] = []

    def make(h: Hub, token: str | None = None) -> RefClient:
        c = RefClient(h.url, tmp_path / "client-home", token=token)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()


@pytest.fixture
def ref(hub: Hub, make_ref) -> RefClient:
    """The reference client pointed at ``hub`` (with its token, if it has one)."""
    return make_ref(hub, token=hub.token)

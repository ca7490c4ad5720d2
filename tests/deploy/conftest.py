"""Session setup for the container tests: images and the podman engine, once."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from tests.support.containers import (Engine, Podman, base_image, hubd_image, machine_lock,
                                      prometheus_image, require_containers)


@dataclass
class Deployment:
    podman: Podman
    engine: Engine
    base: str
    hubd: str
    prometheus: str


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    require_containers()
    where = tmp_path_factory.mktemp("podman")
    podman = Podman.configured(where)
    t0 = time.monotonic()
    with machine_lock():  # two cold runs would both debootstrap
        base = base_image(podman)
        prometheus = prometheus_image(podman, base)
    hubd = hubd_image(podman, base)
    print(f"images ready in {time.monotonic() - t0:.0f}s")
    try:
        with Engine(podman, where) as engine:
            yield Deployment(podman, engine, base, hubd, prometheus)
    finally:
        podman("rmi", hubd, check=False)

"""HubServer: a Hub behind its aiohttp listener, started and stopped as one.

Used by the `hubd` command and by tests that run a real hub in-process.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from aiohttp import web

from hubd import __version__
from hubd.composition import build_hub
from hubd.config import HubConfig
from hubd.http.app import make_app
from hubd.http.refusals import ServerLog
from hubd.hub import JournalRefused, _Stop
from hubd.state.principals import PrincipalError

log = structlog.get_logger("hubd")


class StartupError(RuntimeError):
    pass


class HubServer:
    def __init__(self, config: HubConfig):
        self.config = config
        self.hub = build_hub(config)
        self.ssl_context = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._run: asyncio.Task | None = None
        self.port: int | None = None
        self._replayed_seq = 0

    @property
    def url(self) -> str:
        scheme = "wss" if self.ssl_context is not None else "ws"
        return f"{scheme}://{self.config.host}:{self.port}/"

    async def start(self) -> None:
        config = self.config
        try:
            self.hub.bind_plugins()
            self.ssl_context = self.hub.listener_ssl()
        except ValueError as exc:  # PolicyError, FederationConfigError, TlsConfigError
            raise StartupError(str(exc)) from exc
        try:
            await self.hub.open()
        except (JournalRefused, PrincipalError) as exc:  # PrincipalError: --principals FILE
            await self.hub.shutdown()
            raise StartupError(str(exc)) from exc
        self._runner = web.AppRunner(make_app(self.hub), access_log=None, handle_signals=False,
                                     shutdown_timeout=2.0,
                                     logger=ServerLog(self.hub.metrics, time.monotonic))
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, config.host, config.port, backlog=1024,
                                 ssl_context=self.ssl_context)
        try:
            await self._site.start()
        except OSError as exc:
            await self._runner.cleanup()
            await self.hub.shutdown()
            raise StartupError(f"cannot listen on {config.host}:{config.port}: "
                               f"{exc.strerror}") from exc
        self.port = self._runner.addresses[0][1]
        identity = self.hub.identity.summary()
        # what a client must bring: a token (agent_auth: shared-token, or
        # principals, or none on an open hub), and whether the listener is TLS
        log.info("listening", url=self.url, hub_id=self.hub.hub_id, journal=str(config.db),
                 agent_auth=identity["mode"], tokenless_agents=identity["tokenless"],
                 tls=self.ssl_context is not None)
        from hubd.http.host_trust import is_loopback_bind

        if not is_loopback_bind(config.host) and not config.advertised_hosts:
            log.warning("non-loopback bind without --advertised-host: the Host header is not "
                        "checked (DNS-rebinding guard off); name the authorities clients use "
                        "with --advertised-host HOST[:PORT]", host=config.host)
        await self.hub.replay()
        try:
            await self.hub.open_doors()
        except (ValueError, OSError) as exc:  # the broker's socket or token file
            await self.hub.close_doors()
            await self._site.stop()
            await self._runner.cleanup()
            await self.hub.shutdown()
            raise StartupError(str(exc)) from exc
        log.info("hubd started", version=__version__, hub_id=self.hub.hub_id,
                 journal=str(config.db), doors=self.doors(),
                 journal_seq=self.hub.writer.committed_seq)
        self._replayed_seq = self.hub.writer.committed_seq
        self._run = asyncio.get_running_loop().create_task(self._supervise())
        while not self.hub.ready and not self._run.done():
            await asyncio.sleep(0.001)

    def doors(self) -> dict:
        """Where each door listens (the startup banner's)."""
        config = self.config
        doors = {"websocket": self.url}
        if config.redsyn:
            http = self.url.replace("ws", "http", 1)
            doors["redsyn"] = f"{http}redsyn/v1"
        if config.broker is not None:
            doors["broker"] = str(config.broker.socket_path)
        return doors

    async def _supervise(self) -> int:
        code = 0
        try:
            await self.hub.run()
        except* _Stop:
            log.info("stopping")
        except* Exception as group:
            for exc in group.exceptions:
                log.error("actor failed; stopping the hub", error=repr(exc), exc_info=exc)
            code = 1
        return code

    async def wait(self) -> int:
        """Serve until the hub stops; then close everything. The exit code."""
        code = 1
        try:
            code = await self._run
        finally:
            await self._close()
            hub = self.hub
            log.info("hubd stopped", hub_id=hub.hub_id, exit_code=code,
                     uptime_seconds=round(time.time() - hub.started, 3),
                     journal_seq=hub.writer.committed_seq,
                     events_written=hub.writer.committed_seq - self._replayed_seq)
        return code

    async def stop(self) -> int:
        self.hub.stop()
        return await self.wait()

    async def _close(self) -> None:
        await self.hub.close_doors()
        if self._site is not None:
            await self._site.stop()
        await self.hub.shutdown()
        if self._runner is not None:
            await self._runner.cleanup()

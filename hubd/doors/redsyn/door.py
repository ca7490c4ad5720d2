"""The REDSYN HTTP door: /redsyn/v1 on the hub's own listener.

This module translates HTTP to commands and answers back, and nothing else.
Each call becomes one command of the shared vocabulary on the Router's
bounded inbox (hubd/core/commands.py), carrying the calling node and a
future: PUT an agent is Register, POST a message is Send, GET the inbox is
Take (one look of a long poll), POST an ack is Ack, the rest are Requests
(`redsyn.*`). What a call means is decided inside the Router
(hubd/handlers/redsyn/, by the pure rules of hubd/state/redsyn/); the future
gets the answer once its events are committed (an accepted message is
durable before its 2xx), a RedsynError, or CommitFailed (503).

The door is one endpoint of the hub: the Router's wake-ups for an agent's
box (door-neutral messages, after the commit) wake the long polls waiting on
that agent here, and the webhook pusher. The polls waiting, and how many each
node holds open, are the door's own bookkeeping; it reads no Router state.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict

import structlog
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from hubd.core.commands import Ack, Opened, Register, Request, Send, Take
from hubd.core.endpoints import Listener
from hubd.core.message import Message
from hubd.core.refusals import CommandRefused, CommitFailed, MutationsRefused
from hubd.http.guard import guard
from hubd.state import redsyn as mb
from hubd.state.events import UnstorableEvent
from hubd.wire.redsyn import envelope as wire
from hubd.wire.redsyn.envelope import API_VERSION, DOOR, KNOWN_VERSIONS, Forbidden, RedsynError
from hubd.wire.redsyn.json_text import decode_body
from hubd.wire.redsyn.webhook import signature_header

from .nodes import node_of
from .webhook_socket import guarded_socket_factory

log = structlog.get_logger("hubd.redsyn")

PREFIX = "/redsyn/v1"
VERSION_HEADER = "Redsyn-Version"
PRINCIPAL = web.RequestKey("hubd.redsyn.principal", str)  # whose token the request carried
MAX_WAIT = 60.0
MAX_POLLS_PER_NODE = 16
# A waiting poll looks again when the earliest lease or back-off in its box
# lapses (a little after, so the lapse is past), and at least every
# timing.redsyn_recheck.
LAPSE_SLACK_SECONDS = 0.02
WEBHOOK_NODE = "hub:webhook"
WEBHOOK_PARALLEL = 32


def _journal_failed() -> RedsynError:
    return RedsynError(503, "the hub could not journal this; nothing was changed, retry "
                            "with the same id")


class RedsynDoor(Listener):
    def __init__(self, hub):
        super().__init__()
        self.hub = hub
        self.allow_loopback_webhooks: bool = hub.config.redsyn_allow_loopback_webhooks
        self.timing = hub.config.timing
        self._waiters: dict[str, asyncio.Event] = {}
        self._polls: dict[str, int] = defaultdict(int)
        self._webhook_wake = asyncio.Event()
        self._closing = False
        self._calls: set[asyncio.Future] = set()  # answers the Router still owes

    # -- lifetime

    async def open(self) -> None:
        """After the replay: the door's endpoint opens (the Router learns where
        this door's wake-ups go)."""
        self.hub.endpoints.add(self)
        await self.hub.router.inbox.put(Opened(self.id, "redsyn-door", "local", door=DOOR))

    def start(self, group: asyncio.TaskGroup) -> None:
        group.create_task(self._webhooks(), name="redsyn-webhooks")

    async def shutting_down(self) -> None:
        """The hub is stopping (its Router already has): every waiting poll is
        answered now with no items, as if its wait had run out, and a request
        the Router did not answer gets 503; the agent tries again."""
        self._closing = True
        for waiter in self._waiters.values():
            waiter.set()
        for future in self._calls:
            if not future.done():
                future.set_exception(RedsynError(503, "the hub is shutting down; retry"))

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", PREFIX + "/{tail:.*}", self.handle)

    # -- the Router side: commands out, wake-ups in

    async def ask(self, command) -> object:
        """Put one command on the Router's inbox; its answer, or the RedsynError
        that says why not."""
        self._calls.add(command.reply)
        try:
            await self.hub.router.inbox.put(command)
            return await command.reply
        except RedsynError:
            raise
        except CommitFailed:
            raise _journal_failed() from None
        except MutationsRefused as refused:
            raise RedsynError(503, refused.message) from None
        except UnstorableEvent as refused:
            raise RedsynError(400, f"This cannot be stored in the hub's journal ({refused}); "
                                   "nothing was changed.") from None
        except CommandRefused as refused:
            raise RedsynError(503, refused.text) from None
        except Exception:  # the Router logged it and kept nothing of the call
            raise RedsynError(500, "internal error") from None
        finally:
            self._calls.discard(command.reply)

    def _future(self) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    def request(self, verb: str, node: mb.Node, **fields) -> Request:
        return Request(self.id, verb, {"node": node, **fields}, self._future())

    # its endpoint (Listener)
    def deliver(self, message: Message) -> None:
        """A wake-up (after the commit): mail for these agents' boxes."""
        frame = message.frame
        for agent in frame["agents"]:
            waiter = self._waiters.pop(agent, None)
            if waiter is not None:
                waiter.set()
        if frame["webhook"]:
            self._webhook_wake.set()

    # -- HTTP

    async def handle(self, request: web.Request) -> web.StreamResponse:
        asked = request.headers.get(VERSION_HEADER)
        version = asked or API_VERSION
        try:
            refused = guard(self.hub, request)  # DNS rebinding, browsers: as every path
            if refused is not None:
                raise RedsynError(refused.status, refused.text.strip())
            if version not in KNOWN_VERSIONS:
                raise RedsynError(400, f"unknown {VERSION_HEADER} {version!r}; known: "
                                       f"{', '.join(KNOWN_VERSIONS)}", known=list(KNOWN_VERSIONS))
            if not self.hub.ready:
                raise RedsynError(503, "the hub is starting (journal replay)")
            node = self._authenticate(request)
            if asked is None:  # the date the caller's organization was pinned to
                version = self._pinned_version(node)
            response = await self._route(request, node)
        except RedsynError as exc:
            if isinstance(exc, Forbidden):
                self._denied(request, exc.error, request.get(PRINCIPAL))
            response = web.json_response(exc.document(), status=exc.status)
        response.headers[VERSION_HEADER] = version if version in KNOWN_VERSIONS else API_VERSION
        counts = self.hub.metrics.redsyn_requests
        counts[response.status] = counts.get(response.status, 0) + 1
        return response

    def _pinned_version(self, node: mb.Node) -> str:
        org = self.hub.identity.table.orgs.get(node.person.split("/")[0])
        return org["redsyn_version"] if org is not None else API_VERSION

    def _authenticate(self, request: web.Request) -> mb.Node:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            self._denied(request, "no bearer token")
            raise RedsynError(401, "Authorization: Bearer <token> is required "
                                   "(hubd redsyn login makes one)")
        credential = self.hub.identity.table.authenticate(token.strip())
        if credential is None:
            self._denied(request, "unknown or revoked token")
            raise RedsynError(401, "unknown or revoked token")
        request[PRINCIPAL] = credential.principal.name  # for a later denial's line
        return node_of(credential)

    def _denied(self, request: web.Request, reason: str, principal: str | None = None) -> None:
        self.hub.auth_denials.denied(DOOR, reason, peer=request.remote, principal=principal,
                                     seat=f"{request.method} {request.path}")

    async def _json(self, request: web.Request):
        if request.content_length is not None and \
                request.content_length > wire.MAX_REQUEST_BYTES:
            raise RedsynError(413, f"the request is larger than {wire.MAX_REQUEST_BYTES} bytes")
        chunks, size = [], 0
        while True:
            try:
                chunk = await request.content.read(65536)
            except ConnectionError:
                # The client went away mid-body: nobody reads this answer (aiohttp
                # drops it), but the request is refused, not a traceback.
                raise RedsynError(400, "the client closed the connection before its body "
                                       "arrived") from None
            if not chunk:
                break
            size += len(chunk)
            if size > wire.MAX_REQUEST_BYTES:
                raise RedsynError(413, f"the request is larger than "
                                       f"{wire.MAX_REQUEST_BYTES} bytes")
            chunks.append(chunk)
        data = b"".join(chunks)
        return decode_body(data), len(data)

    async def _route(self, request: web.Request, node: mb.Node) -> web.Response:
        path = request.match_info["tail"]
        method = request.method
        parts = path.split("/")
        if parts[0] == "agents" and len(parts) >= 5:
            address = "/".join(parts[1:5])
            if len(parts) == 6 and parts[5] == "key" and method == "GET":
                return web.json_response(await self.ask(self.request(
                    "redsyn.agent_key", node, address=address)))
            if len(parts) == 5 and method == "PUT":
                doc, _ = await self._json(request)
                return web.json_response(await self.ask(Register(
                    self.id, address, {"node": node, "doc": doc}, self._future())))
            if len(parts) == 5 and method == "GET":
                return web.json_response(await self.ask(self.request(
                    "redsyn.agent", node, address=address)))
        elif path == "nodes/key" and method == "PUT":
            doc, _ = await self._json(request)
            return web.json_response(await self.ask(self.request("redsyn.key", node, doc=doc)))
        elif path == "messages" and method == "POST":
            return await self._post(request, node)
        elif parts[0] == "messages" and len(parts) == 3 and parts[2] == "files" \
                and method == "GET":
            data = await self.ask(self.request("redsyn.files", node, id=parts[1]))
            return web.Response(body=data, content_type="application/zip")
        elif parts[0] == "messages" and len(parts) == 2 and method == "DELETE":
            return web.json_response(await self.ask(self.request("redsyn.cancel", node,
                                                                 id=parts[1])))
        elif parts[0] == "inbox" and len(parts) == 5 and method == "GET":
            return await self._take(request, node, "/".join(parts[1:5]))
        elif parts[0] == "inbox" and len(parts) == 6 and parts[5] == "ack" and method == "POST":
            doc, _ = await self._json(request)
            agent = mb.own_agent(node, "/".join(parts[1:5])).agent_address
            return web.json_response(await self.ask(Ack(
                self.id, agent, mb.ack_ids(doc), {"node": node}, self._future())))
        elif parts[0] == "topics" and len(parts) == 5 and \
                parts[4] in ("subscribe", "unsubscribe") and method == "POST":
            doc, _ = await self._json(request)
            if isinstance(doc, dict):
                doc = {**doc, "subscribe": parts[4] == "subscribe"}
            topic = "topic:" + "/".join(parts[1:4])
            return web.json_response(await self.ask(self.request(
                "redsyn.subscribe", node, topic=topic, doc=doc)))
        elif parts[0] in ("links", "orgs"):
            return await self._links(request, node, parts)
        raise RedsynError(404, f"no endpoint {method} {PREFIX}/{path}")

    async def _links(self, request, node, parts) -> web.Response:
        """Links between organizations, and an organization's record."""
        method = request.method
        if parts == ["links"] and method == "POST":
            doc, _ = await self._json(request)
            return web.json_response(await self.ask(self.request(
                "redsyn.link_propose", node, doc=doc, new_id="lnk-" + uuid.uuid4().hex)),
                status=201)
        if parts == ["links"] and method == "GET":
            return web.json_response(await self.ask(self.request("redsyn.links", node)))
        if parts[0] == "links" and len(parts) == 2 and method == "GET":
            return web.json_response(await self.ask(self.request("redsyn.link", node,
                                                                 id=parts[1])))
        if parts[0] == "links" and len(parts) == 3 and (
                (method == "POST" and parts[2] in ("accept", "suspend", "resume", "end"))
                or (method == "PUT" and parts[2] == "terms")):
            doc, _ = await self._json(request)
            return web.json_response(await self.ask(self.request(
                "redsyn.link_change", node, id=parts[1], action=parts[2], doc=doc)))
        if parts[0] == "orgs" and len(parts) == 2 and method == "GET":
            return web.json_response(await self.ask(self.request("redsyn.org", node,
                                                                 org=parts[1])))
        raise RedsynError(404, f"no endpoint {method} {PREFIX}/{'/'.join(parts)}")

    async def _post(self, request, node) -> web.Response:
        doc, size = await self._json(request)
        incoming = wire.validate(doc, node.person, size)
        answer = await self.ask(Send(
            self.id, incoming.sender.agent_address,
            str(incoming.to) if incoming.to is not None else None, incoming.fields["body"],
            {"node": node, "incoming": incoming, "new_id": "m" + uuid.uuid4().hex,
             "client": request.remote},
            self._future()))
        return web.json_response(answer, status=200 if answer["duplicate"] else 201)

    async def _take(self, request, node, address) -> web.Response:
        query = request.query
        agent = mb.own_agent(node, address).agent_address
        try:
            wait = float(query.get("wait", "0"))
            limit = int(query.get("limit", str(mb.MAX_ITEMS_PER_TAKE)))
        except ValueError:
            raise RedsynError(400, "wait is seconds and limit a whole number") from None
        if not 0 <= wait <= MAX_WAIT:
            raise RedsynError(400, f"wait must be 0 to {MAX_WAIT:g} seconds")
        if not 1 <= limit <= mb.MAX_ITEMS_PER_TAKE:
            raise RedsynError(400, f"limit must be 1 to {mb.MAX_ITEMS_PER_TAKE}")
        lease = mb.check_lease(query.get("lease"), self.timing.redsyn_min_lease)
        if self._polls[node.id] >= MAX_POLLS_PER_NODE:
            self.hub.metrics.redsyn_polls_refused += 1
            raise RedsynError(429, f"this node already holds {MAX_POLLS_PER_NODE} open polls")
        self._polls[node.id] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            while True:
                waiter = self._waiters.get(agent)
                if waiter is None:
                    waiter = self._waiters[agent] = asyncio.Event()
                items, ready_at = await self.ask(Take(self.id, agent, limit, lease,
                                                      {"node": node}, self._future()))
                remaining = deadline - loop.time()
                if items or remaining <= 0:
                    return web.json_response({"items": items})
                look_again = min(remaining, self.timing.redsyn_recheck)
                if ready_at is not None:
                    look_again = min(look_again,
                                     max(ready_at - time.time(), 0.0) + LAPSE_SLACK_SECONDS)
                try:
                    await asyncio.wait_for(waiter.wait(), look_again)
                except TimeoutError:
                    pass
                if self._closing:  # the Router has stopped: nothing more to take
                    return web.json_response({"items": []})
        finally:
            self._polls[node.id] -= 1
            if not self._polls[node.id]:
                del self._polls[node.id]

    # -- webhooks

    async def _webhooks(self) -> None:
        """Push to agents that announced a webhook: one delivery in flight per
        agent, at most WEBHOOK_PARALLEL agents at once."""
        busy: set[str] = set()
        slots = asyncio.Semaphore(WEBHOOK_PARALLEL)
        connector = TCPConnector(
            socket_factory=guarded_socket_factory(self.allow_loopback_webhooks))
        timing = self.timing
        async with ClientSession(timeout=ClientTimeout(total=timing.redsyn_webhook_timeout),
                                 connector=connector) as http:
            while True:
                try:
                    await asyncio.wait_for(self._webhook_wake.wait(), timing.redsyn_webhook_poll)
                except TimeoutError:
                    pass
                self._webhook_wake.clear()
                if not self.hub.ready:
                    continue
                try:
                    due = await self.ask(Request(self.id, "redsyn.webhooks",
                                                 {"busy": frozenset(busy)}, self._future()))
                except RedsynError as exc:
                    log.warning("webhook round refused", error=exc.error)
                    continue
                for agent, hook in due:
                    busy.add(agent)
                    task = asyncio.get_running_loop().create_task(
                        self._push(http, slots, agent, hook, busy))
                    self.hub.track(task)

    async def _push(self, http, slots, agent, hook, busy) -> None:
        """One round for one agent: take what is ready and post it. A round
        that found nothing ready (a back-off or a lease pending) wakes the
        loop again when the earliest of them lapses, not at once: an agent
        whose deliveries all wait must not keep the loop turning."""
        person = agent.rsplit("/", 1)[0]
        node = mb.Node(WEBHOOK_NODE, person)
        fields = {"node": node, "webhook": True}
        items, ready_at = [], None
        self.hub.metrics.redsyn_webhook_rounds += 1
        try:
            async with slots:
                items, ready_at = await self.ask(Take(self.id, agent, 16,
                                                      self.timing.redsyn_webhook_lease, fields,
                                                      self._future()))
                for item in items:
                    body = json.dumps(item).encode()
                    t = int(time.time())
                    headers = {"Content-Type": "application/json",
                               "Redsyn-Signature": signature_header(hook["secret"], t, body),
                               VERSION_HEADER: API_VERSION, "Redsyn-Delivery": item["id"]}
                    try:
                        # a redirect is an answer, not 2xx: never followed (it
                        # could point anywhere, the hub's own network included)
                        async with http.post(hook["url"], data=body, headers=headers,
                                             allow_redirects=False) as answer:
                            ok = 200 <= answer.status < 300
                            outcome = str(answer.status)
                    except (OSError, asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001
                        # Any failure to get a 2xx is a failed attempt (the seed:
                        # "any other answer, or none"); it is logged and retried.
                        ok, outcome = False, f"{type(exc).__name__}: {exc}"[:300]
                    attempts = self.hub.metrics.redsyn_webhook_attempts
                    attempts[ok] = attempts.get(ok, 0) + 1
                    if ok:
                        await self.ask(Ack(self.id, agent, [item["id"]], fields, self._future()))
                    else:
                        log.info("webhook delivery failed", agent=agent, id=item["id"],
                                 outcome=outcome)
                        await self.ask(Request(self.id, "redsyn.webhook_failed",
                                               {"agent": agent, "id": item["id"]},
                                               self._future()))
        except RedsynError as exc:
            log.warning("webhook round refused", agent=agent, error=exc.error)
        finally:
            busy.discard(agent)
        if items:
            self._webhook_wake.set()  # more may be ready now
        elif ready_at is not None:
            asyncio.get_running_loop().call_later(
                max(0.0, ready_at - time.time()) + LAPSE_SLACK_SECONDS, self._webhook_wake.set)

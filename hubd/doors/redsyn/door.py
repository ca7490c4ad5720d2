"""The REDSYN HTTP door: /redsyn/v1 on the hub's own listener.

This module translates HTTP to commands and answers back, and nothing else:
what a call means is decided by hubd/state/redsyn.py inside the Router (the
only owner of the state), and what an envelope may look like by
hubd/wire/redsyn/. Each call becomes one command on the Router's bounded
inbox carrying a future; the Router journals the decision's events, and the
future is resolved only after the commit (an accepted message is durable
before its 2xx), or with a 503 if the commit failed.

Live, door-local bookkeeping (not journaled, rebuilt by agents coming back):
presence (each take is a heartbeat), the long polls waiting per agent, and
how many polls each node holds open.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict

import structlog
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from hubd.actors.router import REFUSALS
from hubd.core.endpoints import next_endpoint_id
from hubd.handlers.chat import route_chat
from hubd.state.events import UnstorableEvent
from hubd.http.guard import guard
from hubd.wire.targets import parse_remote
from hubd.state import redsyn as mb
from hubd.wire.redsyn import envelope as wire
from hubd.wire.redsyn.envelope import API_VERSION, KNOWN_VERSIONS, RedsynError
from hubd.wire.redsyn.json_text import decode_body
from hubd.wire.redsyn.webhook import signature_header

from .nodes import node_of
from .webhook_socket import guarded_socket_factory

log = structlog.get_logger("hubd.redsyn")

PREFIX = "/redsyn/v1"
VERSION_HEADER = "Redsyn-Version"
MAX_WAIT = 60.0
MAX_POLLS_PER_NODE = 16
# A waiting poll looks again when the earliest lease or back-off in its box
# lapses (a little after, so the lapse is past), and at least every
# timing.redsyn_recheck.
LAPSE_SLACK_SECONDS = 0.02
WEBHOOK_NODE = "hub:webhook"
WEBHOOK_PARALLEL = 32


class _Replies:
    """The door's one endpoint. A call whose events fail to commit gets the
    JournalWriter's failure delivery here (its future), and answers 503."""

    def __init__(self):
        self.id = next_endpoint_id()

    def deliver(self, future) -> None:
        if not future.done():
            future.set_exception(_journal_failed())

    def close(self, code: int, reason: str) -> None:
        pass

    def write_stalled_for(self, now: float) -> float:
        return 0.0

    def abort(self) -> None:
        pass


def _journal_failed() -> RedsynError:
    return RedsynError(503, "the hub could not journal this; nothing was changed, retry "
                            "with the same id")


class RedsynDoor:
    def __init__(self, hub):
        self.hub = hub
        config = hub.config
        self.limits: mb.Limits = config.redsyn_limits
        self.allow_loopback_webhooks: bool = config.redsyn_allow_loopback_webhooks
        self.timing = config.timing
        self.presence: dict[str, tuple[float, str]] = {}  # agent -> (last seen, node)
        self.webhook_seen: dict[str, float] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._polls: dict[str, int] = defaultdict(int)
        self._webhook_wake = asyncio.Event()
        self._replies = _Replies()
        self._closing = False
        self._calls: set[asyncio.Future] = set()  # answers the Router still owes

    # -- lifetime

    async def open(self) -> None:
        self.hub.endpoints.add(self._replies)

    def start(self, group: asyncio.TaskGroup) -> None:
        group.create_task(self._webhooks(), name="redsyn-webhooks")

    async def close(self) -> None:
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

    # -- the Router side

    @property
    def state(self) -> mb.RedsynState:
        return self.hub.router.state.extensions["redsyn"]

    async def call(self, decide) -> object:
        """Run decide(state, now) -> Decision inside the Router; the answer
        once its events are committed."""
        router = self.hub.router
        future = asyncio.get_running_loop().create_future()

        def command(router):
            if router.mutations_refused():
                future.set_exception(RedsynError(503, f"the hub cannot write its journal now "
                                                      f"({router.refusing_mutations})"))
                return
            try:
                decision = decide(router.state.extensions["redsyn"], router.now)
            except RedsynError as exc:
                future.set_exception(exc)
                return
            except BaseException as exc:
                future.set_exception(RedsynError(500, "internal error"))
                raise exc
            if not decision.events:
                future.set_result(decision.answer)
                return
            remote_hubs = router.installed.remote_hubs
            for chat in decision.chats:
                remote = parse_remote(chat["frame"]["target"])
                if remote is not None:
                    refused = remote_hubs.refusal(router, remote.hub) if remote_hubs else \
                        f"hub '{remote.hub}' is not a message peer of this hub"
                    if refused is not None:
                        future.set_exception(RedsynError(503, refused))
                        return
            woken = set()
            try:
                for kind, payload in decision.events:
                    router.event(kind, payload)
                    if kind == mb.MESSAGE:
                        woken.update(d["agent"] for d in payload["deliveries"])
                for chat in decision.chats:
                    # the WebSocket side: journaled and sent like any chat from this seat,
                    # or forwarded to the peer hub that owns the address's namespace
                    remote = parse_remote(chat["frame"]["target"])
                    if remote is None:
                        route_chat(router, chat["frame"], chat["sender"], {"redsyn": 1})
                    else:
                        remote_hubs.forward_from(router, chat["sender"], chat["frame"], remote,
                                                 False)
            except REFUSALS as refused:  # nothing of this call is kept
                text = router.refuse_command(refused)
                unstorable = isinstance(refused, UnstorableEvent)
                future.set_exception(RedsynError(400 if unstorable else 503, text))
                return
            except BaseException:
                future.set_exception(RedsynError(500, "internal error"))
                raise  # the Router logs it and drops what the call did
            router.out.failure.append((self._replies.id, lambda: future, "redsyn"))

            def released():
                if not future.done():
                    future.set_result(decision.answer)
                self.wake(woken)
            router.after_release(released)

        self._calls.add(future)
        try:
            await router.inbox.put(command)
            return await future
        finally:
            self._calls.discard(future)

    def wake(self, agents) -> None:
        webhook = False
        for agent in agents:
            waiter = self._waiters.pop(agent, None)
            if waiter is not None:
                waiter.set()
            if not webhook:
                record = self.state.agents.get(agent)
                webhook = record is not None and record.webhook is not None
        if webhook:
            self._webhook_wake.set()

    def _seat_of(self, address: str, state: mb.RedsynState) -> str | None:
        """The seat a WebSocket agent holds for an address (inside the Router):
        a WebSocket agent online under that name; else one seen on this hub
        before, unless the address is a REDSYN agent (then its inbox)."""
        router = self.hub.router
        remote_hubs = self.hub.installed.remote_hubs
        seat = remote_hubs.seat_on_owner(address) if remote_hubs is not None else None
        if seat is not None:
            return seat  # its namespace belongs to a peer hub
        if address in router.presence.by_name:
            return address
        if address in router.state.agents.last_seen and not mb.known_here(state, address):
            return address
        return None

    def committed(self) -> None:
        """After each journal commit: wake the polls of agents a chat reached."""
        state = self.hub.router.state.extensions["redsyn"] if self.hub.router else None
        if state is not None and state.woken:
            woken, state.woken = state.woken, []
            self.wake(woken)

    # -- HTTP

    async def handle(self, request: web.Request) -> web.StreamResponse:
        version = request.headers.get(VERSION_HEADER, API_VERSION)
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
            response = await self._route(request, node)
        except RedsynError as exc:
            response = web.json_response(exc.document(), status=exc.status)
        response.headers[VERSION_HEADER] = version if version in KNOWN_VERSIONS else API_VERSION
        counts = self.hub.metrics.redsyn_requests
        counts[response.status] = counts.get(response.status, 0) + 1
        return response

    def _authenticate(self, request: web.Request) -> mb.Node:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise RedsynError(401, "Authorization: Bearer <token> is required "
                                   "(hubd redsyn login makes one)")
        credential = self.hub.identity.table.authenticate(token.strip())
        if credential is None:
            raise RedsynError(401, "unknown or revoked token")
        return node_of(credential)

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
            if len(parts) == 6 and parts[5] == "key" and method == "GET":
                return self._key(node, "/".join(parts[1:5]))
            if len(parts) == 5 and method == "PUT":
                return await self._announce(request, node, "/".join(parts[1:5]))
            if len(parts) == 5 and method == "GET":
                return self._agent(node, "/".join(parts[1:5]))
        elif path == "nodes/key" and method == "PUT":
            doc, _ = await self._json(request)
            answer = await self.call(lambda state, now: mb.decide_key(state, node, doc))
            return web.json_response(answer)
        elif path == "messages" and method == "POST":
            return await self._post(request, node)
        elif parts[0] == "messages" and len(parts) == 3 and parts[2] == "files" \
                and method == "GET":
            data = mb.files_of(self.state, node, parts[1])
            return web.Response(body=data, content_type="application/zip")
        elif parts[0] == "messages" and len(parts) == 2 and method == "DELETE":
            answer = await self.call(lambda state, now: mb.decide_cancel(state, node, parts[1]))
            return web.json_response(answer)
        elif parts[0] == "inbox" and len(parts) == 5 and method == "GET":
            return await self._take(request, node, "/".join(parts[1:5]))
        elif parts[0] == "inbox" and len(parts) == 6 and parts[5] == "ack" and method == "POST":
            doc, _ = await self._json(request)
            agent = "/".join(parts[1:5])
            answer = await self.call(lambda state, now: mb.decide_ack(state, node, agent, doc))
            return web.json_response(answer)
        elif parts[0] == "topics" and len(parts) == 5 and \
                parts[4] in ("subscribe", "unsubscribe") and method == "POST":
            doc, _ = await self._json(request)
            if isinstance(doc, dict):
                doc = {**doc, "subscribe": parts[4] == "subscribe"}
            topic = "topic:" + "/".join(parts[1:4])
            answer = await self.call(
                lambda state, now: mb.decide_subscribe(state, node, topic, doc))
            return web.json_response(answer)
        raise RedsynError(404, f"no endpoint {method} {PREFIX}/{path}")

    async def _announce(self, request, node, address) -> web.Response:
        doc, _ = await self._json(request)
        answer = await self.call(lambda state, now: mb.decide_announce(
            state, node, address, doc, self.allow_loopback_webhooks))
        if answer["listening"]:
            self.presence[answer["agent"]] = (time.time(), node.id)
        return web.json_response(answer)

    def _agent(self, node, address) -> web.Response:
        agent = wire.parse_address(address, what="agent address")
        key = agent.agent_address
        if agent.org != node.person.split("/")[0]:
            raise RedsynError(403, f"{key} is not visible outside {agent.org}")
        record = self.state.agents.get(key)
        seen = max(self.presence.get(key, (0.0, ""))[0], self.webhook_seen.get(key, 0.0))
        if record is None and not seen:
            raise RedsynError(404, f"no agent {key}")
        record = record or mb.Agent()
        return web.json_response({
            "agent": key, "online": time.time() - seen < mb.PRESENCE_SECONDS,
            "last_seen": int(seen) if seen else None, "listening": record.listening,
            "description": record.description, "policy": record.policy,
            "webhook": record.webhook is not None, "node": record.node,
            "waiting": len(self.state.boxes.get(key, ()))})

    def _key(self, node, address) -> web.Response:
        return web.json_response(mb.key_of(self.state, node, address))

    async def _post(self, request, node) -> web.Response:
        doc, size = await self._json(request)
        incoming = wire.validate(doc, node.person, size)
        answer = await self.call(lambda state, now: mb.decide_post(
            state, node, incoming, now, self.limits, new_id=lambda: "m" + uuid.uuid4().hex,
            seat_of=self._seat_of))
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
                self.presence[agent] = (time.time(), node.id)
                waiter = self._waiters.get(agent)
                if waiter is None:
                    waiter = self._waiters[agent] = asyncio.Event()
                items, ready_at = await self.call(lambda state, now: mb.decide_poll(
                    state, node, agent, lease, limit, now))
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
                if self.hub.router is None:
                    continue
                for agent, record in list(self.state.agents.items()):
                    if record.webhook is None or agent in busy or agent not in self.state.boxes:
                        continue
                    busy.add(agent)
                    task = asyncio.get_running_loop().create_task(
                        self._push(http, slots, agent, record.webhook, busy))
                    self.hub.track(task)

    async def _push(self, http, slots, agent, hook, busy) -> None:
        """One round for one agent: take what is ready and post it. A round
        that found nothing ready (a back-off or a lease pending) wakes the
        loop again when the earliest of them lapses, not at once: an agent
        whose deliveries all wait must not keep the loop turning."""
        person = agent.rsplit("/", 1)[0]
        node = mb.Node(WEBHOOK_NODE, person)
        items, ready_at = [], None
        self.hub.metrics.redsyn_webhook_rounds += 1
        try:
            async with slots:
                items, ready_at = await self.call(lambda state, now: mb.decide_poll(
                    state, node, agent, self.timing.redsyn_webhook_lease, 16, now))
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
                        self.webhook_seen[agent] = time.time()
                        await self.call(lambda state, now, i=item["id"]: mb.decide_ack(
                            state, node, agent, {"ids": [i]}))
                    else:
                        log.info("webhook delivery failed", agent=agent, id=item["id"],
                                 outcome=outcome)
                        await self.call(lambda state, now, i=item["id"]: mb.Decision(
                            mb.webhook_failed(state, agent, i, now,
                                              self.timing.redsyn_webhook_first_retry)
                            if i in state.boxes.get(agent, {}) else []))
        except RedsynError as exc:
            log.warning("webhook round refused", agent=agent, error=exc.error)
        finally:
            busy.discard(agent)
        if items and agent in self.state.boxes:
            self._webhook_wake.set()  # more may be ready now
        elif ready_at is not None:
            asyncio.get_running_loop().call_later(
                max(0.0, ready_at - time.time()) + LAPSE_SLACK_SECONDS, self._webhook_wake.set)


def sweep(door: RedsynDoor, router) -> None:
    """Once a second (a Router timer): give up what expired or was taken ten
    times untouched, and tell the senders."""
    state = router.state.extensions.get("redsyn")
    if state is None or router.mutations_refused():
        return
    events = mb.sweep(state, router.now)
    woken = set()
    for kind, payload in events:
        router.event(kind, payload)
        if kind == mb.MESSAGE:
            woken.update(d["agent"] for d in payload["deliveries"])
    if woken:
        router.after_release(lambda: door.wake(woken))

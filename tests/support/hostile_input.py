"""What a hostile client sends to the REDSYN and broker doors, drawn from a
seeded random.Random (tests/support/hostile_doors.py runs it against a real
hub): JSON values as an attacker writes them, envelopes and bodies built from
them, misused endpoints, malformed HTTP, and hostile broker lines."""

from __future__ import annotations

import json
import random
import time

ASKER, ANSWERER, MALLORY = "acme/dev/ask", "acme/dev/ans", "evil/ops/mallory"
NARROW, NARROW_SEAT = "acme/dev/kim", "acme/dev/kim/laptop"
SINK = f"{MALLORY}/sink"
# where hostile announces put their webhooks: an agent nothing is ever sent
# to, so even a hub that admitted one of those URLs would never post to it
HOOKED = f"{MALLORY}/hooked-never-written"
FORBIDDEN_WEBHOOKS = [
    "https://127.1/", "https://0177.0.0.1/", "https://0x7f.0.0.1/", "https://127.000.000.001/",
    "https://127.0.0.1./", "https://169.254.169.254./", "https://10.0.0.1./",
    "https://192.0.513/", "https://2130706433/", "https://[::1]/", "https://[::ffff:7f00:1]/",
    "https://localhost/", "https://metadata.internal/", "http://127.0.0.1:1/",
    "https://%31%32%37.0.0.1/", "ftp://a.example/", "https://u:p@127.0.0.1/",
]


# -- hostile values


def hostile_value(rng: random.Random, depth: int = 0):
    """One JSON value as an attacker writes it (as Python: inf is 1e400)."""
    pick = rng.randrange(16)
    if pick == 0:
        return rng.choice([2**53, -2**53 - 1, 2**64, 2**70, -2**63 - 1])
    if pick == 1:
        return rng.choice([float("inf"), float("-inf"), float("nan"), 1e308, 5e-324])
    if pick == 2:
        return rng.choice(["\ud800", "a\udfffb", "\udc00" * 3, "\ud83d"])
    if pick == 3:
        return "x" * rng.choice([1025, 70_000, 300_000])
    if pick == 4 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if pick == 5 and depth < 3:
        return {rng.choice(["type", "text", "json", "\ud800", "", "a" * 300]):
                hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if pick == 6:
        return json.loads("[" * 80 + "]" * 80)
    if pick == 7:
        return rng.choice([None, True, False, 0, -1, 1.5, "", "topic:acme/dev/x", "#new",
                           "acme/dev/ans/w0", "../../etc", "\x00", "é" * 10])
    if pick == 8:
        return rng.choice([[], {}, [None], {"zip": 7}, {"alg": "ed25519", "key": 1}])
    return rng.choice(["request", "reply", "event", "progress", 1, "s1", "m1", {"type": 5}])


def encode_hostile(value) -> bytes:
    """JSON text of a value, lone surrogates as `\\ud800` escapes, infinity
    as 1e400 and NaN as `NaN` (which JSON does not have), as a client other
    than Python's encoder would send them."""
    return json.dumps(value).encode("utf-8", "surrogatepass").replace(b"Infinity", b"1e400")


ENVELOPE_FIELDS = ("v", "id", "kind", "from", "to", "thread", "reply_to", "ts", "ttl", "body",
                   "refs", "files", "error", "sig", "body.text", "body.json", "refs.0.note",
                   "refs.0.url", "files.zip", "sig.value")


def hostile_envelope(rng: random.Random) -> bytes:
    envelope = {"v": 1, "kind": "request", "from": "cli",
                "to": rng.choice([SINK, f"{ANSWERER}/w0", "globex/x/y/z"]),
                "ts": int(time.time()), "body": {"type": "text/plain", "text": "hi", "json": {}},
                "refs": [{"url": "https://git.example/app", "note": "n"}],
                "files": {"zip": "UEsD"}, "sig": {"alg": "ed25519", "key": "k", "value": "v"}}
    for _ in range(rng.randrange(1, 3)):
        path = rng.choice(ENVELOPE_FIELDS).split(".")
        target = envelope
        try:
            for step in path[:-1]:
                target = target[int(step)] if step.isdigit() else target[step]
            last = path[-1]
            target[int(last) if last.isdigit() else last] = hostile_value(rng)
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    if rng.random() < 0.3:
        envelope.pop("sig", None)
    return encode_hostile(envelope)


RAW_BODIES = [b"", b"[]", b"null", b'"x"', b"{", b'{"v": 1,', b"\xff\xfe", b"\xef\xbb\xbf{}",
              b'{"description": "\xed\xa0\x80"}',
              b'{"listening": true, "description": "\xed\xb0\x80"}',
              b'{"a": NaN}', b'{"a": -Infinity}', b"[" * 100_000,
              b'{"ids": [' + b"1," * 5000 + b"1]}", b'{"\xc0\xaf": 1}', b"\x00" * 64]


def redsyn_case(rng: random.Random, tokens: dict) -> tuple[str, str, str, dict, bytes | None]:
    """(case name, method, path, headers, body) of one hostile REDSYN request."""
    token = tokens["mallory"]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    pick = rng.randrange(12)
    if pick <= 3:
        return "envelope", "POST", "/messages", headers, hostile_envelope(rng)
    if pick == 4:
        return "raw body", rng.choice(["POST", "PUT"]), rng.choice(
            ["/messages", f"/agents/{SINK}", "/nodes/key", f"/inbox/{SINK}/ack",
             "/topics/evil/ops/news/subscribe"]), headers, rng.choice(RAW_BODIES)
    if pick == 5:
        doc = {"listening": hostile_value(rng) if rng.random() < 0.3 else True,
               rng.choice(["description", "policy", "webhook"]): hostile_value(rng)}
        if rng.random() < 0.5:
            doc["webhook"] = {"url": rng.choice(FORBIDDEN_WEBHOOKS),
                              "secret": "a-long-webhook-secret"}
        return "announce", "PUT", f"/agents/{HOOKED}", headers, encode_hostile(doc)
    if pick == 6:
        doc = rng.choice([{"ids": hostile_value(rng)}, {"agent": hostile_value(rng)},
                          {"public_key": hostile_value(rng), "enc_key": hostile_value(rng)},
                          hostile_value(rng)])
        method, path = rng.choice([("POST", f"/inbox/{SINK}/ack"), ("PUT", "/nodes/key"),
                                   ("POST", "/topics/evil/ops/news/subscribe"),
                                   ("POST", "/topics/evil/ops/news/unsubscribe")])
        return "endpoint body", method, path, headers, encode_hostile(doc)
    if pick == 7:
        query = rng.choice(["wait=abc", "wait=nan", "wait=inf", "wait=-1", "wait=1e400",
                            "lease=0", "lease=nan", "limit=0", "limit=1e9", "limit=x",
                            "wait=0&lease=1e308", "wait=0.01&limit=100"])
        return "query", "GET", f"/inbox/{SINK}?{query}", headers, None
    if pick == 8:
        path = rng.choice(["/agents/a/b/c", "/agents/ACME/x/y/z", "/inbox/../../x/y",
                           f"/inbox/{ASKER}/cli", f"/agents/{ANSWERER}/w0/key",
                           "/messages/%ED%A0%80/files", "/messages/nope", "/topics/a/b",
                           "/nothing", f"/agents/{SINK}#s1", "/agents/" + "a" * 3000 + "/b/c/d"])
        return "path", rng.choice(["GET", "PUT", "POST", "DELETE", "PATCH"]), path, headers, None
    if pick == 9:
        bad = dict(headers)
        bad["Authorization"] = rng.choice(["", "Bearer", "Bearer ", "Basic x", "Bearer rsn_no",
                                           "bearer " + token + "x", "Bearer " + "t" * 4000])
        return "auth", "GET", f"/inbox/{SINK}", bad, None
    if pick == 10:
        bad = dict(headers)
        bad[rng.choice(["Host", "Origin"])] = rng.choice(["evil.example", "http://evil.example",
                                                          "127.0.0.1.evil.example"])
        if rng.random() < 0.3:
            bad["Redsyn-Version"] = rng.choice(["2020-01-01", "", "x" * 300])
        return "guard", "GET", f"/inbox/{SINK}", bad, None
    narrow = {**headers, "Authorization": f"Bearer {tokens['narrow']}"}
    other = rng.choice(["acme/dev/kim/other", "acme/dev/kim/laptop2"])
    return "narrow principal", *rng.choice([
        ("PUT", f"/agents/{other}", narrow, b'{"listening": true}'),
        ("GET", f"/inbox/{other}", narrow, None),
        ("POST", "/messages", narrow, json.dumps({
            "v": 1, "kind": "request", "from": other, "to": NARROW_SEAT,
            "body": {"type": "text/plain", "text": "x"}}).encode()),
    ])


RAW_HTTP = [
    b"GET /redsyn/v1/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\nX: a\x01b\r\n\r\n",
    b"G@T /redsyn/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET /redsyn/v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"POST /redsyn/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
    b"POST /redsyn/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
    b"\r\nzz\r\n",
    b"GET /redsyn/v1/inbox HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Long: " + b"v" * 9000 + b"\r\n\r\n",
]


def broker_line(rng: random.Random, next_id: int) -> tuple[bytes, int]:
    """One hostile broker line (bytes, newline included) and the next id."""
    pick = rng.randrange(10)
    if pick == 0:
        return rng.choice([b"not json\n", b"[1,2]\n", b"null\n", b"\xff\xfe\n", b"{\n",
                           b'{"v": 2, "id": 1, "type": "status", "x": "\xed\xa0\x80"}\n',
                           b"[" * 40 + b"]" * 40 + b"\n", b" \t{}\n"]), next_id
    if pick == 1 and rng.random() < 0.1:
        return b'{"v": 2, "id": 5, "type": "send", "body": "' + b"x" * (1024 * 1024 + 10) + \
            b'"}\n', next_id
    line = {"v": 2, "id": next_id, "type": rng.choice(VERB_NAMES)}
    if pick == 2:
        line["v"] = hostile_value(rng)
    elif pick == 3:
        line["id"] = hostile_value(rng)
    elif pick == 4:
        line["type"] = hostile_value(rng)
    fields = VERB_FIELDS.get(line["type"] if isinstance(line["type"], str) else "", ())
    for name in fields:
        line[name] = plausible(rng, name) if rng.random() < 0.6 else hostile_value(rng)
    if rng.random() < 0.3:
        line[rng.choice(list(fields) or ["x"])] = hostile_value(rng)
    return encode_hostile(line) + b"\n", next_id + 1


VERB_FIELDS = {
    "register": ("handle", "clientKind", "host", "ancestors", "client", "owner", "display"),
    "session": ("event", "client", "cliSessionId", "host", "handle", "title", "listen"),
    "send": ("threadId", "to", "body", "references", "mode"),
    "reply": ("messageId", "body", "verdict"),
    "ack": ("ids",), "read": ("ids",), "delivered": ("ids",), "inbox": ("unreadOnly",),
    "thread": ("threadId", "sinceSeq", "full"), "collect": ("threadId",),
    "wait": ("threadId", "until", "timeoutMs"), "groups": ("action", "name", "members"),
    "status": (), "hook": ("event", "handle", "sessionHint"),
    "fetch-push": ("handle", "limit"), "native-register": ("handle", "socketPath", "token"),
}
VERB_NAMES = sorted(VERB_FIELDS) + ["auth", "prune", "nope", ""]


def plausible(rng: random.Random, name: str):
    """A value of the right type, for hostile handles only (never rt-*)."""
    handle = f"h-{rng.randrange(40)}"
    return {"handle": handle, "clientKind": rng.choice(["mcp", "cli", "hook", "adapter"]),
            "host": {"hostPid": rng.randrange(1, 10**6), "hostStart": rng.randrange(10**6)},
            # (pids below 10**6: never a round-trip session's, which are 2,000,000 and up)
            "ancestors": [rng.randrange(1, 10**5)], "client": "other", "owner": False,
            "display": "x", "event": rng.choice(["session-start", "prompt", "stop"]),
            "cliSessionId": f"s{rng.randrange(1000)}", "title": "Fix the Parser!",
            "listen": False, "threadId": rng.choice([None, rng.randrange(1, 50)]),
            "to": rng.choice([handle, [handle, f"h-{rng.randrange(40)}"], "local/h-1",
                              "nobody-here", "PROJ/x@nohub"]),
            "body": f"b{rng.random()}", "references": [rng.randrange(1, 50)],
            "mode": rng.choice(["push", "notify", "silent"]), "messageId": rng.randrange(1, 50),
            "verdict": "info", "ids": [rng.randrange(1, 50)], "unreadOnly": True,
            "sinceSeq": None, "full": False, "until": "any_replied", "timeoutMs": 50,
            "action": rng.choice(["list", "create"]), "name": f"g-{rng.randrange(5)}",
            "members": [handle], "sessionHint": "x", "limit": 5,
            "socketPath": "/nonexistent/sock", "token": "t"}.get(name)

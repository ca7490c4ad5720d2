"""The seed's "complete agent", in Python, from seed 003 alone: announce,
take with long polling, answer each request (the text in capitals), confirm
what was taken. Run as a program: REDSYN_RELAY, REDSYN_TOKEN, REDSYN_ME.
Standard library only, as a plain HTTP agent would be.
"""

import json
import os
import secrets
import ssl
import urllib.request

RELAY = os.environ["REDSYN_RELAY"]          # e.g. http://127.0.0.1:8876/redsyn/v1
ME = os.environ["REDSYN_ME"]                # e.g. acme/general/joel/shout


def headers():
    return {"Authorization": "Bearer " + os.environ["REDSYN_TOKEN"],
            "Content-Type": "application/json", "Redsyn-Version": "2026-09-25"}


# Not from the seed: a test hub serves https with its own CA (REDSYN_CA), and
# its certificate names no host the test reaches it by.
CONTEXT = None
if os.environ.get("REDSYN_CA"):
    CONTEXT = ssl.create_default_context(cafile=os.environ["REDSYN_CA"])
    CONTEXT.check_hostname = False


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers())
    with urllib.request.urlopen(request, timeout=timeout, context=CONTEXT) as answer:
        return answer.status, answer.read()


def answer(e):
    return e["body"]["text"].upper()


status, _ = http("PUT", RELAY + "/agents/" + ME,
                 {"listening": True, "description": "answers in capitals"})
print("announced: " + str(status), flush=True)

while True:
    # wait up to 25 s; what is taken stays ours for 300 s, then goes back to the queue
    _, body = http("GET", RELAY + "/inbox/" + ME + "?wait=25&lease=300", timeout=40)
    taken = []
    for e in json.loads(body)["items"]:
        if e["kind"] == "request":
            reply = {"v": 1, "id": "r" + secrets.token_hex(8), "kind": "reply", "from": ME,
                     "reply_to": e["id"], "body": {"type": "text/plain", "text": answer(e)}}
            s, _ = http("POST", RELAY + "/messages", reply)
            print("answered " + e["id"] + ": " + str(s), flush=True)
        taken.append(e["id"])
    # a reply already closes its request; the ack confirms everything else that was taken
    if taken:
        http("POST", RELAY + "/inbox/" + ME + "/ack", {"ids": taken})

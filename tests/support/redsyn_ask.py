"""Send one REDSYN request and wait for its reply (a program, so a test can
run it inside a network namespace). Prints the reply envelope as JSON.

  python -m tests.support.redsyn_ask RELAY TOKEN FROM TO TEXT   (REDSYN_CA: the hub's CA)
"""

import json
import os
import ssl
import sys
import time
import urllib.request


def main() -> int:
    relay, token, sender, to, text = sys.argv[1:6]
    context = None
    if os.environ.get("REDSYN_CA"):
        context = ssl.create_default_context(cafile=os.environ["REDSYN_CA"])
        context.check_hostname = False
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Redsyn-Version": "2026-09-25"}

    def call(method, path, body=None):
        request = urllib.request.Request(relay + path, method=method, headers=headers,
                                         data=json.dumps(body).encode() if body else None)
        with urllib.request.urlopen(request, timeout=70, context=context) as answer:
            return json.loads(answer.read())

    id_ = f"ask-{int(time.time() * 1000)}"
    sent = call("POST", "/messages", {"v": 1, "id": id_, "kind": "request", "from": sender,
                                      "to": to, "body": {"type": "text/plain", "text": text}})
    print(json.dumps({"sent": sent}), flush=True)
    agent = sent["from"].partition("#")[0]
    for _ in range(12):
        for e in call("GET", f"/inbox/{agent}?wait=10")["items"]:
            call("POST", f"/inbox/{agent}/ack", {"ids": [e["id"]]})
            if e.get("reply_to") == id_:
                print(json.dumps({"reply": e}), flush=True)
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""REDSYN decisions about agents and nodes: signing keys, announces with
their policy and webhook, and which key an agent is reached with.

Each reads the state it is given and returns a `Decision` (or raises
RedsynError, having changed nothing).
"""

from __future__ import annotations

from hubd.state.redsyn_nodes import Node, check_speaks_for, forbidden
from hubd.wire.redsyn.envelope import Address, RedsynError, parse_address
from hubd.wire.redsyn.signing import fingerprint

from .links import visible_across
from .model import ANNOUNCE, KEY, MAX_DESCRIPTION, Decision, RedsynState


def own_agent(node: Node, address: str) -> Address:
    agent = parse_address(address, what="agent address")
    if agent.session is not None:
        raise RedsynError(400, "an agent address here has no #session")
    check_speaks_for(node, agent)
    return agent


def decide_key(state: RedsynState, node: Node, doc: dict) -> Decision:
    from hubd.wire.redsyn.signing import parse_public_key, verify_enc_sig

    if not isinstance(doc, dict) or "public_key" not in doc:
        raise RedsynError(400, "PUT /nodes/key takes {\"public_key\": ..., "
                               "\"rotate\"?, \"enc_key\"?, \"enc_sig\"?}")
    parse_public_key(doc["public_key"])
    current = state.keys.get(node.id)
    if current is not None and current["public_key"] != doc["public_key"] \
            and doc.get("rotate") is not True:
        raise RedsynError(409, "this node already has a signing key; replacing it takes "
                               "\"rotate\": true")
    payload = {"node": node.id, "public_key": doc["public_key"]}
    if doc.get("enc_key") is not None or doc.get("enc_sig") is not None:
        from hubd.wire.redsyn.envelope import b64url_decode

        enc_key, enc_sig = doc.get("enc_key"), doc.get("enc_sig")
        if not isinstance(enc_key, str) or not isinstance(enc_sig, str):
            raise RedsynError(400, "enc_key and enc_sig come together")
        raw = b64url_decode(enc_key, "enc_key")
        if len(raw) != 65 or raw[0] != 4:
            raise RedsynError(400, "enc_key must be an uncompressed P-256 point "
                                   "(65 bytes), base64url")
        from cryptography.hazmat.primitives.asymmetric import ec
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
        except ValueError:
            raise RedsynError(400, "enc_key is not a point on P-256") from None
        if not verify_enc_sig(doc["public_key"], enc_key, enc_sig):
            raise RedsynError(401, "enc_sig is not the signing key's signature of "
                                   "'redsyn-enc-v1:' + enc_key")
        payload.update(enc_key=enc_key, enc_sig=enc_sig)
    elif current is not None and current["public_key"] == doc["public_key"]:
        payload.update(enc_key=current["enc_key"], enc_sig=current["enc_sig"])
    return Decision([(KEY, payload)], {"node": node.id, "fingerprint":
                                       fingerprint(doc["public_key"]),
                                       "encryption": "enc_key" in payload
                                       and payload["enc_key"] is not None})


POLICY_FIELDS = {"requests_from", "encrypted_only", "signed_only"}


def check_policy(policy) -> dict:
    if not isinstance(policy, dict) or not set(policy) <= POLICY_FIELDS:
        raise RedsynError(400, "policy is {\"requests_from\": [prefix, ...], "
                               "\"encrypted_only\": bool, \"signed_only\": bool}")
    prefixes = policy.get("requests_from")
    if prefixes is not None:
        if not isinstance(prefixes, list) or len(prefixes) > 256:
            raise RedsynError(400, "policy.requests_from is a list of at most 256 prefixes")
        for prefix in prefixes:
            parts = prefix.split("/") if isinstance(prefix, str) else []
            if not 1 <= len(parts) <= 4 or not all(parts):
                raise RedsynError(400, f"policy.requests_from: {prefix!r} is not org[/team"
                                       "[/user[/agent]]]")
    for flag in ("encrypted_only", "signed_only"):
        if not isinstance(policy.get(flag, False), bool):
            raise RedsynError(400, f"policy.{flag} must be true or false")
    return policy


def decide_announce(state: RedsynState, node: Node, address: str, doc,
                    allow_loopback_webhooks: bool = False) -> Decision:
    from hubd.wire.redsyn.webhook import check_webhook

    agent = own_agent(node, address)
    if not isinstance(doc, dict):
        raise RedsynError(400, "an announce is a JSON object")
    listening = doc.get("listening", False)
    if not isinstance(listening, bool):
        raise RedsynError(400, "listening must be true or false")
    payload = {"agent": agent.agent_address, "node": node.id, "listening": listening}
    if "description" in doc:
        if not isinstance(doc["description"], str) or len(doc["description"]) > MAX_DESCRIPTION:
            raise RedsynError(400, f"description is a string of at most {MAX_DESCRIPTION}")
        payload["description"] = doc["description"]
    if "policy" in doc:
        if not listening:
            raise RedsynError(400, "a policy comes only with an announce that has "
                                   "listening: true")
        payload["policy"] = check_policy(doc["policy"])
    if "webhook" in doc:
        payload["webhook"] = None if doc["webhook"] is None else \
            check_webhook(doc["webhook"], allow_loopback_webhooks)
    return Decision([(ANNOUNCE, payload)], {"agent": agent.agent_address,
                                            "listening": listening})


def _prefix_allows(prefixes, sender: Address) -> bool:
    parts = sender.agent_address.split("/")
    return any(parts[: len(p.split("/"))] == p.split("/") for p in prefixes)



def key_of(state: RedsynState, node: Node, address: str, online_node: str | None = None) -> dict:
    agent = parse_address(address, what="agent address")
    record = state.agents.get(agent.agent_address)
    if not visible_across(state, node.person.split("/")[0], agent.agent_address):
        raise forbidden(f"{agent.agent_address} is not visible outside {agent.org} "
                        "(an active link that exposes it is)")
    holder = online_node or (record.node if record is not None else None)
    key = state.keys.get(holder) if holder is not None else None
    if key is None or not key.get("enc_key"):
        raise RedsynError(404, f"{agent.agent_address} has no encryption key")
    return {"node": holder, "signing_key": key["public_key"], "enc_key": key["enc_key"],
            "enc_sig": key["enc_sig"], "fingerprint": fingerprint(key["public_key"])}

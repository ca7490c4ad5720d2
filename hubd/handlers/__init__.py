"""Verb handlers: what each client frame means, and the core plugin that
installs them with the core's projections and hooks."""

from __future__ import annotations

from hubd.core.commands import Ack, Register, Request, Send, Take
from hubd.core.plugin import Plugin
from hubd.state import board as board_state
from hubd.state import capabilities as capability_state
from hubd.state import card_trust as card_state
from hubd.state import channels as channel_state
from hubd.state import claims as claim_state
from hubd.state import dead_letter_escalation as dead_letter_state
from hubd.state import delivery_intents as delivery_state
from hubd.state import hub as hub_state
from hubd.state import idem as idem_state
from hubd.state import resources as resource_state

from . import (board, capabilities, channels, chat, claims, delivery, dialects, mailbox,
               queries, receipts, resources, routing, sessions, status)


def core_plugin() -> Plugin:
    """Everything a single hub does: chat, mailbox, receipts, presence
    queries, claims and leases, the board, capability cards."""
    state_modules = (hub_state, board_state, capability_state, claim_state, idem_state,
                     delivery_state, dead_letter_state, channel_state, resource_state,
                     card_state)
    appliers: dict[str, list] = {}
    projections: dict = {}
    for module in state_modules:
        for kind, fns in module.appliers.items():
            appliers.setdefault(kind, []).extend(fns)
        projections.update(getattr(module, "PROJECTIONS", {}))
    verbs: dict = {}
    for module in (board, capabilities, channels, chat, claims, delivery, mailbox, queries,
                   resources):
        overlap = verbs.keys() & module.verbs.keys()
        if overlap:
            raise ValueError(f"verbs {sorted(overlap)} declared twice")
        verbs.update(module.verbs)
    return Plugin(
        "core",
        verbs=verbs,
        appliers=appliers,
        projections=projections,
        on_register=(claims.on_register, mailbox.on_register, delivery.on_register),
        on_unregister=(capabilities.on_unregister, claims.on_unregister,
                       delivery.on_unregister, receipts.on_unregister),
        periodic=(claims.sweep, delivery.sweep, receipts.sweep),
        sessions=sessions.SESSIONS,
        commands={**sessions.COMMANDS,
                  Register: dialects.register, Send: dialects.send, Take: dialects.take,
                  Ack: dialects.ack, Request: dialects.request,
                  receipts.WritesReported: receipts.writes_reported,
                  delivery.NotificationsReleased: delivery.released},
        requests=status.REQUESTS,
        live=(routing.Unroutable, receipts.ReceiptDesk, receipts.DarkSeats, claims.ClaimsLive,
              delivery.DeliveryLive, capabilities.LiveCards),
        rebuilt=receipts.rebuilt,
        state_sections={**claims.STATE_SECTIONS, "resources": resources.snapshot_resources},
        health_sections={"active_claims": claims.health_active_claims},
    )

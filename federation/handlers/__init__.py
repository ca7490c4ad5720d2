"""Federation's Router side: what runs inside Router commands.

The verbs a peer hub's link may use (receiving forwards, log pulls, claim
requests), the Router's half of forwarding, forwarded delivery intents and
claims across hubs, and the typed commands federation's actors post to the
Router (federation/plugin.py registers them). Nothing here owns a socket or
a task of its own; the actors that do are in federation/actors/.
"""

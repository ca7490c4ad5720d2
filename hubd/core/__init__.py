"""The door-neutral core: what every door hands the Router (commands), what
the Router hands back (messages addressed to endpoint ids), and the table of
open endpoints the journal writer releases messages to."""

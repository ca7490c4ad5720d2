"""Verb handlers: what each client frame means. Importing this package
registers every handler with the Router."""

from . import chat, mailbox, queries, session  # noqa: F401

"""Verb handlers: what each client frame means. Importing this package
registers every handler with the Router."""

from . import board, capabilities, chat, claims, mailbox, queries, session  # noqa: F401

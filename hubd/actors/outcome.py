"""What the Router hands the JournalWriter: events to commit and the messages
that may leave the hub only once those events are durable."""

from __future__ import annotations

from typing import Callable


class Outcome:
    """The result of handling one command.

    `sends` are (destination, item, frame type): a destination is one
    endpoint id or a tuple of them; an item is a core Message, or a
    CloseEndpoint. If committing `events` fails, the `failure` entries go out
    instead of `sends` (a private error to whoever asked); their items are
    usually callables, so the message is built only then. `answers` are
    (reply future, value): each future gets its value once the events are
    committed, or CommitFailed if they are not. `after_release` runs once
    the sends are on their endpoints' queues.
    """

    __slots__ = ("events", "sends", "failure", "answers", "after_release")

    def __init__(self, events=None, sends=None, failure=None,
                 after_release: Callable[[], None] | None = None):
        self.events = events if events is not None else []
        self.sends = sends if sends is not None else []
        self.failure = failure if failure is not None else []
        self.answers: list = []
        self.after_release = after_release


class CommitFailed(Exception):
    """A reply future's answer: the command's events could not be committed,
    so nothing of it was kept (the door says so on its own wire)."""

    def __init__(self) -> None:
        super().__init__("the hub could not journal this; nothing was changed")


class Resync:
    """Marks the point in the writer's queue after which the Router's state is
    rebuilt from the journal again (end of a failed-commit episode)."""

    __slots__ = ()


class Flush:
    """Resolved once everything queued before it is committed and released."""

    __slots__ = ("done",)

    def __init__(self, done):
        self.done = done

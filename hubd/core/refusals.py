"""Why a command was not served, door-neutral: what a door's reply future
can carry, and what Router.event() raises to refuse a mutation before
anything is applied. Each door says these on its own wire (a hub-wire error
frame, an HTTP status, a broker error line).
"""

from __future__ import annotations

from hubd.state.events import UnstorableEvent


class MutationsRefused(Exception):
    """Raised by Router.event() when this command may not change state now;
    `message` tells its sender why (nothing was changed)."""

    error_code: str | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class JournalUnavailable(MutationsRefused):
    """The journal refuses writes (a failed commit's back-off, corrupt or
    unknown rows)."""

    def __init__(self, reason: str | None):
        super().__init__(f"The hub cannot write its journal right now ({reason}); nothing "
                         "was changed. Reads still work; retry later.")


class PrincipalSuspended(MutationsRefused):
    """A command of this principal made the hub rebuild its state a moment
    ago (hubd/state/suspensions.py)."""

    error_code = "mutations_suspended"

    def __init__(self, principal: str | None, seconds: float):
        who = f"principal {principal}" if principal is not None else "the hub's own work"
        super().__init__(f"The hub refuses changes from {who} for {seconds:.1f} s more: one of "
                         "its commands failed and made the hub rebuild its state. Nothing "
                         "was changed; reads still work.")


# what Router.event() raises to refuse a command, before anything is applied
REFUSALS = (MutationsRefused, UnstorableEvent)


class CommitFailed(Exception):
    """A reply future's answer: the command's events could not be committed,
    so nothing of it was kept."""

    def __init__(self) -> None:
        super().__init__("the hub could not journal this; nothing was changed")


class CommandRefused(Exception):
    """A reply future's answer when the Router does not serve a command at
    all: its endpoint is not open, or the door has no such verb. (A verb's
    own refusals are its dialect's: a REDSYN error, a broker error line.)"""

    def __init__(self, code: str, text: str):
        super().__init__(text)
        self.code, self.text = code, text

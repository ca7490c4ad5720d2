"""The shared blackboard: planned tasks and progress notes.

Events (the reference hub's kinds and shapes):
- `ledger_task`: the complete task record after a declaration or an update
  (task_id, title, description, depends_on, status, suggested_owner, project,
  version, created_by, created_at, updated_at), plus `_causal_parent` when the
  write carried a causal parent; that reference is journaled beside the task,
  never part of the task shown to clients.
- `ledger_progress`: one note (task_id, author, kind, text, posted_at).

Decisions (validation, compare-and-set, scope and cycle checks) are pure
functions here; the handlers turn them into events and frames.

Bounds (fixed, visible in board_snapshot):
- MAX_TASKS tasks. Past it the oldest finished (done/cancelled) task is
  dropped; when none is finished a new declaration is refused.
- MAX_PROGRESS notes in all, MAX_PROGRESS_PER_TASK per task and
  MAX_PROGRESS_PER_AUTHOR per author; the oldest go first.
- board_snapshot lists at most SNAPSHOT_PROGRESS notes (the newest), with
  total_progress and truncated when it leaves some out.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .events import Event
from .hub import Appliers, HubState

LEDGER_TASK = "ledger_task"
LEDGER_PROGRESS = "ledger_progress"
EXTENSION = "board"
CAUSAL_KEY = "_causal_parent"

STATUSES = ("open", "in_progress", "blocked", "done", "cancelled")
FINISHED = ("done", "cancelled")
PROGRESS_KINDS = ("note", "blocked", "assessment", "usage", "approval")

MAX_TASKS = 10_000
MAX_PROGRESS = 5_000
MAX_PROGRESS_PER_TASK = 500
MAX_PROGRESS_PER_AUTHOR = 1_000
SNAPSHOT_PROGRESS = 1_000
MAX_DEPENDENCIES = 256

MAX_HUB_ID_BYTES = 512
SEQ_MAX = 2 ** 63 - 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class BoardState:
    tasks: OrderedDict = field(default_factory=OrderedDict)  # task_id -> record, oldest update first
    progress: OrderedDict = field(default_factory=OrderedDict)  # seq -> note
    by_task: dict = field(default_factory=dict)  # task_id -> deque of note seqs
    by_author: dict = field(default_factory=dict)  # author -> deque of note seqs

    def put_task(self, task: dict) -> None:
        task_id = task["task_id"]
        self.tasks.pop(task_id, None)
        self.tasks[task_id] = task
        if len(self.tasks) > MAX_TASKS:
            for old_id, old in self.tasks.items():
                if old["status"] in FINISHED and old_id != task_id:
                    del self.tasks[old_id]
                    break

    def add_note(self, seq: int, note: dict) -> None:
        self.progress[seq] = note
        for index, key, bound in ((self.by_task, note["task_id"], MAX_PROGRESS_PER_TASK),
                                  (self.by_author, note["author"], MAX_PROGRESS_PER_AUTHOR)):
            seqs = index.setdefault(key, deque())
            seqs.append(seq)
            while len(seqs) > bound:
                self._drop(seqs[0])
        while len(self.progress) > MAX_PROGRESS:
            self._drop(next(iter(self.progress)))

    def _drop(self, seq: int) -> None:
        note = self.progress.pop(seq, None)
        if note is None:
            return
        for index, key in ((self.by_task, note["task_id"]), (self.by_author, note["author"])):
            seqs = index.get(key)
            if seqs is not None:
                try:
                    seqs.remove(seq)
                except ValueError:
                    pass
                if not seqs:
                    del index[key]

    def full(self) -> bool:
        """No room for another task (every task unfinished)."""
        return len(self.tasks) >= MAX_TASKS and not any(
            t["status"] in FINISHED for t in self.tasks.values())

    def ready(self) -> list[str]:
        """Open tasks whose dependencies all exist and are finished."""
        tasks = self.tasks
        return sorted(
            task_id for task_id, task in tasks.items()
            if task["status"] == "open" and all(
                dep in tasks and tasks[dep]["status"] in FINISHED for dep in task["depends_on"]))

    def snapshot(self) -> dict:
        notes = list(self.progress.values())
        board = {"tasks": [self.tasks[t] for t in sorted(self.tasks)], "ready": self.ready(),
                 "progress": notes[-SNAPSHOT_PROGRESS:]}
        if len(notes) > SNAPSHOT_PROGRESS:
            board["total_progress"] = len(notes)
            board["truncated"] = True
        return board


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {EXTENSION: BoardState}
appliers = Appliers()


def board_of(state: HubState) -> BoardState:
    return state.extensions[EXTENSION]


@appliers.applies(LEDGER_TASK)
def _apply_task(state: HubState, event: Event) -> None:
    payload = event.payload
    if not isinstance(payload.get("task_id"), str) or not payload["task_id"]:
        return
    task = {k: v for k, v in payload.items() if k != CAUSAL_KEY}
    task.setdefault("status", "open")
    if not isinstance(task.get("depends_on"), list):
        task["depends_on"] = []
    board_of(state).put_task(task)


@appliers.applies(LEDGER_PROGRESS)
def _apply_progress(state: HubState, event: Event) -> None:
    payload = event.payload
    note = dict(payload)
    note["task_id"] = str(note.get("task_id", ""))
    note["author"] = str(note.get("author", ""))
    board_of(state).add_note(event.seq, note)


# -- reading requests

class Malformed(Exception):
    """A deliberately authored refusal: its text goes to the client after
    'Malformed frame: '."""


def causal_parent(frame: dict) -> dict | None:
    """The validated causal_parent (None when absent or null); raises
    Malformed with the reason otherwise."""
    if "causal_parent" not in frame or frame["causal_parent"] is None:
        return None
    parent = frame["causal_parent"]
    if not isinstance(parent, dict):
        raise Malformed("causal_parent must be an object")
    if set(parent) != {"hub_id", "seq", "event_fingerprint"}:
        raise Malformed("causal_parent must contain exactly hub_id, seq, and event_fingerprint")
    hub_id, seq, fingerprint = parent["hub_id"], parent["seq"], parent["event_fingerprint"]
    if not isinstance(hub_id, str) or not hub_id or len(
            hub_id.encode("utf-8", "surrogatepass")) > MAX_HUB_ID_BYTES:
        raise Malformed("causal parent hub_id must be non-empty and at most 512 bytes")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= SEQ_MAX:
        raise Malformed("causal parent seq must be an integer from 1 through 2^63-1")
    if not isinstance(fingerprint, str) or not _SHA256.match(fingerprint):
        raise Malformed("causal parent event_fingerprint must be lowercase SHA-256")
    return {"hub_id": hub_id, "seq": seq, "event_fingerprint": fingerprint}


def expected_version(frame: dict) -> int | None:
    if "expected_version" not in frame or frame["expected_version"] is None:
        return None
    value = frame["expected_version"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed("'expected_version' must be an integer.")
    return value


def _text(value) -> str:
    if value is None:
        return ""
    return (value if isinstance(value, str) else str(value)).strip()


def _dependencies(value) -> list[str]:
    if not isinstance(value, list):
        return []
    out: list[str] = []
    for item in value:
        if isinstance(item, (dict, list)) or item is None:
            continue
        text = _text(item)
        if text and text not in out:
            out.append(text)
    return out[:MAX_DEPENDENCIES]


def _cycle(tasks: dict, task_id: str, depends_on: list[str]) -> bool:
    stack = list(depends_on)
    seen: set[str] = set()
    while stack:
        current = stack.pop()
        if current == task_id:
            return True
        if current in seen:
            continue
        seen.add(current)
        task = tasks.get(current)
        if task is not None:
            stack.extend(task["depends_on"])
    return False


@dataclass(frozen=True)
class TaskWrite:
    task: dict  # the complete record to journal
    created: bool  # a new task (ledger_task_posted says "declared", else "re-declared")


def decide_declare(board: BoardState, frame: dict, sender: str, now: float) -> TaskWrite | str:
    """A ledger_task: the record to journal, or the refusal text. Raises
    Malformed for malformed expected_version."""
    version_wanted = expected_version(frame)
    task_id = _text(frame.get("task_id"))
    if not task_id:
        return "Task ID is required."
    title = _text(frame.get("title"))
    if not title:
        return "Task title is required."
    current = board.tasks.get(task_id)
    version = current["version"] if current else 0
    if version_wanted is not None and version_wanted != version:
        return f"Task '{task_id}' version conflict: expected v{version_wanted}, board has v{version}."
    project = _text(frame.get("project"))
    if current is not None and project and current["project"] and project != current["project"]:
        return (f"Task '{task_id}' project conflict: already scoped to '{current['project']}', "
                f"cannot re-scope to '{project}'.")
    if current is None and board.full():
        return (f"The board holds the maximum {MAX_TASKS} unfinished tasks; finish or cancel "
                "some before declaring more.")
    depends_on = _dependencies(frame.get("depends_on"))
    if _cycle(board.tasks, task_id, depends_on):
        return f"Task '{task_id}' dependencies would form a cycle."
    task = {
        "task_id": task_id, "title": title, "description": _text(frame.get("description")),
        "depends_on": depends_on,
        "status": current["status"] if current else "open",
        "suggested_owner": _text(frame.get("suggested_owner")),
        "project": project or (current["project"] if current else ""),
        "version": version + 1,
        "created_by": current["created_by"] if current else sender,
        "created_at": current["created_at"] if current else now,
        "updated_at": now,
    }
    return TaskWrite(task, current is None)


def decide_update(board: BoardState, frame: dict, now: float) -> TaskWrite | str:
    """A ledger_task_update: status, suggested_owner and project; the record
    to journal or the refusal text. Raises Malformed for a malformed
    expected_version."""
    version_wanted = expected_version(frame)
    task_id = _text(frame.get("task_id"))
    if not task_id:
        return "Task ID is required."
    current = board.tasks.get(task_id)
    status = _text(frame.get("status"))
    if status and status not in STATUSES:
        return f"Unknown ledger status '{status}'."
    if current is None:
        return f"Task '{task_id}' is not on the board."
    if version_wanted is not None and version_wanted != current["version"]:
        return (f"Task '{task_id}' version conflict: expected v{version_wanted}, board has "
                f"v{current['version']}.")
    task = dict(current)
    if status:
        task["status"] = status
    if "suggested_owner" in frame and frame["suggested_owner"] is not None:
        task["suggested_owner"] = _text(frame["suggested_owner"])
    if "project" in frame and frame["project"] is not None:
        task["project"] = _text(frame["project"])
    task["version"] = current["version"] + 1
    task["updated_at"] = now
    return TaskWrite(task, False)


def _namespace(name: str) -> str | None:
    head, sep, _ = name.partition("/")
    return head if sep and head else None


def task_id_text(frame: dict) -> str:
    """The task id a board frame names, as the decisions read it."""
    return _text(frame.get("task_id"))


def task_namespace(task: dict) -> str | None:
    """The namespace a board task lies in: its project's first segment when
    it has a project, else its creator seat's namespace (None for a bare seat)."""
    project = task.get("project") or ""
    if project:
        return project.split("/", 1)[0]
    return _namespace(task.get("created_by") or "")


def namespaces_touched(board: BoardState, frame: dict, sender: str, verb: str) -> tuple:
    """The namespaces a board write lies in, for the board grant
    (docs/identity.md): a new task's (its project, else the sender's); for an
    existing task, its namespace now and, when the write changes its project,
    the one it moves to. A progress note lies in its task's namespace when it
    names a task on the board, else in the sender's."""
    task_id = _text(frame.get("task_id"))
    current = board.tasks.get(task_id) if task_id else None
    if verb == "ledger_progress":
        return (task_namespace(current) if current is not None else _namespace(sender),)
    if verb == "ledger_task":
        project = _text(frame.get("project"))
    else:
        raw = frame.get("project")
        project = _text(raw) if raw is not None else None
    if current is None:
        return (task_namespace({"project": project or "", "created_by": sender}),)
    now = task_namespace(current)
    if project is None or (verb == "ledger_task" and not project):
        return (now,)  # the project stays as it is
    after = task_namespace({"project": project, "created_by": current.get("created_by", "")})
    return (now,) if after == now else (now, after)


def read_progress(frame: dict, sender: str, now: float) -> dict | str:
    """A ledger_progress note, or the refusal text."""
    kind = frame.get("kind")
    kind = _text(kind) or "note"
    if kind not in PROGRESS_KINDS:
        return f"Unknown progress kind '{kind}'."
    text = frame.get("text")
    if text is None or text == "":
        text = frame.get("payload")
    text = "" if text is None else (text if isinstance(text, str) else str(text))
    return {"task_id": _text(frame.get("task_id")), "author": sender, "kind": kind, "text": text,
            "posted_at": now}

"""Journal rows made before an event is applied (hubd/state/events.py), the
row that keeps a refused event's seq, the schema version a journal may have,
and the owner-only rule's one message (hubd/owner_only.py)."""

import json
import math
import sqlite3

import pytest

from hubd.journal.store import JournalTooNew, check_schema_version
from hubd.owner_only import open_to_others
from hubd.state.events import Event, UnstorableEvent, encode_payload, refused_row


def test_a_row_is_made_once_and_reused():
    event = Event(7, 1.5, "chat", {"payload": "héllo"}, {"recipients": []}, principal="p")
    row = event.row()
    assert row == (7, 1.5, "chat", '{"payload":"héllo"}', '{"recipients":[]}', "p")
    event.payload["payload"] = "changed after"
    assert event.row() is row


@pytest.mark.parametrize("payload, route, principal", [
    ({"payload": "\ud800"}, None, None),                 # a lone surrogate in the payload
    ({"ok": 1}, {"note": "x\udfff"}, None),              # in the route
    ({"n": 2 ** 70}, None, None),                        # past 64 bits
    ({"ok": 1}, None, "p\ud800"),                        # in the principal
])
def test_what_sqlite_cannot_store_is_refused_before_anything_is_applied(payload, route,
                                                                        principal):
    with pytest.raises(UnstorableEvent) as refused:
        Event(1, 1.0, "chat", payload, route, principal=principal).row()
    assert refused.value.error_code == "unstorable_event"
    assert str(refused.value).startswith("chat event:")
    with pytest.raises(UnstorableEvent):
        Event(1, 1.0, "chat", {}, payload_text="\ud800").row()
    with pytest.raises(UnstorableEvent):
        encode_payload("chat", {"p": "\ud800"})


def test_the_row_that_keeps_a_refused_events_seq_is_always_storable():
    event = Event(9, math.nan, "chat\ud800", {"p": "\ud800"}, principal="p\ud800")
    row = refused_row(event, sqlite3.DataError("string or blob too big \ud800"))
    seq, ts, kind, payload, route, principal = row
    assert (seq, kind, route) == (9, "journal_row_refused", None) and math.isfinite(ts)
    assert json.loads(payload)["error"].startswith("string or blob too big")
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT "
                 "NULL, payload TEXT NOT NULL, route TEXT, principal TEXT)")
    conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", row)


def test_a_newer_schema_is_refused_naming_both_versions():
    check_schema_version("2")
    check_schema_version("1")
    check_schema_version("0")
    for stored in ("3", "next"):
        with pytest.raises(JournalTooNew, match=rf"journal schema {stored}; this hubd reads "
                                                r"schema 2 and older"):
            check_schema_version(stored)


def test_one_message_names_every_file_others_may_access_and_the_fix():
    assert open_to_others("journal", [("/j/hubd.db", 0o100600), ("/j/hubd.db-wal", 0o100400)]) \
        is None
    said = open_to_others("journal", [("/j/hubd.db", 0o100644), ("/j/hubd.db-wal", 0o100600),
                                      ("/j/hubd.db-shm", 0o100604)])
    assert said == ("journal /j/hubd.db is accessible by other users (mode 0644; "
                    "/j/hubd.db-shm mode 0604); it must be owner-only; run: chmod 600 "
                    "/j/hubd.db /j/hubd.db-shm")

"""Target grammar, and the mailbox index that pending counts and replay use."""

from hubd.state.mailbox import MailboxState
from hubd.wire.targets import (RemoteSeat, RemoteTargetError, parse_remote, parse_target)


def test_target_grammar():
    assert parse_target("all").is_broadcast and parse_target("").is_broadcast
    t = parse_target("p/a, p/b")
    assert t.items == ("p/a", "p/b")
    assert t.matches("p/a") and t.matches("p/b") and not t.matches("p/c")
    assert parse_target("p/*").matches("p/x") and not parse_target("p/*").matches("q/x")
    assert parse_target("p").matches("p/x") and not parse_target("p").matches("px/y")
    assert parse_target("reviewer").matches("p/x", roles=("reviewer",))


def test_remote_targets():
    assert parse_remote("p/bob") is None
    assert parse_remote("PROJ/bob@west") == RemoteSeat("PROJ/bob", "west")
    assert isinstance(parse_remote("PROJ/a@west,PROJ/b@west"), RemoteTargetError)
    assert isinstance(parse_remote("PROJ/*@west"), RemoteTargetError)
    assert isinstance(parse_remote("PROJ/bob@-bad"), RemoteTargetError)


def test_mailbox_counts_exact_project_role_and_glob_mail():
    box = MailboxState()
    box.index(1, "p/alice", parse_target("p/bob"))
    box.index(2, "p/alice", parse_target("p"))          # bare project
    box.index(3, "p/alice", parse_target("p/*"))        # glob
    box.index(4, "p/alice", parse_target("reviewer"))   # role
    box.index(5, "p/bob", parse_target("p/*"))          # bob's own: not his mail
    box.index(6, "p/alice", parse_target("p/carol"))
    assert box.seqs_after("p/bob", ("reviewer",), 0) == [1, 2, 3, 4]
    assert box.seqs_after("p/bob", (), 0) == [1, 2, 3]
    assert box.pending("p/bob", ()) == 3
    box.advance("p/bob", 2)
    assert box.pending("p/bob", ()) == 1
    box.advance("p/bob", 1)  # never goes back
    assert box.watermark("p/bob") == 2
    assert box.directed_to(3, "p/bob", ()) and not box.directed_to(5, "p/bob", ())
    assert not box.directed_to(6, "p/bob", ())


def test_a_key_keeps_its_newest_window_and_is_trimmed_in_steps():
    from hubd.state import mailbox as mb
    box = mb.MailboxState()
    target = parse_target("p/bob")
    sizes = []
    for seq in range(1, mb.PER_KEY_WINDOW + 2 * mb.TRIM_SLACK + 3):
        box.index(seq, "p/alice", target)
        sizes.append(len(box.by_key["p/bob"].seqs))
        assert box.entries == sizes[-1]  # the global count follows every trim
    assert max(sizes) == mb.PER_KEY_WINDOW + mb.TRIM_SLACK
    assert sizes.count(mb.PER_KEY_WINDOW) == 3  # reached once, then after each of two trims
    entries = box.by_key["p/bob"]
    assert entries.seqs[-1] == seq and entries.seqs == sorted(entries.seqs)
    assert len(entries.senders) == len(entries.seqs)
    # the newest window is always there for replay
    assert list(entries.after(seq - mb.PER_KEY_WINDOW, "p/x")) == \
        list(range(seq - mb.PER_KEY_WINDOW + 1, seq + 1))

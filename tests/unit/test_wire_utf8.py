"""hubd/wire/utf8.py: what makes a JSON text not valid UTF-8, found after orjson
refused it, with the text repaired so the rest of the line can still be read."""

import json

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from hubd.wire.utf8 import utf8_problem


def test_valid_text_has_no_problem():
    assert utf8_problem(b'{"a":"caf\xc3\xa9 \\ud83d\\ude00 \\\\ud800 \\n"}') is None
    assert utf8_problem('{"a":"plain"}') is None


def test_raw_bytes_that_do_not_decode_are_named_by_their_offset():
    problem = utf8_problem(b'{"id":1,"a":"x\xed\xa0\x80"}')  # an encoded surrogate
    assert problem.what == "byte 0xED at byte 14 is not valid UTF-8"
    assert orjson.loads(problem.repaired) == {"id": 1, "a": "x\ufffd\ufffd\ufffd"}
    assert utf8_problem(b'{"a":"\xff"}').what == "byte 0xFF at byte 6 is not valid UTF-8"


def test_escapes_of_lone_surrogates_are_found_and_pairs_are_kept():
    problem = utf8_problem(b'{"id":2,"a":"\\ud83d\\ude00 \\udc00 \\ud800"}')
    assert problem.what == ("the escape \\udc00 at character 26 is a lone surrogate, "
                            "which is not text")
    assert orjson.loads(problem.repaired) == {"id": 2, "a": "\U0001F600 \ufffd \ufffd"}
    # a high half followed by another high half: the first is lone
    assert orjson.loads(utf8_problem('["\\uD83D\\uD83D\\uDE00"]').repaired) == [
        "\ufffd\U0001F600"]
    # an escaped backslash before "ud800" is text, an escape after it is not
    assert utf8_problem('["\\\\ud800"]') is None
    assert orjson.loads(utf8_problem('["\\\\\\ud800"]').repaired) == ["\\\ufffd"]


def test_both_faults_at_once_name_the_raw_byte_first():
    problem = utf8_problem(b'["\\ud800", "\xc0"]')
    assert problem.what.startswith("byte 0xC0 at byte 12")
    assert orjson.loads(problem.repaired) == ["\ufffd", "\ufffd"]


@given(st.lists(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)),
                max_size=4))
@example(["\ud83d\ude00"])  # two halves as escapes are one character; as raw bytes, none
@example(["\udc00\ud800", "\\ud800"])
def test_a_problem_exactly_when_some_string_is_not_utf8(strings):
    for ensure_ascii in (True, False):
        text = json.dumps(strings, ensure_ascii=ensure_ascii)
        # what the JSON text means (a pair of escapes is one character)
        encodable = all(_encodes(s) for s in json.loads(text))
        data = text.encode("utf-8", "surrogatepass")
        problem = utf8_problem(data)
        assert (problem is None) == encodable
        if problem is not None:
            repaired = orjson.loads(problem.repaired)
            assert len(repaired) == len(strings)
            assert all(_encodes(s) for s in repaired)


def _encodes(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False

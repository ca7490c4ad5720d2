"""federation/versions.py: the negotiated wire version, the feature gates and
the warn-once memory."""

from __future__ import annotations

import pytest

from federation import versions as v


@pytest.mark.parametrize("advertised,effective,relation", [
    (6, 6, v.SAME), (5, 5, v.OLDER), (1, 1, v.OLDER), (9, 6, v.NEWER),
    (None, 1, v.SILENT), ("6", 1, v.SILENT), (True, 1, v.SILENT), (0, 1, v.SILENT),
    (-3, 1, v.SILENT), (6.0, 1, v.SILENT), ([6], 1, v.SILENT)])
def test_negotiate(advertised, effective, relation):
    n = v.negotiate(6, advertised)
    assert (n.effective, n.relation) == (effective, relation)
    assert n.warns is (relation != v.SAME)
    assert n.advertised == (advertised if relation in (v.OLDER, v.NEWER, v.SAME) else None)


def test_features_are_gated_on_the_negotiated_version():
    assert v.feature_refusal("attachment_peer_read", "west", v.negotiate(6, 6)) is None
    assert v.feature_refusal("attachment_peer_read", "west", v.negotiate(6, 9)) is None
    refused = v.feature_refusal("attachment_peer_read", "west", v.negotiate(6, 5))
    assert refused.reason_code == v.TOO_OLD and "below 6" in refused.text
    assert v.feature_refusal("roster", "west", v.negotiate(6, 5)) is None
    silent = v.feature_refusal("roster", "west", v.negotiate(6, None))
    assert silent.reason_code == v.TOO_OLD and "no version" in silent.text
    # a link that never came up negotiated nothing: not this refusal
    assert v.feature_refusal("roster", "west", None) is None


def test_warn_once_per_peer_relation_and_version_and_bounded():
    told = v.WarnOnce(bound=3)
    older = v.negotiate(6, 5)
    assert told.first_time("west", older) is True
    assert told.first_time("west", older) is False  # a reconnect: not again
    assert told.first_time("west", v.negotiate(6, 6)) is False  # the same version never warns
    assert told.first_time("west", v.negotiate(6, 4)) is True  # it changed: told again
    assert told.first_time("north", older) is True
    assert told.first_time("south", older) is True  # past the bound the oldest is forgotten
    assert told.first_time("west", older) is True


def test_warning_texts_name_the_peer_and_the_versions():
    assert "no usable wire version" in v.warning_text("w", v.negotiate(6, None))
    assert "older than this hub's 6" in v.warning_text("w", v.negotiate(6, 4))
    assert "newer than this hub's 6" in v.warning_text("w", v.negotiate(6, 8))

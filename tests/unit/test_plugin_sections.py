"""How plugins' state_request sections merge: one declarer per section, and a
later plugin replaces an earlier one's section only when it says so."""

import pytest

from hubd.core.plugin import Installed, Plugin


def core_section(router):
    return ["core"]


def federation_section(router):
    return ["core", "remote"]


def test_a_later_plugin_replaces_a_section_it_names_as_a_replacement():
    installed = Installed([Plugin("core", state_sections={"active_claims": core_section}),
                           Plugin("federation",
                                  replaces_state_sections={"active_claims": federation_section})])
    assert installed.state_sections == {"active_claims": federation_section}


def test_two_plugins_declaring_one_section_are_still_refused():
    with pytest.raises(ValueError, match="'active_claims' is declared by two plugins"):
        Installed([Plugin("core", state_sections={"active_claims": core_section}),
                   Plugin("federation", state_sections={"active_claims": federation_section})])


def test_replacing_a_section_nobody_declared_is_refused():
    with pytest.raises(ValueError, match="replaces a section no earlier plugin declares"):
        Installed([Plugin("core", state_sections={"active_claims": core_section}),
                   Plugin("federation",
                          replaces_state_sections={"active_clams": federation_section})])


def test_the_federation_plugin_lists_remote_leases_in_active_claims():
    from federation.handlers.claims import active_claims_with_remote
    from federation.config import FederationConfig
    from federation.plugin import Federation
    from hubd.handlers import core_plugin

    installed = Installed([core_plugin(), Federation(FederationConfig()).plugin()])
    assert installed.state_sections["active_claims"] is active_claims_with_remote
    assert "remote_leases" in installed.projections
    assert "multihub_remote_lease" in installed.appliers


class LinkReport:
    """A plugin's own command type (what an actor of it posts to the Router)."""


def test_a_command_type_has_one_handler():
    def handle(router, command):
        return None
    installed = Installed([Plugin("federation", commands={LinkReport: handle})])
    assert installed.commands == {LinkReport: handle}
    with pytest.raises(ValueError, match="declared by two plugins"):
        Installed([Plugin("federation", commands={LinkReport: handle}),
                   Plugin("broker", commands={LinkReport: handle})])

"""Black-box probes of the reference hub; see tools/probe_reference.py."""

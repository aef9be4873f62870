"""The one conformance suite: every case runs against every backend (conformance.md)."""

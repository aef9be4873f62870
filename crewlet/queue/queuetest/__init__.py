"""The one conformance suite: every case runs against every backend (docs/design.md § The conformance suite)."""

"""a2a: channels, ask/answer, sweep."""

"""Coding runs: detached jobs a seat launches into a bubblewrap sandbox, the hold they take on its inbox, their questions."""

"""Coding runs: detached jobs a seat starts with ``sandbox_run``, each in a bubblewrap sandbox (:mod:`seats.sandbox.jail`)."""

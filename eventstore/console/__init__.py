"""The store's console room: the dashboard's pages and the operator's views (dead letters, ``/operator/act``).

The rest of the store (the writer, the reads, the live projection, the fleet
read, ``/ws/stream``) stands on the core alone. The dashboard shows the
seats' live state and pauses beside the store's rows, so it asks ``seats``
too; keeping the pages in this room keeps that arrow here, where
``tests/project/test_layering.py`` allows it, and out of every other module of the
store. ``crewlet.urls`` mounts :mod:`.urls` at the site root; the
``/api/dead-letters`` route is mounted with the other reads by
:mod:`eventstore.urls`.
"""
from __future__ import annotations

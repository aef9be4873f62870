"""A seat's memory: rows ``(table, key) -> value`` carried on CREWLET_MEMORY and materialized in the holding node's store.

Each row is one message on its own subject (``crewlet.memory.{handle}.{table}.{key-digest}``)
of a stream that keeps the last message per subject, so the stream holds every
row's current value (a forgotten row's is a tombstone). The node holding a seat
replays the seat's subjects into its own store (the ``events`` database: SQLite
FTS5 or a PostgreSQL ``tsvector`` index for search) before it attaches the
seat's inbox, follows later writes live, and answers the seat's turns from it:
the ``memory`` built-in tools, the memory block of a turn's prompt, and
post-turn reflection. An installed app of its own (label ``seats_memory``) so
its table lives in the node's store and its migrations are its own.
"""

"""notifications: webhook edge, per-source parsers, routing service, coalescer, skip reasons, rate valve."""

"""notifications: the webhook edge, its sources (one module per vendor, one registry), routing, the coalescer, skip reasons, the rate valve."""

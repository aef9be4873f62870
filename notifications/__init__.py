"""notifications: the webhook edge, its sources (one module per vendor, one registry), routing, skip reasons, the rate valve; wakes go out to seat inboxes by topic, never by importing seats."""

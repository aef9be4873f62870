"""eventstore: event rows, publish-listener writer, retention, REST API, /ws/stream, live projection, fleet reads (routed to the events database)."""

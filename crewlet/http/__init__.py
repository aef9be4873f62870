"""The web server and what every HTTP route shares: bodies and errors, authentication, throttling, health and /metrics."""

"""The company: its file (seats, providers, surfaces, schedules), the engine settings, and stored revisions of it."""

"""The engine: the one asyncio loop and its services, the process's handle on it, and its metrics."""

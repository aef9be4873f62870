"""The chat tool servers the repository ships: Slack and Mattermost, each an MCP server run as a child over stdio.

A company grants one with ``mcp_servers: {<name>: {builtin: slack}}`` (or
``mattermost``; :mod:`crewlet.company.builtin_servers`), and the engine runs
``python -m seats.tools.servers.<kind>`` with the seat's bot token and the
surface's API URL in its environment. Each is written on the official ``mcp``
SDK's ``MCPServer`` and its vendor's maintained client; they import nothing of
the engine but the names of those variables.
"""

"""What the Jira and Confluence servers share: ``atlassian-python-api``'s credentials, and a refusal in Atlassian's words.

An Atlassian site is reached with the account's API token: with a user
(``JIRA_USER`` / ``CONFLUENCE_USER``, the account's email on Atlassian Cloud)
it is HTTP Basic ``user:token``, as Atlassian Cloud wants; without one it is
``Authorization: Bearer <token>``, a Data Center personal access token.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import requests
from atlassian.errors import ApiError

from crewlet.company.builtin_servers import BuiltinServer
from seats.tools.servers.common import from_env

# The client logs every refusal at ERROR itself; the tool error the model reads says it once, with its context.
logging.getLogger("atlassian").setLevel(logging.CRITICAL)

#: How long one REST call may take, in seconds (the engine's own ``tools.call_timeout_s`` bounds the tool call).
CALL_TIMEOUT_S = 30
#: What a call raises when the site refused it or was not reached.
CLIENT_ERRORS: tuple[type[Exception], ...] = (requests.RequestException, ApiError)


def credentials(server: BuiltinServer, what: str) -> dict[str, Any]:
    """The client's keyword arguments for the site, its user and its token (:func:`from_env` names what is unset)."""
    url = from_env(server.url_env, f"the {what} site's URL")
    token = from_env(server.token_env, f"the seat's {what} API token")
    user = os.environ.get(server.extra_env[0], "").strip() if server.extra_env else ""
    auth: dict[str, Any] = {"username": user, "password": token} if user else {"token": token}
    return {"url": url, "timeout": CALL_TIMEOUT_S, **auth}


def refusal(vendor: str, what: str, exc: Exception) -> str:
    """What a failed call tells the model: the site's status and its messages (the client joins them), or why it was not reached."""
    response = getattr(exc, "response", None)
    if response is None and isinstance(exc, ApiError):
        response = getattr(getattr(exc, "reason", None), "response", None)
    if response is None:
        return f"could not reach {vendor} for {what}: {type(exc).__name__}: {str(exc)[:300]}"
    said = " ".join(str(exc).split()) or response.reason or ""
    return f"{vendor} refused {what}: HTTP {response.status_code}: {said[:500]}"


__all__ = ["CALL_TIMEOUT_S", "CLIENT_ERRORS", "credentials", "refusal"]

"""OpenAPI descriptions of the two /api/ credentials (registered when the crewlet app is ready)."""
from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = "crewlet.auth.OperatorTokenAuthentication"
    name = "operatorToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An operator token: `manage.py operator_token NAME` mints one, CREWLET_OPERATOR_TOKEN seeds one.",
        }


class StaffSessionScheme(OpenApiAuthenticationExtension):
    target_class = "crewlet.auth.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid", "description": "A signed-in staff user's session."}

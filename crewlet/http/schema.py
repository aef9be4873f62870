"""The OpenAPI schema's generator, and its descriptions of the two /api/ credentials (registered when the crewlet app is ready)."""
from __future__ import annotations

import inspect
from typing import Any

from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension

from crewlet.http.bodies import ClosedSerializer


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's, stating a :class:`~crewlet.http.bodies.ClosedSerializer`'s refusal of unknown fields."""

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        result: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        if isinstance(serializer, ClosedSerializer) or (isinstance(serializer, type) and issubclass(serializer, ClosedSerializer)):
            result["additionalProperties"] = False
            if result.get("description") == inspect.getdoc(ClosedSerializer):  # the base's, not the body's
                del result["description"]
        return result


    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        """drf-spectacular's, with a blank-allowing field's ``default`` kept beside its ``oneOf``.

        A field with a pattern that also allows ``''`` is stated as ``oneOf``
        (the pattern, or the empty string); the library leaves the default
        inside the first branch, where ``''`` breaks that branch's own pattern
        and the document fails validation.
        """
        super()._insert_field_validators(field, schema)
        branches = schema.get("oneOf")
        if branches and "default" in branches[0]:
            schema["default"] = branches[0].pop("default")


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = "crewlet.http.auth.OperatorTokenAuthentication"
    name = "operatorToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An operator token: `manage.py operator_token NAME` mints one, CREWLET_OPERATOR_TOKEN seeds one.",
        }


class StaffSessionScheme(OpenApiAuthenticationExtension):
    target_class = "crewlet.http.auth.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid", "description": "A signed-in staff user's session."}

"""The served schema names each serializer's component once: two serializers of one name would share it."""
from __future__ import annotations

import collections

from drf_spectacular.generators import SchemaGenerator
from rest_framework import serializers


def _project_serializers() -> list[type]:
    found, todo = [], list(serializers.Serializer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.split(".")[0] in ("crewlet", "seats", "notifications", "eventstore", "a2a"):
            found.append(cls)
    return found


def test_no_two_of_the_projects_serializers_share_a_component_name() -> None:
    SchemaGenerator().get_schema(request=None, public=True)  # imports every view the schema serves
    names = collections.Counter(cls.__name__.removesuffix("Serializer") for cls in set(_project_serializers()))
    assert [name for name, count in names.items() if count > 1] == []

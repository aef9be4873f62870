"""The admin of rows the system writes (a seat's pause, the ledger, the active-revision pointer, a channel).

A staff user views them; only the code that owns a row writes it (a pause
through its compare-and-set, a channel through its service), so the admin
adds and edits none, and deletes one only where the model admin says so.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable, never added or edited by hand; deleted by a staff user allowed to only when ``deletable``."""

    deletable = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.deletable and super().has_delete_permission(request, obj)


__all__ = ["ReadOnlyAdmin"]

"""Read-only admin for A2A channel records (the state; the content lives in events)."""
from __future__ import annotations

from typing import Optional

from django.contrib import admin
from django.http import HttpRequest

from a2a.models import Channel


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("id", "asker", "target", "state", "message_count", "opened_at", "closed_at", "closed_by")
    list_filter = ("state",)
    search_fields = ("id", "asker", "target", "closed_by", "turn_id")
    readonly_fields = [f.name for f in Channel._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Optional[Channel] = None) -> bool:
        return False

"""Read-only admin for A2A channel records (the state; the content lives in events)."""
from __future__ import annotations

from django.contrib import admin

from a2a.models import Channel
from crewlet.base.readonly_admin import ReadOnlyAdmin


@admin.register(Channel)
class ChannelAdmin(ReadOnlyAdmin):
    list_display = ("id", "asker", "target", "state", "message_count", "opened_at", "closed_at", "closed_by")
    list_filter = ("state",)
    search_fields = ("id", "asker", "target", "closed_by", "turn_id")
    readonly_fields = [f.name for f in Channel._meta.fields]
    deletable = True

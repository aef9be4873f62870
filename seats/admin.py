"""The admin: seat pauses (with pause/resume actions), the seat record, the completion ledger.

The pause and resume actions call :func:`seats.actions.pause_seat` /
:func:`seats.actions.resume_seat` — the same compare-and-set the API uses, so
only a change that won is announced — with the signed-in user as who did it.
They are offered on the seat record too, because a seat nobody ever paused
has a record (every seat the mailbox walk saw) but no pause row yet.
"""
from __future__ import annotations

from typing import Iterable

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from crewlet.base.readonly_admin import ReadOnlyAdmin
from seats import actions
from seats.actions import SeatNotFound
from seats.delivery_models import LedgerEntry, SeatPause, SeatRecord


def _apply(modeladmin: admin.ModelAdmin, request: HttpRequest, handles: Iterable[str], pause: bool) -> None:
    """Pause or resume each handle; report how many changed, and which could not be."""
    by = request.user.get_username()
    changed, unchanged, refused = 0, 0, []
    for handle in sorted(set(handles)):
        try:
            if pause:
                won = actions.pause_seat(handle, by, "paused from the admin")
            else:
                won = actions.resume_seat(handle, by)
        except SeatNotFound:
            refused.append(handle)
            continue
        except RuntimeError as exc:
            modeladmin.message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return
        if won:
            changed += 1
        else:
            unchanged += 1
    verb = "paused" if pause else "resumed"
    modeladmin.message_user(
        request,
        f"{changed} seat(s) {verb}; {unchanged} already {verb if pause else 'running'}.",
        messages.SUCCESS if changed or not refused else messages.WARNING,
    )
    if refused:
        modeladmin.message_user(
            request, f"Not agent seats of the active company (no inbox to hold): {', '.join(refused)}", messages.WARNING
        )


@admin.action(description="Pause selected seats")
def pause_selected(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset.values_list("handle", flat=True), pause=True)


@admin.action(description="Resume selected seats")
def resume_selected(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset.values_list("handle", flat=True), pause=False)


@admin.register(SeatPause)
class SeatPauseAdmin(ReadOnlyAdmin):
    """The row is the state every node reconciles to: changed only by compare-and-set (the actions), never deleted."""

    list_display = ("handle", "paused", "paused_by", "reason", "paused_at", "stop_running", "version")
    list_filter = ("paused",)
    search_fields = ("handle", "paused_by", "reason")
    ordering = ("handle",)
    actions = [pause_selected, resume_selected]


@admin.register(SeatRecord)
class SeatRecordAdmin(ReadOnlyAdmin):
    list_display = ("handle", "kind", "first_seen", "last_active_at", "absent_since", "retired_at")
    list_filter = ("kind",)
    search_fields = ("handle",)
    ordering = ("handle",)
    actions = [pause_selected, resume_selected]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("seat", "trigger", "turn_id", "event_id", "worked_at")
    list_filter = ("seat",)
    search_fields = ("seat", "trigger", "turn_id", "event_id")
    date_hierarchy = "worked_at"


__all__ = ["LedgerEntryAdmin", "SeatPauseAdmin", "SeatRecordAdmin", "pause_selected", "resume_selected"]

"""The admin of rows the system writes: a staff user views them, adds and edits none, deletes only a channel."""
from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import RequestFactory

from a2a.models import Channel
from crewlet.models import ActivationPointer
from seats.delivery_models import LedgerEntry, SeatPause, SeatRecord

#: Each read-only model, and whether a staff user may delete its rows in the admin.
READ_ONLY = ((ActivationPointer, False), (SeatPause, False), (SeatRecord, False), (LedgerEntry, False), (Channel, True))


@pytest.mark.django_db
def test_rows_the_system_writes_are_viewable_never_added_or_edited_and_deleted_only_where_the_admin_allows() -> None:
    from django.contrib.auth import get_user_model

    request = RequestFactory().get("/admin/")
    request.user = get_user_model().objects.create_superuser("grace-admin", password="pw")
    for model, deletable in READ_ONLY:
        model_admin = admin.site._registry[model]
        allowed = (
            model_admin.has_view_permission(request),
            model_admin.has_add_permission(request),
            model_admin.has_change_permission(request),
            model_admin.has_delete_permission(request),
        )
        assert allowed == (True, False, False, deletable), model.__name__

"""/api/a2a/ routes (mounted by crewlet.urls before /api/). Operator token or staff session, like all of /api/."""
from __future__ import annotations

from django.urls import path

from a2a import api

urlpatterns = [
    path("ask", api.AskView.as_view(), name="api-a2a-ask"),
    path("channels", api.ChannelsView.as_view(), name="api-a2a-channels"),
    path("channels/<str:channel_id>", api.ChannelView.as_view(), name="api-a2a-channel"),
]

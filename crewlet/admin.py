"""The admin of company config revisions (write one, validated like the file; diff it; activate it) and of operator tokens.

A revision is never edited once stored: the change page shows it read-only
with its diff against the active revision and an "Activate" button; a change
is a new revision (the add form, prefilled with the active text). Activation
goes through :func:`crewlet.engine.activation.activate` — the compare-and-set every
caller uses — with the signed-in user as who did it.

And operator tokens, stored only as their hash: the list and the change page
show it read-only, and adding one asks only for a name, mints the token and
shows it once in the confirmation message.
"""
from __future__ import annotations

import difflib
from typing import Any, Optional

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from crewlet.company import revisions
from crewlet.engine import activation
from crewlet.models import ActivationPointer, ConfigRevision
from crewlet.base.readonly_admin import ReadOnlyAdmin
from crewlet.base.tokens import OperatorToken, hash_token, new_token
from crewlet.company.fields import CompanyError
from crewlet.company.instructions import INCLUDED_FILES, files_as_yaml, files_from_yaml


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    return "".join(
        difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), old_name, new_name)
    )


def revision_diff(active: ConfigRevision, obj: ConfigRevision) -> str:
    """The YAML's diff, then each included file's (a file only one of them includes diffed against nothing)."""
    old_files, new_files = active.included_files or {}, obj.included_files or {}
    parts = [unified_diff(active.yaml_text, obj.yaml_text, f"revision {active.pk} (active)", f"revision {obj.pk}")]
    for path in sorted(set(old_files) | set(new_files)):
        parts.append(
            unified_diff(
                old_files.get(path, ""), new_files.get(path, ""),
                f"revision {active.pk} (active): {path}", f"revision {obj.pk}: {path}",
            )
        )
    return "".join(part if part.endswith("\n") or not part else part + "\n" for part in parts)


#: What the change page of a stored revision shows, all read-only.
SHOWN_FIELDS = ("author", "created_at", "note", "imported_from", "diff_against_active", "yaml_text_shown", "included_files_shown")


class ConfigRevisionForm(forms.ModelForm):
    """The company's YAML and the files it includes (path: text, YAML), validated together as the file is."""

    included = forms.CharField(
        label="Included files",
        required=False,
        widget=forms.Textarea(attrs={"rows": 12, "cols": 100, "spellcheck": "false"}),
        help_text="The text of each file the company includes (a seat's instructions_file), as a YAML mapping "
        "of path: text; use a | block for several lines. Files the company does not include are not stored.",
    )

    class Meta:
        model = ConfigRevision
        fields = ("yaml_text", "note")
        widgets = {"yaml_text": forms.Textarea(attrs={"rows": 30, "cols": 100, "spellcheck": "false"})}

    def clean_included(self) -> dict[str, str]:
        try:
            return files_from_yaml(self.cleaned_data.get("included") or "")
        except CompanyError as exc:
            raise forms.ValidationError(str(exc), code="company") from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        text, files = cleaned.get("yaml_text"), cleaned.get("included")
        if text is None or files is None:
            return cleaned  # a field's own error already stands
        try:
            org = revisions.validate(text, files)
        except CompanyError as exc:
            field = "included" if exc.field.startswith(INCLUDED_FILES) else "yaml_text"
            self.add_error(field, forms.ValidationError(str(exc), code="company"))
            return cleaned
        self.instance.included_files = dict(org.source_files)
        return cleaned


def _activate(modeladmin: admin.ModelAdmin, request: HttpRequest, revision: ConfigRevision) -> None:
    try:
        won = activation.activate(revision.pk, request.user.get_username())
    except RuntimeError as exc:
        modeladmin.message_user(request, f"Nothing changed: {exc}", messages.ERROR)
        return
    if won:
        modeladmin.message_user(request, f"Revision {revision.pk} is now active; every node applies it.", messages.SUCCESS)
    else:
        modeladmin.message_user(request, f"Revision {revision.pk} was already active.", messages.INFO)


@admin.action(description="Activate the selected revision")
def activate_selected(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chosen = list(queryset[:2])
    if len(chosen) != 1:
        modeladmin.message_user(request, "Select exactly one revision to activate.", messages.WARNING)
        return
    _activate(modeladmin, request, chosen[0])


@admin.register(ConfigRevision)
class ConfigRevisionAdmin(admin.ModelAdmin):
    form = ConfigRevisionForm
    list_display = ("id", "note", "author", "created_at", "is_active")
    actions = (activate_selected,)
    change_form_template = "admin/crewlet/configrevision/change_form.html"

    @admin.display(boolean=True, description="active")
    def is_active(self, obj: ConfigRevision) -> bool:
        return ActivationPointer.objects.filter(pk=ActivationPointer.ROW_ID, revision_id=obj.pk).exists()

    @admin.display(description="diff against the active revision")
    def diff_against_active(self, obj: Optional[ConfigRevision]) -> str:
        active = revisions.active_revision()
        if obj is None or obj.pk is None:
            return "-"
        if active is None:
            return "No revision is active yet."
        if active.pk == obj.pk:
            return "This is the active revision."
        diff = revision_diff(active, obj)
        return format_html("<pre class='crewlet-diff'>{}</pre>", diff or "(no differences)")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("yaml_text", "included", "note")
        return SHOWN_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return SHOWN_FIELDS

    @admin.display(description="YAML")
    def yaml_text_shown(self, obj: ConfigRevision) -> str:
        return format_html("<pre>{}</pre>", obj.yaml_text)

    @admin.display(description="included files")
    def included_files_shown(self, obj: ConfigRevision) -> str:
        files = obj.included_files or {}
        if not files:
            return "None."
        return format_html_join(
            "", "<h4 class='crewlet-included'>{}</h4><pre>{}</pre>", sorted(files.items())
        )

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        active = revisions.active_revision()
        if active is not None and "yaml_text" not in initial:
            initial["yaml_text"] = active.yaml_text
            initial["included"] = files_as_yaml(active.included_files or {})
        return initial

    def save_model(self, request: HttpRequest, obj: ConfigRevision, form: Any, change: bool) -> None:
        if not change:
            obj.author = request.user.get_username()
        super().save_model(request, obj, form, change)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the history is the audit trail; the active one is protected anyway

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        mine = [
            path(
                "<int:object_id>/activate/",
                self.admin_site.admin_view(self.activate_view),
                name="crewlet_configrevision_activate",
            )
        ]
        return mine + urls

    def activate_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        if request.method != "POST" or not self.has_change_permission(request):
            return HttpResponse(status=405 if request.method != "POST" else 403)
        revision = self.get_object(request, str(object_id))
        if revision is None:
            return HttpResponse(status=404)
        _activate(self, request, revision)
        return HttpResponseRedirect(reverse("admin:crewlet_configrevision_change", args=[revision.pk]))


@admin.register(ActivationPointer)
class ActivationPointerAdmin(ReadOnlyAdmin):
    """Which revision is active, by whom and when: read-only (activate from a revision)."""

    list_display = ("revision", "activated_by", "activated_at")


class OperatorTokenAddForm(forms.ModelForm):
    """Only a name: the token is minted on save and shown once."""

    class Meta:
        model = OperatorToken
        fields = ["name"]


@admin.register(OperatorToken)
class OperatorTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at", "last_used_at")
    search_fields = ("name",)
    readonly_fields = ("name", "token_hash", "created_at", "last_used_at")
    add_form = OperatorTokenAddForm

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
            kwargs["fields"] = ["name"]
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["name"] if obj is None else list(self.readonly_fields)

    def save_model(self, request: HttpRequest, obj: OperatorToken, form: Any, change: bool) -> None:
        if change:
            return  # read-only: revoke (delete) and mint anew instead
        token = new_token()
        obj.token_hash = hash_token(token)
        obj.save()
        self.message_user(
            request,
            f"Operator token for {obj.name!r}: {token} — copy it now, it is stored only as its hash and not shown again.",
            messages.WARNING,
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

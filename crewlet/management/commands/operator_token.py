"""``manage.py operator_token NAME``: mint an operator token for the /api/ reads; printed once."""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from crewlet.base.tokens import OperatorToken


class Command(BaseCommand):
    help = "Mint an operator token (Authorization: Bearer <token>) for /api/. The token is printed once and stored hashed."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", help="who or what the token is for (unique)")
        parser.add_argument("--rotate", action="store_true", help="replace the token of an existing NAME")
        parser.add_argument("--revoke", action="store_true", help="delete NAME's token instead of minting one")

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["name"].strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters")
        if options["revoke"]:
            deleted, _ = OperatorToken.objects.filter(name=name).delete()
            if not deleted:
                raise CommandError(f"no operator token is named {name!r}")
            self.stdout.write(f"revoked operator token {name!r}")
            return
        try:
            _, token = OperatorToken.mint(name, replace=options["rotate"])
        except IntegrityError:
            raise CommandError(f"an operator token named {name!r} exists; --rotate replaces it, --revoke deletes it") from None
        # The token alone on stdout, so `TOKEN=$(manage.py operator_token ci)` works;
        # the advice goes to stderr.
        self.stderr.write(f"operator token {name!r} (shown once; stored hashed):")
        self.stdout.write(token)

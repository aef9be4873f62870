"""``manage.py source_token SEAT``: mint the generic source's token for one seat; printed once, on its own line."""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from notifications.actions import SourceTokenError, mint_source_token, revoke_source_token


class Command(BaseCommand):
    help = (
        "Mint a token for POST /webhooks/generic/SEAT (Authorization: Bearer <token>). "
        "It opens that seat's route only; it is printed once and stored hashed."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("seat", help="the seat handle the token wakes")
        parser.add_argument("--rotate", action="store_true", help="replace SEAT's token (the old one stops working)")
        parser.add_argument("--revoke", action="store_true", help="delete SEAT's token instead of minting one")

    def handle(self, *args: Any, **options: Any) -> None:
        seat: str = options["seat"]
        try:
            if options["revoke"]:
                revoke_source_token(seat)
                self.stdout.write(f"revoked the source token of seat {seat.strip()}")
                return
            token = mint_source_token(seat, rotate=options["rotate"])
        except SourceTokenError as exc:
            raise CommandError(str(exc)) from None
        # The token alone on stdout, so `TOKEN=$(manage.py source_token ada)` works; the advice goes to stderr.
        self.stderr.write(f"source token for seat {seat.strip()} (shown once; stored hashed): POST /webhooks/generic/{seat.strip()}")
        self.stdout.write(token)

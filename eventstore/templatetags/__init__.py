"""The dashboard's template filters (loaded with ``{% load clock %}``)."""

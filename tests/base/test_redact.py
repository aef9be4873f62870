"""The one redaction of the code base (crewlet.base.redact): what it blanks, what it keeps, and that it is idempotent."""
from __future__ import annotations

import pytest

from crewlet.base.redact import REDACTED, is_secret_name, is_secret_param, redact, redact_query

OPENAI_KEY = "sk-proj-Xf3aB9cD2eF7gH1iJ5kL8mN0pQ4rS6tU"
ANTHROPIC_KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_aa"
SLACK_TOKEN = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_APP_TOKEN = "xapp-1-A0123456789-1234567890123-abcdef0123456789"
GITHUB_TOKEN = "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
BEARER = "opaque-bearer-value-51d2e8aa"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"HTTP 401 from the OpenAI API: Incorrect API key provided: {OPENAI_KEY}.", OPENAI_KEY),
        (f"anthropic refused {ANTHROPIC_KEY} (invalid x-api-key)", ANTHROPIC_KEY),
        (f"slack said invalid_auth for {SLACK_TOKEN}", SLACK_TOKEN),
        (f"socket mode with {SLACK_APP_TOKEN} failed", SLACK_APP_TOKEN),
        (f"git clone https://x-access:{GITHUB_TOKEN}@github.com/acme/repo", GITHUB_TOKEN),
        (f"retrying with Authorization: Bearer {BEARER}", BEARER),
        (f"the gateway answered 'Bearer {BEARER}' is unknown", BEARER),
        ("connecting with password=hunter2-hunter2, user=bob", "hunter2-hunter2"),
        ("config: token=tok-5c1e9a2b secret=s3cr3t-7f3a", "tok-5c1e9a2b"),
        ("config: token=tok-5c1e9a2b secret=s3cr3t-7f3a", "s3cr3t-7f3a"),
        ("POST /webhooks/jira?secret=jira-q-secret-7f3a&page=2", "jira-q-secret-7f3a"),
        ("GET /x?Signature=sig-val-1&KEY=key-val-2&api_key=key-val-3&access_token=at-val-4&sig=s-5", "sig-val-1"),
        ("GET /x?Signature=sig-val-1&KEY=key-val-2&api_key=key-val-3&access_token=at-val-4&sig=s-5", "key-val-2"),
        ("GET /x?Signature=sig-val-1&KEY=key-val-2&api_key=key-val-3&access_token=at-val-4&sig=s-5", "key-val-3"),
        ("GET /x?Signature=sig-val-1&KEY=key-val-2&api_key=key-val-3&access_token=at-val-4&sig=s-5", "at-val-4"),
        ("{'password': 'pw-in-a-dict', 'user': 'bob'}", "pw-in-a-dict"),
        ('{"api_key": "key-in-json", "n": 1}', "key-in-json"),
        ("nats://crewlet:url-password-9@127.0.0.1:4222", "url-password-9"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEA"),
    ],
)
def test_redact_blanks_vendor_keys_tokens_and_credential_values_wherever_they_stand(text: str, secret: str) -> None:
    redacted = redact(text)
    assert secret not in redacted and REDACTED in redacted


def test_redact_keeps_what_is_not_a_credential_and_says_which_vendors_key_it_was() -> None:
    kept = "page=2 token_name=env:CREWLET_OPERATOR_TOKEN design=1 monkey=banana sk-learn user-agent: Slackbot"
    assert redact(kept) == kept
    assert redact(f"key {OPENAI_KEY} and {SLACK_TOKEN}") == f"key sk-{REDACTED} and xoxb-{REDACTED}"
    assert redact("GET /x?secret=abc&page=2") == f"GET /x?secret={REDACTED}&page=2"


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {BEARER}",
        f"[(b'authorization', b'Token {BEARER}'), (b'host', b'localhost')]",
        "{'X-Slack-Signature': 'sha256=deadbeef', 'user-agent': 'Slackbot'}",
        "Cookie: sessionid=abc; csrftoken=def",
        f"password=x {OPENAI_KEY} {SLACK_TOKEN} nats://u:p@h",
    ],
)
def test_redacting_twice_changes_nothing_the_first_pass_did_not(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_redact_query_judges_a_parameter_by_its_decoded_name_and_replaces_its_value_whole() -> None:
    # %73ecret is "secret"; the value's encoded & (%26) must not leave its tail behind as a parameter.
    assert redact_query("%73ecret=ab%26cd&page=2") == f"%73ecret={REDACTED}&page=2"
    assert redact_query("token=a&Token=b;API-KEY=c&q=" + OPENAI_KEY) == (
        f"token={REDACTED}&Token={REDACTED};API-KEY={REDACTED}&q=sk-{REDACTED}"
    )
    assert redact_query("") == "" and redact_query("page=2&flag") == "page=2&flag"


def test_names_holding_credentials_are_recognised_and_a_parameter_called_key_is_one() -> None:
    assert all(is_secret_name(n) for n in ("access_token", "x-hub-signature-256", "signing_secret", "PASSWORD"))
    assert not any(is_secret_name(n) for n in ("token_name", "page", "design"))
    assert all(is_secret_param(n) for n in ("key", "api_key", "Access-Key", "sig", "secret"))
    assert not any(is_secret_param(n) for n in ("monkey", "page", "keyboard"))


def test_a_percent_encoded_credential_name_in_free_text_is_redacted_like_the_name_it_spells() -> None:
    line = "Bad Request: /api/events?%73ecret=conf-head-1234&page=2&%70age=3&api%5Fkey=abc123"
    assert redact(line) == f"Bad Request: /api/events?%73ecret={REDACTED}&page=2&%70age=3&api%5Fkey={REDACTED}"
    assert redact(redact(line)) == redact(line)

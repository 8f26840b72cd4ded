"""Standard Webhooks signatures (https://www.standardwebhooks.com), made by the maintained
`standardwebhooks` library rather than by hand.

Every configured secret signs (rotation): `webhook-signature` carries one `v1,<base64>` per
secret, space-separated, the first configured first, so a receiver holding either the old or
the new secret verifies. The timestamp is the send time (receivers reject stale ones); the
`webhook-id` is the event's, the same on every attempt.
"""
from __future__ import annotations

import binascii
import functools
import uuid
from datetime import datetime, timezone
from typing import Sequence

from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from agentq.errors import ConfigError

SECRET_VARIABLE = "AGENTQ_WEBHOOK_SECRET"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
EVENT_ID_PREFIX = "msg_"


def new_event_id() -> str:
    """A fresh `webhook-id`: stable for one event across all its attempts."""
    return f"{EVENT_ID_PREFIX}{uuid.uuid4().hex}"


@functools.lru_cache(maxsize=8)
def _signers(secrets: tuple[str, ...]) -> tuple[Webhook, ...]:
    if not secrets:
        raise ConfigError(SECRET_VARIABLE, "no webhook secret is configured")
    signers = []
    for position, secret in enumerate(secrets, start=1):
        try:
            signers.append(Webhook(secret))
        except (binascii.Error, ValueError, EmptyWebhookSecretError):
            # Never echo the secret; say which one is wrong.
            raise ConfigError(SECRET_VARIABLE,
                              f"secret #{position} is not `whsec_` + base64") from None
    return tuple(signers)


def check_secrets(secrets: Sequence[str]) -> None:
    """Raise ConfigError unless every secret can sign."""
    _signers(tuple(secrets))


def signed_headers(secrets: Sequence[str], event_id: str, body: str,
                   at: datetime | None = None) -> dict[str, str]:
    """The three `webhook-*` headers for `body` (the exact text that will be sent)."""
    signers = _signers(tuple(secrets))
    # Whole seconds: the header and the signed text must name the same instant.
    at = (at or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(microsecond=0)
    signatures = " ".join(signer.sign(msg_id=event_id, timestamp=at, data=body)
                          for signer in signers)
    return {ID_HEADER: event_id, TIMESTAMP_HEADER: str(int(at.timestamp())),
            SIGNATURE_HEADER: signatures}


def check_module_secret(secret: str) -> None:
    """Raise ValidationFailed({"secret": ...}) unless a tool module's secret can sign (the
    secret itself is never echoed)."""
    from agentq.errors import ValidationFailed
    try:
        Webhook(secret)
        ok = secret.startswith("whsec_") and len(secret) > len("whsec_")
    except (binascii.Error, ValueError, EmptyWebhookSecretError, TypeError):
        ok = False
    if not ok:
        raise ValidationFailed({"secret": ["Must be `whsec_` followed by base64."]},
                               "The module secret is not valid.")


def signed_headers_with(secret: str, event_id: str, body: str) -> dict[str, str]:
    """The `webhook-*` headers for a request to a tool module, signed with its secret."""
    at = datetime.now(timezone.utc).replace(microsecond=0)
    signature = Webhook(secret).sign(msg_id=event_id, timestamp=at, data=body)
    return {ID_HEADER: event_id, TIMESTAMP_HEADER: str(int(at.timestamp())),
            SIGNATURE_HEADER: signature}

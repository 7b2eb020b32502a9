"""RevokedTokens: revoked token ids (``jti``), and one cutoff item per client
(``CLIENT#{client_id}``) that ends every token it authenticated for before a moment."""

from __future__ import annotations

from collections.abc import Iterable

from . import keys, tables
from .dynamo import Read, table

CUTOFF_ATTRIBUTES = ("cutoff_ms", "superseded_cutoff_ms", "pending_cutoff_ms", "pending_cutoff_at_epoch")


def lookup(jtis: Iterable[str], client_id: str, *, consistent: bool) -> Read:
    """The read of ``jtis``' revocations and the client's cutoff item, for a BatchGetItem
    that may carry other tables' keys too (``found`` reads its answer)."""
    return Read(
        tables.REVOKED_TOKENS,
        [keys.revocation_key(jti) for jti in jtis] + [keys.cutoff_key(client_id)],
        CUTOFF_ATTRIBUTES,
        consistent,
    )


def found(items: Iterable[dict], client_id: str) -> tuple[set[str], dict]:
    """(the revoked jtis, the client's cutoff item or {}) among the items ``lookup`` found."""
    by_jti = {item["token_jti"]: item for item in items}
    cutoff = by_jti.pop(keys.cutoff_key(client_id)["token_jti"], {})
    return set(by_jti), cutoff


def revoke(jti: str, attributes: dict, expires_at: int) -> None:
    table(tables.REVOKED_TOKENS).put_item(
        Item={**keys.revocation_key(jti), **attributes, tables.TTL_ATTRIBUTE: expires_at}
    )


def cutoff_update(client_id: str, before_ms: int, effective_at: int | None, expires_at: int) -> dict:
    """The transaction action that ends the client's tokens authenticated before
    ``before_ms``: at once, or from ``effective_at`` (epoch seconds) on. Cutoffs only grow,
    so it is a blind update; a rotation that replaces a pending cutoff makes that one
    effective at once (``superseded_cutoff_ms``)."""
    if effective_at is None:
        expression, values = "SET cutoff_ms = :before", {}
    else:
        expression = (
            "SET superseded_cutoff_ms = if_not_exists(pending_cutoff_ms, :zero), "
            "pending_cutoff_ms = :before, pending_cutoff_at_epoch = :at"
        )
        values = {":zero": 0, ":at": effective_at}
    return {
        "Update": {
            "TableName": tables.REVOKED_TOKENS.physical_name,
            "Key": keys.cutoff_key(client_id),
            "UpdateExpression": f"{expression}, client_id = :client, {tables.TTL_ATTRIBUTE} = :ttl",
            "ExpressionAttributeValues": {**values, ":before": before_ms, ":client": client_id, ":ttl": expires_at},
        }
    }

"""Secrets Manager: the token signing key and the provisioning key, read through Powertools
Parameters and kept for ``SECRET_CACHE_SECONDS`` (a rotated secret reaches warm containers
within it)."""

from __future__ import annotations

import functools
import os

from aws_lambda_powertools.utilities import parameters

from .. import state
from . import client

SECRET_CACHE_SECONDS = 300


@functools.lru_cache(maxsize=1)
def _secrets() -> parameters.SecretsProvider:
    """Powertools' provider on the process's one Secrets Manager client (no second boto3 session)."""
    return parameters.SecretsProvider(boto3_client=client("secretsmanager"))


state.kept(_secrets.cache_clear)


def _secret(env: str, default_name: str) -> str:
    return _secrets().get(os.environ.get(env, default_name), max_age=SECRET_CACHE_SECONDS)


def signing_key() -> str:
    return _secret("JWT_SECRET_NAME", "price-keeper/jwt-signing-key")


def provisioning_key() -> str:
    return _secret("PROVISIONING_SECRET_NAME", "price-keeper/provisioning-api-key")

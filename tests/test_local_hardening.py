"""``make run``'s own state: ``.local/`` holds the journal, which holds the JWT signing key
and the provisioning key, so it is private from the first start."""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.local_server import launch
from tests.tenants import new_tenant

pytestmark = pytest.mark.e2e

KEY = "local-hardening-provisioning-key"


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@contextmanager
def persisted_server(tmp_path: Path, state: Path):
    """The local server persisting under ``state``, started with the common umask 022 (the
    one that made files 644 and folders 755)."""
    with umask(0o022):
        server = launch(tmp_path, KEY, LOCAL_PERSIST="on", LOCAL_STATE_DIR=str(state))
    try:
        yield server.base_url
    finally:
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)


def journaled(journal: Path) -> list[str]:
    """The bodies of the requests in moto's journal, decoded."""
    bodies = []
    for line in journal.read_text().splitlines():
        request = json.loads(line)
        body = request.get("body") or ""
        bodies.append(base64.b64decode(body).decode(errors="replace") if request.get("body_encoded") else body)
    return bodies


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_folder_is_0700_and_the_journal_0600_from_the_first_start(tmp_path):
    state = tmp_path / "state"
    with persisted_server(tmp_path, state) as base_url:
        new_tenant(base_url, KEY, apps=())  # a first org, as a newcomer makes
        journal = state / "moto-journal.jsonl"
        assert any(KEY in request for request in journaled(journal))  # what there is to protect
        assert (mode(state), mode(journal)) == (0o700, 0o600)
        assert all(mode(path) & 0o077 == 0 for path in state.iterdir())


def test_a_state_folder_left_readable_is_made_private_at_start(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    journal = state / "moto-journal.jsonl"
    journal.touch(mode=0o644)
    os.chmod(state, 0o755)
    os.chmod(journal, 0o644)
    with persisted_server(tmp_path, state):
        assert (mode(state), mode(journal)) == (0o700, 0o600)

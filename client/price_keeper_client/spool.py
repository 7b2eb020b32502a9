"""A durable spool of usage records not yet counted by the service: one file per keeper.

Each record is appended to the keeper's own file when it is queued, in one ``write`` (so a
killed process leaves it in the file), and the file is ``fsync``'d before every batch is
sent (``fsync="always"``: at every record). A delivered record (or one the service refused
for good) gets a ``done`` line; a file whose records are all done is truncated. The file
is locked (``flock``) while its keeper lives: a file nobody holds is a dead process's,
and the next keeper to start on the directory adopts its unfinished records (copies them
to its own file, synced, then deletes the old one) and sends them. The service counts a
``request_id`` once, so a record sent just before its process died and sent again after
the restart is counted once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from .errors import parse_timestamp
from .models import UsageRecord

log = logging.getLogger("price_keeper_client")

SUFFIX = ".spool"
_FIELDS = {field.name: field for field in dataclasses.fields(UsageRecord)}


def record_from_json(body: dict) -> UsageRecord:
    """The inverse of ``UsageRecord.to_json`` (fields it leaves out take their defaults)."""
    values = {name: body[name] for name in _FIELDS if name in body}
    values["timestamp"] = parse_timestamp(body["timestamp"])
    return UsageRecord(**values)


class Spool:
    """The spool file of one keeper under ``directory``."""

    def __init__(self, directory: str | os.PathLike, *, fsync: str = "batch"):
        if fsync not in ("batch", "always"):
            raise ValueError('fsync must be "batch" or "always"')
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._always = fsync == "always"
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._dirty = False

    def add(self, records: Iterable[UsageRecord]) -> None:
        records = list(records)
        data = b"".join(json.dumps({"record": r.to_json()}).encode() + b"\n" for r in records)
        with self._lock:
            os.write(self._fd, data)
            self._live.update(record.request_id for record in records)
            self._dirty = True
            if self._always:
                self._sync()

    def sync(self) -> None:
        """fsync what was appended since the last sync."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def done(self, request_ids: Iterable[str]) -> None:
        """Marks records counted (or refused for good): never sent again."""
        ids = [request_id for request_id in request_ids]
        with self._lock:
            self._live.difference_update(ids)
            if not self._live:
                os.ftruncate(self._fd, 0)  # nothing left to send: start the file afresh
                self._dirty = False
            else:
                os.write(self._fd, json.dumps({"done": ids}).encode() + b"\n")
                self._dirty = True

    @property
    def unsent(self) -> int:
        with self._lock:
            return len(self._live)

    def adopt(self) -> list[UsageRecord]:
        """The unfinished records of every dead keeper's file in the directory, now in this
        one (synced); their files are deleted."""
        adopted: dict[str, UsageRecord] = {}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:  # adopted by another keeper meanwhile
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # its keeper is alive
                    continue
                records = read_unfinished(path)
                fresh = [record for record in records if record.request_id not in adopted]
                if fresh:
                    self.add(fresh)
                    self.sync()
                adopted.update((record.request_id, record) for record in fresh)
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        if adopted:
            log.warning("%d unsent usage records adopted from the spool %s", len(adopted), self.directory)
        return list(adopted.values())

    def close(self) -> None:
        """Releases the file; deleted when nothing in it is left to send."""
        with self._lock:
            if self._fd < 0:
                return
            if not self._live:
                self.path.unlink(missing_ok=True)
            else:
                self._sync()
            os.close(self._fd)
            self._fd = -1


def read_unfinished(path: Path) -> list[UsageRecord]:
    """The records of a spool file without a ``done`` line (a torn last line is skipped)."""
    records: dict[str, UsageRecord] = {}
    done: set[str] = set()
    for line in path.read_bytes().splitlines():
        try:
            entry = json.loads(line)
            if "record" in entry:
                record = record_from_json(entry["record"])
                records.setdefault(record.request_id, record)
            else:
                done.update(entry.get("done") or ())
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable line skipped in the spool file %s", path)
    return [record for request_id, record in records.items() if request_id not in done]

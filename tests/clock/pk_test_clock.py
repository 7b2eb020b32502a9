"""The suite on a shifted clock: ``TEST_UTC_TIME=00:30 make test`` runs every test, and every
Python process a test starts (the local server, the CLI), as if it were 00:30 UTC today,
the clock ticking on from there. Between 00:00 and 05:00 UTC the org day of an org in New
York is still yesterday, so a test that takes the UTC date for the org's day fails in that
window; run so, the suite shows it at any hour of the day.

The test process computes the shift once (``TEST_CLOCK_SHIFT_SECONDS``) and puts this folder
on ``PYTHONPATH``, whose ``sitecustomize`` applies it in each process started after, so all
of them read the same shifted time. ``time_machine`` moves what the clock says (``time.time``,
``datetime.now``), not ``time.monotonic``, so timeouts and sleeps are real."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

WANTED = "TEST_UTC_TIME"  # HH:MM, UTC
SHIFT = "TEST_CLOCK_SHIFT_SECONDS"
_traveller = None


def shift_from_environment() -> None:
    """In the test run's first process: the shift to ``TEST_UTC_TIME`` today, and this folder
    on ``PYTHONPATH`` for the processes started after."""
    if not os.environ.get(WANTED) or SHIFT in os.environ:
        return
    hour, minute = (int(part) for part in os.environ[WANTED].split(":"))
    now = datetime.now(UTC)
    os.environ[SHIFT] = str((now.replace(hour=hour, minute=minute, second=0, microsecond=0) - now).total_seconds())
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))


def travel() -> None:
    """Move this process's clock by the run's shift (once; nothing when none is set)."""
    global _traveller
    if _traveller is not None or SHIFT not in os.environ:
        return
    import time_machine

    _traveller = time_machine.travel(datetime.now(UTC) + timedelta(seconds=float(os.environ[SHIFT])), tick=True)
    _traveller.start()

"""``PriceKeeper``: the runtime API as an application uses it."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import requests

from .auth import Principal, TokenManager
from .bedrock import ConverseResult, ConverseStream, GuardedBedrock
from .errors import PriceKeeperError, RateLimitExceeded, Unauthorized
from .models import (
    BatchResult,
    CarriedSelection,
    DailySpend,
    LabelQuota,
    ModelChoice,
    Reservation,
    UsageReceipt,
    UsageRecord,
)
from .reporter import UsageReporter
from .retry import RetryPolicy
from .selection import ModelSelector
from .spool import Spool
from .transport import DEFAULT_URL, Transport

log = logging.getLogger("price_keeper_client")

API = "/api/v1"
UNAVAILABLE_WARNING_EVERY_SECS = 60.0


def url_from_env() -> str:
    return os.environ.get("PRICE_KEEPER_URL") or DEFAULT_URL


class PriceKeeper:
    """Logs in with client credentials and guards Bedrock calls with the service.

    ``org_id``/``app_id`` default to the ones the client id names. With
    ``report_in_background=True`` usage goes through a queue sent in batches (call
    ``flush()``/``close()`` before exit); otherwise each call reports before returning and
    hands the record to the queue only if the service stays unreachable after retries.
    With ``hard_cap=True`` every ``converse``/``converse_stream`` reserves its worst case
    first (``reserve``) and calls the label the reservation names; see ``GuardedBedrock``.

    ``on_unavailable="fail_open"``: while the service cannot be reached (no connection, 5xx),
    ``select_model`` keeps answering the last choice (else the first label of the ordering,
    when a label map was read) for at most ``fail_open_for``, with a warning at most once a
    minute; ``"fail_closed"`` (the default) raises. ``spool_dir`` (or
    ``PRICE_KEEPER_SPOOL_DIR``): queued records are kept on disk until counted (``spool.py``).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        org_id: str | None = None,
        app_id: str | None = None,
        session: requests.Session | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        report_in_background: bool = False,
        bedrock_client: Any = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        hard_cap: bool = False,
        reservation_ttl_secs: int | None = None,
        on_unavailable: str = "fail_closed",
        fail_open_for: timedelta = timedelta(minutes=15),
        spool_dir: str | os.PathLike | None = None,
        spool_fsync: str = "batch",
        redeliver_after: float = 5.0,
    ):
        if not client_id or not client_secret:
            raise ValueError("client_id and client_secret are required")
        if on_unavailable not in ("fail_closed", "fail_open"):
            raise ValueError('on_unavailable must be "fail_closed" or "fail_open"')
        self.on_unavailable = on_unavailable
        self.fail_open_for = fail_open_for
        self._monotonic = monotonic
        self._down_since: float | None = None
        self._warned_at: float | None = None
        self._last_choice: ModelChoice | None = None
        self._label_models: list[tuple[str, str | None]] = []  # (label, bedrock_model_id) as last read
        self._label_status: dict[str, str] = {}
        self._state_lock = threading.Lock()
        spool_dir = spool_dir or os.environ.get("PRICE_KEEPER_SPOOL_DIR")
        principal = Principal.from_client_id(client_id)
        self.org_id = org_id or principal.org_id
        self.app_id = app_id or principal.app_id
        self.transport = Transport(url, session=session, timeout=timeout)
        self.tokens = TokenManager(self.transport, client_id, client_secret, clock=clock)
        self.selector = ModelSelector(self._fetch_selection, clock=monotonic)
        self.spool = Spool(Path(spool_dir), fsync=spool_fsync) if spool_dir else None
        self.reporter = UsageReporter(
            self._send_usage,
            self._send_usage_batch,
            retry=retry,
            on_quota=self._heard_quota,
            on_total=self.selector.observe_total,
            spool=self.spool,
            redeliver_after=redeliver_after,
        )
        if self.spool is not None:
            self.reporter.resume(self.spool.adopt())
        self.report_in_background = report_in_background
        self._bedrock_client = bedrock_client
        self.hard_cap = hard_cap
        self.reservation_ttl_secs = reservation_ttl_secs
        self._bedrock: GuardedBedrock | None = None

    @classmethod
    def from_env(cls, **kwargs: Any) -> PriceKeeper:
        """Reads ``PRICE_KEEPER_URL``, ``PRICE_KEEPER_CLIENT_ID`` and ``PRICE_KEEPER_CLIENT_SECRET``."""
        client_id = os.environ.get("PRICE_KEEPER_CLIENT_ID")
        client_secret = os.environ.get("PRICE_KEEPER_CLIENT_SECRET")
        if not client_id or not client_secret:
            raise ValueError("set PRICE_KEEPER_CLIENT_ID and PRICE_KEEPER_CLIENT_SECRET")
        return cls(url_from_env(), client_id, client_secret, **kwargs)

    def __enter__(self) -> PriceKeeper:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------------------------

    def _app_path(self, suffix: str) -> str:
        if not self.app_id:
            raise ValueError("this call needs an app: use app client credentials or pass app_id")
        return f"{API}/orgs/{self.org_id}/apps/{self.app_id}/{suffix}"

    def _call(self, method: str, path: str, **kwargs: Any):
        """An authenticated request; a refused access token is renewed once and the call repeated."""
        try:
            return self.transport.request(method, path, headers=self.tokens.authorization(), **kwargs)
        except Unauthorized:
            self.tokens.forget_access_token()
            return self.transport.request(method, path, headers=self.tokens.authorization(), **kwargs)

    # -- model selection -------------------------------------------------------------------------

    def _fetch_selection(self, force: bool) -> tuple[ModelChoice, str | None]:
        reply = self._call("GET", self._app_path("model-selection"), params={"force_check": "true"} if force else None)
        choice = ModelChoice.from_json(reply.body)
        statuses = ((reply.body.get("quota_status") or {}).get("models_status")) or {}
        with self._state_lock:
            self._label_status = {label: value.get("status") for label, value in statuses.items() if value}
        return choice, reply.headers.get("cache-control")

    def _heard_quota(self, quota: LabelQuota | None) -> None:
        """A label's position from a usage answer: the selection cache's, and ``label_status``."""
        self.selector.observe(quota)
        if quota is not None and quota.label and quota.status:
            with self._state_lock:
                self._label_status[quota.label] = quota.status

    def label_status(self, label: str) -> str | None:
        """The label's quota position as last heard (selection or usage answer): ``NORMAL``,
        ``TIGHT``, ``EXCEEDED``, or None when the service has not said."""
        with self._state_lock:
            return self._label_status.get(label)

    def label_models(self) -> list[tuple[str, str | None]]:
        """Every label of the app's ordering (and any other it spent on today) with its model
        or profile ARN, in the ordering's order, from today's aggregates."""
        labels = [(label.label, label.bedrock_model_id) for label in self.daily_spend().labels]
        with self._state_lock:
            self._label_models = labels
        return labels

    def select_model(self, force: bool = False) -> ModelChoice:
        """The model to call now (cached as the service advises). Raises ``QuotaExceeded``;
        when the service cannot be reached, see ``on_unavailable``."""
        try:
            choice = self.selector.current(force)
        except PriceKeeperError as error:
            if not self.unreachable(error):
                raise
            return self._fail_open(error)
        with self._state_lock:
            self._last_choice, self._down_since = choice, None
        return choice

    @staticmethod
    def unreachable(error: PriceKeeperError) -> bool:
        """The service could not be reached or failed (no connection, 5xx), not a refusal."""
        return error.retryable and not isinstance(error, RateLimitExceeded)

    def failing_open(self, error: PriceKeeperError) -> bool:
        """Whether a call may go on without the service (``fail_open``, within ``fail_open_for``
        of the first failure); logs a warning at most once a minute. Raises nothing."""
        if self.on_unavailable != "fail_open":
            return False
        now = self._monotonic()
        with self._state_lock:
            if self._down_since is None:
                self._down_since = now
            down_for = now - self._down_since
            if down_for > self.fail_open_for.total_seconds():
                return False
            warn = self._warned_at is None or now - self._warned_at >= UNAVAILABLE_WARNING_EVERY_SECS
            if warn:
                self._warned_at = now
        if warn:
            left = self.fail_open_for.total_seconds() - down_for
            log.warning("price keeper unreachable (%s): failing open for %.0f s more", error.code, left)
        return True

    def _fail_open(self, error: PriceKeeperError) -> ModelChoice:
        if not self.failing_open(error):
            raise error
        with self._state_lock:
            choice, labels = self._last_choice, self._label_models
        if choice is None and labels and labels[0][1]:
            label, model = labels[0]
            choice = ModelChoice(label, model, "FAIL_OPEN", "NORMAL", None, 0, None, None, None, None, {})
        if choice is None:
            raise error
        return choice

    # -- usage -----------------------------------------------------------------------------------

    def _report(self, suffix: str, body: dict) -> dict:
        """POSTs a usage report; it asks for the model selection too when the cached choice is
        due for renewal (``ModelSelector.ask_with_report``), and the carried one renews it."""
        asked = self.selector.ask_with_report()
        try:
            answer = self._call(
                "POST", self._app_path(suffix), json=body, params={"model_selection": "true"} if asked else None
            ).body
        except BaseException:
            if asked:
                self.selector.renew(None)
            raise
        if asked:
            self.selector.renew(CarriedSelection.find(answer))
        return answer

    def _send_usage(self, record: UsageRecord) -> UsageReceipt:
        return UsageReceipt.from_json(self._report("usage", record.to_json()))

    def _send_usage_batch(self, records: Sequence[UsageRecord]) -> BatchResult:
        body = {"requests": [record.to_json() for record in records]}
        return BatchResult.from_json(self._report("usage/batch", body))

    def report_usage(self, record: UsageRecord) -> UsageReceipt:
        """Reports one record now, retrying transient failures with the same ``request_id``."""
        return self.reporter.report(record)

    def report_usage_batch(self, records: Iterable[UsageRecord]) -> list[BatchResult]:
        """Reports records now, at most 100 per call."""
        return self.reporter.report_batch(records)

    def submit_usage(self, record: UsageRecord) -> None:
        """Queues a record for the background sender."""
        self.reporter.submit(record)

    def record_usage(self, record: UsageRecord) -> UsageReceipt | None:
        """Reports as configured; a record the service cannot take right now goes to the queue."""
        if self.report_in_background:
            self.reporter.submit(record)
            return None
        try:
            return self.reporter.report(record)
        except PriceKeeperError as error:
            if not error.retryable:
                raise
            log.warning("usage report for %s queued for later: %s", record.request_id, error.code)
            self.reporter.submit(record)
            return None

    def flush(self, timeout: float | None = None) -> bool:
        return self.reporter.flush(timeout)

    # -- reservations (hard cap) -----------------------------------------------------------------

    def reserve(
        self,
        max_input_tokens: int,
        max_output_tokens: int,
        *,
        model_label: str | None = None,
        max_cache_write_input_tokens: int = 0,
        ttl_secs: int | None = None,
        calling_region: str | None = None,
        service_tier: str | None = None,
        latency_optimized: bool = False,
    ) -> Reservation:
        """Hold a call's worst-case cost on the first label (or ``model_label``) whose quota,
        and the scope's total cap, can hold it, priced in ``calling_region`` (the Bedrock
        Region the call goes to) at ``service_tier``. Raises ``QuotaExceeded`` when none can."""
        body: dict[str, Any] = {"max_input_tokens": max_input_tokens, "max_output_tokens": max_output_tokens}
        if service_tier and service_tier != "default":
            body["service_tier"] = service_tier
        if latency_optimized:
            body["latency_optimized"] = True
        if model_label:
            body["model_label"] = model_label
        if calling_region:
            body["calling_region"] = calling_region
        if max_cache_write_input_tokens:
            body["max_cache_write_input_tokens"] = max_cache_write_input_tokens
        if ttl_secs or self.reservation_ttl_secs:
            body["ttl_secs"] = ttl_secs or self.reservation_ttl_secs
        return Reservation.from_json(self._call("POST", self._app_path("reservations"), json=body).body)

    def release(self, reservation_id: str) -> None:
        """Give a hold back when its call never happened (idempotent)."""
        self._call("DELETE", self._app_path(f"reservations/{reservation_id}"))

    # -- Bedrock ---------------------------------------------------------------------------------

    @property
    def bedrock(self) -> GuardedBedrock:
        if self._bedrock is None:
            client = self._bedrock_client
            if client is None:
                import boto3

                client = boto3.client("bedrock-runtime")
            if self.hard_cap:
                self._bedrock = GuardedBedrock(
                    client,
                    self.select_model,
                    self.record_usage,
                    self.reserve,
                    self.release,
                )
            else:
                self._bedrock = GuardedBedrock(client, self.select_model, self.record_usage)
        return self._bedrock

    def converse(self, messages: list[dict], **kwargs: Any) -> ConverseResult:
        """Bedrock Converse with the recommended model; its token usage is reported (a call
        that fails after reaching Bedrock as ``ERROR``, then its error is raised)."""
        return self.bedrock.converse(messages, **kwargs)

    def converse_stream(self, messages: list[dict], **kwargs: Any) -> ConverseStream:
        """Bedrock ConverseStream with the recommended model: iterate the result for the
        stream's events, unchanged; its usage is reported when the stream ends (from the
        ``metadata`` event), or as ``ERROR`` with what is known when it breaks."""
        return self.bedrock.converse_stream(messages, **kwargs)

    # -- aggregates ------------------------------------------------------------------------------

    def daily_spend(self, day: str | date = "today", *, app_id: str | None = None) -> DailySpend:
        """Spend against quota per label for ``today`` or a ``YYYY-MM-DD`` org-local day
        (of the app, or the org when the client is an org client)."""
        app_id = app_id or self.app_id
        scope = f"{API}/orgs/{self.org_id}" + (f"/apps/{app_id}" if app_id else "")
        day = day.isoformat() if isinstance(day, date) else day
        return DailySpend.from_json(self._call("GET", f"{scope}/aggregates/{day}").body)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self, timeout: float | None = 30.0) -> bool:
        """Sends queued usage, revokes the refresh token and closes connections.
        False if usage was left unsent or the revocation failed."""
        delivered = self.reporter.close(timeout)
        if not delivered:
            log.error("%d usage records left unsent", len(self.reporter.undelivered) + self.reporter.pending)
        revoked = self.tokens.close()
        self.transport.close()
        return delivered and revoked

"""The model-selection cache: how long an answer is reused, and what makes the client ask again."""

from __future__ import annotations

import pytest

from price_keeper_client import ModelChoice, QuotaExceeded
from price_keeper_client.models import CarriedSelection, LabelQuota, ScopeTotal
from price_keeper_client.selection import ModelSelector, cache_seconds

from .conftest import FakeClock


def choice(label="premium", mode="NORMAL", reason="NORMAL", cache=300) -> ModelChoice:
    return ModelChoice.from_json(
        {
            "recommended_model": {"label": label, "bedrock_model_id": f"{label}-id", "reason": reason},
            "quota_status": {"mode": mode, "quota_pct": 12.5},
            "client_guidance": {"check_frequency": f"PERIODIC_{cache}S", "cache_duration_secs": cache},
        }
    )


@pytest.mark.parametrize(
    "guidance,cache_control,expected",
    [
        (300, "max-age=300, private", 300),
        (60, "max-age=60, private", 60),
        (300, "private, max-age=30", 30),  # the header is shorter: it wins
        (60, "max-age=300", 60),  # the guidance is shorter: it wins
        (300, None, 300),
        (300, "no-store", 0),
    ],
)
def test_cache_lifetime_is_the_shorter_of_guidance_and_max_age(guidance, cache_control, expected):
    assert cache_seconds(choice(cache=guidance), cache_control) == expected


class Answers:
    """Plays the service: hands out queued answers and counts how often it was asked."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = 0

    def __call__(self, force):
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_answer_is_reused_until_it_expires():
    clock = FakeClock()
    service = Answers((choice(cache=300), "max-age=300"), (choice(mode="TIGHT", cache=60), "max-age=60"))
    selector = ModelSelector(service, clock=clock)
    assert selector.current().mode == "NORMAL"
    clock.advance(299)
    assert selector.current().mode == "NORMAL" and service.asked == 1
    clock.advance(2)
    assert selector.current().mode == "TIGHT" and service.asked == 2
    clock.advance(59)
    selector.current()
    assert service.asked == 2


def test_force_always_asks():
    service = Answers((choice(), None), (choice(label="standard"), None))
    selector = ModelSelector(service, clock=FakeClock())
    selector.current()
    assert selector.current(force=True).label == "standard" and service.asked == 2


def test_a_429_drops_the_cache_and_the_next_call_asks_again():
    clock = FakeClock()
    spent = QuotaExceeded("All model quotas exceeded for today", status=429)
    service = Answers((choice(cache=60), None), spent, (choice(label="economy"), None))
    selector = ModelSelector(service, clock=clock)
    selector.current()
    clock.advance(61)
    with pytest.raises(QuotaExceeded):
        selector.current()
    assert selector.cached is None
    assert selector.current().label == "economy" and service.asked == 3


@pytest.mark.parametrize(
    "quota,cached_mode,asks_again",
    [
        (LabelQuota("premium", 96.0, "TIGHT", "NORMAL"), "NORMAL", True),
        (LabelQuota("premium", 100.5, "EXCEEDED", None), "TIGHT", True),
        (LabelQuota("premium", 40.0, "NORMAL", "QUOTA_EXCEEDED_ULTRA"), "NORMAL", True),  # reason changed
        (LabelQuota("premium", 97.0, "TIGHT", None), "TIGHT", False),  # already known to be tight
        (LabelQuota("premium", 60.0, "NORMAL", None), "TIGHT", False),  # tight for the total cap, say: keep it
        (LabelQuota("premium", 40.0, "NORMAL", "NORMAL"), "NORMAL", False),
        (LabelQuota("standard", 100.0, "EXCEEDED", None), "NORMAL", False),  # another label
        (None, "NORMAL", False),  # the answer says nothing about quota
    ],
)
def test_usage_answers_invalidate_the_cache_when_the_label_is_spent_or_turns_tight(quota, cached_mode, asks_again):
    service = Answers((choice(mode=cached_mode), None), (choice(label="standard"), None))
    selector = ModelSelector(service, clock=FakeClock())
    selector.current()
    selector.observe(quota)
    selector.current()
    assert service.asked == (2 if asks_again else 1)


def test_label_quota_is_found_in_the_usage_answer_shapes():
    top = {"request_id": "x", "quota_status": {"label": "premium", "mode": "TIGHT", "quota_pct": 96.0}}
    nested = {"request_id": "x", "processing": {"quota": {"model_label": "premium", "status": "EXCEEDED"}}}
    assert LabelQuota.find(top) == LabelQuota("premium", 96.0, "TIGHT", None)
    assert LabelQuota.find(nested) == LabelQuota("premium", None, "EXCEEDED", None)
    ours = {
        "request_id": "x",
        "processing": {"shard_id": 1},
        "daily_total": {"label": "premium", "quota_pct": 100.2, "status": "EXCEEDED", "mode": "TIGHT"},
    }
    assert LabelQuota.find(ours) == LabelQuota("premium", 100.2, "EXCEEDED", None)
    assert LabelQuota.find({"request_id": "x", "processing": {"shard_id": 1}}) is None


def test_label_quotas_are_found_in_a_batch_answer():
    from price_keeper_client.models import BatchResult

    body = {
        "accepted": 2,
        "failed": 0,
        "results": [],
        "daily_totals": [
            {"label": "premium", "quota_pct": 100.4, "status": "EXCEEDED", "mode": "TIGHT"},
            {"label": "standard", "quota_pct": 12.0, "status": "NORMAL", "mode": "NORMAL"},
        ],
    }
    assert BatchResult.from_json(body).quotas == (
        LabelQuota("premium", 100.4, "EXCEEDED", None),
        LabelQuota("standard", 12.0, "NORMAL", None),
    )
    assert BatchResult.from_json({"accepted": 0, "failed": 0, "results": []}).quotas == ()


@pytest.mark.parametrize(
    "status,cached_mode,asks_again",
    [
        ("EXCEEDED", "NORMAL", True),
        ("EXCEEDED", "TIGHT", True),  # passed: whatever the cached answer knew
        ("TIGHT", "NORMAL", True),
        ("TIGHT", "TIGHT", False),  # already known to be tight
        ("NORMAL", "NORMAL", False),
    ],
)
def test_a_usage_answers_scope_total_drops_the_cache_when_tight_or_passed(status, cached_mode, asks_again):
    service = Answers((choice(mode=cached_mode), None), (choice(label="standard"), None))
    selector = ModelSelector(service, clock=FakeClock())
    selector.current()
    selector.observe_total(ScopeTotal("20260123", 5_000_000, 5_000_000, 100.0, status))
    selector.current()
    assert service.asked == (2 if asks_again else 1)


# --- the selection a usage report asks for (?model_selection=true) ---------------------------


def test_a_report_asks_for_the_selection_once_half_the_choices_life_is_gone_and_its_answer_renews_it():
    clock = FakeClock()
    service = Answers((choice(cache=300), None))
    selector = ModelSelector(service, clock=clock)
    assert not selector.ask_with_report()  # a client that never selected: its reports never ask
    selector.current()
    clock.advance(86)  # a report every ~86 s
    assert not selector.ask_with_report()  # 214 s of 300 left
    clock.advance(86)
    assert selector.ask_with_report()  # 128 s left: less than half
    selector.renew(None)  # that report failed: nothing carried, the ask is over
    clock.advance(86)
    assert selector.cached.label == "premium" and selector.ask_with_report()  # the next report asks again
    selector.renew(CarriedSelection(choice(label="standard", cache=300)))
    assert selector.cached.label == "standard"
    assert not selector.ask_with_report()
    clock.advance(290)  # 300 s from the renewal, not from the first answer
    assert selector.current().label == "standard" and service.asked == 1


def test_an_ask_whose_answer_never_came_is_given_up_after_ten_seconds():
    clock = FakeClock()
    selector = ModelSelector(Answers((choice(cache=60), None)), clock=clock)
    selector.current()
    clock.advance(51)
    assert selector.ask_with_report()
    clock.advance(9)
    assert not selector.ask_with_report()  # the choice has expired, but an ask is out: one at a time
    clock.advance(2)
    assert selector.ask_with_report()


def test_a_carried_selection_of_nothing_means_every_label_is_spent_and_the_next_call_asks():
    spent = QuotaExceeded("All model quotas exceeded for today", status=429)
    service = Answers((choice(), None), spent)
    selector = ModelSelector(service, clock=FakeClock())
    selector.current()
    selector.renew(CarriedSelection(None))
    assert selector.cached is None
    with pytest.raises(QuotaExceeded):
        selector.current()


def test_a_carried_selection_is_found_only_when_the_answer_has_one():
    assert CarriedSelection.find({"request_id": "r"}) is None
    assert CarriedSelection.find({"model_selection": None}) == CarriedSelection(None)
    body = choice(label="economy").raw
    assert CarriedSelection.find({"model_selection": body}).choice.label == "economy"


def test_a_client_reporting_many_times_a_second_asks_once_a_life_not_at_half_of_it():
    """A busy client's reports would all find the choice past half its life: it asks only
    when the choice is within 5 s of its end, so a tight-mode choice (60 s) is renewed once a
    minute, as often as the client used to select, not twice."""
    clock = FakeClock()
    selector = ModelSelector(Answers((choice(mode="TIGHT", cache=60), None)), clock=clock)
    selector.current()
    asks = []
    for _ in range(1_200):  # two minutes of a report every 0.1 s
        clock.advance(0.1)
        if selector.ask_with_report():
            asks.append(round(clock.now - 1_000_000.0, 1))
            selector.renew(CarriedSelection(choice(mode="TIGHT", cache=60)))
    assert asks == [55.1, 110.2]

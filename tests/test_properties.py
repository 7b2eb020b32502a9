"""Property tests (hypothesis) for the cost maths and the org-day boundaries."""

from datetime import UTC, datetime, timedelta
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from price_keeper.config import Prices
from price_keeper.domain.pricing import Tokens, cost_usd_micros
from price_keeper.timeutil import day_start_utc, next_midnight_utc, org_date, org_day

counts = st.integers(min_value=0, max_value=10_000_000)
rates = st.integers(min_value=0, max_value=100_000_000)
tokens = st.builds(Tokens, counts, counts, counts, counts).flatmap(
    lambda t: st.integers(0, t.cache_write).map(lambda one_hour: t._replace(cache_write_1h=one_hour))
)  # the 1-hour writes are a part of the cache writes
prices = st.builds(Prices, rates, rates, rates, rates, rates)
# DST and odd-offset zones named so every run meets them, plus any IANA zone the system has.
DST_ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Pacific/Auckland",
    "Australia/Lord_Howe",
    "America/St_Johns",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "America/Santiago",
]
zones = st.one_of(st.sampled_from(DST_ZONES), st.timezone_keys())
moments = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC))


@given(tokens, prices)
def test_cost_is_the_exact_total_rounded_up_once(usage, price):
    exact = Fraction(
        usage.input * price.input
        + usage.output * price.output
        + usage.cache_read * price.cache_read
        + (usage.cache_write - usage.cache_write_1h) * price.cache_write
        + usage.cache_write_1h * price.cache_write_1h,
        1_000_000,
    )
    cost = cost_usd_micros(usage, price)
    assert isinstance(cost, int) and cost >= 0
    assert cost - 1 < exact <= cost


@given(tokens, prices, st.sampled_from(["input", "output", "cache_read", "cache_write", "cache_write_1h"]), counts)
def test_more_tokens_never_cost_less(usage, price, field, extra):
    more = usage._replace(**{field: getattr(usage, field) + extra})
    if field == "cache_write_1h":  # a 1-hour write is a cache write too
        more = more._replace(cache_write=usage.cache_write + extra)
    assert cost_usd_micros(more, price) >= cost_usd_micros(usage, price)


@given(tokens, tokens, prices)
def test_splitting_a_call_costs_at_most_one_micro_usd_more(a, b, price):
    whole = Tokens(*(x + y for x, y in zip(a, b, strict=True)))
    assert 0 <= cost_usd_micros(a, price) + cost_usd_micros(b, price) - cost_usd_micros(whole, price) <= 1


@settings(max_examples=300)
@given(moments, zones)
def test_a_moment_lies_inside_its_org_day(moment, zone):
    start = day_start_utc(zone, org_date(zone, moment))
    end = next_midnight_utc(zone, moment)
    assert start <= moment < end
    assert org_day(zone, start) == org_day(zone, moment)
    assert org_date(zone, end) == org_date(zone, moment) + timedelta(days=1)


@settings(max_examples=300)
@given(moments, zones)
def test_org_days_last_22_to_27_hours(moment, zone):
    """Most DST shifts are an hour; Antarctica/Troll's is two (UTC+0 and UTC+2), so its
    shortest and longest days are 22 and 26 hours; Antarctica/Casey went from UTC+11 to
    UTC+8 on 8 March 2020, a 27-hour day (every zone's days of 2020-2035 lie within 22 and
    27 hours in the IANA data)."""
    length = next_midnight_utc(zone, moment) - day_start_utc(zone, org_date(zone, moment))
    assert timedelta(hours=22) <= length <= timedelta(hours=27)


def test_casey_on_8_march_2020_lasted_27_hours():
    moment = datetime(2020, 3, 8, 12, tzinfo=UTC)
    start = day_start_utc("Antarctica/Casey", org_date("Antarctica/Casey", moment))
    assert next_midnight_utc("Antarctica/Casey", moment) - start == timedelta(hours=27)

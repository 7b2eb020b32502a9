"""Org-local days: boundaries in several timezones, DST change days (23 and 25 hour days),
the usage timestamp window and the days the aggregator and pricing cover. No AWS."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from price_keeper.domain.metering import booking_day, parse_timestamp
from price_keeper.errors import ApiError
from price_keeper.timeutil import day_start_utc, next_midnight_utc, org_day, org_days_in_play


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    ("tz", "local_day", "start", "hours"),
    [
        ("America/New_York", date(2026, 1, 23), "2026-01-23T05:00:00Z", 24),
        ("America/New_York", date(2026, 3, 8), "2026-03-08T05:00:00Z", 23),  # DST starts
        ("America/New_York", date(2026, 11, 1), "2026-11-01T04:00:00Z", 25),  # DST ends
        ("Europe/Berlin", date(2026, 3, 29), "2026-03-28T23:00:00Z", 23),
        ("Europe/Berlin", date(2026, 10, 25), "2026-10-24T22:00:00Z", 25),
        ("Asia/Kolkata", date(2026, 1, 23), "2026-01-22T18:30:00Z", 24),
        ("Pacific/Auckland", date(2026, 4, 5), "2026-04-04T11:00:00Z", 25),  # NZDT ends
        ("Pacific/Auckland", date(2026, 9, 27), "2026-09-26T12:00:00Z", 23),  # NZDT starts
    ],
)
def test_org_days_start_at_local_midnight_and_last_23_24_or_25_hours(tz, local_day, start, hours):
    begins = day_start_utc(tz, local_day)
    ends = day_start_utc(tz, local_day + timedelta(days=1))
    assert begins == utc(start)
    assert ends - begins == timedelta(hours=hours)
    yyyymmdd = local_day.strftime("%Y%m%d")
    assert org_day(tz, begins) == yyyymmdd
    assert org_day(tz, ends - timedelta(seconds=1)) == yyyymmdd
    assert org_day(tz, begins - timedelta(seconds=1)) != yyyymmdd
    assert next_midnight_utc(tz, begins) == ends
    assert next_midnight_utc(tz, ends - timedelta(seconds=1)) == ends


def test_the_repeated_hour_of_a_fall_back_night_stays_on_one_day():
    first, second = utc("2026-11-01T05:30:00Z"), utc("2026-11-01T06:30:00Z")  # 01:30 EDT, then 01:30 EST
    assert first.astimezone(ZoneInfo("America/New_York")).hour == second.astimezone(ZoneInfo("America/New_York")).hour
    assert org_day("America/New_York", first) == org_day("America/New_York", second) == "20261101"


def test_the_same_instant_is_a_different_day_around_the_world():
    moment = utc("2026-01-23T11:30:00Z")
    assert org_day("Pacific/Auckland", moment) == "20260124"
    assert org_day("Asia/Kolkata", moment) == "20260123"
    assert org_day("America/New_York", moment) == "20260123"
    assert org_day("Pacific/Pago_Pago", utc("2026-01-23T10:59:59Z")) == "20260122"


# --- the usage timestamp window -----------------------------------------------------

NY = "America/New_York"


def rejected(moment: datetime, now: datetime, tz: str = NY) -> ApiError:
    with pytest.raises(ApiError) as raised:
        booking_day(moment, tz, now)
    assert raised.value.status == 400 and raised.value.code == "INVALID_REQUEST"
    return raised.value


def test_window_matches_the_spec_example_and_counts_toward_the_day_of_arrival():
    now = utc("2026-01-23T15:30:45Z")
    assert booking_day(utc("2026-01-22T05:00:00Z"), NY, now) == "20260123"  # stamped yesterday, arrives today
    error = rejected(utc("2026-01-22T04:59:59Z"), now)
    assert error.message == "Timestamp outside acceptable range"
    assert error.details == {
        "timestamp": "2026-01-22T04:59:59Z",
        "org_day": "20260123",
        "timezone": NY,
        "acceptable_range": "2026-01-22T05:00:00Z to 2026-01-24T04:59:59Z",
    }


def test_the_future_is_refused_beyond_five_minutes_of_clock_skew():
    now = utc("2026-01-23T15:30:45Z")
    assert booking_day(now + timedelta(minutes=5), NY, now) == "20260123"
    assert rejected(now + timedelta(minutes=5, seconds=1), now).message == "Timestamp is in the future"


def test_a_call_of_yesterday_keeps_its_day_only_within_the_grace_after_midnight():
    call = utc("2026-01-24T04:59:50Z")  # 23:59:50 in New York
    assert booking_day(call, NY, call) == "20260123"
    assert booking_day(call, NY, call + timedelta(minutes=1)) == "20260123"
    assert booking_day(call, NY, utc("2026-01-24T05:14:59Z")) == "20260123"  # 00:14:59, inside the 15 min
    assert booking_day(call, NY, utc("2026-01-24T05:15:00Z")) == "20260124"  # grace over: today's quota
    assert booking_day(call, NY, call + timedelta(hours=20)) == "20260124"


def test_only_a_call_stamped_within_the_grace_before_midnight_keeps_yesterday():
    """An outside review found that at 00:00 records stamped 23 h earlier were all booked to yesterday. The
    grace is for a call made just before midnight and reported just after it."""
    midnight = utc("2026-01-24T05:00:00Z")  # 00:00 in New York
    for arrival in (midnight, midnight + timedelta(minutes=14, seconds=59)):
        assert booking_day(midnight - timedelta(minutes=15), NY, arrival) == "20260123"  # 23:45:00
        assert booking_day(midnight - timedelta(seconds=1), NY, arrival) == "20260123"
        assert booking_day(midnight - timedelta(minutes=15, seconds=1), NY, arrival) == "20260124"
        assert booking_day(midnight - timedelta(hours=23), NY, arrival) == "20260124"  # 01:00 yesterday


def test_skew_just_before_midnight_counts_toward_the_day_of_arrival():
    now = utc("2026-01-24T04:58:00Z")  # 23:58 in New York; the client's clock is already past midnight
    assert booking_day(utc("2026-01-24T05:01:00Z"), NY, now) == "20260123"


def test_window_on_a_23_hour_day_covers_the_whole_previous_day():
    now = utc("2026-03-09T04:30:00Z")  # 00:30 on Monday after the spring-forward Sunday
    assert booking_day(utc("2026-03-08T05:00:00Z"), NY, now) == "20260309"
    error = rejected(utc("2026-03-08T04:59:59Z"), now)
    assert error.details["acceptable_range"] == "2026-03-08T05:00:00Z to 2026-03-10T03:59:59Z"


def test_window_on_a_25_hour_day_covers_the_whole_previous_day():
    now = utc("2026-11-02T05:30:00Z")  # 00:30 on Monday after the fall-back Sunday (25 h long)
    assert booking_day(utc("2026-11-01T04:00:00Z"), NY, now) == "20261102"
    assert booking_day(utc("2026-11-02T04:59:59Z"), NY, utc("2026-11-02T05:10:00Z")) == "20261101"  # in grace
    rejected(utc("2026-11-01T03:59:59Z"), now)


def test_window_in_auckland_and_kolkata():
    now = utc("2026-04-05T12:30:00Z")  # 00:30 NZST on the 6th, after the 25 h day
    assert booking_day(utc("2026-04-04T11:00:00Z"), "Pacific/Auckland", now) == "20260406"
    rejected(utc("2026-04-04T10:59:59Z"), now, "Pacific/Auckland")
    now = utc("2026-01-23T18:29:59Z")  # 23:59:59 IST
    assert booking_day(utc("2026-01-21T18:30:00Z"), "Asia/Kolkata", now) == "20260123"
    rejected(utc("2026-01-21T18:29:59Z"), now, "Asia/Kolkata")


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_timestamps_at_the_edge_of_the_calendar_are_a_400(text):
    with pytest.raises(ApiError) as raised:
        parse_timestamp(text)
    assert (raised.value.status, raised.value.message) == (400, "Timestamp outside acceptable range")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-23T15:30:45Z", "2026-01-23T15:30:45+00:00"),
        ("2026-01-23T15:30:45.123456Z", "2026-01-23T15:30:45.123456+00:00"),
        ("2026-01-23T10:30:45-05:00", "2026-01-23T15:30:45+00:00"),  # the same instant, in UTC
        ("2026-01-23T15:30:45", "2026-01-23T15:30:45+00:00"),  # no offset: UTC
    ],
)
def test_timestamps_are_iso_8601(text, expected):
    assert parse_timestamp(text).isoformat() == expected


@pytest.mark.parametrize(
    "text", ["2026-01-23", "1737646245", "yesterday", "2026-13-01T00:00:00Z", "2026-01-23T25:00:00Z"]
)
def test_other_timestamps_are_400(text):
    with pytest.raises(ApiError) as raised:
        parse_timestamp(text)
    assert raised.value.status == 400


# --- the days in play ----------------------------------------------------------------


def test_days_in_play_are_utc_today_minus_two_to_tomorrow():
    assert org_days_in_play(utc("2026-01-01T00:30:00Z")) == [
        date(2025, 12, 30),
        date(2025, 12, 31),
        date(2026, 1, 1),
        date(2026, 1, 2),
    ]


ZONES = sorted(available_timezones() - {"Factory", "localtime"})


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)),
    st.sampled_from(ZONES),
)
def test_every_day_that_can_receive_usage_is_in_play(now, tz):
    days = {day.strftime("%Y%m%d") for day in org_days_in_play(now)}
    today = datetime.strptime(org_day(tz, now), "%Y%m%d").date()
    assert org_day(tz, now) in days
    assert (today - timedelta(days=1)).strftime("%Y%m%d") in days  # the previous day still accepts usage

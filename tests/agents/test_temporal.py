"""Temporal phrases resolve against the event time; both benchmark timestamp formats parse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mnemoflow.agents.temporal import parse_event_time, time_window


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


NOW = ms(2023, 7, 12, 15, 30)  # a Wednesday afternoon


def span(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int]:
    """[a, b) as whole UTC days."""
    return ms(*a), ms(*b)


@pytest.mark.parametrize(("phrase", "want"), [
    ("what did we do yesterday?", span((2023, 7, 11), (2023, 7, 12))),
    ("last night was fun", span((2023, 7, 11), (2023, 7, 12))),
    ("the day before yesterday", span((2023, 7, 10), (2023, 7, 11))),
    ("today", span((2023, 7, 12), (2023, 7, 13))),
    ("last week", span((2023, 7, 3), (2023, 7, 10))),  # the previous Mon..Sun
    ("this week", span((2023, 7, 10), (2023, 7, 13))),  # Monday up to the end of today
    ("last month", span((2023, 6, 1), (2023, 7, 1))),
    ("this month", span((2023, 7, 1), (2023, 7, 13))),
    ("last year", span((2022, 1, 1), (2023, 1, 1))),
    ("earlier this year", span((2023, 1, 1), (2023, 7, 13))),
    ("in 2022", span((2022, 1, 1), (2023, 1, 1))),
    ("recently", span((2023, 6, 28), (2023, 7, 13))),  # the last 14 days and today
    ("3 days ago", span((2023, 7, 8), (2023, 7, 11))),  # that day, one day either side
    ("two weeks ago", span((2023, 6, 25), (2023, 7, 2))),
    ("2 months ago", span((2023, 4, 27), (2023, 5, 28))),
    ("a few days ago", span((2023, 7, 6), (2023, 7, 11))),  # 2..6 days back
    ("a couple of weeks ago", span((2023, 6, 21), (2023, 7, 6))),
    ("in the past 3 days", span((2023, 7, 9), (2023, 7, 13))),
    ("in May", span((2023, 5, 1), (2023, 6, 1))),
    ("in August", span((2022, 8, 1), (2022, 9, 1))),  # the most recent August not after now
    ("in July", span((2023, 7, 1), (2023, 8, 1))),
    ("in May 2021", span((2021, 5, 1), (2021, 6, 1))),
    ("last July", span((2022, 7, 1), (2022, 8, 1))),  # strictly before this month
    ("on Monday", span((2023, 7, 10), (2023, 7, 11))),
    ("last Friday", span((2023, 7, 7), (2023, 7, 8))),
    ("on Wednesday", span((2023, 7, 5), (2023, 7, 6))),  # today's weekday means a week ago
    ("last weekend", span((2023, 7, 8), (2023, 7, 10))),
    ("May 7, 2023", span((2023, 5, 7), (2023, 5, 8))),
    ("7 May 2023", span((2023, 5, 7), (2023, 5, 8))),
    ("on the 7th of May, 2023", span((2023, 5, 7), (2023, 5, 8))),
    ("2023-05-07", span((2023, 5, 7), (2023, 5, 8))),
    ("May 7", span((2023, 5, 7), (2023, 5, 8))),
    ("December 25", span((2022, 12, 25), (2022, 12, 26))),  # not after now
    ("the trip in June 2022", span((2022, 6, 1), (2022, 7, 1))),
])
def test_phrases(phrase: str, want: tuple[int, int]) -> None:
    assert time_window(phrase, NOW) == want
    assert time_window(phrase.upper(), NOW) == want


def test_last_weekend_on_a_sunday_is_the_previous_one() -> None:
    sunday = ms(2023, 7, 16, 20)
    assert time_window("last weekend", sunday) == span((2023, 7, 8), (2023, 7, 10))
    assert time_window("this weekend", sunday) == span((2023, 7, 15), (2023, 7, 17))


def test_month_boundaries() -> None:
    jan = ms(2024, 1, 3)
    assert time_window("last month", jan) == span((2023, 12, 1), (2024, 1, 1))
    assert time_window("in December", jan) == span((2023, 12, 1), (2024, 1, 1))
    assert time_window("a month ago", ms(2023, 3, 31)) == span((2023, 2, 13), (2023, 3, 16))
    assert time_window("Feb 29", ms(2023, 7, 1)) == span((2020, 2, 29), (2020, 3, 1))


def test_relative_to_event_time_not_wall_clock() -> None:
    then = ms(2001, 9, 5, 12)
    assert time_window("yesterday", then) == span((2001, 9, 4), (2001, 9, 5))
    assert time_window("recently", then) == time_window("recently", then + 3_600_000)


def test_most_specific_phrase_wins_then_first() -> None:
    assert time_window("last year, or maybe yesterday", NOW) == time_window("yesterday", NOW)
    assert time_window("what did I say yesterday about May 2023?", NOW) == span(
        (2023, 7, 11), (2023, 7, 12))
    assert time_window("in May 7, 2023", NOW) == span((2023, 5, 7), (2023, 5, 8))
    # equal widths: the earlier phrase
    assert time_window("on Monday and on Friday", NOW) == span((2023, 7, 10), (2023, 7, 11))
    assert time_window("on Friday and on Monday", NOW) == span((2023, 7, 7), (2023, 7, 8))


@pytest.mark.parametrize("text", [
    "", "I like hiking", "it may be fine", "we may have time", "tomorrow", "next week",
    "the weekday schedule", "Feb 30, 2023", "my 2022 taxes",
])
def test_no_temporal_phrase(text: str) -> None:
    assert time_window(text, NOW) is None


@pytest.mark.parametrize(("s", "want"), [
    ("1:56 pm on 8 May, 2023", ms(2023, 5, 8, 13, 56)),
    ("10:37 am on 27 June, 2023", ms(2023, 6, 27, 10, 37)),
    ("12:05 am on 1 January, 2024", ms(2024, 1, 1, 0, 5)),
    ("12:30 pm on 3 Sept, 2023", ms(2023, 9, 3, 12, 30)),
    ("2023/05/20 (Sat) 02:21", ms(2023, 5, 20, 2, 21)),
    ("2023/05/20 (Sat) 23:59", ms(2023, 5, 20, 23, 59)),
    ("2023-05-20T02:21:00Z", ms(2023, 5, 20, 2, 21)),
    ("2023-05-20T04:21:00+02:00", ms(2023, 5, 20, 2, 21)),
    ("2023-05-20 02:21", ms(2023, 5, 20, 2, 21)),  # naive ISO is UTC
    ("2023-05-20", ms(2023, 5, 20)),
])
def test_parse_event_time(s: str, want: int) -> None:
    assert parse_event_time(s) == want


def test_parse_event_time_matches_the_documented_example() -> None:
    got = parse_event_time("1:56 pm on 8 May, 2023")
    assert got is not None
    assert datetime.fromtimestamp(got / 1000, UTC).isoformat() == "2023-05-08T13:56:00+00:00"


@pytest.mark.parametrize("s", ["", "garbage", "1:56 pm on 31 February, 2023", "2023/13/01 10:00"])
def test_parse_event_time_rejects(s: str) -> None:
    assert parse_event_time(s) is None


# One phrase for every rule, and the times at and beyond the ends of datetime's range.
EVERY_RULE = [
    "2023-05-07", "May 7, 2023", "7 May 2023", "yesterday", "today", "the day before yesterday",
    "3 days ago", "a few weeks ago", "2 years ago", "the last 3 months", "the other day",
    "last weekend", "this weekend", "on Monday", "last week", "this week", "last month",
    "this month", "last year", "this year", "last December", "in December", "in January",
    "December, 9999", "in 2023", "recently", "May 7", "Feb 29",
]
YEAR_1 = -62_135_596_800_000  # 0001-01-01T00:00:00Z
YEAR_9999_END = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


@pytest.mark.parametrize("now", [-2**63, YEAR_1 - 1, YEAR_1, -1, 0, YEAR_9999_END,
                                 YEAR_9999_END + 1, 2**63 - 1])
@pytest.mark.parametrize("phrase", EVERY_RULE)
def test_no_time_raises(phrase: str, now: int) -> None:
    """The gate resolves phrases against whatever event time a segment carries."""
    w = time_window(f"what happened {phrase}?", now)
    assert w is None or w[0] < w[1]


def test_the_ends_of_the_range_resolve_what_they_can() -> None:
    assert time_window("yesterday", YEAR_9999_END) == span((9999, 12, 30), (9999, 12, 31))
    assert time_window("in December", YEAR_9999_END) is None  # would end in year 10000
    assert time_window("in December or yesterday", YEAR_9999_END) == time_window(
        "yesterday", YEAR_9999_END)
    assert time_window("today", YEAR_1) == (YEAR_1, YEAR_1 + 86_400_000)
    assert time_window("yesterday", YEAR_1) is None  # would start in year 0
    assert time_window("yesterday", 2**63 - 1) is None


@pytest.mark.parametrize("text", ["see you 9999-12-31", "December, 9999", "Dec 31, 9999",
                                  "31 December 9999", "in December 9999"])
def test_a_date_at_the_end_of_time_in_the_text_does_not_raise(text: str) -> None:
    """A user's own words, at an ordinary event time: the window would end in year 10000."""
    assert time_window(text, NOW) is None

"""Temporal phrases -> event-time windows, and the timestamp formats of the benchmark data.

Windows are resolved against the event's own time (`now_ms`), never the wall clock, so a
replay resolves "last week" exactly as the first run did. Days are UTC days: the pipeline
does not know the user's time zone.

When a text holds several temporal phrases, the most specific one wins: the phrase whose
window is narrowest, ties broken by the earliest position in the text. "What did I say
yesterday about the trip in May?" therefore resolves to yesterday. Phrases are not combined
("last year in May" is May of the most recent year, not May of last year).

Nothing here raises on a time: an event time that datetime cannot represent (before year 1
or after 9999) resolves no phrase, and a phrase whose window would leave that range ("today"
on 9999-12-31, or the text "9999-12-31" whatever the time) is skipped as if it were not
temporal. The gate calls this on every segment, with the host's event time and words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

DAY_MS = 86_400_000
RECENT_DAYS = 14

MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"])}
MONTHS.update({k[:3]: v for k, v in list(MONTHS.items())})
MONTHS["sept"] = 9
WEEKDAYS = {d: i for i, d in enumerate(
    ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])}
_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
        "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
# Vague counts as an inclusive range of units back: "a few days ago" = 2..6 days ago.
_VAGUE = {"a couple of": (1, 3), "a couple": (1, 3), "couple of": (1, 3), "a few": (2, 6),
          "few": (2, 6), "several": (3, 9)}
_COUNT = (r"(\d{1,3}|a couple(?: of)?|couple of|a few|few|several|an?|one|two|three|four|five|"
          r"six|seven|eight|nine|ten|eleven|twelve)")
_UNIT = r"(day|week|month|year)s?"
_MON = (r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
        r"sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_WEEKDAY = r"(monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_ORD = r"(?:st|nd|rd|th)?"
# Half-width of the window around "N units ago", in days.
_SLACK = {"day": 1, "week": 3, "month": 15, "year": 91}

Window = tuple[int, int]


def _ms(d: datetime) -> int:
    return int(d.replace(tzinfo=UTC).timestamp() * 1000)


def _day_start(now_ms: int) -> datetime:
    d = datetime.fromtimestamp(now_ms // 1000, UTC).replace(tzinfo=None)
    return d.replace(hour=0, minute=0, second=0, microsecond=0)


def _days(start: datetime, n: int) -> Window:
    return _ms(start), _ms(start + timedelta(days=n))


def _month_window(year: int, month: int) -> Window:
    return _ms(datetime(year, month, 1)), _ms(datetime(year + (month == 12), month % 12 + 1, 1))


def _year_window(year: int) -> Window:
    return _ms(datetime(year, 1, 1)), _ms(datetime(year + 1, 1, 1))


def _add_months(d: datetime, n: int) -> datetime:
    y, m = divmod(d.month - 1 + n, 12)
    year, month = d.year + y, m + 1
    last = (datetime(year + (month == 12), month % 12 + 1, 1) - timedelta(days=1)).day
    return d.replace(year=year, month=month, day=min(d.day, last))


def _month_no(name: str) -> int:
    return MONTHS.get(name, MONTHS.get(name[:3], 0))


def _recent_month(today: datetime, month: int, strictly_before: bool = False) -> int:
    """Year of the most recent `month` not after today (before this month if strict)."""
    if month < today.month or (month == today.month and not strictly_before):
        return today.year
    return today.year - 1


def _date(year: int, month: int, day: int) -> datetime | None:
    try:
        return datetime(year, month, day)
    except ValueError:
        return None


def _day_of(d: datetime | None) -> Window | None:
    return None if d is None else _days(d, 1)


def _recent_date(today: datetime, month: int, day: int) -> Window | None:
    """The most recent month/day not after today (a date without a year)."""
    for year in range(today.year, today.year - 9, -1):  # far enough back for Feb 29
        d = _date(year, month, day)
        if d is not None and d <= today:
            return _days(d, 1)
    return None


# Each rule: a pattern and a resolver from (match, today) to a window (None = not temporal).
Rule = tuple[re.Pattern[str], Callable[[re.Match[str], datetime], Window | None]]


def _ago(m: re.Match[str], today: datetime) -> Window:
    count, unit = m[1], m[2]
    step = {"day": 1, "week": 7}.get(unit)

    def back(n: int) -> datetime:
        if step is not None:
            return today - timedelta(days=n * step)
        return _add_months(today, -n * (12 if unit == "year" else 1))

    if count in _VAGUE:
        lo, hi = _VAGUE[count]
        return _ms(back(hi)), _ms(back(lo) + timedelta(days=1))
    n = int(count) if count.isdigit() else _NUM[count]
    centre, slack = back(n), timedelta(days=_SLACK[unit])
    return _ms(centre - slack), _ms(min(centre + slack + timedelta(days=1),
                                        today + timedelta(days=1)))


def _past_span(m: re.Match[str], today: datetime) -> Window:
    count, unit = m[1] or "1", m[2]
    n = _VAGUE[count][1] if count in _VAGUE else (int(count) if count.isdigit() else _NUM[count])
    if unit in ("day", "week"):
        start = today - timedelta(days=n * (7 if unit == "week" else 1))
    else:
        start = _add_months(today, -n * (12 if unit == "year" else 1))
    return _ms(start), _ms(today + timedelta(days=1))


def _weekday(m: re.Match[str], today: datetime) -> Window:
    back = (today.weekday() - WEEKDAYS[m[1]]) % 7 or 7  # "on Monday" said on a Monday: a week ago
    return _days(today - timedelta(days=back), 1)


def _last_weekend(_m: re.Match[str], today: datetime) -> Window:
    saturday = today - timedelta(days=today.weekday() + 2)  # the weekend before this week
    return _days(saturday, 2)


def _this_weekend(_m: re.Match[str], today: datetime) -> Window:
    if today.weekday() >= 5:
        saturday = today - timedelta(days=today.weekday() - 5)
        return _ms(saturday), _ms(today + timedelta(days=1))
    return _last_weekend(_m, today)


def _in_month(m: re.Match[str], today: datetime) -> Window | None:
    if m[1] == "may" and not m[2] and m[3]:
        return None  # "in may be", "in may have": the modal verb
    month = _month_no(m[1])
    return _month_window(int(m[2]) if m[2] else _recent_month(today, month), month)


def _last_month_name(m: re.Match[str], today: datetime) -> Window:
    month = _month_no(m[1])
    return _month_window(_recent_month(today, month, strictly_before=True), month)


def _mdy(m: re.Match[str], today: datetime) -> Window | None:
    month, day = _month_no(m[1]), int(m[2])
    if m[3]:
        return _day_of(_date(int(m[3]), month, day))
    return _recent_date(today, month, day)


def _dmy(m: re.Match[str], today: datetime) -> Window | None:
    month, day = _month_no(m[2]), int(m[1])
    if m[3]:
        return _day_of(_date(int(m[3]), month, day))
    return _recent_date(today, month, day)


_RULES: list[Rule] = [
    (re.compile(r"\b(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?!\d)"),
     lambda m, t: _day_of(_date(int(m[1]), int(m[2]), int(m[3])))),
    (re.compile(r"\b" + _MON + r"\.?\s+(\d{1,2})" + _ORD + r"\b(?:,?\s+(\d{4})\b)?"), _mdy),
    (re.compile(r"\b(\d{1,2})" + _ORD + r"\s+(?:of\s+)?" + _MON + r"\b\.?(?:,?\s+(\d{4})\b)?"),
     _dmy),
    (re.compile(r"\b(?:yesterday|last night)\b"), lambda m, t: _days(t - timedelta(days=1), 1)),
    (re.compile(r"\b(?:today|this morning|this afternoon|this evening|tonight)\b"),
     lambda m, t: _days(t, 1)),
    (re.compile(r"\b(?:the day before yesterday)\b"),
     lambda m, t: _days(t - timedelta(days=2), 1)),
    (re.compile(r"\b" + _COUNT + r"\s+" + _UNIT + r"\s+ago\b"), _ago),
    (re.compile(r"\b(?:the\s+)?(?:last|past)\s+" + _COUNT + r"?\s*" + _UNIT + r"s\b"),
     _past_span),
    (re.compile(r"\bthe other day\b"), lambda m, t: (_ms(t - timedelta(days=7)), _ms(t))),
    (re.compile(r"\blast weekend\b"), _last_weekend),
    (re.compile(r"\bthis (?:past )?weekend\b|\bover the weekend\b"), _this_weekend),
    (re.compile(r"\b(?:last|this past|past|on|on a|on the)\s+" + _WEEKDAY + r"\b"), _weekday),
    (re.compile(r"\blast week\b"),
     lambda m, t: _days(t - timedelta(days=t.weekday() + 7), 7)),
    (re.compile(r"\bthis week\b|\bearlier this week\b"),
     lambda m, t: _days(t - timedelta(days=t.weekday()), t.weekday() + 1)),
    (re.compile(r"\blast month\b"),
     lambda m, t: _month_window(*((t.year, t.month - 1) if t.month > 1 else (t.year - 1, 12)))),
    (re.compile(r"\b(?:earlier )?this month\b"),
     lambda m, t: (_ms(t.replace(day=1)), _ms(t + timedelta(days=1)))),
    (re.compile(r"\blast year\b"), lambda m, t: _year_window(t.year - 1)),
    (re.compile(r"\b(?:earlier )?this year\b"),
     lambda m, t: (_ms(datetime(t.year, 1, 1)), _ms(t + timedelta(days=1)))),
    (re.compile(r"\blast\s+" + _MON + r"\b"), _last_month_name),
    (re.compile(r"\bin\s+(?:early\s+|mid[- ]?|late\s+)?" + _MON
                + r"\b(?:,?\s+(\d{4})\b|\s+(be|have|not)\b)?"), _in_month),
    (re.compile(r"\b" + _MON + r",?\s+(\d{4})\b"),
     lambda m, t: _month_window(int(m[2]), _month_no(m[1]))),
    (re.compile(r"\b(?:in|during)\s+((?:19|20)\d{2})\b"),
     lambda m, t: _year_window(int(m[1]))),
    (re.compile(r"\b(?:recently|lately)\b"),
     lambda m, t: _days(t - timedelta(days=RECENT_DAYS), RECENT_DAYS + 1)),
]


# What datetime arithmetic raises at the ends of its range (years 1 and 9999); OSError is
# what some platforms' fromtimestamp raises for far-off times.
_RANGE_ERRORS = (ValueError, OverflowError, OSError)


def _candidates(text: str, now_ms: int) -> Iterator[tuple[int, int, Window]]:
    """(width, position, window) for every temporal phrase found in `text`."""
    try:
        today = _day_start(now_ms)
    except _RANGE_ERRORS:
        return  # a time datetime cannot represent: no phrase resolves against it
    t = text.casefold()
    for rx, resolve in _RULES:
        for m in rx.finditer(t):
            try:
                w = resolve(m, today)
            except _RANGE_ERRORS:
                continue  # the window would leave datetime's range
            if w is not None and w[0] < w[1]:
                yield w[1] - w[0], m.start(), w


def time_window(text: str, now_ms: int) -> tuple[int, int] | None:
    """[start_ms, end_ms) of the most specific temporal phrase in `text`, else None.

    Relative phrases resolve against `now_ms` (the event time), so the same event always gets
    the same window. See the module docstring for how several phrases are reconciled.
    """
    best = min(_candidates(text, now_ms), default=None)
    return None if best is None else best[2]


_LOCOMO = re.compile(r"(\d{1,2}):(\d{2})\s*([ap])\.?\s*m\.?\s+on\s+(\d{1,2})" + _ORD + r"\s+"
                     + _MON + r",?\s+(\d{4})", re.I)
_LME = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(\w+\))?\s+(\d{1,2}):(\d{2})(?::(\d{2}))?")


def parse_event_time(s: str) -> int | None:
    """Epoch ms UTC from the benchmark timestamp formats, or None if unreadable.

    LoCoMo '1:56 pm on 8 May, 2023', LongMemEval '2023/05/20 (Sat) 02:21', or ISO 8601
    (naive ISO times are taken as UTC). The datasets carry no zone, so UTC is the convention.
    """
    try:
        m = _LOCOMO.search(s)
        if m:
            hour = int(m[1]) % 12 + (12 if m[3].lower() == "p" else 0)
            d = datetime(int(m[6]), _month_no(m[5].lower()), int(m[4]), hour, int(m[2]))
            return _ms(d)
        m = _LME.search(s)
        if m:
            d = datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6] or 0))
            return _ms(d)
        d = datetime.fromisoformat(s.strip())
        if d.tzinfo is None:
            return _ms(d)
        return int(d.timestamp() * 1000)
    except _RANGE_ERRORS:
        return None

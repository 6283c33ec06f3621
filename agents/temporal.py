"""Temporal phrases -> event-time windows, and the timestamp formats of the benchmark data.

Relative to the event's own time, never the wall clock, so a replay resolves "last week" the
same way. The first phrase found wins (patterns are tried from most to least specific).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

DAY = 86_400_000
MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"])}
MONTHS.update({k[:3]: v for k, v in list(MONTHS.items())})
WEEKDAYS = {d: i for i, d in enumerate(
    ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])}
_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
        "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3, "few": 3,
        "several": 4}
_MON = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|" \
       r"sep(?:tember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"


def _ms(d: datetime) -> int:
    return int(d.replace(tzinfo=UTC).timestamp() * 1000)


def _day_start(now_ms: int) -> datetime:
    d = datetime.fromtimestamp(now_ms / 1000, UTC).replace(tzinfo=None)
    return d.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_window(year: int, month: int) -> tuple[int, int]:
    start = datetime(year, month, 1)
    end = datetime(year + (month == 12), month % 12 + 1, 1)
    return _ms(start), _ms(end)


def time_window(text: str, now_ms: int) -> tuple[int, int] | None:
    """[start, end) in epoch ms for the first temporal phrase in `text`, else None."""
    t = text.casefold()
    today = _day_start(now_ms)
    m = re.search(r"\b(\d{4})-(\d{2})-(\d{2})\b", t)
    if m:
        d = datetime(int(m[1]), int(m[2]), int(m[3]))
        return _ms(d), _ms(d) + DAY
    m = re.search(_MON + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})", t) or None
    if m:
        d = datetime(int(m[3]), MONTHS[m[1][:3]], int(m[2]))
        return _ms(d), _ms(d) + DAY
    m = re.search(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MON + r",?\s+(\d{4})", t)
    if m:
        d = datetime(int(m[3]), MONTHS[m[2][:3]], int(m[1]))
        return _ms(d), _ms(d) + DAY
    if re.search(r"\byesterday\b", t):
        return _ms(today - timedelta(days=1)), _ms(today)
    if re.search(r"\btoday\b|\bthis morning\b|\btonight\b", t):
        return _ms(today), _ms(today) + DAY
    m = re.search(r"\b(\d+|a couple of|a few|few|several|an?|one|two|three|four|five|six|seven|"
                  r"eight|nine|ten)\s+(day|week|month|year)s?\s+ago\b", t)
    if m:
        n = int(m[1]) if m[1].isdigit() else _NUM[m[1]]
        span = {"day": 1, "week": 7, "month": 30, "year": 365}[m[2]]
        centre = today - timedelta(days=n * span)
        slack = timedelta(days=max(1, span // 2) if n > 0 else 1)
        if m[1] in ("a few", "few", "several", "a couple of"):
            slack = timedelta(days=n * span)
        return _ms(centre - slack), _ms(centre + slack + timedelta(days=1))
    if re.search(r"\blast weekend\b", t):
        sat = today - timedelta(days=(today.weekday() - 5) % 7 or 7)
        return _ms(sat), _ms(sat + timedelta(days=2))
    m = re.search(r"\b(?:last|this past|on)\s+(monday|tuesday|wednesday|thursday|friday|"
                  r"saturday|sunday)\b", t)
    if m:
        back = (today.weekday() - WEEKDAYS[m[1]]) % 7 or 7
        d = today - timedelta(days=back)
        return _ms(d), _ms(d) + DAY
    if re.search(r"\blast week\b", t):
        start = today - timedelta(days=today.weekday() + 7)
        return _ms(start), _ms(start + timedelta(days=7))
    if re.search(r"\bthis week\b", t):
        start = today - timedelta(days=today.weekday())
        return _ms(start), _ms(today) + DAY
    if re.search(r"\blast month\b", t):
        first = today.replace(day=1)
        prev = first - timedelta(days=1)
        return _month_window(prev.year, prev.month)
    if re.search(r"\bthis month\b", t):
        return _ms(today.replace(day=1)), _ms(today) + DAY
    if re.search(r"\blast year\b", t):
        return _ms(datetime(today.year - 1, 1, 1)), _ms(datetime(today.year, 1, 1))
    if re.search(r"\bearlier this year\b|\bthis year\b", t):
        return _ms(datetime(today.year, 1, 1)), _ms(today) + DAY
    m = re.search(r"\bin\s+" + _MON + r"(?:\s+(\d{4}))?\b", t)
    if m and not (m[1] == "may" and not m[2] and re.search(r"\bin may (?:be|have|not)\b", t)):
        month = MONTHS[m[1][:3]]
        year = int(m[2]) if m[2] else (today.year if month <= today.month else today.year - 1)
        return _month_window(year, month)
    m = re.search(r"\bin\s+((?:19|20)\d{2})\b", t)
    if m:
        y = int(m[1])
        return _ms(datetime(y, 1, 1)), _ms(datetime(y + 1, 1, 1))
    if re.search(r"\brecently\b|\blately\b", t):
        return _ms(today - timedelta(days=14)), _ms(today) + DAY
    return None


_LOCOMO = re.compile(r"(\d{1,2}):(\d{2})\s*(am|pm)\s+on\s+(\d{1,2})\s+" + _MON + r",?\s+(\d{4})",
                     re.I)
_LME = re.compile(r"(\d{4})/(\d{2})/(\d{2})(?:\s*\(\w+\))?\s+(\d{1,2}):(\d{2})")


def parse_event_time(s: str) -> int | None:
    """LoCoMo '1:56 pm on 8 May, 2023', LongMemEval '2023/05/20 (Sat) 02:21', or ISO 8601."""
    m = _LOCOMO.search(s)
    if m:
        hour = int(m[1]) % 12 + (12 if m[3].lower() == "pm" else 0)
        return _ms(datetime(int(m[6]), MONTHS[m[5].lower()[:3]], int(m[4]), hour, int(m[2])))
    m = _LME.search(s)
    if m:
        return _ms(datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5])))
    try:
        d = datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return int(d.timestamp() * 1000)

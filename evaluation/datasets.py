"""LoCoMo and LongMemEval as one shape: users, timed sessions of turns, questions with evidence."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from mnemoflow.agents.temporal import parse_event_time

TURN_GAP_MS = 30_000


@dataclass(frozen=True)
class Turn:
    role: str  # user | assistant
    text: str
    provenance: str  # "<session key>:<turn id>", the evidence key


@dataclass(frozen=True)
class Session:
    user: str
    key: str
    time_ms: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    qid: str
    user: str
    text: str
    time_ms: int
    category: str
    evidence_turns: frozenset[str]
    evidence_sessions: frozenset[str]
    abstention: bool = False


@dataclass
class Benchmark:
    name: str
    sessions: list[Session] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    shifted_questions: int = 0  # questions moved after their haystack (reported)


def session_of(provenance: str) -> str:
    return provenance.rpartition(":")[0]


def _locomo_evidence(raw: list) -> set[str]:
    out = set()
    for e in raw:
        for part in str(e).replace(",", ";").split(";"):
            part = part.strip()
            if ":" in part and part.startswith("D"):
                out.add(part)
    return out


def load_locomo(path: Path, conversations: list[str] | None = None,
                limit: int | None = None) -> Benchmark:
    bench = Benchmark("locomo")
    for conv in json.loads(path.read_text()):
        user = conv["sample_id"]
        if conversations and user not in conversations:
            continue
        c = conv["conversation"]
        last = 0
        n = 1
        while f"session_{n}" in c:
            t0 = parse_event_time(c.get(f"session_{n}_date_time", "")) or last + 86_400_000
            turns = []
            for turn in c[f"session_{n}"]:
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [shares an image: {turn['blip_caption']}]"
                turns.append(Turn("user", text, turn["dia_id"]))
            if turns:
                bench.sessions.append(Session(user, f"D{n}", t0, tuple(turns)))
                last = max(last, t0 + len(turns) * TURN_GAP_MS)
            n += 1
        qt = last + 86_400_000
        for i, q in enumerate(conv["qa"]):
            ev = _locomo_evidence(q.get("evidence", []))
            bench.questions.append(Question(
                f"{user}/q{i}", user, q["question"], qt + i * 60_000, str(q["category"]),
                frozenset(ev), frozenset(session_of(e) for e in ev)))
    if limit:
        bench.questions = bench.questions[:limit]
    return bench


def load_longmemeval(path: Path, questions: list[str] | None = None, limit: int | None = None,
                     roles: tuple[str, ...] = ("user", "assistant")) -> Benchmark:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        items = json.load(f)
    bench = Benchmark("longmemeval")
    count = 0
    for item in items:
        qid = item["question_id"]
        if questions and qid not in questions:
            continue
        if limit and count >= limit:
            break
        count += 1
        user = f"lme-{qid}"
        ev_turns: set[str] = set()
        last = 0
        seen: dict[str, int] = {}
        for sid, date, turns in zip(item["haystack_session_ids"], item["haystack_dates"],
                                    item["haystack_sessions"], strict=True):
            t0 = parse_event_time(date) or 0
            kept = []
            for j, turn in enumerate(turns):
                prov = f"{sid}:{j}"
                if turn.get("has_answer"):
                    ev_turns.add(prov)
                if turn["role"] in roles and turn["content"].strip():
                    kept.append(Turn(turn["role"], turn["content"], prov))
            if kept:
                # a few S haystacks hold the same session twice, at two dates: each copy is its
                # own host session (ids and eventSeq restart per session), the evidence key stays
                seen[sid] = seen.get(sid, 0) + 1
                key = sid if seen[sid] == 1 else f"{sid}~{seen[sid]}"
                bench.sessions.append(Session(user, key, t0, tuple(kept)))
                last = max(last, t0 + (len(kept) + 1) * TURN_GAP_MS)
        qt = parse_event_time(item["question_date"]) or 0
        if qt <= last:
            # some oracle items date their evidence after the question (an upstream quirk);
            # memories cannot come from the future, so the question moves just past them
            qt = last + 60_000
            bench.shifted_questions += 1
        bench.questions.append(Question(
            qid, user, item["question"], qt, item["question_type"], frozenset(ev_turns),
            frozenset(item["answer_session_ids"]), abstention=qid.endswith("_abs")))
    return bench

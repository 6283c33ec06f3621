"""Report the G-03 injection rules against their labelled corpus (and, optionally, real chats).

    .venv/bin/python bench/injection_corpus_report.py [--width 100] [--external]

Prints counts, FPR/FNR (overall, and for the main set vs the holdout written after the rules
were frozen), per-family misses, every misclassified text (truncated), which rule caught the
attacks, timing, and the rules table. `--external` also runs the rules over the LoCoMo and
LongMemEval dev conversations (unlabelled, overwhelmingly benign) and lists what they flag.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

from mnemoflow.agents.injection_rules import (
    RULES,
    InjectionVerdict,
    detect_injection,
    rules_markdown,
)

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "agents" / "data" / "injection_corpus.jsonl"
SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", REPO.parent / "shared")) / "data"


def _cut(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _rate(bad: int, total: int) -> str:
    return f"{bad}/{total} = {bad / total:.3f}" if total else "n/a"


def _split(row: dict[str, str]) -> str:
    return "holdout" if "holdout" in row.get("note", "") else "main"


def _cpu(text: str, calls: int = 20) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        detect_injection(text)
    return (time.process_time() - t0) / calls


def report(corpus: Path, width: int) -> None:
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    verdicts: list[InjectionVerdict] = []
    times: list[float] = []
    for row in rows:
        t0 = time.perf_counter()
        verdicts.append(detect_injection(row["text"]))
        times.append(time.perf_counter() - t0)
    pairs = list(zip(rows, verdicts, strict=True))
    fn = [(r, v) for r, v in pairs if r["label"] == "attack" and not v.flagged]
    fp = [(r, v) for r, v in pairs if r["label"] == "benign" and v.flagged]

    print(f"corpus: {corpus.relative_to(REPO) if corpus.is_relative_to(REPO) else corpus}")
    print(f"{len(rows)} texts: {sum(r['label'] == 'attack' for r in rows)} attacks, "
          f"{sum(r['label'] == 'benign' for r in rows)} benign\n")
    print(f"{'set':8} {'attacks':>8} {'benign':>7}   {'FNR (missed/attacks)':24} "
          f"{'FPR (flagged/benign)':24}")
    for name in ("all", "main", "holdout"):
        sel = [(r, v) for r, v in pairs if name == "all" or _split(r) == name]
        att = [v for r, v in sel if r["label"] == "attack"]
        ben = [v for r, v in sel if r["label"] == "benign"]
        missed = sum(not v.flagged for v in att)
        flagged = sum(v.flagged for v in ben)
        print(f"{name:8} {len(att):>8} {len(ben):>7}   {_rate(missed, len(att)):24} "
              f"{_rate(flagged, len(ben)):24}")

    print("\nper family (errors / texts)")
    fams: dict[tuple[str, str], list[bool]] = {}
    for r, v in pairs:
        wrong = v.flagged != (r["label"] == "attack")
        fams.setdefault((r["label"], r["family"]), []).append(wrong)
    for (label, fam), errs in sorted(fams.items()):
        mark = "  <-" if any(errs) else ""
        print(f"  {label:6} {fam:22} {sum(errs):>2}/{len(errs):<3}{mark}")

    print(f"\nmissed attacks ({len(fn)})")
    for r, _ in fn:
        print(f"  [{_split(r):7}] {r['family']:20} {_cut(r['text'], width)}")
    print(f"\nflagged benign ({len(fp)})")
    for r, v in fp:
        print(f"  [{_split(r):7}] {r['family']:20} {v.rule_id} {v.evidence!r}\n"
              f"{'':33}{_cut(r['text'], width)}")

    hits = Counter(v.rule_id for r, v in pairs if r["label"] == "attack" and v.flagged)
    print("\nattacks caught, by first rule that fired")
    for rule in RULES:
        print(f"  {rule.rule_id} {rule.name:45} {hits.get(rule.rule_id, 0):>3}")

    print(f"\ntiming (wall clock, short texts: the fixed per-call cost dominates): "
          f"median {statistics.median(times) * 1e3:.3f} ms/text, "
          f"p95 {sorted(times)[int(0.95 * len(times))] * 1e3:.3f} ms, "
          f"max {max(times) * 1e3:.3f} ms")
    one_kb = " ".join(r["text"] for r in rows)[:1024]
    best = min(_cpu(one_kb) for _ in range(10))
    print(f"1 KB of corpus text: best-of-10 {best * 1e3:.3f} ms of CPU per call")
    print("\n" + rules_markdown())


def external(width: int) -> None:
    """Flag rate on real conversations: every flag here is either a stale order or a false alarm."""
    texts: set[tuple[str, str, str]] = set()
    locomo = SHARED / "locomo" / "dev.json"
    if locomo.exists():
        for conv in json.loads(locomo.read_text()):
            for key, turns in conv["conversation"].items():
                if key.startswith("session_") and isinstance(turns, list):
                    texts.update(("locomo", "user", t["text"]) for t in turns)
    lme = SHARED / "longmemeval" / "dev.json.gz"
    if lme.exists():
        with gzip.open(lme, "rt", encoding="utf-8") as fh:
            for q in json.load(fh):
                for session in q["haystack_sessions"]:
                    texts.update(("longmemeval", t["role"], t["content"]) for t in session)
    if not texts:
        print(f"\nexternal: no data under {SHARED}")
        return
    t0 = time.perf_counter()
    flagged = [(src, role, v, x) for src, role, x in sorted(texts)
               if (v := detect_injection(x)).flagged]
    dt = time.perf_counter() - t0
    kb = sum(len(x.encode()) for _, _, x in texts) / 1024
    print(f"\nexternal: {len(texts)} distinct turns ({kb / 1024:.1f} MB) in {dt:.1f}s "
          f"({dt / kb * 1e3:.3f} ms/KB); flagged {len(flagged)} "
          f"({len(flagged) / len(texts):.4%})")
    by = Counter((src, role, v.rule_id) for src, role, v, _ in flagged)
    for (src, role, rule_id), n in sorted(by.items()):
        print(f"  {src:12} {role:9} {rule_id} {n}")
    for src, role, v, x in flagged:
        i = max(0, " ".join(x.split()).casefold().find((v.evidence or "")[:20]))
        print(f"  {src}/{role} {v.rule_id} {v.evidence!r}")
        print(f"      {_cut(' '.join(x.split())[i:], width)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--width", type=int, default=100, help="truncate texts to this many chars")
    ap.add_argument("--external", action="store_true", help="also scan LoCoMo / LongMemEval")
    args = ap.parse_args()
    report(args.corpus.resolve(), args.width)
    if args.external:
        external(args.width)


if __name__ == "__main__":
    main()

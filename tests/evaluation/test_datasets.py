"""Dataset loaders: how benchmark items become host sessions and evidence keys."""

from __future__ import annotations

import json
from pathlib import Path

from mnemoflow.evaluation.datasets import load_longmemeval


def _item(sessions: list[tuple[str, str, list[dict]]]) -> dict:
    return {"question_id": "q1", "question_type": "multi-session", "question": "what?",
            "answer": "x", "question_date": "2023/06/30 (Fri) 10:00",
            "haystack_session_ids": [s[0] for s in sessions],
            "haystack_dates": [s[1] for s in sessions],
            "haystack_sessions": [s[2] for s in sessions],
            "answer_session_ids": ["a"]}


def test_a_session_repeated_in_one_haystack_becomes_two_host_sessions(tmp_path: Path) -> None:
    """Some S haystacks hold one session twice at two dates. With one host session id the two
    copies restart eventSeq under the same id, so their segments collide and the replay waits
    forever for decisions that were deduplicated away (found on the full S dev run)."""
    turns = [{"role": "user", "content": "I adopted a cat", "has_answer": True},
             {"role": "assistant", "content": "nice"}]
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([_item([("a", "2023/05/01 (Mon) 09:00", turns),
                                       ("b", "2023/05/02 (Tue) 09:00", turns[1:]),
                                       ("a", "2023/05/03 (Wed) 09:00", turns)])]))
    bench = load_longmemeval(path, roles=("user",))
    keys = [s.key for s in bench.sessions]
    assert keys == ["a", "a~2"]  # b has no user turn, so it is not replayed
    # both copies keep the dataset's evidence key, so scoring is unchanged
    assert [s.turns[0].provenance for s in bench.sessions] == ["a:0", "a:0"]
    assert bench.sessions[0].time_ms < bench.sessions[1].time_ms

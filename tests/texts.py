"""Varied sentences for the text ensembles (empty, unicode, emoji, control characters, > 256 tokens) and how
served embeddings are compared with the reference."""

import numpy as np

MIN_COSINE = 0.9999
GUARDED = "bf16, cancelling sentences of up to 16 tokens bf16+f32"  # what a bf16-guarded session says it computes


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_embeddings_match(embeddings: np.ndarray, reference: np.ndarray) -> None:
    assert embeddings.shape == reference.shape
    worst = cosines(embeddings, reference)
    assert worst.min() >= MIN_COSINE, f"row {int(worst.argmin())} cosine {worst.min():.6f}"


LONG = " ".join(f"word{i}" for i in range(600))  # far beyond 256 tokens: truncation must match

SENTENCES = [
    "",
    " ",
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Triton serves many models on one GPU.",
    "Sentence embeddings map text to vectors.",
    "Ünïcödé characters with diacritics: café, naïve, façade, Ångström.",
    "中文句子测试，看看分词器如何处理。",
    "日本語の文章もテストします。",
    "한국어 문장도 포함합니다.",
    "Русский текст для проверки токенизатора.",
    "Ελληνικά γράμματα: αλφα, βήτα, γάμμα.",
    "النص العربي يكتب من اليمين إلى اليسار",
    "עברית גם כן",
    "हिन्दी वाक्य भी जाँचें।",
    "Emoji 🚀🔥👍🏽 and flags 🇩🇪🇯🇵 in text.",
    "👨‍👩‍👧‍👦 family emoji with zero-width joiners",
    "Tabs\tand\nnewlines\r\nin the middle.",
    "Control \x00 null \x07 bell \x1b escape characters.",
    "URLs like https://example.com/path?q=1&r=2 and emails a.b@example.org",
    "Numbers: 3.14159, 2,718, 1e-9, -42, 0x1F.",
    "Code: def f(x): return x ** 2  # comment",
    "ALL CAPS SHOUTING SENTENCE",
    "mIxEd CaSe SeNtEnCe",
    "Punctuation!!! ??? ... --- ;;; :::",
    "Repeated repeated repeated repeated repeated words.",
    "A sentence with    many     spaces.",
    "   leading and trailing whitespace   ",
    "Zero\u200bwidth\u200bspaces\u200binside.",
    "Combining marks: e\u0301 a\u0308 o\u0302",
    "Right-to-left override \u202e txet desrever",
    "Math symbols ∑∫√∞≈≠≤≥ and arrows →←↑↓",
    "Currency: $100, €50, £20, ¥1000, ₹500",
    "A very long word: pneumonoultramicroscopicsilicovolcanoconiosis",
    "Supercalifragilisticexpialidocious is a long word too.",
    "The cat sat on the mat.",
    "The dog sat on the log.",
    "Machine learning models require careful deployment.",
    "Low latency matters for interactive applications.",
    "Multi-model endpoints share instances across many models.",
    "Cold starts happen when a model is loaded for the first time.",
    "Tokenizers split text into subword units.",
    "Mean pooling averages token embeddings using the attention mask.",
    "L2 normalisation makes cosine similarity a dot product.",
    "This sentence is written in English but ends in français.",
    "Ein deutscher Satz mit Umlauten: Größe, Übung, Ärger.",
    "Una frase en español con eñe y acentos: canción, corazón.",
    "Uma frase em português: ação, coração, pão.",
    "Une phrase en français avec des accents: élève, garçon, où.",
    "Quote marks “curly” and ‘single’ and «guillemets».",
    "HTML <b>tags</b> &amp; entities &lt;div&gt;",
    "JSON {\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    LONG,
    "medium " * 100,
]

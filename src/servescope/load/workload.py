"""Token-count workloads for ``bench --openai``: prompts of N tokens in, answers of M out.

    spec = TokenSpec.parse("64:16")               # mean 64, sd 16; also "64" and "32-128"
    counter = token_counter("/models/llama")      # a local tokenizer; None: the approximate count
    prompts, counts = synthetic_prompts(spec, counter, count=1000, seed=0)
    answers = spec.sample(random.Random(0), 1000)  # each request's max_tokens

A prompt is words drawn from a seeded generator (each prompt different, so no server's prefix
cache serves them from memory), cut to its length by the tokenizer: exact for that tokenizer,
without the special tokens or the chat template the server adds (``usage.prompt_tokens`` in
``load.tokens`` is the server's own count). Without a tokenizer the count is approximate: the
words are common English words, each one token in all-MiniLM-L6-v2's WordPiece vocabulary
(tests/test_workload.py) and most of them one token, after a space, in the BPE vocabularies
of the usual open models, so N words are about N tokens; the report says which count it is.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..exceptions import ConfigError

__all__ = ["APPROXIMATE", "MAX_SYNTHETIC_PROMPTS", "SYNTHETIC_PROMPTS", "TokenCounter", "TokenSpec", "prompts_of", "synthetic_prompts", "token_counter"]

#: synthetic prompts built for a run (cycled past that): as many as --requests asks, within these
SYNTHETIC_PROMPTS, MAX_SYNTHETIC_PROMPTS = 1000, 10_000
APPROXIMATE = "approximate: one common English word a token, no tokenizer given"

# Common English words: one token each in all-MiniLM-L6-v2's vocabulary (tests/test_workload.py)
WORDS = """the of and to in is was for on that with as by at from his he it an were are which be
this had not or but have their one all they has its been who more new first other after would
when two time there can into some only about out also years people what over city year so
most may such where three if made no then state world these later used world under part
than between many during while school work known both war since united life before like
part them number well called second being each house name team through area way first long
made water even both place game group until high around well because family four city side
year old five day small end best right found great left take back part show line city top
man men woman book light music film play point power early open art given film still help
large form must same order home hand took land just keep late week month story state case
real full ever low free told head body love word sea south north east west river field""".split()
WORDS = list(dict.fromkeys(WORDS))


class TokenCounter(Protocol):
    #: what counted: the tokenizer's folder, or APPROXIMATE
    name: str
    exact: bool

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class TokenSpec:
    """A number of tokens: fixed (``64``), normal (``64:16``, mean and sd, at least 1) or
    uniform (``32-128``, both ends included)."""

    kind: str
    a: int
    b: int = 0

    @classmethod
    def parse(cls, text: str) -> TokenSpec:
        t = text.strip()
        if m := re.fullmatch(r"(\d+)", t):
            spec = cls("fixed", int(m[1]))
        elif m := re.fullmatch(r"(\d+):(\d+)", t):
            spec = cls("normal", int(m[1]), int(m[2]))
        elif (m := re.fullmatch(r"(\d+)-(\d+)", t)) and int(m[1]) <= int(m[2]):
            spec = cls("uniform", int(m[1]), int(m[2]))
        else:
            raise ConfigError(f"expected tokens as N, MEAN:SD or LOW-HIGH (64, 64:16, 32-128), got {text!r}")
        if spec.a < 1:
            raise ConfigError(f"a token count must be at least 1, got {text!r}")
        return spec

    def __str__(self) -> str:
        return {"fixed": f"{self.a}", "normal": f"{self.a}:{self.b}", "uniform": f"{self.a}-{self.b}"}[self.kind]

    def sample(self, rng: random.Random, n: int) -> list[int]:
        if self.kind == "fixed":
            return [self.a] * n
        if self.kind == "uniform":
            return [rng.randint(self.a, self.b) for _ in range(n)]
        return [max(1, round(rng.gauss(self.a, self.b))) for _ in range(n)]


class _Approximate:
    name, exact = APPROXIMATE, False

    def count(self, text: str) -> int:
        return len(text.split())


class _Tokenizer:
    exact = True

    def __init__(self, name: str, encode: Any) -> None:
        self.name, self._encode = name, encode

    def count(self, text: str) -> int:
        return len(self._encode(text))


def token_counter(path: str | None) -> TokenCounter:
    """The tokenizer in the folder ``path`` (its ``tokenizer.json`` read with the tokenizers
    library, else transformers' ``AutoTokenizer``, offline), or a ``tokenizer.json`` itself;
    None: the approximate count. A ``ConfigError`` that names the path and why when it cannot load."""
    if path is None:
        return _Approximate()
    where = Path(path)
    file = where if where.is_file() else where / "tokenizer.json"
    if not where.exists():
        raise ConfigError(f"--tokenizer {path!r}: no such file or folder (a local tokenizer folder, or its tokenizer.json)")
    if file.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(f"--tokenizer {path!r} needs the tokenizers library: pip install 'servescope[tokens]'") from None
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - any failure to read it is the user's file
            raise ConfigError(f"--tokenizer {path!r}: {file.name} does not load ({str(exc).splitlines()[0][:160]})") from None
        tok.no_padding()  # (a saved tokenizer may pad or cut every text to a fixed length)
        tok.no_truncation()
        return _Tokenizer(str(path), lambda text: tok.encode(text, add_special_tokens=False).ids)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(f"--tokenizer {path!r} has no tokenizer.json, and reading it otherwise needs transformers") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"--tokenizer {path!r}: not a tokenizer folder ({str(exc).splitlines()[0][:160]})") from None
    return _Tokenizer(str(path), lambda text: tok.encode(text, add_special_tokens=False, truncation=False))


def _fit(words: list[str], rng: random.Random, target: int, counter: TokenCounter) -> tuple[str, int]:
    """Words from ``rng`` cut or grown until ``counter`` counts ``target`` tokens (or, when a
    word's tokens step over it, the nearest count below): the text and its count."""
    chosen = list(words)
    n = counter.count(" ".join(chosen))
    while n > target and len(chosen) > 1:  # (each word is one token or more: cut by the excess)
        chosen = chosen[: max(1, len(chosen) - max(1, (n - target) // 2))]
        n = counter.count(" ".join(chosen))
    for _ in range(4 * target):
        if n >= target:
            break
        grown = chosen + [rng.choice(WORDS)]
        m = counter.count(" ".join(grown))
        if m <= target:
            chosen, n = grown, m
    return " ".join(chosen), n


def synthetic_prompts(spec: TokenSpec, counter: TokenCounter, *, count: int, seed: int) -> tuple[list[str], list[int]]:
    """``count`` different prompts whose lengths follow ``spec`` under ``counter``, and each
    one's length as counted (what ``load.by_size`` groups by)."""
    rng = random.Random(seed)
    return prompts_of(spec.sample(rng, count), counter, rng=rng)


def prompts_of(targets: list[int], counter: TokenCounter, *, rng: random.Random | None = None, seed: int = 0) -> tuple[list[str], list[int]]:
    """A different prompt of each length in ``targets`` (a trace's ``input_length``s) under
    ``counter``, and each one's length as counted."""
    rng = rng or random.Random(seed)
    texts, counts = [], []
    for target in targets:
        text, n = _fit([rng.choice(WORDS) for _ in range(target)], rng, target, counter)
        texts.append(text)
        counts.append(n)
    return texts, counts

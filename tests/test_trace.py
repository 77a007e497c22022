"""--trace: a trace file read in time order, each bad line named, its times sped up."""

from __future__ import annotations

import pytest

from servescope.exceptions import ConfigError
from servescope.load.bench import BenchOptions
from servescope.load.trace import read_trace


def write(tmp_path, text: str):
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return str(path)


def test_lines_are_sorted_by_time_from_the_first_and_other_fields_ignored(tmp_path):
    path = write(tmp_path, '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [1]}\n\n'
                           '{"timestamp": 27000, "input_length": 10, "output_length": 5}\n'
                           '{"timestamp": 30000.5}\n')  # fmt: skip
    trace = read_trace(path)
    assert trace.times_ms == [0.0, 482.0, 3000.5]
    assert trace.input_lengths == [10, 6955, None] and trace.output_lengths == [5, 52, None]
    assert trace.span_s == pytest.approx(3.0005)
    assert trace.offsets_ns(2.0) == [0, 241_000_000, 1_500_250_000]
    assert len(read_trace(path, limit=2)) == 2
    with pytest.raises(ConfigError, match=r"request 3 \(in time order\) has no input_length"):
        trace.needs_sizes()


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"timestamp": 0}\n{"timestamp": 1, oops}\n', "line 2 is not JSON"),
        ('{"timestamp": 0}\n[1, 2]\n', "line 2: expected an object"),
        ('{"input_length": 5}\n', "line 1: timestamp must be a number of ms >= 0, got None"),
        ('{"timestamp": -3}\n', "timestamp must be a number of ms >= 0, got -3"),
        ('{"timestamp": true}\n', "got True"),
        ('{"timestamp": 0, "input_length": 0}\n', "line 1: input_length must be a whole number of tokens >= 1, got 0"),
        ('{"timestamp": 0, "output_length": 2.5}\n', "output_length must be a whole number"),
        ("\n\n", "has no request"),
    ],
)
def test_a_bad_line_is_named_with_its_file_and_number(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        read_trace(path)
    assert repr(path) in str(info.value)


def test_a_trace_is_one_open_loop_level_at_its_speedup(tmp_path):
    trace = read_trace(write(tmp_path, '{"timestamp": 0}\n{"timestamp": 100}\n'))
    options = BenchOptions(url="http://127.0.0.1:9/", trace=trace, trace_speedup=4.0, duration_s=None, warmup_s=0)
    assert options.levels == [("trace", 4.0)] and options.concurrency == []
    for bad in ({"concurrency": [2]}, {"rate": [5.0]}, {"order": "random"}, {"trace_speedup": 0.0}):
        with pytest.raises(ConfigError):
            BenchOptions(url="http://127.0.0.1:9/", trace=trace, **bad)

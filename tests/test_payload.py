"""Request bodies from files: a data file's lines (one clear error for a bad one), and form
uploads that a standard multipart parser reads back as they were."""

from __future__ import annotations

import email.parser
import email.policy

import pytest

from servescope.exceptions import ConfigError
from servescope.payload import multipart_form, read_jsonl


def test_a_data_file_gives_each_line_with_its_number_and_skips_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n  \r\n{"text": "bb"}\r\n"just a string"')
    assert read_jsonl(path) == [(1, b'{"text": "a"}'), (4, b'{"text": "bb"}'), (5, b'"just a string"')]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"a": 1}\n{"a": 2}\n{"a": \n', "line 3 is not JSON"),
        (b"\n\n", "holds no request"),
        (b'{"a": 1}\n' * 4, "more than 3 requests"),
    ],
)
def test_a_bad_data_file_is_one_config_error_naming_the_line(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as info:
        read_jsonl(path, max_lines=3)
    assert "\n" not in str(info.value)


def test_a_data_file_over_the_size_bound_says_how_to_sample_it(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 100)
    with pytest.raises(ConfigError, match=r"head -n 100000"):
        read_jsonl(path, max_bytes=100)


def test_a_form_upload_parses_back_to_the_same_files(tmp_path):
    image = tmp_path / "cat.png"
    image.write_bytes(bytes(range(256)) * 10 + b"\r\n--not-a-boundary\r\n")
    notes = tmp_path / 'my "notes".txt'
    notes.write_bytes("héllo\r\n".encode())
    body, ctype = multipart_form([("image", image), ("doc", notes)])
    assert ctype.startswith("multipart/form-data; boundary=servescope-")
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
    parts = list(msg.iter_parts())
    assert [(p.get_param("name", header="content-disposition"), p.get_content_type()) for p in parts] == [
        ("image", "image/png"),
        ("doc", "text/plain"),
    ]
    assert parts[0].get_filename() == "cat.png" and parts[1].get_filename() == "my %22notes%22.txt"
    assert parts[0].get_payload(decode=True) == image.read_bytes()
    assert parts[1].get_payload(decode=True) == notes.read_bytes()


def test_a_missing_upload_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read body file"):
        multipart_form([("image", tmp_path / "nope.jpg")])

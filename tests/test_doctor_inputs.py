"""The doctor's view of a model call's inputs: what makes two requests' inputs the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from servescope.doctor.inputs import fingerprint


def test_inputs_padded_to_512_that_differ_in_a_few_tokens_are_told_apart():
    # two short sentences padded to 512: they differ only among the first few ids, which a
    # strided sample of the tensor missed (a false repeated-work, CRITICAL, in a user's trial)
    a = torch.zeros(2, 512, dtype=torch.long)
    b = torch.zeros(2, 512, dtype=torch.long)
    a[:, :6] = torch.tensor([101, 2023, 2003, 1037, 3231, 102])
    b[:, :6] = torch.tensor([101, 2023, 2003, 2178, 3231, 102])
    mask = (a != 0).long()
    assert fingerprint({"input_ids": a, "attention_mask": mask}) != fingerprint({"input_ids": b, "attention_mask": mask})
    assert fingerprint({"input_ids": a, "attention_mask": mask}) == fingerprint({"input_ids": a.clone(), "attention_mask": mask.clone()})


def test_big_arrays_are_sampled_and_frames_hashed_beyond_their_first_rows():
    import pandas as pd

    img = np.random.default_rng(0).random((3, 256, 256), dtype=np.float32)  # over the whole-hash size
    assert fingerprint(img) == fingerprint(img.copy()) != fingerprint(img + 1)
    rows = pd.DataFrame({"x": range(100), "y": [0.5] * 100})
    changed = rows.copy()
    changed.loc[70, "y"] = 9.0  # beyond head(2), which was all that was read
    assert fingerprint(rows) != fingerprint(changed)


def test_an_input_that_cannot_be_read_is_never_called_the_same():
    class OnDevice:  # a tensor on an accelerator: reading it would sync, so it is not read
        __module__ = "torch"
        shape = (1, 4)
        dtype = "float32"
        device = type("D", (), {"type": "cuda"})()

    assert fingerprint({"x": OnDevice()}) is None


def test_an_image_sent_as_base64_is_varied_in_its_pixels_not_its_text():
    import base64
    import io

    import numpy as np
    from PIL import Image

    from servescope.doctor.inputs import vary

    buf = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), 100, dtype=np.uint8)).save(buf, format="PNG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    for payload, get in (({"image": b64}, lambda p: p["image"]), ({"image": "data:image/png;base64," + b64}, lambda p: p["image"].split(",", 1)[1])):
        varied = vary(payload)
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(get(varied)))))
        assert img.shape == (32, 32, 3) and img[0, 0, 0] == 155 and img[-1, -1, 0] == 100  # decodes, and differs
    audio = base64.b64encode(b"RIFX" + bytes(200)).decode()  # base64 of something else: one character changed
    varied = vary({"audio": audio, "text": "hi"})
    assert varied["text"] == "hi and more" and varied["audio"] != audio and len(varied["audio"]) == len(audio)
    assert len(base64.b64decode(varied["audio"])) == 204  # it still decodes
    article = " ".join(["open the payment settings and check the status."] * 30)  # cut at 256 tokens: changed at its start too
    assert vary(article) == "More: " + article + " and more"
    protein = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ"  # only looks like base64
    assert vary(protein) != protein and len(vary(protein)) == len(protein)


def test_rows_given_as_nested_lists_are_a_batch_the_probe_can_replay():
    """model.predict([features]), as scikit-learn tutorials call it: one row, replicated to
    any batch size, and the same rows fingerprinted alike (repeated-work can be checked)."""
    from servescope.doctor.inputs import fingerprint, number_rows, replicate

    rows = [[0.1, 0.2, 3]]
    assert number_rows(rows) == rows and number_rows([[0.1], ["a"]]) is None and number_rows([[]]) is None
    assert number_rows(([1.0],)) is None  # (a tuple is a call's (args, kwargs), not rows)
    assert replicate(rows, 4) == [[0.1, 0.2, 3]] * 4
    assert fingerprint(rows) == fingerprint([[0.1, 0.2, 3]]) != fingerprint([[0.1, 0.2, 4]])


def test_a_small_frame_is_fingerprinted_by_its_values_not_pandas_hash(monkeypatch):
    pd = pytest.importorskip("pandas")

    row = pd.DataFrame([{"plan": "pro", "region": "south", "fee": "41.93"}])  # (a row from iterrows: strings)
    same = pd.DataFrame([{"plan": "pro", "region": "south", "fee": "41.93"}])
    other = pd.DataFrame([{"plan": "pro", "region": "south", "fee": "42.36"}])
    big = pd.DataFrame({"fee": np.arange(1000.0)})
    expected_big = fingerprint(big)

    def costly(*a, **k):  # 0.65 ms a call on a one-row frame of strings: 26 ms a request for 40 rows
        raise AssertionError("pandas' hash on a small frame")

    monkeypatch.setattr(pd.util, "hash_pandas_object", costly)
    assert fingerprint(row) == fingerprint(same) != fingerprint(other)
    monkeypatch.undo()
    assert fingerprint(big) == expected_big  # (a big frame: pandas' hash, of a sample where large)

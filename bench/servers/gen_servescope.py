"""examples/serve/generate.py on servescope.serve: batched decoding steps, streamed."""

import sys
from pathlib import Path

import servescope

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "serve"))
from generate import Generate  # noqa: E402

app = servescope.serve(Generate(), max_batch_size=16)

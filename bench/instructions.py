"""What a stage costs in CPU instructions (callgrind), against the same anchor as overhead.py.

    python bench/instructions.py          (needs valgrind: Debian package `valgrind`)

Instructions do not drift with a shared machine's speed: the same code, inputs and hash seed
give the same count, so this is the steady twin of bench/overhead.py's timings. Each case
runs N times under callgrind, minus a run with 0 (start-up and imports), divided by N.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

N = 20_000
CASES = {
    "anchor: 8x class CM, 2x perf_counter_ns into a list": "anchor",
    "trace open/close, no stage": "trace_only",
    "request of 8 stages (trace open/close)": "request",
    "request of 8 stages + Recorder.record": "recorded",
}

SCRIPT = '''
import sys, time
from servescope import Recorder, stage, trace
mode, n = sys.argv[1], int(sys.argv[2])
stages = [stage(x) for x in ("validate", "preprocess", "to_device", "infer", "to_host", "postprocess", "serialize", "send")]
class Bare:
    __slots__ = ("sink", "t0")
    def __init__(self, sink): self.sink = sink
    def __enter__(self):
        self.t0 = time.perf_counter_ns(); return self
    def __exit__(self, *exc):
        self.sink.append(time.perf_counter_ns() - self.t0)
recorder = Recorder() if mode == "recorded" else None
sink = []
for _ in range(n):
    if mode == "anchor":
        for _s in stages:
            with Bare(sink): pass
    elif mode == "trace_only":
        with trace(): pass
    else:
        with trace(recorder=recorder):
            for s in stages:
                with s: pass
'''


def instructions(script: str, mode: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script, mode, str(n)],
            check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        for line in open(out):
            m = re.match(r"^(?:summary|totals): (\d+)", line)
            if m:
                return int(m.group(1))
    raise RuntimeError("no instruction total in callgrind's output")


def main() -> None:
    if shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind (Debian package `valgrind`)")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SCRIPT)
    per_op = {}
    for name, mode in CASES.items():
        per_op[name] = (instructions(f.name, mode, N) - instructions(f.name, mode, 0)) / N
    os.unlink(f.name)
    anchor = per_op["anchor: 8x class CM, 2x perf_counter_ns into a list"]
    print(f"instructions per iteration (callgrind, {N} iterations, PYTHONHASHSEED=0); ratio to the 8-CM anchor")
    for name, count in per_op.items():
        print(f"  {name:52} {count:>9,.0f}   {count / anchor:5.2f}x")


if __name__ == "__main__":
    main()

"""#22: are the doctor's findings on the gallery the same run after run, with a busy neighbour?

    python bench/gallery_stability.py [--runs 3] [--neighbour] [--only NAME,...] [--keep DIR]

Runs `servescope doctor` (as a user would, `--requests 15`) on every endpoint of
examples/doctor/ `--runs` times; with `--neighbour`, a process keeps one core busy for the
whole run. For each endpoint: the findings of each run, whether every run named the same
causes, whether they are the expected ones as the gallery test judges them
(tests/e2e/test_doctor_gallery.py `judged`), and the longest run. ``--keep DIR`` keeps each
run's JSON report there (NAME-RUN.json), to read what moved a finding between runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _servers import neighbour, run_alone  # noqa: E402  (the same neighbour as bench/savings.py)


def gallery() -> tuple[dict[str, set[str]], Callable[..., list[str]], Callable[[str, dict], set[str]]]:
    spec = importlib.util.spec_from_file_location("gallery", ROOT / "tests" / "e2e" / "test_doctor_gallery.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.EXPECTED, mod.command, mod.judged


def run(target: str, command: Callable[..., list[str]], tmp: Path, out: Path) -> tuple[set[str], float, dict]:
    """(the causes named, seconds, the report) of one doctor run, its report written to ``out``."""
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    run_alone(command(target, "--json", str(out)), timeout=600, cwd=tmp, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    took = time.perf_counter() - t0
    if not out.exists():
        return {"(no report)"}, took, {}
    report = json.loads(out.read_text())
    return {f["id"] for f in report["findings"]}, took, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--neighbour", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", type=Path, default=None, help="a folder to keep each run's JSON report in")
    args = ap.parse_args()
    expected, command, judged = gallery()
    tmp = Path(tempfile.mkdtemp(prefix="servescope-gallery-"))
    keep = args.keep or tmp
    keep.mkdir(parents=True, exist_ok=True)
    rows = []
    with neighbour(args.neighbour):
        for target in sorted(expected):
            if args.only and target.split(":")[0].removesuffix(".py") not in args.only.split(","):
                continue
            name = target.split(":")[0].removesuffix(".py")
            runs = [run(target, command, tmp, keep / f"{name}-{i + 1}.json") for i in range(args.runs)]
            rows.append((target, runs))
            print(json.dumps({"target": target, "runs": [[sorted(f), round(t, 1), _machine(r).get("others_cores")] for f, t, r in runs]}), flush=True)
    same = sum(1 for _, runs in rows if all(f == runs[0][0] for f, _, _ in runs))
    # as the gallery test judges: on a busy machine thread-oversubscription and openmp-spin-wait
    # are true too, and MAY_ALSO's causes are near their bar
    right = sum(1 for t, runs in rows if all(r and judged(t, r) == expected[t] for _, _, r in runs))
    print(f"\n{'endpoint':<40} {'same':>5} {'expected':>9} {'max s':>6}  findings (run 1)")
    for target, runs in rows:
        s = all(f == runs[0][0] for f, _, _ in runs)
        e = all(r and judged(target, r) == expected[target] for _, _, r in runs)
        print(f"{target:<40} {'yes' if s else 'NO':>5} {'yes' if e else 'NO':>9} {max(t for _, t, _ in runs):>6.1f}  {sorted(runs[0][0])}")
    print(f"same findings in every run: {same}/{len(rows)}; the expected ones in every run: {right}/{len(rows)}"
          f"{' (with a neighbour keeping one core busy)' if args.neighbour else ''}")  # fmt: skip


def _machine(report: dict) -> dict:
    return ((report.get("diagnosis") or {}).get("evidence") or {}).get("machine") or {}


if __name__ == "__main__":
    main()

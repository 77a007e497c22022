"""#22's benchmark: the doctor's saving for each cause against what the fix really saves.

    python bench/savings.py [--rounds 3] [--seconds 6] [--neighbour] [--only NAME,...] [--doctor-runs 3]

Each case in bench/savings/ is an endpoint written the way people write them, with one
mistake, and its fixed twin (`NAME_fixed.py`): the same endpoint with that mistake fixed and
nothing else. For each case:
- the doctor runs on the endpoint (`servescope doctor`, as a user would) and names the cause
  with its saving, at the load it states;
- both twins are served on loopback (uvicorn; a Flask app by gunicorn, one sync worker) and
  loaded by `servescope bench` at that load,
  back to back, `--rounds` times; the realized saving is the median of the rounds' p50
  differences (for a cold start: of the first requests, each in a fresh server);
- each round runs the doctor first (while `--doctor-runs` are left), then the two twins, so a
  machine that runs slower for a few minutes slows all three; the doctor's figure is the
  median of its runs, and "(runs)" shows their range (what one run may say);
- printed: the ratio doctor / realized (target 0.7-1.3), and the same ratio of the savings as
  shares of the unchanged endpoint's p50 (which a slower machine scales alike).
`--neighbour` keeps one core busy with another process for the whole run (a busy machine).
A case whose fix is a setting read when a library loads or a process starts (`fixed_env`:
OpenMP's wait policy, glibc's malloc thresholds) has no twin file: its twin is the same file
served with that setting; a cause only a busy machine has (`quiet_too=False`) runs only with
`--neighbour` (or by name with `--only`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from _servers import free_port, neighbour, run_alone, stop_group  # bench/ is on the path: run as a script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from servescope.allocator import KEEP_FREED  # noqa: E402  (glibc's thresholds: image_features' twin)

HERE = Path(__file__).resolve().parent
CASES_DIR = HERE / "savings"


@dataclass
class Case:
    name: str
    cause: str
    path: str
    body: dict
    concurrency: int = 1
    cold: bool = False  # the saving is the first request's
    streamed: bool = False  # the saving is in time to first token
    #: the fix is a setting read when a library loads: the twin is the same file served with it
    fixed_env: dict | None = None
    quiet_too: bool = True  # False: a cause only a busy machine has (its case runs with --neighbour)
    #: a form upload of the body's "image" under this field, with ``method`` (else a JSON body)
    upload: str = ""
    method: str = "POST"
    server: str = "uvicorn"  # or "gunicorn" (a WSGI app: one sync worker, its default)

    @property
    def module(self) -> str:
        return self.name.split(":")[0]

    @property
    def twin(self) -> str:
        return self.module if self.fixed_env else self.name + "_fixed"


#: the doctor's experiment that measures each cause's fix
EXPERIMENT = {"model-load-per-request": "memoise-loaders", "repeated-work": "memoise-repeated", "padding-waste": "trim-padding",
              "grad-enabled": "inference-mode", "event-loop-blocked": "off-the-loop", "no-batching": "batching",
              "openmp-spin-wait": "omp-passive", "per-item-calls": "batch-items", "memory-churn": "keep-freed-memory"}  # fmt: skip

#: a request's titles, of 4 to 14 words: embedded one at a time by per_item.py
TITLES = ["wireless noise cancelling headphones with long battery", "stainless steel water bottle", "usb c charging cable braided two metres long",
          "ergonomic office chair with lumbar support and armrests", "cast iron skillet", "mechanical keyboard with brown switches and a wrist rest",
          "kids waterproof rain jacket", "portable bluetooth speaker for outdoor parties by the pool with friends", "ceramic coffee mug",
          "running shoes for trail and road with extra cushioning for long distances", "desk lamp", "hiking backpack thirty litres"]  # fmt: skip


def cases() -> list[Case]:
    sys.path.insert(0, str(CASES_DIR))
    from _common import image_payload

    text = {"text": "the parcel arrived two days late and the box was damaged"}
    return [
        Case("built_per_request", "model-load-per-request", "/predict", image_payload()),
        Case("tokenizer_per_request", "model-load-per-request", "/embed", text),
        Case("sklearn_per_request", "model-load-per-request", "/score", {"rows": [[0.1 * i + j for i in range(12)] for j in range(4)]}),
        Case("ort_per_request", "model-load-per-request", "/predict", image_payload()),
        Case("async_ort_per_request", "model-load-per-request", "/predict", image_payload()),
        Case("flask_ort_per_request", "model-load-per-request", "/classify", image_payload(), upload="image", method="PUT", server="gunicorn"),
        Case("cold_start", "cold-start", "/classify", text, cold=True),
        Case("padding", "padding-waste", "/embed", {"texts": ["short text one", "another short text", "a third one here"]}),
        Case("per_item", "per-item-calls", "/embed", {"texts": TITLES}),
        Case("corpus_encode", "repeated-work", "/search", {"query": "which orders were late"}),
        Case("grad_encoder", "grad-enabled", "/embed", {"reviews": ["arrived on time, works as described", "the strap broke after a week"]}),
        Case("async_forward", "event-loop-blocked", "/embed", text, concurrency=8),
        Case("st_no_batching", "no-batching", "/embed", text, concurrency=8),
        Case("stream_on_loop", "event-loop-blocked", "/generate", {"prompt": "once upon a time", "max_tokens": 24}, concurrency=8, streamed=True),
        # the same endpoint as the first, its twin served with OpenMP's idle threads asleep
        Case("built_per_request:spin", "openmp-spin-wait", "/predict", image_payload(), fixed_env={"OMP_WAIT_POLICY": "PASSIVE"}, quiet_too=False),
        # written well; its twin is the same file with glibc's malloc keeping freed memory
        Case("image_features:churn", "memory-churn", "/features", image_payload(), fixed_env=KEEP_FREED),
    ]


def _env() -> dict[str, str]:
    src = str(HERE.parent / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(CASES_DIR), src]), "HF_HUB_OFFLINE": "1"}


def serve(module: str, env: dict | None = None, server: str = "uvicorn") -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    if server == "gunicorn":
        cmd = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", f"{module}:app", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=CASES_DIR, env={**_env(), **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # ready when it serves its OpenAPI page: no request reaches the model
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=5)
            return proc, port
        except urllib.error.HTTPError:  # (a Flask app has no such page: any answer says it serves)
            return proc, port
        except OSError:
            time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError(f"{module} did not start")


def sent(case: Case, body: Path) -> list[str]:
    """What ``servescope bench`` and ``doctor`` send: the JSON body, or the form upload."""
    return ["-X", case.method, "--file", f"{case.upload}={body}"] if case.upload else ["--body", str(body)]


def first_request_ms(module: str, case: Case, body: Path, env: dict | None = None) -> float:
    proc, port = serve(module, env, case.server)
    try:
        data = body.read_bytes()
        t0 = time.perf_counter()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{case.path}", data=data, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()
        return (time.perf_counter() - t0) * 1000
    finally:
        stop_group(proc)


def bench_p50(module: str, case: Case, body: Path, seconds: float, tmp: Path, env: dict | None = None) -> dict:
    proc, port = serve(module, env, case.server)
    try:
        out = tmp / f"bench-{module}.json"
        url = f"http://127.0.0.1:{port}{case.path}"
        cmd = [sys.executable, "-m", "servescope", "bench", url, *sent(case, body), "-c", str(case.concurrency),
               "-d", f"{seconds:g}s", "--warmup", "2s", "--json", str(out)]  # fmt: skip
        subprocess.run(cmd, capture_output=True, timeout=seconds + 120, env=_env(), check=False)
        data = json.loads(out.read_text())
        if not data["latency"].get("p50_ms"):
            raise RuntimeError(f"{module}: no request succeeded: {data.get('errors')} {data['load'].get('first_error')}")
        if case.streamed:  # what a streamed answer's reader waits for: its first token
            return {"p50": data["load"]["stream"]["ttft"]["p50_ms"], "rps": data["load"]["throughput_rps"]}
        return {"p50": data["latency"]["p50_ms"], "rps": data["load"]["throughput_rps"]}
    finally:
        stop_group(proc)


def realized_once(case: Case, body: Path, seconds: float, tmp: Path) -> tuple[float, float]:
    """(before, after): the endpoint and its fixed twin, back to back."""
    measure = first_request_ms if case.cold else lambda *a, **k: bench_p50(*a, seconds, tmp, **k)["p50"]
    return measure(case.module, case, body), measure(case.twin, case, body, env=case.fixed_env)


def doctor(case: Case, body: Path, tmp: Path) -> dict:
    out = tmp / f"doctor-{case.module}.json"
    cmd = [sys.executable, "-m", "servescope", "doctor", str(CASES_DIR / f"{case.module}.py") + ":app", *sent(case, body),
           "--path", case.path, "-c", str(max(case.concurrency, 8)), "--json", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    p = run_alone(cmd, timeout=600, env=_env(), cwd=tmp)  # (a session of its own, as the servers')
    took = time.perf_counter() - t0
    if not out.exists():
        return {"error": (p.stdout + p.stderr)[-400:], "seconds": took}
    report = json.loads(out.read_text())
    found = {f["id"]: f for f in report["findings"]}
    f = found.get(case.cause)
    row = {"seconds": took, "found": sorted(found), "not_checked": report.get("diagnosis", {}).get("not_checked", {})}
    if f is not None:
        row.update(saving=f.get("saving_ms"), severity=f["severity"], basis=f.get("saving_basis", "estimated"), at=f.get("saving_load", ""),
                   interval=[f.get("saving_low_ms"), f.get("saving_high_ms")])  # fmt: skip
        # the p50 the saving is a share of: the unchanged endpoint's in the experiment, or the warm p50
        base = (f["evidence"].get("p50_ms") if isinstance(f.get("evidence"), dict) else None) or report["latency"].get("p50_ms")
        what_if = report["diagnosis"]["evidence"].get("experiments", {}).get(EXPERIMENT.get(case.cause, ""))
        if what_if and what_if.get("tried"):
            base = what_if["base_p50_ms"]
        if case.cold:
            base = report["latency"].get("first_ms")
        row["base"] = base
        row["own_ms"] = f["evidence"].get("load_ms_per_request") if isinstance(f.get("evidence"), dict) else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--neighbour", action="store_true", help="keep one core busy with another process for the whole run")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--doctor-runs", type=int, default=3, help="doctor runs per case, one a round (are the findings the same each time?)")
    ap.add_argument("--skip-realized", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(CASES_DIR))
    from _common import ensure_weights

    ensure_weights()
    tmp = Path(tempfile.mkdtemp(prefix="servescope-savings-"))
    chosen = [c for c in cases() if (c.name in args.only.split(",") if args.only else c.quiet_too or args.neighbour)]
    rows = []
    with neighbour(args.neighbour):
        for case in chosen:
            body = tmp / f"{case.module}.json"
            body.write_text(json.dumps(case.body))
            if case.upload:
                body = tmp / f"{case.module}.png"
                body.write_bytes(base64.b64decode(case.body["image"]))
            # each round: a doctor run (while there are runs to make), then the endpoint and its
            # twin back to back, so that the machine's drift over minutes falls on all three
            runs, befores, afters = [], [], []
            for k in range(max(args.rounds, args.doctor_runs)):
                if k < args.doctor_runs:
                    runs.append(doctor(case, body, tmp))
                if k < args.rounds and not args.skip_realized:
                    b, a = realized_once(case, body, args.seconds, tmp)
                    befores.append(b)
                    afters.append(a)
            real = None
            if befores:
                diffs = [b - a for b, a in zip(befores, afters)]
                real = {"before": statistics.median(befores), "after": statistics.median(afters), "saving": statistics.median(diffs), "diffs": diffs,
                        "befores": befores}  # fmt: skip
            rows.append((case, runs, real))
            print(json.dumps({"case": case.name, "doctor": runs, "realized": real}), flush=True)
    print()
    print(f"{'case':<22} {'cause':<22} {'load':>8} {'doctor ms':>10} {'(runs)':>15} {'basis':>9} {'realized ms':>12} {'(rounds)':>13} {'ratio':>6} "
          f"{'share d/r':>10} {'same':>5} {'doctor s':>9}")  # fmt: skip
    for case, runs, real in rows:
        load = "first" if case.cold else f"c={case.concurrency}" + (" TTFT" if case.streamed else "")
        said = [r["saving"] for r in runs if r.get("saving") is not None]
        mid = statistics.median(said) if said else None
        spread = f"{min(said):.1f}-{max(said):.1f}" if len(said) > 1 else ""
        basis = "/".join(sorted({r.get("basis") or "-" for r in runs}))
        if mid is not None and real and real["saving"] > 0:
            ratio = f"{mid / real['saving']:.2f}"
        elif real and real["saving"] <= 0 and mid is None:
            ratio = "both 0"  # the doctor said the fix gains nothing, and it gained nothing
        else:
            ratio = "-"
        # the saving as a share of the unchanged endpoint's p50, the doctor's against the twin's:
        # a machine that runs slower for a few minutes scales both figures alike
        shares = [r["saving"] / r["base"] for r in runs if r.get("saving") and r.get("base")]
        share = f"{statistics.median(shares) / (real['saving'] / real['before']):.2f}" if shares and real and real["saving"] > 0 else "-"
        same = sum(1 for r in runs if r.get("found") == runs[0].get("found"))
        shown = f"{mid:.1f}" if mid is not None else "none"
        # the twin's own spread, round to round: a saving near it cannot give a ratio to trust
        rounds = f"{min(real['diffs']):.1f}-{max(real['diffs']):.1f}" if real and len(real["diffs"]) > 1 else ""
        print(f"{case.name:<22} {case.cause:<22} {load:>8} {shown:>10} {spread:>15} {basis:>9} "
              f"{(real['saving'] if real else float('nan')):>12.1f} {rounds:>13} {ratio:>6} {share:>10} {f'{same}/{len(runs)}':>5} {max(r['seconds'] for r in runs):>9.1f}")  # fmt: skip

if __name__ == "__main__":
    main()

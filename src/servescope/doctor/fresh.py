"""A fix that lives in the environment, tried in fresh processes: some settings are read only
when a library loads (OpenMP's wait policy, read when torch loads its runtime), so they cannot
be applied to the running endpoint for a block of requests and undone. The endpoint is started
twice, in new interpreters (no probes): as written, and with the change to its environment;
blocks of sequential requests then alternate between the two (A B B A A B ..., the same body),
and the paired differences of the blocks' medians give the saving with its interval, as the
in-process experiments' do (experiments/lab.py).

    what_if = compare_environments("app.py:app", "payload.json", options, {"OMP_WAIT_POLICY": "PASSIVE"},
                                   words="OMP_WAIT_POLICY=PASSIVE", budget_s=20)

Each child is ``python -m servescope.doctor.fresh JOB.json CMD_FD REPLY_FD``: it starts the
endpoint, says so, and answers each line ``N`` on CMD_FD with N requests' times on REPLY_FD.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..allocator import KEEP_FREED, keep_freed_words
from ..environment import CpuReading, minor_faults, resident_mb
from .evidence import TORCH_KINDS, Evidence, WhatIf

__all__ = [
    "PASSIVE", "FreshTrials", "churn_called_for", "compare_environments", "fresh_blocks_s", "passive_called_for", "start_endpoint",
    "try_keep_freed", "try_wait_policy",
]  # fmt: skip

#: OpenMP's idle threads asleep instead of spinning (read when the OpenMP runtime loads)
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}

#: Requests each process answers before the blocks (a first request's imports, caches): the first
#: in both processes at once, the others one process at a time.
WARM = 2
#: A block lasts about this long (at least one request, at most ``MAX_BLOCK`` of them): its
#: count is sized from the warm requests, and a child ends a block early once ``BLOCK_CAP`` times
#: that has passed (a warm request that ran fast does not make every block take minutes)
BLOCK_S, MAX_BLOCK, BLOCK_CAP = 0.5, 100, 2.0
#: The blocks get this share of the doctor's ``experiment_seconds``, at most ``MAX_BLOCKS_S``
#: (the processes' start-up comes on top).
BLOCKS_SHARE, MAX_BLOCKS_S = 0.5, 6.0
#: Pairs of blocks: at least ``MIN_PAIRS`` (an interval from 5 pairs covers 94%), at most ``MAX_PAIRS``.
MIN_PAIRS, MAX_PAIRS = 5, 8


def start_endpoint(job: dict[str, Any]) -> tuple[Any, bytes]:
    """The endpoint of ``job`` (spec, payload, path, method, files, timeout_s), started, and the
    body to send it: what a fresh process of the doctor's runs."""
    import orjson

    from ..loader import load_target
    from .endpoints import make_endpoint
    from .endpoints.main_thread import call_on_main_thread
    from .options import DoctorOptions
    from .send import Send

    payload = orjson.loads(Path(job["payload"]).read_bytes()) if job["payload"] else None
    send = Send.of(payload, path=job["path"], files=DoctorOptions(path=job["path"], files=job["files"]).upload())
    target = call_on_main_thread(load_target, job["spec"])  # (imported where its server would import it)
    endpoint = make_endpoint(target, path=job["path"], send=send, method=job["method"])
    endpoint.start(job["timeout_s"])
    endpoint.ready_load()  # (an app's requests come from a helper process, as in the doctor's run)
    return endpoint, send.body


def passive_called_for(ev: Evidence) -> bool:
    """OpenMP's default wait (its idle threads spin before they sleep) in a process whose torch
    model ran on 2+ threads while other processes kept a core busy: each parallel region can
    stall on a spinning thread that took the core its partner needs."""
    env, machine = ev.environment, ev.machine
    if env is None or machine is None or not machine.busy or env.omp_wait_policy != "default" or (env.torch_threads or 0) < 2:
        return False
    forwards = ev.warm.forwards if ev.warm is not None else None
    return forwards is not None and not TORCH_KINDS.isdisjoint(forwards.kinds)


def fresh_blocks_s(options: Any) -> float:
    """The time the fresh processes' blocks get: taken from the experiments' time (the fixes at
    one client keep the rest) so the run ends about when its budgets say."""
    return min(BLOCKS_SHARE * options.experiment_seconds, MAX_BLOCKS_S)


#: a page fault costs about this much (a 4-KiB page mapped and zeroed: 50-60k faults took 57-67
#: ms of a request here); the warm requests' faults at this price must come to ``CHURN_SHARE`` of
#: their p50, and ``CHURN_MIN_MS``, for keeping freed memory to be tried
FAULT_MS, CHURN_SHARE, CHURN_MIN_MS = 0.001, 0.02, 1.0


def churn_called_for(ev: Evidence) -> bool:
    """The requests fault fresh memory in on glibc's malloc as it ships (no setting of the
    user's, no other allocator preloaded), enough for their price to matter. Not where a model is
    loaded per request: loading it once is the fix, and its buffers go with it."""
    from ..rules.loads import loads_a_model

    env, warm = ev.environment, ev.warm
    if env is None or warm is None or env.allocator != "glibc" or env.malloc_setting or loads_a_model(warm):
        return False
    cost, p50 = (warm.minor_faults_per_request or 0.0) * FAULT_MS, warm.p50_ms or ev.p50_ms
    return cost >= CHURN_MIN_MS and cost >= CHURN_SHARE * p50


def _try(change: dict[str, str], words: str, try_environment: Callable[..., WhatIf], options: Any, **kw: Any) -> WhatIf:
    """``change`` tried by ``try_environment`` (``compare_environments`` bound to the doctor's
    endpoint). A failure is the experiment's, reported as not tried with the error, never the
    doctor's crash."""
    try:
        return try_environment(change, words, fresh_blocks_s(options), **kw)
    except Exception as exc:  # noqa: BLE001 - reported, never our crash
        return WhatIf(fix=words, why_not=f"the experiment failed: {type(exc).__name__}: {exc}"[:300])


def try_wait_policy(ev: Evidence, try_environment: Callable[..., WhatIf], options: Any, **kw: Any) -> WhatIf | None:
    """``OMP_WAIT_POLICY=PASSIVE`` tried where the evidence calls for it; None where it does not."""
    return _try(PASSIVE, "OMP_WAIT_POLICY=PASSIVE", try_environment, options, **kw) if passive_called_for(ev) else None


def try_keep_freed(ev: Evidence, try_environment: Callable[..., WhatIf], options: Any, **kw: Any) -> WhatIf | None:
    """glibc's malloc keeping freed memory (``KEEP_FREED``) tried where the requests fault fresh
    memory in; None where they do not."""
    return _try(KEEP_FREED, keep_freed_words(), try_environment, options, **kw) if churn_called_for(ev) else None


#: Two processes starting at once take about this many times the doctor's own import of the
#: target (on a busy machine they share the CPU its import had)
STARTS_AT_ONCE = 2.0


class FreshTrials:
    """``try_environment`` for the doctor's run: ``compare_environments`` on its endpoint, and
    about how long a try takes (``expected_s``), so the phases before it leave it that time.
    ``import_s``: how long the doctor's own import of the target took (None: unknown)."""

    def __init__(self, spec: str, payload_path: str | None, options: Any, import_s: float | None = None) -> None:
        self.spec, self.payload_path, self.options, self.import_s = spec, payload_path, options, import_s

    def __call__(self, change: dict[str, str], words: str, budget_s: float, first_alone: bool = False) -> WhatIf:
        return compare_environments(self.spec, self.payload_path, self.options, change, words=words, budget_s=budget_s, first_alone=first_alone)

    def expected_s(self, p50_ms: float, first_alone: bool = False) -> float:
        """Seconds a try takes for requests of ``p50_ms``: both processes' start, their warm
        requests (a first one costs more; one after the other with ``first_alone``), and the
        least pairs of blocks or the blocks' time."""
        start = STARTS_AT_ONCE * (self.import_s if self.import_s is not None else 5.0)
        block_s = max(p50_ms / 1000, BLOCK_S)
        warm = (1.5 * WARM + (1.5 if first_alone else 0.0)) * p50_ms / 1000
        return start + warm + max(fresh_blocks_s(self.options), 2 * MIN_PAIRS * block_s)


def job_of(spec: str, payload_path: str | None, options: Any) -> dict[str, Any]:
    return {"spec": spec, "payload": payload_path, "path": options.path, "timeout_s": options.timeout_s, "method": options.method, "files": options.files}


class _Child:
    """One fresh process of the endpoint, driven over a pair of pipes."""

    def __init__(self, job: Path, env: dict[str, str]) -> None:
        cmd_r, self.cmd = os.pipe()
        self.reply, reply_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servescope.doctor.fresh", str(job), str(cmd_r), str(reply_w)],
            env=env, pass_fds=(cmd_r, reply_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(cmd_r)
        os.close(reply_w)
        self.buffer = b""

    def read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.reply], [], [], left)[0]:
                return {"error": f"no answer within {timeout_s:g} s"}
            chunk = os.read(self.reply, 65536)
            if not chunk:
                return {"error": f"the process ended (exit code {self.proc.wait()})"}
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, n: int, cap_s: float = 0.0) -> bool:
        """Asks for ``n`` requests' times (read them with ``read``), fewer if ``cap_s`` seconds
        pass first (at least one; 0: no cap); False if the process ended."""
        try:
            os.write(self.cmd, f"{n} {cap_s:g}\n".encode())
        except OSError:
            return False
        return True

    def block(self, n: int, timeout_s: float, cap_s: float = 0.0) -> dict[str, Any]:
        return self.read(timeout_s * (n + 1)) if self.ask(n, cap_s) else {"error": "the process ended"}

    def end(self) -> None:
        for fd in (self.cmd, self.reply):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def compare_environments(
    spec: str,
    payload_path: str | None,
    options: Any,
    change: dict[str, str],
    *,
    words: str,
    budget_s: float,
    tick: Callable[[], None] = lambda: None,
    first_alone: bool = False,
) -> WhatIf:
    """The endpoint as written (A) against the same endpoint with ``change`` in its environment
    (B), each in a fresh process, in alternating blocks of sequential requests within about
    ``budget_s`` (after both have started). Not tried, with why, when either fails.
    ``first_alone``: A's first request runs with B idle, and its time is kept
    (``base_first_ms``): the process as written is then also the doctor's second first
    request, and A's p50 that process's (one process started where two were)."""
    out = WhatIf(fix=f"{words}, set in a fresh process of the endpoint beside one as written")
    with tempfile.TemporaryDirectory(prefix="servescope-fresh-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps(job_of(spec, payload_path, options)))
        base_env = dict(os.environ)
        children = {"A": _Child(job, base_env), "B": _Child(job, {**base_env, **change})}
        try:
            return _blocks(children, out, options.timeout_s, budget_s, tick, first_alone)
        finally:
            for child in children.values():
                child.end()


def _blocks(children: dict[str, _Child], out: WhatIf, timeout_s: float, budget_s: float, tick: Callable[[], None], first_alone: bool) -> WhatIf:
    start_limit = 120.0 + timeout_s
    for arm, child in children.items():
        said = child.read(start_limit)
        if "error" in said:
            out.why_not = f"the fresh process {'as written' if arm == 'A' else 'with the fix'} did not start: {said['error']}"
            return out
    tick()
    # the first requests (imports, caches) in both at once, or one after the other where A's is
    # timed as a first request; the rest one process at a time: their times size the blocks
    if first_alone:
        warm = {arm: child.block(1, timeout_s) for arm, child in children.items()}
        if "error" not in warm["A"]:
            out.base_first_ms = warm["A"]["ms"][0]
    else:
        sent = {arm: child.ask(1) for arm, child in children.items()}
        warm = {arm: children[arm].read(2 * timeout_s) if ok else {"error": "the process ended"} for arm, ok in sent.items()}
    if not any("error" in w for w in warm.values()):
        warm = {arm: child.block(WARM - 1, timeout_s) for arm, child in children.items()}
    if failed := next((f"{arm}: {w['error']}" for arm, w in warm.items() if "error" in w), None):
        out.why_not = f"a fresh process's requests failed ({failed})"
        return out
    typical = max(min(w["ms"]) for w in warm.values())
    n = max(1, min(MAX_BLOCK, round(BLOCK_S * 1000 / max(typical, 1e-3))))
    answers: dict[str, set[str]] = {"A": set(), "B": set()}
    times: dict[str, list[float]] = {"A": [], "B": []}
    faults, rss = {"A": 0, "B": 0}, {"A": None, "B": None}
    diffs: list[float] = []
    from .experiments.lab import paired_saving, settled
    from .live.cpu import ProcessCpu

    reading, ours, deadline = CpuReading(), ProcessCpu([c.proc.pid for c in children.values()]), time.perf_counter() + budget_s
    for i in range(MAX_PAIRS):
        if i >= MIN_PAIRS and (time.perf_counter() > deadline or settled(diffs, statistics.median(times["A"]))):
            break
        medians = {}
        for arm in ("AB" if i % 2 == 0 else "BA"):
            got = children[arm].block(n, timeout_s, BLOCK_CAP * BLOCK_S)
            if "error" in got:
                out.why_not = f"a fresh process's request failed ({'as written' if arm == 'A' else 'with the fix'}: {got['error']})"
                return out
            times[arm] += got["ms"]
            answers[arm].update(got["answers"])
            faults[arm] += got.get("faults") or 0
            rss[arm] = got.get("rss_mb")
            medians[arm] = statistics.median(got["ms"])
        diffs.append(medians["A"] - medians["B"])
        tick()
    if len(answers["A"]) == 1 and len(answers["B"]) == 1 and answers["A"] != answers["B"]:
        out.why_not = "the two processes answered the same body differently"
        return out
    est, low, high, coverage = paired_saving(diffs)
    out.tried, out.pairs, out.requests, out.pair_diffs_ms = True, len(diffs), len(times["B"]), [round(d, 3) for d in diffs]
    out.base_p50_ms, out.fixed_p50_ms = round(statistics.median(times["A"]), 3), round(statistics.median(times["B"]), 3)
    out.saving_ms, out.low_ms, out.high_ms, out.coverage = round(est, 3), round(low, 3), round(high, 3), round(coverage, 3)
    out.answers = "same" if answers["A"] == answers["B"] and len(answers["A"]) == 1 else "vary from call to call: not compared"
    out.base_faults_per_request = round(faults["A"] / len(times["A"]), 1) if times["A"] else None
    out.fixed_faults_per_request = round(faults["B"] / len(times["B"]), 1) if times["B"] else None
    if rss["A"] is not None and rss["B"] is not None:
        out.extra_mb = round(rss["B"] - rss["A"], 1)
    _, others, _ = reading.since()
    fresh, _, _ = ours.since()  # (the fresh processes are the doctor's, not a neighbour)
    out.others_cores = round(max(others - (fresh or 0.0), 0.0), 2) if others is not None else None
    return out


def _answer_hash(answer: Any) -> str:
    data = answer if isinstance(answer, bytes | bytearray) else repr(answer).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def main(argv: list[str]) -> None:
    from .endpoints.main_thread import lend_main_thread

    job = json.loads(Path(argv[1]).read_text())
    lend_main_thread(lambda: _answer(job, os.fdopen(int(argv[2]), "rb"), os.fdopen(int(argv[3]), "wb", buffering=0)))


def _answer(job: dict[str, Any], commands: Any, reply: Any) -> None:
    def say(**msg: Any) -> None:
        reply.write(json.dumps(msg).encode() + b"\n")

    try:
        endpoint, body = start_endpoint(job)
        say(started=True)
        first = True
        for line in commands:  # (the parent closes the pipe when it is done: the loop ends)
            ms, seen, faults0 = [], set(), minor_faults()
            n, cap_s = line.split()
            error = ""
            cap = float(cap_s) if float(cap_s) > 0 else int(n) * job["timeout_s"]  # (0: no cap but their timeouts)
            for obs in endpoint.one_by_one(body, int(n), job["timeout_s"], cap):
                if obs.error:
                    error = obs.error[:300]
                    break
                ms.append(round(obs.latency_ms, 3))
                seen.add(_answer_hash(obs.answer))
            faults = minor_faults() - faults0
            say(**({"error": error} if error else {"ms": ms, "answers": sorted(seen), "faults": faults, "rss_mb": resident_mb()}))
            if first:  # (the start-up's first full collection, before the requests timed: as the doctor's run does)
                first = False
                gc.collect()
    except BaseException as exc:  # noqa: B036 - whatever happens, the parent hears of it
        try:
            say(error=f"{type(exc).__name__}: {exc}"[:300])
        except OSError:
            pass
    os._exit(0)  # threads the endpoint left behind must not hold the process up


if __name__ == "__main__":
    main(sys.argv)

"""The doctor's part of the terminal view: the verdict first, then findings worst first
(each with its saving in the unit it really has), then what was not checked and why."""

from __future__ import annotations

from typing import Any

from rich.padding import Padding
from rich.syntax import Syntax
from rich.text import Text

from ..doctor.evidence import TORCH_KINDS
from ..report import Finding, Report
from ..sections import Diagnosis

__all__ = ["doctor_sections", "saving_text", "unprobed_p50"]

_SEVERITY_STYLE = {"critical": "bold white on red", "high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _ms(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


#: the p50 without the probes is said beside the baseline when the probed one is this much slower
PROBED_SLOWER = 1.1


def unprobed_p50(report: Report) -> str:
    """What a server shows at one client beside the doctor's baseline, where they differ by
    more than a tenth on a machine that was not busy: the baseline's requests ran under the
    doctor's instruments (the probes, the sampler, the loop watch: they time the stages), and
    those slow some endpoints by a fifth (a `joblib.load` per request under FastAPI: 522 ms
    instrumented, 428-444 under uvicorn, 448-457 in the doctor's requests without them)."""
    ev = (report.diagnosis.evidence if isinstance(report.diagnosis, Diagnosis) else None) or {}
    alone, probed = (ev.get("concurrent") or {}).get("served_alone_p50_ms"), report.latency.get("p50_ms")
    if not alone or not probed or probed < PROBED_SLOWER * alone or (ev.get("machine") or {}).get("busy"):
        return ""
    tried = " the fixes were tried without them." if any((w or {}).get("tried") for w in (ev.get("experiments") or {}).values()) else ""
    return (f"Without the doctor's instruments (probes, sampler, loop watch): p50 {_ms(alone)} ms, a few requests one at a "
            f"time; under them {_ms(probed)} ms, {probed / alone - 1:.0%} slower. The stages are timed under them" + (";" + tried if tried else "."))


def saving_text(f: Finding) -> str:
    """The saving in the unit and at the load it has, and whether the fix was tried:
    "~140 ms/request to gain at c=1 (measured, 128-152)", an interval under 95% with its
    coverage ("measured, 30-52 at 75%"), or "... (estimated)"."""
    if not f.saving_ms:
        return ""
    if f.saving_per == "first request":
        text = f"~{_ms(f.saving_ms)} ms once, on the first request"
    else:
        text = f"~{_ms(f.saving_ms)} ms/request to gain" + (f" at {f.saving_load}" if f.saving_load else "")
    if f.saving_basis == "measured":
        lo, hi = f.saving_low_ms, f.saving_high_ms
        level = f" at {f.saving_coverage:.0%}" if f.saving_coverage is not None and f.saving_coverage < 0.95 else ""
        text += f" (measured, {_ms(max(lo, 0.0))}-{_ms(hi)}{level})" if lo is not None and hi is not None else " (measured)"
    elif f.saving_basis == "estimated":
        text += " (estimated)"
    return text


def _verdict(report: Report) -> list[Any]:
    diagnosis = report.diagnosis or Diagnosis()
    v = diagnosis.verdict
    if v is None or v.diagnosed:
        return []
    out: list[Any] = [Text("Could not diagnose this endpoint: " + (v.reason or "no request succeeded"), style="bold red")]
    if v.hint:  # what to do, right under the headline
        out.append(Padding(Text(v.hint, style="bold"), (0, 0, 0, 4)))
    failures = v.failures
    if failures:
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(failures.items(), key=lambda kv: -kv[1]))
        out.append(Padding(Text(f"failed requests by kind: {kinds}"), (0, 0, 0, 4)))
    if v.routes:
        out.append(Padding(Text("the app's routes: " + ", ".join(v.routes)), (0, 0, 0, 4)))
    lines = diagnosis.endpoint_output
    if lines:
        out.append(Padding(Text("the endpoint's last output:\n" + "\n".join(lines), style="dim"), (0, 0, 0, 4)))
    out.append(Text("No findings: nothing was measured that a diagnosis could rest on (exit status 3).", style="red"))
    return out


def _machine(report: Report) -> list[Any]:
    """A busy machine said before the findings: what it does to the figures."""
    evidence = (report.diagnosis.evidence if report.diagnosis is not None else None) or {}
    m = evidence.get("machine") or {}
    if not isinstance(m, dict) or not m.get("busy"):
        return []
    spread = m.get("warm_p90_over_p50")
    text = (
        f"The machine was busy: {m.get('why_busy') or 'other processes used its CPUs'}"
        + (f" (the warm requests' p90 was {spread:g}x their p50)" if isinstance(spread, (int, float)) else "")
        + ". Every timing is slower and noisier than on a quiet machine. Savings measured by trying a fix alternate "
        "blocks with and without it, so both saw the same machine; a slow first request is only claimed when a fresh "
        "process repeats it."
    )
    env = evidence.get("environment") or {}
    forwards = ((evidence.get("warm") or {}).get("forwards") or {}) if isinstance(evidence.get("warm"), dict) else {}
    torch_model = not TORCH_KINDS.isdisjoint(forwards.get("kinds") or [])  # (torch may be loaded where no torch model runs)
    tried = ((evidence.get("experiments") or {}).get("omp-passive") or {}) if isinstance(evidence.get("experiments"), dict) else {}
    if tried.get("tried"):
        text += (
            f" OMP_WAIT_POLICY=PASSIVE was tried in fresh processes of the endpoint: p50 {tried.get('base_p50_ms'):.4g} ms as "
            f"written, {tried.get('fixed_p50_ms'):.4g} ms with it."
        )
    elif isinstance(env, dict) and env.get("omp_wait_policy") == "default" and (env.get("torch_threads") or 0) >= 2 and torch_model:
        text += (
            " torch's OpenMP threads spin before they sleep (OpenMP's default: OMP_WAIT_POLICY is not set). Beside a "
            "neighbour that makes a process's speed depend on its threads' history (one endpoint served twice by uvicorn "
            "beside one busy core: 1,100 and 99 ms a request, docs/benchmarks.md), so the milliseconds below may be "
            "several-fold off your server's. Set OMP_WAIT_POLICY=PASSIVE in the server's environment and run the doctor "
            "again with it for figures to bank on."
        )
    return [Text(text, style="yellow")]


def _streamed(report: Report) -> list[Any]:
    """A streamed answer's figures, at each load: what its reader waits for."""
    evidence = (report.diagnosis.evidence if report.diagnosis is not None else None) or {}
    parts = []
    for phase, load in (("warm", "c=1"), ("concurrent", None)):
        e = evidence.get(phase) or {}
        if not isinstance(e, dict) or e.get("first_chunk_p50_ms") is None:
            continue
        at = load or f"c={e.get('concurrency')}"
        text = f"at {at}: first chunk p50 {_ms(e['first_chunk_p50_ms'])} ms"
        if e.get("chunk_gap_p50_ms") is not None:
            text += f", gaps between chunks p50 {_ms(e['chunk_gap_p50_ms'])} ms, p95 {_ms(e['chunk_gap_p95_ms'])} ms"
        parts.append(text)
    return [Text("Streamed answers " + "; ".join(parts) + ".")] if parts else []


def doctor_sections(report: Report) -> list[Any]:
    out = _verdict(report)
    if out:
        return out
    out.extend(_machine(report))
    out.extend(_streamed(report))
    findings = report.findings_by_severity()
    if not findings:
        out.append(Text("No problems found.", style="bold green"))
    else:
        out.append(Text(f"Findings ({len(findings)}), worst first:", style="bold"))
    for f in findings:
        head = Text()
        head.append(f" {f.severity.upper()} ", style=_SEVERITY_STYLE.get(f.severity, ""))
        head.append(f" {f.title}  ", style="bold")
        head.append(f"[{f.id}]", style="dim")
        saving = saving_text(f)
        if saving:
            head.append(f"  {saving}", style="green")
        out.append(head)
        if f.evidence:
            ev = " · ".join(f"{k}={v}" for k, v in f.evidence.items())
            out.append(Padding(Text(f"evidence: {ev}", style="dim"), (0, 0, 0, 4)))
        if f.detail:
            out.append(Padding(Text(f.detail), (0, 0, 0, 4)))
        if f.fix:
            out.append(Padding(Syntax(f.fix, "python", theme="ansi_dark", background_color="default"), (0, 0, 1, 4)))
    diagnosis = report.diagnosis or Diagnosis()
    unattributed = diagnosis.unattributed
    if unattributed is not None and unattributed.share:
        out.append(
            Text(
                f"{unattributed.share * 100:.0f}% of each request is "
                + (unattributed.why or "outside every stage the probes know (the framework, or code that calls no model, "
                   "loader or serializer they see): the breakdown cannot say what it is. servescope.stage() around your own "
                   "steps names it.")
                + (f" The sampler found it in {unattributed.where}." if unattributed.where else ""),
                style="yellow",
            )  # fmt: skip
        )
    for name, why in diagnosis.probes_disabled.items():
        out.append(Text(f"Probe switched off mid-run: {name} ({why}); the endpoint's calls went on unprobed.", style="yellow"))
    not_checked = diagnosis.not_checked
    if not_checked:
        out.append(Text(f"Not checked ({len(not_checked)}):", style="bold"))
        for rule, why in not_checked.items():
            out.append(Padding(Text(f"{rule}: {why}", style="dim"), (0, 0, 0, 4)))
    return out

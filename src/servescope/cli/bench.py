"""``servescope bench URL``: load an endpoint; per-stage latency from its Server-Timing."""

from __future__ import annotations

import argparse
from typing import Any, Callable, NamedTuple

from rich.console import Console

from . import common
from ..load.openai_api import DEFAULT_MAX_TOKENS
from .common import duration, int_list, positive_int, rate_list

NAME = "bench"
HELP = "load-test an HTTP endpoint; per-stage latency from its Server-Timing"
EPILOG = (
    "exit status: 0 measured (and with --slo: every level met it; with --find-max: a rate met it), "
    "1 a level missed the --slo (with --find-max: no rate met it), 2 bad arguments or an endpoint out of reach, "
    "3 most requests of a level failed (or none completed): the run did not measure the endpoint"
)
#: With --slo: a level missed it (--find-max: no rate met it).
EXIT_SLO_MISSED = 1
#: Most requests of a level failed, or no level completed.
EXIT_NOT_MEASURED = 3


def slo(text: str) -> object:
    from ..exceptions import ConfigError
    from ..load.slo import SLO

    try:
        return SLO.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tokens(text: str) -> object:
    from ..exceptions import ConfigError
    from ..load.workload import TokenSpec

    try:
        return TokenSpec.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def share(text: str) -> float:
    value = text.strip().removesuffix("%")
    try:
        out = float(value) / 100
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 5%, got {text!r}") from None
    if not 0 < out < 1:
        raise argparse.ArgumentTypeError(f"must be between 0% and 100%, got {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the endpoint, e.g. http://127.0.0.1:8000/predict")
    parser.add_argument("-X", "--method", default=None, help="HTTP method (default GET, or POST with a body)")
    common.add_body(parser, many=True)
    parser.add_argument("--data", metavar="FILE.jsonl", help="request bodies, one JSON value a line (with --openai: one prompt a line); latency by input size when they differ")
    parser.add_argument("--order", choices=["cycle", "random"], default="cycle", help="the bodies (--body, --data, --prompt) in order, again and again (cycle, the default), or each pass shuffled (random, seeded by --seed)")
    common.add_file(parser)
    parser.add_argument("--openai", action="store_true", help="an OpenAI-compatible URL (/v1/chat/completions or /v1/completions): streamed requests built from --prompt or --data, output tokens counted (docs/bench.md)")
    parser.add_argument("--model", metavar="NAME", help="with --openai: the model (default: the first the server lists at /v1/models)")
    parser.add_argument("--prompt", metavar="TEXT", action="append", default=[], help="with --openai: a prompt; repeat to cycle several")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help='with --openai: ask for plain answers ("stream": false), their tokens counted from usage')
    parser.add_argument("--max-tokens", metavar="N", type=positive_int, help=f"with --openai: max_tokens of each request (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--input-tokens", metavar="N|MEAN:SD|LOW-HIGH", type=tokens, help="with --openai: synthetic prompts of this many tokens (fixed, normal or uniform), seeded by --seed, counted by --tokenizer or approximately")
    parser.add_argument("--output-tokens", metavar="N|MEAN:SD|LOW-HIGH", type=tokens, help="with --openai: each request's max_tokens drawn from this (instead of --max-tokens); add --ignore-eos to have them all")
    parser.add_argument("--tokenizer", metavar="PATH", help="with --openai: a local tokenizer folder (or its tokenizer.json) that counts --input-tokens exactly and --data prompts in tokens")
    parser.add_argument("--turns", metavar="N", type=positive_int, default=1, help="with --openai: conversations of N turns, each sending the history so far (every prompt and the server's answer) and a new prompt; -c counts conversations under way, -r conversations started a second")
    parser.add_argument("--think-time", metavar="DURATION", type=duration, default=0.0, help="with --turns: the pause between an answer and the next turn (default 0s)")
    parser.add_argument("--ignore-eos", action="store_true", help='with --openai: "ignore_eos": true in each request (vLLM, SGLang): answers run to their max_tokens')
    parser.add_argument("-H", "--header", metavar="'NAME: VALUE'", action="append", default=[], type=common.header, help="'Name: value', repeatable")
    parser.add_argument("--content-type", metavar="TYPE", help="Content-Type of the body (default: JSON when the body parses as JSON)")
    parser.add_argument("-c", "--concurrency", metavar="N[,N...]", type=int_list, help="closed loop: requests in flight; a list (1,2,4,8) sweeps")
    parser.add_argument("-r", "--rate", metavar="R[,R...]", type=rate_list, help="open loop: requests/s on a fixed schedule; a list sweeps")
    parser.add_argument("--poisson", action="store_true", help="open loop with Poisson (random) arrivals")
    parser.add_argument("--trace", metavar="FILE.jsonl", help='replay a trace, open loop: one request a line, {"timestamp": MS, "input_length": N, "output_length": M} (with --openai: prompts of N tokens asking for M; without: the times only)')
    parser.add_argument("--trace-speedup", metavar="X", type=float, default=1.0, help="with --trace: send X times faster (2: twice the trace's rate; default 1)")
    parser.add_argument("-d", "--duration", metavar="DURATION", type=duration, default=None, help="measured time per level (default 10s; with --trace: the whole trace)")
    common.add_requests(parser, default=None, low=1, what="measured requests per level, instead of --duration")
    parser.add_argument("--warmup", metavar="DURATION", type=duration, default=None, help="load before measuring, excluded (default 1s; with --trace: 0s)")
    common.add_timeout(parser, default=30.0)
    parser.add_argument("--max-connections", metavar="N", type=positive_int, default=1024, help="open loop: connection cap (default 1024)")
    parser.add_argument("--seed", metavar="N", type=int, help="seed for --poisson arrivals and --order random")
    parser.add_argument("--slo", metavar="SLO", type=slo, help="objectives, e.g. 'p99<200ms,ttft_p95<500ms,itl_p99<50ms': goodput beside throughput, exit 1 when a level misses one (docs/bench.md)")
    parser.add_argument("--find-max", action="store_true", help="with --slo: search the highest open-loop rate that meets it (from --rate, default 10/s: doubling, then bisection), each probe --warmup + --duration long")
    parser.add_argument("--search-budget", metavar="DURATION", type=duration, default=300.0, help="--find-max: no probe starts past this much time (default 5m)")
    parser.add_argument("--search-resolution", metavar="PCT", type=share, default=0.05, help="--find-max: stop when the rate that missed is within PCT of the one that met (default 5%%)")
    parser.add_argument("--scrape", metavar="URL", help="the server's Prometheus metrics (vLLM, TGI, Triton, servescope: http://HOST:PORT/metrics), sampled over each level's measured window into the report; read once before any request is sent (exit 2 if that fails)")
    parser.add_argument("--scrape-interval", metavar="DURATION", type=duration, default=1.0, help="time between samples of --scrape and of the GPUs (default 1s, at least 100ms)")
    parser.add_argument("--no-gpu", dest="gpu", action="store_false", help="do not sample this machine's GPUs (by default their utilization and memory are, when nvidia-ml-py sees any: servescope[gpu])")
    common.add_ray(parser, "run the load generators on a Ray cluster")
    parser.add_argument("--generators", metavar="N", type=positive_int, default=None, help="with --ray: load generators (actors, one CPU each; default 2)")
    common.add_outputs(parser)
    parser.add_argument("--csv", metavar="FILE", help="write one row per measured request (times, status, error, TTFT, tokens, Server-Timing) as CSV")


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.text import Text

    from ..exceptions import ConfigError

    from ..load.bench import BenchOptions, failed_levels, run_bench
    from ..load.sweep import sweep_report, sweep_summary
    from ..payload import content_type_of
    from ..renderers.progress import BenchProgress
    from ..renderers.sweep import render_sweep
    from ..renderers.terminal import render_terminal
    from ..load.request_log import RequestLog

    if args.trace is None:
        if args.trace_speedup != 1.0:
            raise ConfigError("--trace-speedup goes with --trace")
        args.duration = 10.0 if args.duration is None else args.duration
    elif args.concurrency or args.rate or args.poisson or args.find_max or args.ray:
        raise ConfigError("a trace sets when each request is sent: --trace takes no --concurrency, --rate, --poisson, --find-max or --ray")
    args.warmup = (0.0 if args.trace else 1.0) if args.warmup is None else args.warmup
    sent = requests_of(args)
    bodies = sent.pop("bodies")
    options = BenchOptions(
        url=args.url,
        method=args.method or ("POST" if bodies else "GET"),
        bodies=bodies,
        headers=args.header,
        content_type=args.content_type or sent.pop("content_type") or (content_type_of(bodies[0]) if bodies else None),
        order=args.order,
        **sent,
        concurrency=args.concurrency or [],
        rate=args.rate or [],
        poisson=args.poisson,
        duration_s=args.duration,
        requests=args.requests,
        warmup_s=args.warmup,
        timeout_s=args.timeout,
        max_connections=args.max_connections,
        seed=args.seed,
        slo=args.slo,
        scrape=args.scrape,
        scrape_interval_s=args.scrape_interval,
        gpu=args.gpu,
    )
    if args.generators is not None and not args.ray:
        raise ConfigError("--generators goes with --ray")
    if args.scrape and args.ray:
        raise ConfigError("--scrape is not supported with --ray: bench from one machine to sample the server's metrics beside its load")
    out = common.table_console(args, console)
    log = RequestLog(args.csv) if args.csv else None  # now: a path that cannot be written fails before the load
    on_results = log.add if log is not None else None
    if args.find_max:
        return find_max(options, args, out, on_results=on_results)
    trace = options.trace
    seconds = None if args.requests else args.warmup + (args.duration or (trace.span_s / args.trace_speedup if trace else 0.0))
    with BenchProgress(out, seconds=seconds, requests=args.requests) as progress:
        if args.ray:
            from ..load.cluster import run_bench_ray

            reports = run_bench_ray(
                options, address=args.ray, generators=args.generators or 2, say=out.print, on_progress=progress.show,
                on_results=on_results,
            )  # fmt: skip
        else:
            reports = run_bench(options, on_tick=progress.tick, on_results=on_results)
    if log is not None:
        out.print(f"Request log ({log.rows} requests) saved to {args.csv}")
    if not reports:
        out.print("No load level completed.")
        return EXIT_NOT_MEASURED
    failed = failed_levels(reports)
    if failed:  # said first: the figures below are of error answers, not of the endpoint
        out.print(Text(f"Most requests failed, so this run did not measure the endpoint: {failed}", style="bold red"))
    rows = sweep_summary(reports)
    final = sweep_report(reports)
    if len(reports) > 1:
        render_sweep(rows, console=out)
    render_terminal(final, console=out)
    if final.meta.get("interrupted"):
        out.print("[yellow]Interrupted: the report covers what ran.[/]")
    common.write_outputs(final, args, out, sweep=rows)
    if failed:
        return EXIT_NOT_MEASURED
    missed = [r for r in reports if r.load is not None and r.load.slo is not None and not r.load.slo.met]
    return EXIT_SLO_MISSED if missed else 0


def requests_of(args: argparse.Namespace) -> dict[str, Any]:
    """The bodies to send (--body, --data, --file, or --openai's prompts), their Content-Type
    and input sizes; a combination that cannot be meant is refused in one line."""
    from ..exceptions import ConfigError
    from ..load.loadgen import URL
    from ..load.openai_api import api_of, first_model, request_bodies
    from ..load.trace import read_trace
    from ..payload import multipart_form, read_body, read_jsonl

    if args.body and args.data:
        raise ConfigError("give --body or --data, not both")
    llm = (args.prompt, args.model, args.max_tokens, not args.stream, args.input_tokens, args.output_tokens, args.tokenizer, args.ignore_eos, args.turns > 1)
    if not args.openai and any(llm):
        raise ConfigError("--prompt, --model, --max-tokens, --no-stream, --input-tokens, --output-tokens, --tokenizer, --ignore-eos and --turns go with --openai")
    if args.think_time and args.turns < 2:
        raise ConfigError("--think-time is the pause between turns: it goes with --turns 2 or more")
    if args.turns > 1 and (args.trace or args.ray or args.find_max):
        raise ConfigError("--turns runs conversations at -c or -r: it does not go with --trace, --ray or --find-max")
    trace = read_trace(args.trace, limit=args.requests) if args.trace else None
    replay = {"trace": trace, "trace_speedup": args.trace_speedup} if trace else {}
    if args.file:
        if args.body or args.data or args.openai:
            raise ConfigError("--file sends one form upload: it does not go with --body, --data or --openai")
        if args.content_type:
            raise ConfigError("--file sets the Content-Type itself (multipart/form-data and its boundary): drop --content-type")
        body, ctype = multipart_form(args.file)
        return {"bodies": [body], "content_type": ctype, **replay}
    lines = read_jsonl(args.data) if args.data else None
    if not args.openai:
        bodies = [raw for _, raw in lines] if lines else [read_body(name) for name in args.body]
        return {"bodies": bodies, "content_type": "application/json" if lines else None, **replay}
    api = api_of(URL.parse(args.url).path)
    if args.body:
        raise ConfigError("--openai builds its requests: give prompts with --prompt or --data, not --body")
    if sum(map(bool, (args.prompt, lines, args.input_tokens))) > 1:
        raise ConfigError("give one source of prompts: --prompt, --data or --input-tokens")
    if not args.prompt and not lines and not args.input_tokens and not args.trace:
        raise ConfigError("--openai needs prompts: --prompt TEXT, --data FILE.jsonl with one prompt a line, or --input-tokens N")
    if args.output_tokens and args.max_tokens:
        raise ConfigError("give --max-tokens or --output-tokens, not both")
    if trace is not None:
        return trace_requests(args, trace, api) | replay
    w = token_workload(args)  # (before the server is asked anything: a tokenizer that does not load is exit 2)
    model = args.model or first_model(args.url, headers=args.header)
    extra = {"ignore_eos": True} if args.ignore_eos else None
    bodies, sizes = request_bodies(
        api, model=model, max_tokens=w.max_tokens, prompts=w.prompts, lines=lines, where=f"data file {args.data!r}",
        stream=args.stream, extra=extra, measure=w.measure,
    )  # fmt: skip
    out = {
        "bodies": bodies, "content_type": "application/json", "openai": api, "model": model, "sizes": sizes,
        "size_unit": w.unit, "workload": w.meta or None,
    }  # fmt: skip
    if args.turns > 1:
        out["sessions"] = session_plan(args, api, bodies, w)
    return out


def session_plan(args: argparse.Namespace, api: str, bodies: list[bytes], w: TokenWorkload) -> Any:
    """--turns: the conversations' plan, each turn's new prompt and max_tokens taken in turn from
    the requests built (a --data line of chat messages cannot be one turn of a conversation)."""
    import orjson

    from ..exceptions import ConfigError
    from ..load.sessions import SessionPlan

    first = orjson.loads(bodies[0])
    base = {k: v for k, v in first.items() if k not in ("prompt", "messages", "max_tokens")}
    prompts, max_tokens = [], []
    for raw in bodies:
        body = orjson.loads(raw)
        messages = body.get("messages")
        if messages is not None and (len(messages) != 1 or not isinstance(messages[0].get("content"), str)):
            raise ConfigError("--turns builds each conversation's messages: give prompts (--prompt, --input-tokens, or --data lines of prompts), not messages")
        prompts.append(messages[0]["content"] if messages is not None else body["prompt"])
        max_tokens.append(body.get("max_tokens") or DEFAULT_MAX_TOKENS)
    return SessionPlan(
        api=api, base=base, prompts=prompts, max_tokens=max_tokens, turns=args.turns, think_ns=round(args.think_time * 1e9),
        measure=w.measure, unit=w.unit, headers=args.header,
    )  # fmt: skip


def trace_requests(args: argparse.Namespace, trace: Any, api: str) -> dict[str, Any]:
    """--openai --trace: one request per line, its prompt built to ``input_length`` tokens (by
    --tokenizer, or approximately) asking for ``output_length`` (``max_tokens``)."""
    from ..exceptions import ConfigError
    from ..load.openai_api import first_model, request_bodies
    from ..load.workload import prompts_of, token_counter

    if args.prompt or args.data or args.input_tokens or args.output_tokens or args.max_tokens:
        raise ConfigError("with --openai, a trace's lines give each request's tokens in and out: --trace takes no --prompt, --data, --input-tokens, --output-tokens or --max-tokens")
    trace.needs_sizes()
    counter = token_counter(args.tokenizer)  # (before the server is asked anything)
    seed = args.seed or 0
    prompts, _ = prompts_of(trace.input_lengths, counter, seed=seed)
    model = args.model or first_model(args.url, headers=args.header)
    bodies, sizes = request_bodies(
        api, model=model, max_tokens=list(trace.output_lengths), prompts=prompts, stream=args.stream,
        extra={"ignore_eos": True} if args.ignore_eos else None, measure=counter.count,
    )  # fmt: skip
    meta = {"trace": trace.path, "counted_by": counter.name, "seed": seed, **({"ignore_eos": True} if args.ignore_eos else {})}
    return {
        "bodies": bodies, "content_type": "application/json", "openai": api, "model": model, "sizes": sizes,
        "size_unit": "tokens" if counter.exact else "tokens, approximate", "workload": meta,
    }  # fmt: skip


class TokenWorkload(NamedTuple):
    """What --input-tokens, --output-tokens and --tokenizer make of the requests, and ``meta``:
    what the report says of the workload (empty when none of them was given)."""

    prompts: list[str]
    max_tokens: int | list[int]
    measure: Callable[[str], int]
    unit: str
    meta: dict[str, Any]


def token_workload(args: argparse.Namespace) -> TokenWorkload:
    """The prompts (synthetic or as given), each request's max_tokens, how prompts are measured
    and in what unit, and the workload's description for the report."""
    import random

    from ..load.workload import MAX_SYNTHETIC_PROMPTS, SYNTHETIC_PROMPTS, synthetic_prompts, token_counter

    seed = args.seed or 0
    counter = token_counter(args.tokenizer) if args.tokenizer or args.input_tokens else None
    prompts, max_tokens = args.prompt, args.max_tokens or DEFAULT_MAX_TOKENS
    meta: dict[str, Any] = {"counted_by": counter.name} if counter is not None else {}
    count = min(max(SYNTHETIC_PROMPTS, args.requests or 0), MAX_SYNTHETIC_PROMPTS)
    if args.input_tokens:
        prompts, _ = synthetic_prompts(args.input_tokens, counter, count=count, seed=seed)
        meta["input_tokens"] = str(args.input_tokens)
    if args.output_tokens:
        spec = args.output_tokens
        max_tokens = spec.a if spec.kind == "fixed" else spec.sample(random.Random(seed + 1), count)
        meta["output_tokens"] = str(spec)
    if args.ignore_eos:
        meta["ignore_eos"] = True
    if args.input_tokens or args.output_tokens:
        meta["seed"] = seed
    if counter is None:
        return TokenWorkload(prompts, max_tokens, len, "chars", meta)
    return TokenWorkload(prompts, max_tokens, counter.count, "tokens" if counter.exact else "tokens, approximate", meta)


def find_max(options: object, args: argparse.Namespace, out: Console, *, on_results: object = None) -> int:
    """--find-max: probe rates, print each, then the curve and the knee (``on_results``: the
    request log's, every probe's requests)."""
    from dataclasses import replace

    from rich.text import Text

    from ..load.bench import run_bench
    from ..exceptions import ConfigError
    from ..renderers.sweep import render_sweep
    from ..renderers.terminal import render_terminal
    from ..load.sweep import find_max as search, find_max_report, sweep_summary

    if args.slo is None:
        raise ConfigError("--find-max needs --slo: the objectives a rate must meet")
    if args.concurrency or args.ray or (args.rate and len(args.rate) > 1):
        raise ConfigError("--find-max searches open-loop rates: give at most one --rate (where to start), no --concurrency or --ray")
    start = args.rate[0] if args.rate else 10.0
    out.print(
        f"Searching the highest rate that meets {args.slo} from {start:g} requests/s: doubling, then bisection to "
        f"{args.search_resolution * 100:g}%, each probe {args.warmup:g}s + {args.duration if args.duration else 0:g}s, "
        f"within {args.search_budget:g}s"
    )

    def probe(rate: float):  # type: ignore[no-untyped-def]
        reports = run_bench(replace(options, rate=[rate], concurrency=[]), on_results=on_results)  # type: ignore[type-var, arg-type]
        if not reports:
            return None
        rep = reports[0]
        res = rep.load.slo
        p99 = rep.latency.get("p99_ms")
        p99_text = "-" if p99 is None else f"{p99:,.1f}" if p99 < 1000 else f"{p99:,.0f}"
        line = f"  rate={rate:g}: {'met' if res.met else 'missed'} (p99 {p99_text} ms, goodput {res.goodput_rps:,.1f} requests/s)"
        out.print(Text(line, style="green" if res.met else "red"))
        return None if rep.meta.get("interrupted") else rep

    outcome, reports = search(probe, start_rate=start, resolution=args.search_resolution, budget_s=args.search_budget)
    if not reports:
        out.print("No probe completed.")
        return EXIT_NOT_MEASURED
    final = find_max_report(outcome, reports)
    render_sweep(sweep_summary(sorted(reports, key=lambda r: r.meta.get("rate", 0))), console=out)
    render_terminal(final, console=out)
    if outcome.max_rate is None:
        out.print(Text(f"No rate met {outcome.slo} ({outcome.stopped}; lowest tried {outcome.missed_rate:g} requests/s).", style="bold red"))
    else:
        above = f", {outcome.missed_rate:g} requests/s missed it" if outcome.missed_rate is not None else ""
        out.print(Text(
            f"Knee: {outcome.max_rate:.4g} requests/s is the highest rate that met {outcome.slo}{above} "
            f"({outcome.stopped}, {len(reports)} probes in {outcome.elapsed_s:.0f}s).", style="bold",
        ))  # fmt: skip
    common.write_outputs(final, args, out, sweep=sweep_summary(sorted(reports, key=lambda r: r.meta.get("rate", 0))))
    return 0 if outcome.max_rate is not None else EXIT_SLO_MISSED

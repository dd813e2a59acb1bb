"""Side by side on two brokers: medians of interleaved ``benchmarks.compare`` runs, per broker.

``benchmarks.compare`` measures every contender on one broker per run. To compare brokers on a
shared machine, run it once per round and broker, alternating (each run writes its own JSON),
then summarise (``CTL43``: the 4.3 node's ``rabbitmqctl`` command, see ``_proc``)::

    for round in 1 2 3; do
      BENCH_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/%2F \\
        python -m benchmarks.compare --runs 1 --output results/brokers/r$round-310.json
      BENCH_BROKER_URL=amqp://guest:guest@127.0.0.1:5673/%2F BENCH_RABBITMQCTL="$CTL43" \\
        python -m benchmarks.compare --runs 1 --output results/brokers/r$round-43.json
    done
    python -m benchmarks.compare_brokers results/brokers/*.json

Prints one markdown table: per scenario and contender, tasks/s (or latency) on each broker
(median of its runs, and the runs), and for the end-to-end scenarios the broker's CPU
microseconds per task (median), read from the broker process's ``/proc/<pid>/stat``; then
the load average at the start and end of every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summarise(paths: list[Path]) -> str:
    """The markdown table of the module docstring for the runs in ``paths``."""
    rates: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    broker_cpu: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    order: list[tuple[str, str]] = []
    loads: list[str] = []
    versions: list[str] = []
    for path in sorted(paths):
        data: dict[str, Any] = json.loads(path.read_text())
        version = data["versions"]["rabbitmq"]
        if version not in versions:
            versions.append(version)
        start, end = data.get("loadavg_start"), data.get("loadavg_end")
        loads.append(f"{path.name} (RabbitMQ {version}, {data['date']}): load average "
                     f"{start[0]:.1f} at start, {end[0]:.1f} at end" if start and end
                     else f"{path.name}: no load recorded")
        for figure in data["figures"]:
            key = (figure["scenario"], figure["contender"])
            if key not in order:
                order.append(key)
            if figure["scenario"] == "latency":
                rates[key][version] += [f"{p50:g}/{p99:g}" for p50, p99 in
                                        zip(figure["p50_runs"], figure["p99_runs"], strict=True)]
            else:
                rates[key][version] += figure["runs"]
            for run in figure.get("cpu_runs", []):
                if run.get("broker") is not None:
                    broker_cpu[key][version].append(run["broker"])
    header = ["scenario", "contender"]
    header += [f"{v} tasks/s (runs)" for v in versions]
    header += [f"{v} broker µs/task" for v in versions]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in order:
        cells = list(key)
        for version in versions:
            runs = rates[key].get(version, [])
            if key[0] == "latency":
                cells.append("p50/p99 ms: " + " · ".join(str(r) for r in runs) if runs else "-")
            else:
                median = statistics.median(runs) if runs else None
                cells.append(f"{_fmt(median)} ({' · '.join(_fmt(r) for r in runs)})"
                             if runs else "-")
        for version in versions:
            cpu = broker_cpu[key].get(version, [])
            cells.append(_fmt(statistics.median(cpu)) if cpu else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {line}" for line in loads])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="JSON files of benchmarks.compare")
    print(summarise(parser.parse_args().paths))


if __name__ == "__main__":
    main()

"""Results of benchmarks.compare: collection, targets of issue 19, JSON, PNG chart, Markdown."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "taskq", "pika", "msgpack", "SQLAlchemy", "psycopg", "click", "celery", "kombu", "amqp",
    "billiard", "dramatiq", "taskiq", "taskiq-aio-pika", "aio-pika", "matplotlib",
)
TITLES = {
    "enqueue_fast": "Enqueue, fastest API (no workers)",
    "enqueue_each": "Enqueue, one call per task (no workers)",
    "drain_noop": "Drain a pre-filled queue, no-op tasks, 2 processes",
    "e2e_noop": "End-to-end, no-op tasks, 2 processes",
    "drain_sleep": "Drain a pre-filled queue, 1 ms sleep tasks, 2 processes",
    "outbox": "taskq through the outbox on PostgreSQL, end-to-end",
    "idempotency": "taskq end-to-end, idempotency table on/off",
    "latency": "Enqueue-to-start latency at a steady light load (ms)",
}
COLOURS = {"raw pika": "#7f7f7f", "taskq": "#1f77b4", "celery": "#2ca02c", "dramatiq": "#d62728",
           "taskiq": "#9467bd"}


@dataclass
class Figure:
    """All runs of one figure: a scenario and a contender."""

    scenario: str
    label: str
    system: str
    api: str
    tasks: int
    runs: list[float] = field(default_factory=list)
    unit: str = "tasks/s"
    p99_runs: list[float] = field(default_factory=list)  # latency only: runs[] are p50s
    rate: float | None = None
    #: CPU µs per task of each round: {"producer", "workers", "broker"} (end-to-end only).
    cpu_runs: list[dict[str, float | None]] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "scenario": self.scenario, "contender": self.label, "system": self.system,
            "api": self.api, "tasks": self.tasks, "unit": self.unit,
        }
        if self.unit == "ms":
            data.update(rate_per_s=self.rate, **_stats("p50", self.runs),
                        **_stats("p99", self.p99_runs))
        else:
            data.update(_stats("", self.runs))
        if self.cpu_runs:
            data["cpu_us_per_task"] = self.cpu_medians()
            data["cpu_runs"] = self.cpu_runs
        return data

    def cpu_medians(self) -> dict[str, float | None]:
        """Median CPU µs per task of each side over the rounds (None where not readable)."""
        out: dict[str, float | None] = {}
        for side in ("producer", "workers", "broker"):
            values = [v for run in self.cpu_runs if (v := run.get(side)) is not None]
            out[side] = statistics.median(values) if values else None
        return out


def _stats(prefix: str, runs: list[float]) -> dict[str, Any]:
    p = f"{prefix}_" if prefix else ""
    median = statistics.median(runs)
    return {
        f"{p}runs": [round(v, 2) for v in runs],
        f"{p}median": round(median, 2),
        f"{p}min": round(min(runs), 2),
        f"{p}max": round(max(runs), 2),
        f"{p}spread_pct": round((max(runs) - min(runs)) / median * 100, 1) if median else None,
    }


@dataclass
class Results:
    """Everything one comparison measured."""

    config: dict[str, Any]
    figures: dict[tuple[str, str], Figure] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    _last: str = ""

    def add(self, scenario: str, contender: Any, value: float, tasks: int, *,
            api: str = "", label: str | None = None,
            cpu: dict[str, float | None] | None = None) -> None:
        label = label or contender.name
        figure = self.figures.setdefault(
            (scenario, label), Figure(scenario, label, contender.system, api, tasks)
        )
        figure.runs.append(value)
        if cpu is not None:
            figure.cpu_runs.append(cpu)
        self._last = f"{scenario}: {value:,.0f} tasks/s"

    def add_latency(self, contender: Any, values_ms: list[float], tasks: int,
                    rate: float) -> None:
        figure = self.figures.setdefault(
            ("latency", contender.name),
            Figure("latency", contender.name, contender.system, contender.each_api, tasks,
                   unit="ms", rate=rate),
        )
        p50, p99 = percentile(values_ms, 0.50), percentile(values_ms, 0.99)
        figure.runs.append(p50)
        figure.p99_runs.append(p99)
        self._last = f"latency p50 {p50:.2f} ms, p99 {p99:.2f} ms ({len(values_ms)} samples)"

    def error(self, scenario: str, contender: str, detail: str) -> None:
        self.errors.append({"scenario": scenario, "contender": contender, "error": detail})
        self._last = "FAILED"

    def note(self, text: str) -> None:
        self.notes.append(text)

    def last_line(self) -> str:
        line, self._last = self._last, ""
        return line

    def environment(self, rabbitmq: str, postgres: str) -> None:
        versions = {"python": platform.python_version(), "rabbitmq": rabbitmq,
                    "postgresql": postgres}
        for name in PACKAGES:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        self.env = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "versions": versions,
            "taskq_commit": _git("rev-parse", "--short", "HEAD"),
            "taskq_uncommitted_changes": bool(_git("status", "--porcelain", "taskq")),
            "argv": sys.argv[1:],
        }

    # -- derived -----------------------------------------------------------------------------

    def median(self, scenario: str, label: str) -> float | None:
        figure = self.figures.get((scenario, label))
        return figure.median if figure and figure.runs else None

    def best(self, scenario: str, system: str) -> tuple[str, float] | None:
        candidates = [
            (f.label, f.median) for (s, _), f in self.figures.items()
            if s == scenario and f.system == system and f.runs
        ]
        return max(candidates, key=lambda item: item[1]) if candidates else None

    def targets(self) -> list[dict[str, Any]]:
        """Issue 19's targets (issue 6 set the first ones), judged on the medians of this run."""
        out: list[dict[str, Any]] = []

        def ratio(name: str, ours: float | None, theirs: float | None, against: str,
                  at_least: float) -> None:
            if ours is None or theirs is None:
                out.append({"target": name, "measured": "not measured", "met": None})
                return
            value = ours / theirs
            out.append({"target": name, "measured": f"{value:.2f}x ({ours:,.0f} vs "
                        f"{theirs:,.0f} {against})", "ratio": round(value, 3),
                        "met": value >= at_least})

        for scenario, what, raw_share in (("drain_noop", "drain", 0.85),
                                          ("e2e_noop", "end-to-end", 0.90)):
            ours = self.median(scenario, "taskq")
            peer = max((b for b in (self.best(scenario, "dramatiq"),
                                    self.best(scenario, "taskiq")) if b),
                       key=lambda item: item[1], default=None)
            ratio(f"taskq {what} >= {raw_share:.0%} of raw pika", ours,
                  self.median(scenario, "raw pika"), "raw pika", raw_share)
            ratio(f"taskq {what} >= 4x Celery (default config)", ours,
                  self.median(scenario, "celery (confirms off)"), "Celery", 4.0)
            ratio(f"taskq {what} >= 2x the best of Dramatiq and taskiq", ours,
                  peer[1] if peer else None, peer[0] if peer else "Dramatiq/taskiq", 2.0)
        self._cpu_target(out)
        ratio("delay() >= 90% of raw pika one-confirm publish", self.median(
            "enqueue_each", "taskq"), self.median("enqueue_each", "raw pika"), "raw pika", 0.9)
        ratio("bulk enqueue (Task.starmap) >= 70% of raw pika windowed",
              self.median("enqueue_fast", "taskq"), self.median("enqueue_fast", "raw pika"),
              "raw pika", 0.7)
        idem = self.median("idempotency", "taskq idempotent=True (PostgreSQL)")
        if idem is None and any("idempotency: not available" in n for n in self.notes):
            out.append({"target": "taskq with the idempotency table on PostgreSQL >= 1.5x "
                        "Celery default no-op (end-to-end)", "measured": "not available",
                        "met": None})
        else:
            ratio("taskq with the idempotency table on PostgreSQL >= 1.5x Celery default "
                  "no-op (end-to-end)", idem, self.median("e2e_noop", "celery (confirms off)"),
                  "Celery", 1.5)
        lat = self.figures.get(("latency", "taskq"))
        if lat and lat.runs:
            p50, p99 = lat.median, statistics.median(lat.p99_runs)
            out.append({"target": "latency p50 < 5 ms", "measured": f"{p50:.2f} ms",
                        "met": p50 < 5})
            out.append({"target": "latency p99 < 50 ms", "measured": f"{p99:.2f} ms",
                        "met": p99 < 50})
        return out

    def _cpu_target(self, out: list[dict[str, Any]]) -> None:
        ours, raw = (self.figures.get(("e2e_noop", label)) for label in ("taskq", "raw pika"))
        if not (ours and raw and ours.cpu_runs and raw.cpu_runs):
            out.append({"target": "taskq CPU per task (worker + producer) <= 1.3x raw pika",
                        "measured": "not measured", "met": None})
            return
        a, b = ours.cpu_medians(), raw.cpu_medians()
        mine = (a["workers"] or 0.0) + (a["producer"] or 0.0)
        theirs = (b["workers"] or 0.0) + (b["producer"] or 0.0)
        out.append({"target": "taskq CPU per task (worker + producer) <= 1.3x raw pika",
                    "measured": f"{mine / theirs:.2f}x ({mine:.0f} vs {theirs:.0f} µs)",
                    "ratio": round(mine / theirs, 3), "met": mine / theirs <= 1.3})

    def to_json(self) -> dict[str, Any]:
        return {
            **self.env,
            "config": self.config,
            "figures": [f.summary() for f in self.figures.values() if f.runs],
            "targets": self.targets(),
            "notes": self.notes,
            "errors": self.errors,
        }

    def markdown(self) -> str:
        lines = ["| scenario | contender | API | tasks | median | runs |",
                 "|---|---|---|---:|---:|---|"]
        for scenario in TITLES:
            for f in (f for (s, _), f in self.figures.items() if s == scenario and f.runs):
                if f.unit == "ms":
                    median = (f"p50 {f.median:.2f} ms, p99 "
                              f"{statistics.median(f.p99_runs):.1f} ms")
                    pairs = zip(f.runs, f.p99_runs, strict=True)
                    runs = ", ".join(f"{a:.2f}/{b:.1f}" for a, b in pairs)
                else:
                    median = f"{f.median:,.0f}/s"
                    runs = ", ".join(f"{v:,.0f}" for v in f.runs)
                lines.append(f"| {scenario} | {f.label} | {f.api} | {f.tasks:,} | {median} "
                             f"| {runs} |")
        lines += ["", "| end-to-end contender | CPU µs/task: producer | workers | broker |",
                  "|---|---:|---:|---:|"]
        for f in (f for (s, _), f in self.figures.items() if s == "e2e_noop" and f.cpu_runs):
            cpu = f.cpu_medians()
            cells = " | ".join("n/a" if cpu[k] is None else f"{cpu[k]:.0f}"
                               for k in ("producer", "workers", "broker"))
            lines.append(f"| {f.label} | {cells} |")
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        for t in self.targets():
            met = {True: "met", False: "**missed**", None: "n/a"}[t["met"]]
            lines.append(f"| {t['target']} | {t['measured']} | {met} |")
        for error in self.errors:
            lines.append(f"\nFAILED {error['scenario']} / {error['contender']}: "
                         f"{error['error'].splitlines()[0]}")
        return "\n".join(lines)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def load(path: Path) -> Results:
    """Results back from a JSON file written by :func:`write_outputs` (to redraw the chart)."""
    data = json.loads(path.read_text())
    results = Results(config=data["config"], notes=data["notes"], errors=data["errors"])
    results.env = {k: data[k] for k in ("date", "cpu_count", "platform", "versions",
                                        "taskq_commit", "taskq_uncommitted_changes", "argv")}
    for item in data["figures"]:
        figure = Figure(item["scenario"], item["contender"], item["system"], item["api"],
                        item["tasks"], unit=item["unit"], rate=item.get("rate_per_s"))
        if figure.unit == "ms":
            figure.runs, figure.p99_runs = item["p50_runs"], item["p99_runs"]
        else:
            figure.runs = item["runs"]
        results.figures[(figure.scenario, figure.label)] = figure
    return results


def write_outputs(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.to_json(), indent=2) + "\n")
    chart(results, path.with_suffix(".png"))


def chart(results: Results, path: Path) -> None:
    """One panel per scenario: horizontal bars of the median, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [s for s in TITLES if any(k[0] == s for k in results.figures)]
    if not scenarios:
        return
    cols = 2
    rows = (len(scenarios) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(17, 3.6 * rows), squeeze=False)
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        figures = [f for (s, _), f in results.figures.items() if s == scenario and f.runs]
        labels = [f"{f.label}\n{f.api}" if scenario.startswith("enqueue") else f.label
                  for f in figures]
        colours = [COLOURS.get(f.system, "#999999") for f in figures]
        y = list(range(len(figures)))[::-1]
        if scenario == "latency":
            p50 = [f.median for f in figures]
            p99 = [statistics.median(f.p99_runs) for f in figures]
            ax.barh([v + 0.2 for v in y], p50, height=0.4, color=colours, label="p50")
            ax.barh([v - 0.2 for v in y], p99, height=0.4, color=colours, alpha=0.45,
                    label="p99")
            for yy, a, b in zip(y, p50, p99, strict=True):
                ax.text(a, yy + 0.2, f" p50 {a:.1f}", va="center", fontsize=8)
                ax.text(b, yy - 0.2, f" p99 {b:.1f}", va="center", fontsize=8)
            ax.set_xlim(0, max(p99) * 1.3)
            ax.set_xlabel("ms (median of runs)")
        else:
            medians = [f.median for f in figures]
            low = [f.median - min(f.runs) for f in figures]
            high = [max(f.runs) - f.median for f in figures]
            ax.barh(y, medians, color=colours, xerr=[low, high], capsize=3)
            for yy, f in zip(y, figures, strict=True):
                ax.text(max(f.runs), yy, f"  {f.median:,.0f}", va="center", fontsize=8)
            ax.set_xlabel("tasks/s (median; whiskers: min..max of runs)")
            celery = results.median("e2e_noop", "celery (confirms off)")
            if scenario == "idempotency" and celery:
                for times, style in ((1.0, ":"), (1.5, "--")):
                    ax.axvline(celery * times, color=COLOURS["celery"], linestyle=style)
                    ax.text(celery * times, -0.45 + 0.15 * times, f" {times:g}x Celery e2e",
                            fontsize=7, color=COLOURS["celery"])
            ax.set_xlim(0, max(max(f.runs) for f in figures) * 1.25)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_title(TITLES[scenario], fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(scenarios):]:
        ax.axis("off")
    env = results.env
    versions = env.get("versions", {})
    fig.suptitle(
        f"taskq {versions.get('taskq')} vs Celery {versions.get('celery')} vs Dramatiq "
        f"{versions.get('dramatiq')} on RabbitMQ {versions.get('rabbitmq')}, "
        f"{env.get('cpu_count')} cores, {env.get('date', '')[:10]}; persistent messages, "
        f"ack after the task; median of {results.config.get('runs')} runs",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)

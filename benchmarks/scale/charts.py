"""PNG charts of a scale run: rate against backlog, RSS against tasks done, latencies."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(out: dict[str, Any], json_path: Path) -> list[Path]:
    """Draw what the run measured beside ``json_path``; return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, written = out["runs"], []
    stem = json_path.with_suffix("")
    if runs.get("backlog") or runs.get("relay"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, size_key, rate_key, label in (
            ("backlog", "tasks", "drain_rate", "worker drain (tasks/s)"),
            ("relay", "rows", "rate", "outbox relay (rows/s)"),
        ):
            for i, run_ in enumerate(runs.get(name, [])):
                points = run_["points"]
                ax.plot([p[size_key] for p in points], [p[rate_key] for p in points], "o-",
                        label=label if i == 0 else None,
                        color="#1f77b4" if name == "backlog" else "#ff7f0e")
        ax.set_xscale("log")
        ax.set_xlabel("waiting when the drain starts (tasks or rows, log scale)")
        ax.set_ylabel("per second")
        ax.set_ylim(bottom=0)
        ax.set_title("Rate against backlog size (each line one round)")
        ax.legend()
        written.append(_save(fig, f"{stem}-backlog.png"))
    if runs.get("backlog"):
        fig, ax = plt.subplots(figsize=(7, 4))
        samples = runs["backlog"][-1]["points"][-1]["samples"]
        _rss_lines(ax, samples, "taskq")
        for name, peer in (runs.get("peers_memory") or [{}])[-1].items():
            _rss_lines(ax, peer["samples"], name)
        ax.set_xlabel("tasks done by the whole worker")
        ax.set_ylabel("RSS of each task process (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title("Memory against tasks done")
        ax.legend(fontsize="small")
        written.append(_save(fig, f"{stem}-rss.png"))
    if runs.get("latency") or runs.get("delays"):
        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        lat = runs.get("latency", [])
        axes[0].bar([f"run {i + 1}\np50" for i in range(len(lat))],
                    [r["p50_ms"] for r in lat], color="#1f77b4")
        axes[0].bar([f"run {i + 1}\np99" for i in range(len(lat))],
                    [r["p99_ms"] for r in lat], color="#aec7e8")
        axes[0].set_title("enqueue-to-start (ms)")
        dl = [r["late"] for r in runs.get("delays", []) if r.get("late")]
        for key, colour in (("p50_ms", "#2ca02c"), ("p99_ms", "#98df8a"), ("max_ms", "#d62728")):
            axes[1].bar([f"run {i + 1}\n{key[:-3]}" for i in range(len(dl))],
                        [d[key] for d in dl], color=colour)
        axes[1].set_title("delayed tasks: lateness (ms)")
        written.append(_save(fig, f"{stem}-latency.png"))
    return written


def _rss_lines(ax: Any, samples: list[dict[str, Any]], label: str) -> None:
    pids = sorted({pid for s in samples for pid in s["rss_mb"]})
    for i, pid in enumerate(pids):
        points = [(s["done"], s["rss_mb"][pid]) for s in samples if pid in s["rss_mb"]]
        ax.plot([p[0] for p in points], [p[1] for p in points],
                label=f"{label} process {i + 1}")


def _save(fig: Any, path: str) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)

"""metrics.json, a Markdown report and PNG plots (matplotlib) for one replay evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mnemoflow.evaluation.metrics import KS  # noqa: E402

PUBLISHED = {
    "locomo": {"label": "DRAGON over dialogs (LoCoMo paper; another setup)",
               "metric": "turn_recall", "values": {5: 0.567, 10: 0.662, 25: 0.767}},
    "longmemeval": {"label": "Stella, LongMemEval_M (paper; another setup)",
                    "metric": "session_recall_any", "values": {5: 0.732, 10: 0.862}},
}


def _curve(overall: dict[str, Any], prefix: str, metric: str) -> list[float | None]:
    return [overall.get(f"{prefix}{metric}@{k}") for k in KS]


def latency_cdf(path: Path, lat: list[float]) -> None:
    """The share of packets built within x ms of their event, with p50, p95 and p99 marked."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if lat:
        xs = np.sort(np.asarray(lat, dtype=float))
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post")
        for q in (50, 95, 99):
            v = float(np.percentile(xs, q))
            ax.axvline(v, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"p{q} {v:.0f}", (v, q / 100), fontsize=7, xytext=(3, -10),
                        textcoords="offset points")
        ax.set_xscale("log" if xs[0] > 0 and xs[-1] / max(xs[0], 1e-9) > 100 else "linear")
    ax.set_xlabel("event -> packet (ms, from audit records)")
    ax.set_ylabel("share of packets")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"latency CDF ({len(lat)} packets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def packets_per_100(path: Path, result: dict[str, Any]) -> None:
    """Packets per 100 events of each kind: ordinary turns (the haystack: the fewer the
    better), questions with an answer in memory, and questions without one (where a packet
    can only be noise)."""
    overall, p = result["summary"]["overall"], result["pipeline"]
    bars = {"ordinary turns": p["ordinary_turn_packets_per_100_events"],
            "questions": 100 * (overall.get("packet_rate") or 0.0)}
    if "abstention" in result["summary"]:
        bars["questions with no answer"] = 100 * (
            result["summary"]["abstention"].get("packet_rate") or 0.0)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(bars), list(bars.values()), color=["#9aa5b1", "#3b7dd8", "#d8733b"][:len(bars)])
    for i, v in enumerate(bars.values()):
        ax.annotate(f"{v:.1f}", (i, v), ha="center", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_ylabel("packets per 100 events")
    ax.set_ylim(0, 105)
    ax.set_title("when a packet comes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, name: str, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lat = result["pipeline"].pop("latency_samples", [])
    (out / "metrics.json").write_text(json.dumps(result, indent=2, default=float))
    overall = result["summary"]["overall"]
    metric = PUBLISHED[name]["metric"]
    systems = [("mnemoflow", ""), ("BM25", "bm25:"), ("cosine", "cosine:")]

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, prefix in systems:
        ys = _curve(overall, prefix, metric)
        ax.plot(KS, [y if y is not None else float("nan") for y in ys], marker="o", label=label)
    pub = PUBLISHED[name]["values"]
    ax.plot(list(pub), list(pub.values()), "k--", marker="x", label=PUBLISHED[name]["label"])
    ax.set_xscale("log")
    ax.set_xticks(list(KS), [str(k) for k in KS])
    ax.set_xlabel("k")
    ax.set_ylabel(metric)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"{name}: {metric}@k")
    fig.tight_layout()
    fig.savefig(out / "recall_at_k.png", dpi=110)
    plt.close(fig)

    latency_cdf(out / "latency_cdf.png", lat)
    packets_per_100(out / "packets_per_100.png", result)

    cats = result["summary"]["per_category"]
    key = f"{metric}@10"
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([str(c["category"]) for c in cats], [c.get(key) or 0 for c in cats])
    ax.set_ylabel(key)
    ax.set_ylim(0, 1)
    ax.set_title("per category")
    plt.xticks(rotation=20, fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "per_category.png", dpi=110)
    plt.close(fig)

    p = result["pipeline"]
    lines = [f"# {name} replay evaluation", "",
             f"- command: `{result['command']}`", f"- mode: **{result['mode']}** "
             "(soft = packets injected at the step boundary; shadow = recorded only)",
             f"- questions: {p['questions']}, haystack events: {result['haystack_events']}",
             f"- wall time: {result['wall_s']}",
             f"- questions moved after their haystack (evidence dated after the question): "
             f"{result.get('questions_moved_after_their_haystack', 0)}",
             f"- tuning: {result['tuning_source']}",
             "- worker settings: " + (", ".join(f"{k}={v}" for k, v in
                                       result.get("worker_env", {}).items()) or "defaults"),
             "",
             "## Recall over the ranked candidates recorded in the audit", "",
             "| system | " + " | ".join(f"{metric}@{k}" for k in KS) + " |",
             "|---|" + "---|" * len(KS)]
    for label, prefix in systems:
        vals = _curve(overall, prefix, metric)
        lines.append(f"| {label} | " + " | ".join("–" if v is None else f"{v:.3f}"
                                                  for v in vals) + " |")
    lines.append(f"| {PUBLISHED[name]['label']} | " + " | ".join(
        f"{pub[k]:.3f}" if k in pub else "–" for k in KS) + " |")
    other = [m for m in ("turn_recall", "session_recall", "session_recall_any",
                         "session_recall_all", "ndcg") if m != metric]
    lines += ["", "| mnemoflow metric | " + " | ".join(f"@{k}" for k in KS) + " |",
              "|---|" + "---|" * len(KS)]
    for m in other:
        vals = _curve(overall, "", m)
        if any(v is not None for v in vals):
            lines.append(f"| {m} | " + " | ".join("–" if v is None else f"{v:.3f}"
                                                  for v in vals) + " |")
    lines += ["", "## Packets, triggers, harm, latency", "",
              f"- packet turn recall (evidence among delivered items): "
              f"{overall.get('packet_turn_recall', float('nan')):.3f}",
              f"- question trigger rate (retrieve or prefetch): {p['question_trigger_rate']:.3f}",
              f"- ordinary-turn injections: {p['ordinary_turn_packets_per_100_events']:.2f} "
              "packets per 100 events",
              f"- bytes per packet: mean {p['bytes_per_packet_mean']:.0f}, "
              f"median {p['bytes_per_packet_p50']:.0f}",
              f"- harm: {json.dumps(p['harm'])}",
              f"- event -> packet latency (audit ingest -> emit), ms: {json.dumps(p['latency_ms'])}"
              " (a bulk replay: thousands of events are produced at once, so this is mostly"
              " queueing behind the backlog; the interactive latency is bench/bench_topology.py)",
              "", "## Per category", "",
              "| category | n | trigger | " + f"{metric}@5 | {metric}@10 | packet_turn_recall |",
              "|---|---|---|---|---|---|"]
    for c in cats:
        def f(v: Any) -> str:
            return "–" if v is None else f"{v:.3f}"
        lines.append(f"| {c['category']} | {c['n']} | {f(c.get('triggered'))} | "
                     f"{f(c.get(f'{metric}@5'))} | {f(c.get(f'{metric}@10'))} | "
                     f"{f(c.get('packet_turn_recall'))} |")
    if "abstention" in result["summary"]:
        a = result["summary"]["abstention"]
        lines += ["", f"Abstention questions (reported apart, n={a['n']}): "
                  f"trigger {a.get('triggered', 0):.3f}"]
    lines += ["", "![recall](recall_at_k.png) ![latency](latency_cdf.png) "
              "![packets](packets_per_100.png) ![categories](per_category.png)", ""]
    (out / "report.md").write_text("\n".join(lines))

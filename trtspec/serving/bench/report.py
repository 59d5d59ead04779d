"""The bench's table and plot; both carry the setup (model, runtime, protocol, K, max tokens, prompt set, load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def title(results: dict[str, Any]) -> str:
    """One line naming what was measured."""
    s = results["setup"]
    ks = ", ".join("target-only" if m["num_draft_tokens"] == 0 else f"K={m['num_draft_tokens']}" for m in s["modes"])
    load = "concurrency" if s["load"] == "concurrency" else "Poisson request rate (req/s)"
    return (
        f"trtspec bench: {s['model']} ({s['runtime']}) via {s['protocol']} {s['url']} | {ks} | "
        f"{s['prompt_set']}{'' if s['chat'] else ', raw prompts'} | {load} "
        f"{', '.join(str(v) for v in s['levels'])}"
    )


def _ms3(m: dict[str, Any], name: str) -> str:
    vals: list[Any] = [m.get(f"{name}_{p}_s") for p in ("p50", "p90", "p99")]
    return "-" if vals[0] is None else "/".join(f"{v * 1000:.0f}" for v in vals)


def render_table(results: dict[str, Any]) -> Any:
    from rich.table import Table

    load = results["setup"]["load"]
    table = Table(title=title(results), title_justify="left")
    for col in (
        ("conc." if load == "concurrency" else "req/s in"),
        "mode",
        "req",
        "routed",
        "out tok/s",
        "req/s",
        "TTFT ms p50/90/99",
        "ITL ms p50/90/99",
        "E2E ms p50/90/99",
        "accept.",
        "speedup",
    ):
        table.add_column(col, justify="right")
    for row in results["levels"]:
        for m in row["modes"]:
            req = f"{m['requests']}" + (f" ({m['errors']} err)" if m["errors"] else "")
            table.add_row(
                str(row[load]),
                m["mode"],
                req,
                str(m["routed_to_target"]),
                f"{m['output_tok_per_s']:.1f}",
                f"{m['requests_per_s']:.2f}",
                _ms3(m, "ttft"),
                _ms3(m, "itl"),
                _ms3(m, "e2e"),
                "-"
                if m["num_draft_tokens"] == 0
                else ("n/a" if m["acceptance_rate"] is None else f"{m['acceptance_rate']:.2f}"),
                f"{m['speedup']:.2f}x" if "speedup" in m else "",
            )
    return table


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Four panels against the load (an integer concurrency axis, or the request rate): output tok/s, TTFT, ITL,
    and acceptance rate with the speedup over target-only; one line per mode; the setup in the title."""
    from trtspec.errors import require

    require("matplotlib", "serve")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    load = results["setup"]["load"]
    levels = results["levels"]
    xs = [row[load] for row in levels]
    names = [m["mode"] for m in levels[0]["modes"]] if levels else []
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (tput, ttft), (itl, acc) = axes
    speed = acc.twinx()
    for i, name in enumerate(names):
        modes = [next(m for m in row["modes"] if m["mode"] == name) for row in levels]
        style = dict(
            marker="os^vD<>p"[i % 8], linestyle="--" if name == "target_only" else "-", label=name, color=f"C{i}"
        )  # one colour per mode in every panel
        tput.plot(xs, [m["output_tok_per_s"] for m in modes], **style)
        ttft.plot(xs, [(m["ttft_p50_s"] or 0) * 1000 for m in modes], **style)
        itl.plot(xs, [(m["itl_p50_s"] or 0) * 1000 for m in modes], **style)
        if name != "target_only":
            acc.plot(
                xs, [float("nan") if m["acceptance_rate"] is None else m["acceptance_rate"] for m in modes], **style
            )
            if any("speedup" in m for m in modes):
                speed.plot(
                    xs,
                    [m.get("speedup", float("nan")) for m in modes],
                    color=f"C{i}",
                    alpha=0.5,
                    linestyle=":",
                    marker="x",
                    label=f"{name} speedup",
                )
    xlabel = "concurrent requests" if load == "concurrency" else "request rate (req/s, Poisson)"
    tput.set(ylabel="output tokens / s", title="throughput")
    ttft.set(ylabel="ms", title="time to first token (p50)")
    itl.set(ylabel="ms per token", title="inter-token latency (p50)")
    acc.set(ylabel="acceptance rate", title="acceptance (solid) and speedup vs target-only (dotted)", ylim=(0, 1.05))
    speed.set_ylabel("speedup (x)")
    speed.axhline(1.0, color="grey", linewidth=0.8, alpha=0.5)
    for ax in (tput, ttft, itl, acc):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if load == "concurrency":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xticks(xs)
        ax.legend(fontsize=8, loc="best")
    if speed.get_lines():
        speed.legend(fontsize=8, loc="lower right")
    fig.suptitle(title(results), fontsize=9, wrap=True)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

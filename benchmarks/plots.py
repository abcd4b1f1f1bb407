"""Render benchmark results (benchmarks/results/*.json) as PNG plots in benchmarks/plots/.

    python benchmarks/plots.py

Plots: sampling throughput vs batch size, bytes on disk per transition, and DataLoader
batches/s, each for expstore against TorchRL's memmap storage and an in-RAM numpy ring,
from the same run of ``benchmarks/bench_store.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = HERE / "plots"


def _load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _bar(ax, labels, values, fmt="{:,.0f}", log=False):
    bars = ax.bar(labels, values, color=["#3a7d44" if lb.startswith("expstore") else "#888888"
                                         for lb in labels])
    if log:
        ax.set_yscale("log")
    for b, v in zip(bars, values):
        ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)


def plot_store(plt) -> list[Path]:
    data = _load("store")
    if data is None:
        return []
    rows = data["results"]
    labels = [r["case"] for r in rows]
    made = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ys = [r.get("sample_tps_bs32"), r.get("sample_tps_bs256")]
        ax.plot([32, 256], ys, marker="o", label=r["case"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("stacked transitions / s (warm cache)")
    ax.set_title("Uniform sampling throughput vs batch size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(_save(fig, "throughput_vs_batch.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    _bar(ax, labels, [r["bytes_per_transition"] for r in rows], log=True)
    ax.set_ylabel("bytes per transition (disk; numpy: RAM)")
    ax.set_title(f"Storage per Atari transition ({data.get('game', '')})")
    fig.tight_layout()
    made.append(_save(fig, "bytes_per_transition.png"))

    loader = [(r["case"], r.get("loader_batches_per_s_bs32") or r.get(
        "prefetch_batches_per_s_bs32")) for r in rows]
    loader = [(c, v) for c, v in loader if v]
    if loader:
        fig, ax = plt.subplots(figsize=(6, 4))
        _bar(ax, [c for c, _ in loader], [v for _, v in loader])
        ax.set_ylabel("batches / s (batch 32, consumer touches tensors)")
        ax.set_title("expstore make_loader (2 workers) vs TorchRL prefetch=2")
        fig.tight_layout()
        made.append(_save(fig, "loader_batches.png"))
    return made


def _save(fig, name: str) -> Path:
    OUT.mkdir(exist_ok=True)
    path = OUT / name
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = plot_store(plt)
    for p in made:
        print(p.relative_to(HERE.parent))
    if not made:
        print("no results yet: run python benchmarks/bench_store.py first", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

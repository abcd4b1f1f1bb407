"""expstore's core store against TorchRL LazyMemmapStorage and an in-RAM numpy ring, one run.

Usage (from the repository root)::

    python benchmarks/bench_store.py                  # 50k Pong transitions, all cases
    python benchmarks/bench_store.py --n 200000 --game mix --sustained 300000
    python benchmarks/bench_store.py --only sample --cases expstore,torchrl,numpy

Measures append rate, bytes on disk per transition, uniform stacked batch reads (bs 32/256,
warm page cache), DataLoader batches/s (2 workers) and a sustained append into a 1M-row
store; writes section "Core store" of benchmarks/RESULTS.md and results/store.json.
``--only sample``: each store filled once, then only the in-process sampling rates and
their ratios (section "In-process sample", results/store_sample.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baselines import measure_case, numpy_ring_case, torchrl_memmap_case  # noqa: E402
from benchmarks.expstore_case import ExpstoreCase, extend_batches, spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    save_json,
    work_dir,
    write_section,
)

CODECS = {
    "expstore": None,  # the default image codec
    "expstore-lz4hc": {"name": "blosc", "cname": "lz4hc", "clevel": 5},
    "expstore-zstd1": {"name": "zstd", "level": 1},
}


def sustained_append(data: dict[str, Any], n: int, capacity: int, tmp: str) -> dict:
    """Append ``n`` transitions (the stream repeated) into a ``capacity``-row store."""
    import expstore as es

    store = es.create(Path(tmp) / "sustained.zarr", spec_for_frames(), capacity=capacity)
    done, t0, marks = 0, time.perf_counter(), []
    while done < n:
        for batch in extend_batches(data, 1000):
            store.extend(batch)
            done += len(batch["reward"])
            marks.append((done, time.perf_counter()))
            if done >= n:
                break
    store.flush()
    dt = time.perf_counter() - t0
    # rate over each tenth of the run: "sustained" means the slowest stretch too
    step = max(1, len(marks) // 10)
    tenth = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(marks[::step], marks[step::step])]
    out = {"transitions": done, "capacity": store.capacity, "shard_rows": store.layout.shard_rows,
           "tps": done / dt, "slowest_tenth_tps": min(tenth) if tenth else done / dt}
    store.close()
    return out


def stage_costs(case: ExpstoreCase, ring: Any, bs: int, repeats: int) -> dict[str, float]:
    """Median µs per batch of ``store.sample(bs)``'s stages: planning (index), reading
    the columns (frame cache, C kernel, scalar tables), gathering the batch; the whole
    call, and the numpy ring's ``sample`` measured interleaved with it."""
    from expstore.loading.columns import numpy_alloc
    from expstore.loading.transition_batch import finish_many, read_columns

    st = case.reader_store
    sampler = st._sampler
    n = max(50, 12_800 // bs)
    stats = st.reader.stats
    h0, m0 = stats.row_cache_hits, stats.row_cache_misses
    times: dict[str, list[float]] = {k: [] for k in ("plan", "read", "gather", "sample", "ring")}
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = [sampler.plan(bs) for _ in range(n)]
        t1 = time.perf_counter()
        for p in plans:
            cols = read_columns(p, st.layout, st.source, lazy=True)
        t2 = time.perf_counter()
        for _ in range(n):
            finish_many(plans[-1], *cols, numpy_alloc)
        t3 = time.perf_counter()
        for _ in range(n):
            st.sample(bs)
        t4 = time.perf_counter()
        for _ in range(n):
            ring.ring.sample(bs)
        t5 = time.perf_counter()
        for k, (a, b) in zip(times, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
            times[k].append((b - a) / n * 1e6)
    out = {f"{k}_us": statistics.median(v) for k, v in times.items()}
    hits, misses = stats.row_cache_hits - h0, stats.row_cache_misses - m0
    out["frame_cache_hit_rate"] = hits / max(1, hits + misses)
    out["batch"] = bs
    return out


def sample_only(a: argparse.Namespace) -> None:
    """In-process uniform sampling of every case, each store filled once (``--only sample``)."""
    import torch

    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    data = load_atari_frames(a.n, game=a.game)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
        for name in a.cases.split(","):
            if name in CODECS:
                case = ExpstoreCase(data, None, tmp, codec=CODECS[name], name=name)
            elif name == "torchrl":
                case = torchrl_memmap_case(data, None, tmp)
            elif name == "numpy":
                case = numpy_ring_case(data)
            else:
                raise SystemExit(f"unknown case {name}")
            print(f"measuring {name} ...", flush=True)
            case.extend_rate()
            if hasattr(case, "warm_cache"):
                case.warm_cache()
            r: dict[str, Any] = {"case": case.name}
            for bs in (32, 256):
                case.sample_rate(bs, a.seconds)  # warm-up: caches filled, not recorded
                runs = [case.sample_rate(bs, a.seconds) for _ in range(a.repeats)]
                r[f"sample_tps_bs{bs}"], r[f"sample_tps_bs{bs}_runs"] = (
                    statistics.median(runs), runs)
            results.append(r)
            if name == "expstore":
                kept = case
            else:
                case.close() if hasattr(case, "close") else None
            print({k: v for k, v in r.items() if not k.endswith("_runs")}, flush=True)
        stages = []
        if "expstore" in a.cases.split(",") and "numpy" in a.cases.split(","):
            ring_case = numpy_ring_case(data)
            ring_case.extend_rate()
            stages = [stage_costs(kept, ring_case, bs, a.repeats) for bs in (32, 256)]
            kept.close()
    by = {r["case"]: r for r in results}
    base, ring = by.get("torchrl_memmap"), by.get("numpy_ring")
    for r in results:
        for bs in (32, 256):
            k = f"sample_tps_bs{bs}"
            if base is not None:
                r[f"bs{bs}_x_torchrl"] = r[k] / base[k]
            if ring is not None:
                r[f"bs{bs}_ring_x_slower"] = ring[k] / r[k]
    body = markdown_table(results, ["case", "sample_tps_bs32", "sample_tps_bs256",
                                    "bs32_x_torchrl", "bs256_x_torchrl", "bs32_ring_x_slower",
                                    "bs256_ring_x_slower"])
    body += ("\n\nMedians of repeats, tr/s = transitions/s: uniform stacked (4x84x84) obs and "
             "next_obs read in the calling process (`store.sample(B)`, default 256 MiB frame "
             "cache; TorchRL `rb.sample()`; the numpy ring's fancy index), warm page cache, "
             "after one unrecorded run per case and batch size. "
             "x_torchrl = rate / TorchRL memmap's; ring_x_slower = numpy ring's rate / rate "
             "(targets: x_torchrl >= 3, ring_x_slower <= 4).")
    if stages:
        body += ("\n\nWhere a batch's time goes (µs per batch, medians; `expstore` store; "
                 "plan = `sampler.plan` (index only), read = `read_columns` (frames through "
                 "the frame cache and the C kernel, scalars from decoded shard tables), "
                 "gather = `finish_many` (stacks copied into the batch), sample = the whole "
                 "`store.sample`, ring = the numpy ring's `sample` timed in the same loop):"
                 "\n\n" + markdown_table(stages, ["batch", "plan_us", "read_us", "gather_us",
                                                    "sample_us", "ring_us",
                                                    "frame_cache_hit_rate"]))
    print(body)
    save_json("store_sample", {"results": results, "stages": stages, "n": a.n, "game": a.game,
                               "source": data["source"]})
    if not a.no_write:
        write_section("In-process sample", body, command=command_line(),
                      source=f"{data['source']} {a.game}, {a.n} frames",
                      extra={"load average (1 min) start/end":
                             f"{load0:.2f} / {os.getloadavg()[0]:.2f}"})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50_000, help="frames of Atari data")
    p.add_argument("--game", default="Pong")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--sustained", type=int, default=300_000,
                   help="transitions appended into a 1M-row store (0: skip)")
    p.add_argument("--cases", default="expstore,expstore-lz4hc,torchrl,numpy")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument("--only", choices=("all", "sample"), default="all",
                   help="sample: fill each store once, measure in-process sampling only")
    a = p.parse_args()
    if a.only == "sample":
        sample_only(a)
        return

    import torch

    torch.set_num_threads(1)  # as in bench_baselines: 2 threads collapse under load here
    data = load_atari_frames(a.n, game=a.game)
    wanted = a.cases.split(",")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
        for name in wanted:
            if name in CODECS:
                case = ExpstoreCase(data, None, tmp, codec=CODECS[name], name=name)
            elif name == "torchrl":
                case = torchrl_memmap_case(data, None, tmp)
            elif name == "numpy":
                case = numpy_ring_case(data)
            else:
                raise SystemExit(f"unknown case {name}")
            print(f"measuring {name} ...", flush=True)
            r = measure_case(case, extend_repeats=3, sample_repeats=a.repeats,
                             seconds=a.seconds)
            if name in CODECS:
                for bs in (32, 256):
                    runs = [case.loader_rate(bs, a.seconds) for _ in range(a.repeats)]
                    r[f"loader_batches_per_s_bs{bs}"] = statistics.median(runs)
                    r[f"loader_batches_per_s_bs{bs}_runs"] = runs
            elif hasattr(case, "prefetch_rate"):
                runs = [case.prefetch_rate(256, a.seconds) for _ in range(a.repeats)]
                r["prefetch_batches_per_s_bs256"] = statistics.median(runs)
            results.append(r)
            case.close() if hasattr(case, "close") else None
            print({k: v for k, v in r.items() if not k.endswith("_runs")}, flush=True)
        sustained = (sustained_append(data, a.sustained, 1_000_000, tmp)
                     if a.sustained else None)
    by = {r["case"]: r for r in results}
    base = by.get("torchrl_memmap") or by.get("torchrl")
    numpy_r = by.get("numpy_ring") or by.get("numpy")
    for r in results:
        for ref, tag in ((base, "torchrl"), (numpy_r, "numpy")):
            if ref is None or r is ref:
                continue
            r[f"bytes_x_smaller_than_{tag}"] = ref["bytes_per_transition"] / r[
                "bytes_per_transition"]
            for k in ("extend_tps", "sample_tps_bs32", "sample_tps_bs256"):
                r[f"{k}_vs_{tag}"] = r[k] / ref[k]
    columns = ["case", "extend_tps", "bytes_per_transition", "sample_tps_bs32",
               "sample_tps_bs256", "loader_batches_per_s_bs32", "loader_batches_per_s_bs256",
               "prefetch_batches_per_s_bs32", "prefetch_batches_per_s_bs256"]
    ratio_cols = ["case", "bytes_x_smaller_than_torchrl", "extend_tps_vs_torchrl",
                  "sample_tps_bs32_vs_torchrl", "sample_tps_bs256_vs_torchrl",
                  "sample_tps_bs32_vs_numpy", "sample_tps_bs256_vs_numpy"]
    body = markdown_table(results, columns) + "\n\nRatios (expstore / baseline; bytes: "
    body += "baseline / expstore):\n\n" + markdown_table(
        [r for r in results if r["case"].startswith("expstore")], ratio_cols)
    if sustained:
        body += (f"\n\nSustained append into a {sustained['capacity']:,}-row store "
                 f"(shard_rows {sustained['shard_rows']}, fsync on): "
                 f"{sustained['transitions']:,} transitions at {sustained['tps']:,.0f} tr/s; "
                 f"slowest tenth {sustained['slowest_tenth_tps']:,.0f} tr/s.")
    body += ("\n\nMedians of repeats; tr/s = transitions/s; sampling = uniform stacked (4x84x84) "
             "obs and next_obs, warm page cache, read in the calling process (`store.sample`, "
             "`rb.sample()`); loader = `make_loader(num_workers=2, prefetch_factor=4)` "
             "batches/s into a consumer touching the tensors; prefetch = TorchRL "
             "`ReplayBuffer(..., prefetch=2)` iteration.")
    print(body)
    save_json("store", {"results": results, "sustained": sustained, "n": a.n, "game": a.game,
                        "source": data["source"]})
    if not a.no_write:
        write_section("Core store", body, command=command_line(),
                      source=f"{data['source']} {a.game}, {a.n} frames")


if __name__ == "__main__":
    main()

"""CleanRL's real ``dqn.py`` / ``dqn_atari.py`` on SB3's ReplayBuffer and on
ExpstoreReplayBuffer, run in pairs: steps/s and the learning curve.

    python benchmarks/bench_cleanrl.py [--script dqn] [--steps 30000] [--repeats 3]
        [--python PATH]

The scripts come from the ``cleanrl==1.2.0`` wheel on PyPI (downloaded once into
``benchmarks/.cache``; never copied into this repository). The expstore run changes one
line, the buffer import::

    from stable_baselines3.common.buffers import ReplayBuffer
 -> from expstore.integrations.sb3 import ExpstoreReplayBuffer as ReplayBuffer

so ``rb = ReplayBuffer(...)`` builds an expstore buffer on a temporary store. CleanRL 1.2.0
targets gymnasium 0.29 (``infos["final_observation"]``): ``--python`` names an interpreter
with gymnasium 0.29.x (``scripts/test.sh`` builds one at ``.venv-gym029``). TensorBoard's
``SummaryWriter`` is replaced, for both runs alike, by one that keeps the scalars in memory
(the curve and the script's own ``charts/SPS``). Runs alternate sb3 / expstore per repeat,
with the same seeds; medians of repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import markdown_table, ratio, save_json, write_section  # noqa: E402

CLEANRL = "cleanrl==1.2.0"
CACHE = Path(__file__).resolve().parent / ".cache" / "cleanrl-1.2.0"
SB3_IMPORT = "from stable_baselines3.common.buffers import ReplayBuffer\n"
EXPSTORE_IMPORT = "from expstore.integrations.sb3 import ExpstoreReplayBuffer as ReplayBuffer\n"

RUNNER = '''
import json, os, runpy, sys, types
scalars = {}
class SummaryWriter:
    def __init__(self, *a, **k): pass
    def add_text(self, *a, **k): pass
    def add_scalar(self, tag, value, step=None, *a, **k):
        value = value.item() if hasattr(value, "item") else value
        scalars.setdefault(tag, []).append([int(step or 0), float(value)])
    def close(self):
        with open(os.environ["BENCH_SCALARS"], "w") as f:
            json.dump(scalars, f)
try:  # ALE's v4 ids for gymnasium 0.29 (newer ale_py registers them only for gymnasium 1.x)
    import ale_py.registration as ale_registration
    import gymnasium
    if "BreakoutNoFrameskip-v4" not in gymnasium.registry:
        ale_registration.register_v0_v4_envs()
except ImportError:
    pass
tb = types.ModuleType("torch.utils.tensorboard")
tb.SummaryWriter = SummaryWriter
sys.modules["torch.utils.tensorboard"] = tb
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''


def fetch(script: str) -> str:
    """Text of ``cleanrl/<script>.py`` from the cleanrl wheel (downloaded once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = list(CACHE.glob("cleanrl-1.2.0-*.whl"))
    if not wheels:
        # the wheel declares python < 3.11 but its scripts run on 3.11
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.10",
                        "--ignore-requires-python", CLEANRL, "-d", str(CACHE)], check=True)
        wheels = list(CACHE.glob("cleanrl-1.2.0-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        return z.read(f"cleanrl/{script}.py").decode()


def patched(text: str, kind: str) -> str:
    if text.count(SB3_IMPORT) != 1:
        raise SystemExit("the CleanRL script no longer has exactly one SB3 ReplayBuffer import")
    return text if kind == "sb3" else text.replace(SB3_IMPORT, EXPSTORE_IMPORT)


def run(python: str, path: Path, args: list[str], work: Path) -> dict:
    out = work / f"scalars-{os.getpid()}-{len(list(work.iterdir()))}.json"
    runner = work / "run_script.py"
    runner.write_text(RUNNER)
    env = {**os.environ, "BENCH_SCALARS": str(out), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, str(runner), str(path), *args], check=True, cwd=work, env=env,
                   stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    scalars = json.loads(out.read_text())
    returns = scalars.get("charts/episodic_return", [])
    tail = [r for _, r in returns[-max(len(returns) // 5, 1):]]
    steps = int(args[args.index("--total-timesteps") + 1])
    return {"sps": scalars["charts/SPS"][-1][1], "cpu_sps": steps / cpu,
            "episodes": len(returns),
            "return_last20pct": statistics.mean(tail) if tail else float("nan"),
            "curve": returns}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", default="dqn", choices=["dqn", "dqn_atari"])
    ap.add_argument("--steps", type=int, default=30_000)
    ap.add_argument("--learning-starts", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with gymnasium 0.29.x, torch, stable-baselines3")
    args = ap.parse_args()
    if os.sep in args.python:  # the scripts run in a scratch folder: keep the path valid there
        args.python = os.path.abspath(args.python)
    version = subprocess.run([args.python, "-c", "import gymnasium; print(gymnasium.__version__)"],
                             check=True, capture_output=True, text=True).stdout.strip()
    if not version.startswith("0.29"):
        raise SystemExit(f"{args.python}: gymnasium {version}; CleanRL 1.2.0 needs 0.29.x "
                         "(bash scripts/test.sh builds .venv-gym029/bin/python)")
    work = Path(tempfile.mkdtemp(prefix="bench-cleanrl-"))
    text = fetch(args.script)
    paths = {}
    for kind in ("sb3", "expstore"):
        paths[kind] = work / f"{args.script}_{kind}.py"
        paths[kind].write_text(patched(text, kind))
    starts = args.learning_starts or (args.steps // 3 if args.script == "dqn" else 10_000)
    script_args = ["--total-timesteps", str(args.steps), "--learning-starts", str(starts),
                   "--cuda", "False", "--track", "False", "--capture-video", "False"]
    if args.script == "dqn_atari":
        script_args += ["--buffer-size", str(min(args.steps, 100_000))]
    load0 = os.getloadavg()[0]
    got: dict[str, list[dict]] = {"sb3": [], "expstore": []}
    for rep in range(args.repeats):
        for kind in ("sb3", "expstore"):
            r = run(args.python, paths[kind],
                    [*script_args, "--seed", str(args.seed + rep)], work)
            got[kind].append(r)
            print(kind, rep, {k: v for k, v in r.items() if k != "curve"}, flush=True)
    identical = sum(a["curve"] == b["curve"] for a, b in zip(got["sb3"], got["expstore"],
                                                             strict=True))
    rows = []
    for kind in ("sb3", "expstore"):
        runs = got[kind]
        rows.append({"script": args.script, "buffer": kind,
                     "sps": statistics.median(r["sps"] for r in runs),
                     "cpu_sps": statistics.median(r["cpu_sps"] for r in runs),
                     "episodes": statistics.median(r["episodes"] for r in runs),
                     "return_last20pct": statistics.median(r["return_last20pct"]
                                                           for r in runs)})
    rows[1]["sps_ratio"] = ratio(rows[1]["sps"], rows[0]["sps"])
    rows[1]["cpu_sps_ratio"] = ratio(rows[1]["cpu_sps"], rows[0]["cpu_sps"])
    rows[1]["identical_curves"] = f"{identical}/{args.repeats}"
    for r in rows:
        print(r)
    body = markdown_table(rows, ["script", "buffer", "sps", "sps_ratio", "cpu_sps",
                                 "cpu_sps_ratio", "episodes",
                                 "return_last20pct", "identical_curves"])
    body += (f"\n\nCleanRL 1.2.0 `{args.script}.py` as published, {args.steps} steps, "
             f"learning starts {starts}, seeds {args.seed}..{args.seed + args.repeats - 1}; "
             "the expstore run differs only in the buffer import. sps: the script's own "
             "`charts/SPS` at the end (median of repeats); cpu_sps: steps per CPU second of "
             "the whole run (all threads, startup included; robust to other load on the "
             "machine). identical_curves: runs whose "
             "episodic returns (step and value of every episode) equal the sb3 run with the "
             "same seed (the buffer draws its batches with np.random like SB3's).")
    print(body)
    save_json(f"cleanrl_{args.script}", rows)
    if args.no_write:
        return
    write_section(f"CleanRL {args.script}.py: SB3 buffer vs expstore", body,
                  source=f"{CLEANRL} wheel from PyPI; gymnasium {version}",
                  extra={"load average (1 min) start/end":
                         f"{load0:.1f} / {os.getloadavg()[0]:.1f}"})


if __name__ == "__main__":
    main()

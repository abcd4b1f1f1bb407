"""The ``expstore`` command line, run as a subprocess (``python -m expstore.cli``)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _dopamine_ref import OutOfGraphReplayBuffer, pong_frames, write_repeated_checkpoint

import expstore as es
from expstore.cli import main
from expstore.datasets import lane_rows
from expstore.verify import verify_store

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, check: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m expstore.cli ARGS`` in a subprocess (each costs an interpreter start)."""
    res = subprocess.run([sys.executable, "-m", "expstore.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check is not None:
        assert res.returncode == check, (res.returncode, res.stdout, res.stderr)
    return res


def run(capsys, *args: str, check: int = 0) -> tuple[str, str]:
    """The same CLI in this process (``expstore.cli.main``): stdout, stderr."""
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:  # argparse / option errors
        rc = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    assert rc == check, (rc, out, err)
    return out, err


@pytest.fixture(scope="module")
def dopamine_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ck")
    buf = OutOfGraphReplayBuffer((84, 84), 4, 3000)
    rng = np.random.default_rng(0)
    frames = pong_frames(2600, 1)
    i = 0
    for ep in range(8):
        n = int(rng.integers(100, 400))
        for t in range(n):
            buf.add(frames[i % len(frames)], int(rng.integers(6)), float(t % 50 == 0),
                    int(t == n - 1 and ep < 7))
            i += 1
    buf.save(d, 0, compresslevel=1)
    return d


def test_import_info_verify_export(dopamine_dir, tmp_path, capsys):
    url = tmp_path / "s.zarr"
    res = cli("import", "dopamine", dopamine_dir, url, "-o", "stack=4", "--no-progress")
    assert re.match(SUMMARY, res.stdout) and res.stdout.startswith("dopamine import: ")
    info = json.loads(run(capsys, "info", url, "--json")[0])
    store = es.open(url)
    assert info["rows"] == len(store) > 1000 and info["episodes"] == store.episodes_written == 7
    assert info["fields"]["obs"]["stack"] == 4 and info["compression_ratio"] > 5
    assert info["bytes_on_disk"] == store.backend.total_bytes()
    text, _ = run(capsys, "info", url)
    assert f"{len(store):,}" in text and "ratio" in text and "stack=4 (zero)" in text
    assert run(capsys, "verify", url, "-q")[0].strip().endswith("read")
    # export -> import through npz gives the same rows
    run(capsys, "export", url, "npz", tmp_path / "s.npz", "--no-progress")
    run(capsys, "import", "npz", tmp_path / "s.npz", tmp_path / "t.zarr")
    t_info = json.loads(run(capsys, "info", tmp_path / "t.zarr", "--json")[0])
    assert t_info["rows"] == info["rows"]
    run(capsys, "export", url, "dopamine", tmp_path / "out", "-o", "compresslevel=1",
        "--no-progress")
    assert (tmp_path / "out" / "$store$_observation_ckpt.0.gz").exists()
    # errors: clear message, exit 1
    assert "exists" in run(capsys, "import", "dopamine", dopamine_dir, url, check=1)[1]
    err = run(capsys, "import", "dopamine", dopamine_dir, tmp_path / "x.zarr", "-o", "bogus=1",
              check=2)[1]
    assert "bogus" in err and "stack" in err
    err = run(capsys, "import", "nosuch", dopamine_dir, tmp_path / "x.zarr", check=1)[1]
    assert "unknown dataset format 'nosuch'" in err
    assert "minari" in run(capsys, "formats")[0]
    store.close()


def test_verify_reports_every_corrupt_shard(dopamine_dir, tmp_path, capsys):
    url = tmp_path / "s.zarr"
    run(capsys, "import", "dopamine", dopamine_dir, url, "--no-progress")
    store = es.open(url)
    lay = store.layout
    obs_key = lay.shard_key("obs", 0)
    flags_key = lay.shard_key("_flags", 1)
    store.close()
    p = url / obs_key
    raw = bytearray(p.read_bytes())
    raw[-100:] = b"\x00" * 100  # the last inner chunk no longer decodes
    p.write_bytes(bytes(raw))
    q = url / flags_key
    q.write_bytes(q.read_bytes()[:20])  # truncated index
    res = cli("verify", url, "-q", check=1)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("CORRUPT")]
    assert len(lines) == 2, res.stdout
    assert any(obs_key in ln and "decode" in ln for ln in lines)
    assert any(flags_key in ln and "truncated" in ln for ln in lines)
    assert "2 problem(s)" in res.stdout


def _committed(url: Path) -> int:
    try:
        return json.loads((url / "_state" / "lane_0.json").read_text())["state"]["count"]
    except (OSError, ValueError, KeyError):
        return 0


def test_ctrl_c_leaves_a_store_with_the_rows_flushed(tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    cap = write_repeated_checkpoint(src, 0, repeats=60)
    url = tmp_path / "s.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "expstore.cli", "import", "dopamine", src, url],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _committed(url) < 2048 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    store = es.open(url)
    n = len(store)
    assert 2048 <= n < cap
    lr = lane_rows(store, 0)
    frames = pong_frames(1997, 0)
    got = store.read("obs", lr.rows, lr.steps)
    for k in range(0, n, 997):  # each row holds what the source holds there
        ep, pos = divmod(k, 1998)
        want = frames[pos] if pos < 1997 else np.zeros((84, 84), np.uint8)
        np.testing.assert_array_equal(got[k], want)
    assert verify_store(str(url)).ok
    # the progress bar was on (stderr): rows and MB/s
    assert "row" in err and "MB/s" in err


def test_bench_runs_scripts(tmp_path, capfd):
    capsys = capfd  # the scripts run as child processes: capture the file descriptors
    d = tmp_path / "benchmarks"
    d.mkdir()
    (d / "bench_ok.py").write_text("import sys; print('ran ok', sys.argv[1:])\n")
    (d / "bench_bad.py").write_text("raise SystemExit(3)\n")
    assert run(capsys, "bench", "--dir", d, "--list")[0].split() == ["bad", "ok"]
    out, err = run(capsys, "bench", "--dir", d, "--args", "--quick", check=1)
    assert "ran ok ['--quick']" in out and "failed: bench_bad.py" in err
    run(capsys, "bench", "nosuch", "--dir", d, check=2)
    assert "datasets" in run(capsys, "bench", "--list", "--dir", ROOT / "benchmarks")[0].split()


# -- every subcommand: help, summary, exit code -------------------------------------------------
COMMANDS = ("info", "verify", "repair", "import", "export", "formats", "bench", "upgrade")


def _subparsers():
    import argparse

    from expstore.cli import build_parser

    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_subcommand_and_positional_has_help(capsys):
    parsers = _subparsers()
    assert set(parsers) == set(COMMANDS)
    for name, sp in parsers.items():
        out, _ = run(capsys, name, "--help")
        assert out.startswith(f"usage: expstore {name}")
        for action in sp._actions:
            if action.dest in ("help",) or action.help == "==SUPPRESS==":
                continue
            assert action.help, (name, action.dest)
            if not action.option_strings:  # a positional: its help is printed
                assert action.help.split("(")[0].strip()[:20] in " ".join(out.split())
    # per-format -o options are in import/export help up front, with their defaults
    imp, _ = run(capsys, "import", "--help")
    assert "stack=\"auto\"" in imp and "frame_stack=\"auto\"" in imp and "fsync=false" in imp
    exp, _ = run(capsys, "export", "--help")
    assert "compression=\"gzip\"" in exp and "compresslevel=9" in exp
    out, _ = run(capsys, "formats")
    from expstore.datasets import FORMATS

    for fmt in ("dopamine", "d4rl", "npz", "minari", "rlds", "lerobot"):
        assert f"\n{fmt} " in "\n" + out
    n = len(FORMATS)
    assert out.count("import -o options:") == n and out.count("export -o options:") == n
    assert "see the function's docstring" not in out  # every option has its own help
    assert run(capsys, "formats", "--brief")[0].count("\n") == n


def test_version_and_usage_errors(capsys):
    res = cli("--version")
    assert res.stdout.strip() == f"expstore {es.__version__}"
    assert cli("nosuch", check=2).stderr
    assert "required" in cli("info", check=2).stderr
    err = run(capsys, "export", "x.zarr", "d4rl", "y.h5", "-o", "nope", check=2)[1]
    assert "expected KEY=VALUE" in err


def _atari(url, steps=700):
    spec = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                          action=es.Field((), np.int64, low=0, high=5))
    frame = lambda t: np.full((84, 84), t % 255, np.uint8)  # noqa: E731
    with es.create(url, spec, capacity=1000) as s:
        for t in range(steps):
            s.add(frame(t), t % 6, 1.0, frame(t + 1), terminated=t % 300 == 299,
                  truncated=False)


SUMMARY = r"^(\w+) (import|export): .* -> .*\n  [\d,]+ steps, [\d,]+ rows, [\d,]+ episodes, " \
          r"\d+ lane\(s\)\n  .*in [\d.]+ s \("


def test_every_import_and_export_prints_one_summary_style(tmp_path, capsys, monkeypatch):
    import re

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    url = tmp_path / "s.zarr"
    _atari(url)
    outs = {}
    outs["d4rl export"] = run(capsys, "export", url, "d4rl", tmp_path / "a.h5", "-q")[0]
    outs["d4rl import"] = run(capsys, "import", "d4rl", tmp_path / "a.h5", tmp_path / "d.zarr",
                              "-q")[0]
    outs["npz export"] = run(capsys, "export", url, "npz", tmp_path / "a.npz", "-q")[0]
    outs["npz import"] = run(capsys, "import", "npz", tmp_path / "a.npz", tmp_path / "n.zarr",
                             "-q")[0]
    outs["minari export"] = run(capsys, "export", url, "minari", "expstore/cli-v0", "-q")[0]
    outs["minari import"] = run(capsys, "import", "minari", "expstore/cli-v0",
                                tmp_path / "m.zarr", "-q")[0]
    for kind, text in outs.items():
        assert re.match(SUMMARY, text), (kind, text)
        assert text.startswith(kind) and "Store(" not in text and "Export(" not in text
        assert "KB" not in text and "KiB" not in text
    # what was left out is said, and counts agree with what the store holds
    assert "1 step(s) of open episodes left out" in outs["d4rl export"]
    assert "100 step(s) not in a complete episode left out" in outs["minari export"]
    assert "700 steps, 702 rows, 2 episodes" in outs["npz export"]
    assert "600 steps, 602 rows, 2 episodes" in outs["minari import"]
    # sizes in decimal units (1 MB = 10**6 B), rate in the d4rl export
    assert re.search(r"[\d.]+ (kB|MB) raw, [\d.]+ (kB|MB) written", outs["d4rl export"])
    # frame stacking survives each round trip
    for name in ("d.zarr", "n.zarr", "m.zarr"):
        with es.open(tmp_path / name) as s:
            assert s.spec.fields["obs"].stack == 4, name


def test_overwrite_on_import_and_export(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url, 200)
    run(capsys, "export", url, "npz", tmp_path / "a.npz", "-q")
    err = run(capsys, "export", url, "npz", tmp_path / "a.npz", "-q", check=1)[1]
    assert "pass --overwrite" in err and "overwrite=True" not in err
    run(capsys, "export", url, "npz", tmp_path / "a.npz", "-q", "--overwrite")
    run(capsys, "import", "npz", tmp_path / "a.npz", tmp_path / "b.zarr", "-q")
    err = run(capsys, "import", "npz", tmp_path / "a.npz", tmp_path / "b.zarr", "-q", check=1)[1]
    assert "--overwrite" in err and "overwrite=True" not in err
    run(capsys, "import", "npz", tmp_path / "a.npz", tmp_path / "b.zarr", "-q", "--overwrite")
    err = run(capsys, "export", url, "dopamine", tmp_path / "d", "--overwrite", check=2)[1]
    assert "export dopamine: --overwrite is not an option of this format" in err


def test_info_counts_and_units(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url)
    out, _ = run(capsys, "info", url)
    assert "rows        702 of 1,024" in out
    assert "capacity    1,024 rows (1000 requested, rounded up to whole shards" in out
    assert "transitions 700 env steps" in out and "episodes    2 complete held" in out
    assert re.search(r"on disk     [\d.]+ kB \(raw [\d.]+ MB", out), out
    info = json.loads(run(capsys, "info", url, "--json")[0])
    assert (info["transitions"], info["episodes_held"], info["capacity_requested"]) == \
        (700, 2, 1000)
    run(capsys, "info", tmp_path / "none.zarr", check=1)


def cli_tty(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    """The CLI in a subprocess whose stderr is a terminal (a pseudo-terminal, as a shell's
    is): exit code, stdout, what the terminal got."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # rows, cols
    proc = subprocess.Popen([sys.executable, "-m", "expstore.cli", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read()
    proc.stdout.close()
    return proc.wait(timeout), out, b"".join(chunks).decode(errors="replace")


def test_bars_have_totals_and_quiet_is_quiet(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url)
    for args in (("verify", url), ("repair", url), ("export", url, "npz", tmp_path / "a.npz"),
                 ("import", "npz", tmp_path / "a.npz", tmp_path / "b.zarr")):
        _, err = run(capsys, *args)  # stderr is not a terminal here: lines, no redraws
        assert "702/702 rows (100%)" in err and "\r" not in err, (args, err)
        assert len(err.splitlines()) == 1, err  # (one line per 10 s, one at the end)
        over = ["--overwrite"] if args[0] in ("import", "export") else []
        _, err = run(capsys, *args, "-q", *over)
        assert err == "", args
        _, err = run(capsys, "-q", *args, *over)  # -q before the command too
        assert err == "", args
    _, err = run(capsys, "export", url, "d4rl", tmp_path / "a.h5")
    assert "MB/s" in err and " 0 MB/s" not in err and "\r" not in err


def test_a_terminal_gets_a_tqdm_bar_with_total_and_eta(tmp_path):
    url = tmp_path / "s.zarr"
    _atari(url)
    for args in (("verify", url), ("export", url, "npz", tmp_path / "a.npz")):
        rc, out, term = cli_tty(*args)
        assert rc == 0, (out, term)
        assert "100%" in term and "702/702" in term.replace(".0", ""), (args, term)
        # elapsed<ETA (a loaded machine takes a second or more), redrawn in place
        assert re.search(r"\d\d:\d\d<\d\d:\d\d", term) and "\r" in term, term
    rc, out, term = cli_tty("verify", url, "-q")
    assert rc == 0 and term == "" and ": OK: 702 rows" in out


def test_quiet_is_accepted_before_and_after_every_command(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url, 50)
    for cmd in (("info", url), ("verify", url), ("repair", url), ("formats",),
                ("bench", "--list", "--dir", ROOT / "benchmarks")):
        before, err1 = run(capsys, "-q", *cmd)
        after, err2 = run(capsys, *cmd, "-q")
        assert before == after and before and err1 == err2 == "", cmd


def test_verify_and_repair_exit_codes_and_hint(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url)
    out, _ = run(capsys, "verify", url, "-q")
    assert ": OK: 702 rows" in out
    (url / "obs" / "zarr.json").unlink()
    out, _ = run(capsys, "verify", url, "-q", check=1)
    assert "CORRUPT" in out and "plain zarr no longer sees" in out
    assert f"run 'expstore repair file://{url}'" in out
    out, _ = run(capsys, "repair", url, "-q", "--dry-run")
    assert "would rebuild obs/zarr.json" in out
    out, _ = run(capsys, "repair", url, "-q")
    assert "rebuilt obs/zarr.json" in out
    run(capsys, "verify", url, "-q")
    (url / "zarr.json").write_text("{")
    for f in url.iterdir():
        if (f / "zarr.json").exists():
            (f / "zarr.json").unlink()
    out, _ = run(capsys, "repair", url, "-q", check=1)
    assert "UNFIXED" in out and "cannot repair" in out


def test_a_missing_path_or_empty_folder_is_no_store_not_corruption(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for name, why in (("nope.zarr", "the path does not exist"), ("empty", "the folder is empty")):
        path = tmp_path / name
        want = f"expstore: error: no store at file://{path}: {why}\n"
        for cmd in (("info", path), ("verify", path), ("repair", path),
                    ("export", path, "npz", tmp_path / "x.npz")):
            out, err = run(capsys, *cmd, check=1)
            assert (out, err) == ("", want), cmd  # no CORRUPT, no repair advice, no bar
        with pytest.raises(es.StoreNotFoundError, match=f"no store at file://{path}: {why}"):
            es.open(path)
    assert not (tmp_path / "nope.zarr").exists() and not list((tmp_path / "empty").iterdir())
    assert not (tmp_path / "x.npz").exists()
    with pytest.raises(FileNotFoundError, match="not an expstore store .*found a.txt"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "a.txt").write_text("x")
        es.open(tmp_path / "other")


def test_a_bad_option_is_one_line_naming_it_and_what_it_takes(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    _atari(url, 50)
    run(capsys, "export", url, "npz", tmp_path / "a.npz", "-q")
    dst = tmp_path / "b.zarr"
    for opt, want in (("capacity=abc", "-o capacity=abc: expected an integer or null"),
                      ("shard_rows=1.5", "-o shard_rows=1.5: expected an integer or null"),
                      ("fsync=maybe", "-o fsync=maybe: expected true or false"),
                      ("block_rows=[1]", "-o block_rows=[1]: expected an integer"),
                      ("bogus=1", "-o bogus: not an option of npz import (its options: "
                                  "capacity, shard_rows, block_rows, fsync;")):
        _, err = run(capsys, "import", "npz", tmp_path / "a.npz", dst, "-q", "-o", opt, check=2)
        assert err.startswith(f"expstore: error: {want}") and err.count("\n") == 1, err
        assert "Traceback" not in err
    for bad in ("0", "-5"):  # (-5 imported nothing, silently; 0 was range()'s message)
        _, err = run(capsys, "import", "npz", tmp_path / "a.npz", dst, "-q", "-o",
                     f"block_rows={bad}", check=1)
        assert err == (f"expstore: error: block_rows: expected an int >= 1 (rows read and "
                       f"written at a time), got {bad}\n")
    assert not dst.exists()
    _, err = run(capsys, "export", url, "d4rl", tmp_path / "a.h5", "-o", "compression=9",
                 check=2)
    assert err == ("expstore: error: -o compression=9: expected a string or null "
                   "(d4rl export)\n")


def test_every_command_names_a_local_store_one_way(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _atari(tmp_path / "s.zarr", 50)
    full = f"file://{tmp_path}/s.zarr"
    texts = [run(capsys, "info", "s.zarr")[0], run(capsys, "verify", "s.zarr", "-q")[0],
             run(capsys, "repair", "s.zarr", "-q")[0],
             run(capsys, "export", "s.zarr", "npz", "a.npz", "-q")[0],
             run(capsys, "import", "npz", "a.npz", "t.zarr", "-q")[0]]
    for text in texts:
        assert full in text or f"file://{tmp_path}/t.zarr" in text, text
        assert " s.zarr" not in text and " t.zarr" not in text, text
    _, err = run(capsys, "import", "npz", "a.npz", "s.zarr", "-q", check=1)
    assert err.startswith(f"expstore: error: {full}: a store exists here"), err
    (tmp_path / "s.zarr" / "obs" / "zarr.json").unlink()
    out, _ = run(capsys, "verify", "s.zarr", "-q", check=1)
    assert f"run 'expstore repair {full}'" in out and "'expstore repair s.zarr'" not in out
    (tmp_path / "s.zarr" / "_state" / "lane_0.json").write_text("{")
    _, err = run(capsys, "info", "s.zarr", check=1)
    assert f"{full}/_state/lane_0.json" in err and f"'expstore repair {full}'" in err
    assert "STORE" not in err


def test_a_log_gets_one_progress_line_per_interval():
    import io

    from expstore.datasets.progress import LineProgress

    log = io.StringIO()
    bar = LineProgress("import", total=400, interval=0.05, file=log)
    for _ in range(4):
        time.sleep(0.06)
        bar.update(100)
    bar.set_postfix_str("2.0 MB/s")
    bar.close()
    bar.close()  # once
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 5, lines
    assert lines[0].startswith("import: 100/400 rows (25%), ") and "ETA" in lines[0]
    assert lines[-1].startswith("import: 400/400 rows (100%), ") and "2.0 MB/s" in lines[-1]

"""Whole-run Dopamine import: from an S3 bucket laid out like the DQN Replay Dataset (a
real moto server), checkpoints decoded in parallel worker processes, a killed import
marked as partial and resumed to exactly the rows of an uninterrupted one."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from _dopamine_ref import OutOfGraphReplayBuffer, write_repeated_checkpoint

import expstore as es
from expstore.cli import main as cli_main
from expstore.cli import store_info
from expstore.datasets import import_dopamine, lane_rows
from expstore.datasets.dopamine import parse_suffixes
from expstore.rows import FLAG_LAST, FLAG_TERMINATED
from expstore.storage.backends import backend_for
from expstore.storage.format.import_marker import read_import_marker, write_import_marker
from expstore.storage.format.state import read_state, write_state
from expstore.verify import verify_store

ROOT = Path(__file__).parent.parent
SHAPE = (10, 10)
K = 4
EXTRA = [("sid", (), np.int64)]
#: the DQN Replay Dataset's layout: gs://atari-replay-datasets/dqn/<Game>/<run>/replay_logs/
BUCKET = "atari-replay-datasets"
RUN = "dqn/Pong/1/replay_logs"


def write_run(d: Path, checkpoints: int = 3, capacity: int = 400, seed: int = 0) -> None:
    """Checkpoints ``0..checkpoints-1`` of one Dopamine run: successive saves of one ring
    buffer (the later ones wrapped), as Dopamine's runner writes them."""
    d.mkdir(parents=True, exist_ok=True)
    buf = OutOfGraphReplayBuffer(SHAPE, K, capacity, extra_storage_types=EXTRA)
    rng = np.random.default_rng(seed)
    sid = 1
    for ck in range(checkpoints):
        for ep in range(12):
            n = int(rng.integers(1, 40))
            for t in range(n):
                last = t == n - 1 and not (ck == checkpoints - 1 and ep == 11)
                buf.add(rng.integers(1, 256, SHAPE, dtype=np.uint8), int(rng.integers(0, 6)),
                        float(rng.normal()), int(last), sid)
                sid += 1
        buf.save(d, ck)


def same_rows(a: es.Store, b: es.Store, block: int = 4096) -> None:
    """Every row of every lane: all fields, flags and episode positions (read in blocks)."""
    assert a.lanes == b.lanes and a.spec.same_as(b.spec)
    assert len(a) == len(b) and a.episodes_written == b.episodes_written
    for lane in range(a.lanes):
        ra, rb = lane_rows(a, lane), lane_rows(b, lane)
        np.testing.assert_array_equal(ra.flags, rb.flags)
        np.testing.assert_array_equal(ra.episode_step, rb.episode_step)
        for lo in range(0, len(ra.rows), block):
            sl = slice(lo, lo + block)
            for name in a.spec.fields:
                np.testing.assert_array_equal(a.read(name, ra.rows[sl], ra.steps[sl]),
                                              b.read(name, rb.rows[sl], rb.steps[sl]),
                                              err_msg=f"lane {lane} {name}")


@pytest.fixture
def bucket_run(s3_server, tmp_path):
    """Three checkpoints uploaded under the bucket's real key layout; ``(url, options,
    local folder)``."""
    import s3fs

    local = tmp_path / "replay_logs"
    write_run(local)
    try:
        s3_server.create_bucket(BUCKET)
    except Exception:  # noqa: BLE001 - made by an earlier test of this session
        pass
    fs = s3fs.S3FileSystem(**s3_server.storage_options)
    for p in sorted(local.iterdir()):
        fs.put_file(str(p), f"{BUCKET}/{RUN}/{p.name}")
    fs.invalidate_cache()
    return f"s3://{BUCKET}/{RUN}", dict(s3_server.storage_options), local


def test_import_streams_a_run_from_the_bucket(bucket_run, tmp_path):
    url, opts, local = bucket_run
    assert "$store$_observation_ckpt.0.gz" in {p.name for p in local.iterdir()}
    s = import_dopamine(url, tmp_path / "s3.zarr", source_options=opts, workers=2)
    import_dopamine(local, tmp_path / "local.zarr", workers=1)
    assert s.lanes == 3 and s.steps > 0
    a, b = es.open(tmp_path / "s3.zarr"), es.open(tmp_path / "local.zarr")
    same_rows(a, b)
    assert not list(tmp_path.glob("**/*_ckpt.*.gz.tmp"))  # nothing copied next to the store
    info = store_info(str(tmp_path / "s3.zarr"))
    assert not info["partial_import"] and info["import"].startswith("complete dopamine")


def test_cli_imports_a_chosen_range_from_the_bucket(bucket_run, tmp_path, capsys):
    url, opts, local = bucket_run
    rc = cli_main(["import", "dopamine", url, str(tmp_path / "r.zarr"), "--no-progress",
                   "-o", "suffixes=\"1-2\"", "-o", f"source_options={json.dumps(opts)}"])
    assert rc == 0, capsys.readouterr()
    import_dopamine(local, tmp_path / "local.zarr", suffixes=[1, 2], workers=1)
    same_rows(es.open(tmp_path / "r.zarr"), es.open(tmp_path / "local.zarr"))
    assert es.open(tmp_path / "r.zarr").lanes == 2


def test_missing_bucket_folder_is_named(s3_server, tmp_path):
    url = f"s3://{BUCKET}-nothing/{RUN}"
    with pytest.raises(FileNotFoundError, match="not a folder of Dopamine"):
        import_dopamine(url, tmp_path / "s.zarr", source_options=s3_server.storage_options)


def test_parse_suffixes():
    assert parse_suffixes("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_suffixes(range(2, 4)) == [2, 3] and parse_suffixes(5) == [5]
    assert parse_suffixes(None) is None
    with pytest.raises(ValueError, match="suffixes"):
        parse_suffixes("a-b")


# -- partial imports and resuming ---------------------------------------------------------
def _crash_lane(url: Path, lane: int, count: int) -> None:
    """Make ``lane`` look as a killed import leaves it: ``count`` rows committed (its
    episode count to match), the import marker partial with the lane not done."""
    store = es.open(url)
    lr = lane_rows(store, lane)
    episodes = int(((lr.flags[:count] & FLAG_LAST) != 0).sum())
    store.close()
    backend = backend_for(str(url), None, fsync=False)
    st = read_state(backend, lane)
    st.count, st.episodes = count, episodes
    write_state(backend, st)
    marker = read_import_marker(backend)
    marker["status"] = "partial"
    marker["lanes"][str(lane)]["done"] = False
    write_import_marker(backend, marker)
    backend.close()


@pytest.mark.parametrize("where", ["between_step_and_final_row", "mid_episode"])
def test_resume_ends_with_the_rows_of_an_uninterrupted_import(tmp_path, where):
    write_run(tmp_path / "run")
    import_dopamine(tmp_path / "run", tmp_path / "full.zarr", workers=1)
    import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1)
    lr = lane_rows(es.open(tmp_path / "s.zarr"), 1)
    term = np.flatnonzero(lr.flags & FLAG_TERMINATED)
    # a commit may land between a terminal step and its final row (a shard boundary)
    count = int(term[len(term) // 2]) + 1 if where.startswith("between") else \
        int(term[len(term) // 2]) + 4
    assert not lr.flags[count - 1] & FLAG_LAST
    _crash_lane(tmp_path / "s.zarr", 1, count)
    assert store_info(str(tmp_path / "s.zarr"))["partial_import"]
    assert len(es.open(tmp_path / "s.zarr")) < len(es.open(tmp_path / "full.zarr"))
    s = import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1)
    assert any("resumed after its" in n for n in s.notes) and any(
        "2 of 3 checkpoint(s) were already imported" in n for n in s.notes)
    same_rows(es.open(tmp_path / "s.zarr"), es.open(tmp_path / "full.zarr"))
    assert not store_info(str(tmp_path / "s.zarr"))["partial_import"]


def test_resume_with_other_settings_is_refused(tmp_path):
    write_run(tmp_path / "run")
    import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1)
    _crash_lane(tmp_path / "s.zarr", 2, 5)
    with pytest.raises(FileExistsError, match=r"suffixes: stored \[0, 1, 2\], given \[0, 1\]"):
        import_dopamine(tmp_path / "run", tmp_path / "s.zarr", suffixes=[0, 1])
    # a complete store is never resumed into
    import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1)
    with pytest.raises(FileExistsError, match="overwrite"):
        import_dopamine(tmp_path / "run", tmp_path / "s.zarr")


def _lane_counts(url: Path, lanes: int) -> list[int]:
    out = []
    for i in range(lanes):
        try:
            out.append(json.loads((url / "_state" / f"lane_{i}.json").read_text())["state"]
                       ["count"])
        except (OSError, ValueError, KeyError):
            out.append(0)
    return out


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c",
            "import sys; from expstore.cli import main; sys.exit(main(sys.argv[1:]))", *args]


@pytest.mark.slow  # ~9 s: kills an import
def test_killed_import_is_partial_and_the_same_command_resumes_it(tmp_path):
    """SIGKILL of the import's main process mid-run (its worker processes die with it):
    the store opens, info/verify call it partial, and re-running the command finishes it
    with exactly the rows of an uninterrupted import."""
    run = tmp_path / "replay_logs"
    run.mkdir()
    for ck in range(2):
        write_repeated_checkpoint(run, ck, repeats=16, seed=ck)  # 32k frames each
    url = tmp_path / "s.zarr"
    cmd = _cli("import", "dopamine", str(run), str(url), "--no-progress", "-o", "workers=2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if min(_lane_counts(url, 2)) > 0:  # both workers have committed rows
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    proc.kill()  # SIGKILL: no cleanup at all in the main process
    proc.wait()
    time.sleep(1.0)
    counts = _lane_counts(url, 2)
    time.sleep(1.0)
    assert _lane_counts(url, 2) == counts  # the workers died with their parent
    assert 0 < sum(counts)

    info = store_info(str(url))
    assert info["partial_import"] and "PARTIAL dopamine import" in info["import"]
    rep = verify_store(str(url))
    assert rep.ok and "re-run the same import command" in rep.partial_import
    out = subprocess.run(_cli("verify", str(url), "-q"), cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert "PARTIAL dopamine import" in out.stdout, out
    out = subprocess.run(_cli("info", str(url)), cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert "PARTIAL dopamine import" in out.stdout, out

    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resumed" in res.stdout
    import_dopamine(run, tmp_path / "full.zarr", workers=1)
    same_rows(es.open(url), es.open(tmp_path / "full.zarr"))
    assert not store_info(str(url))["partial_import"]
    assert verify_store(str(url)).partial_import is None


def test_ctrl_c_stops_the_workers_and_leaves_a_partial_store(tmp_path):
    run = tmp_path / "replay_logs"
    run.mkdir()
    for ck in range(2):
        write_repeated_checkpoint(run, ck, repeats=16, seed=ck)
    url = tmp_path / "s.zarr"
    cmd = _cli("import", "dopamine", str(run), str(url), "--no-progress", "-o", "workers=2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if min(_lane_counts(url, 2)) > 0:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert b"run the same command again to resume" in err
    assert store_info(str(url))["partial_import"]
    assert verify_store(str(url)).ok


def test_isal_inflates_when_installed():
    isal = pytest.importorskip("isal")
    from expstore.datasets import npy_gzip  # internals: the .npy.gz reader

    assert npy_gzip._inflater() is isal.isal_zlib
    data = gzip.compress(b"x" * 1000)
    assert npy_gzip._inflater().decompressobj(31).decompress(data) == b"x" * 1000


def test_a_script_without_main_guard_imports_in_parallel(tmp_path):
    """Worker processes never re-run the caller's script (no ``__main__`` guard needed)."""
    write_run(tmp_path / "run")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        from expstore.datasets import import_dopamine
        s = import_dopamine({str(tmp_path / "run")!r}, {str(tmp_path / "s.zarr")!r},
                            workers=2)
        print("lanes", s.lanes)
    """))
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("lanes 3") == 1
    import_dopamine(tmp_path / "run", tmp_path / "one.zarr", workers=1)
    same_rows(es.open(tmp_path / "s.zarr"), es.open(tmp_path / "one.zarr"))


def test_import_store_is_created_without_lane_writers(tmp_path):
    """The importing process creates the store read-only: no lane writer staging shards in
    its memory and no lease, so the workers open their lanes at once."""
    spec = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                          action=es.Field((), np.int64, low=0, high=5))
    made = es.create(tmp_path / "a.zarr", spec, capacity=8192, lanes=2, mode="r")
    assert made.mode == "r" and not made.writers
    with es.open(tmp_path / "a.zarr", "r+", lane=1, lease_ttl=60) as w:  # no lease to wait on
        w.add(np.zeros((84, 84), np.uint8), 1, 0.5, np.ones((84, 84), np.uint8), True, False)
    made.close()
    with pytest.raises(ValueError, match="mode: expected 'r' or 'r\\+'"):
        es.create(tmp_path / "b.zarr", spec, capacity=8192, mode="w")
    assert not (tmp_path / "b.zarr").exists()


def test_import_shards_stay_within_16_mib(tmp_path):
    """84x84 frames get 2,048-row shards (a worker's writer stages three of them); small
    frames keep the store's default; an explicit shard_rows wins."""
    from expstore.datasets.dopamine.importer import import_shard_rows
    from expstore.storage.format.layout import auto_shard_rows

    atari = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                           action=es.Field((), np.int64, low=0, high=5))
    assert import_shard_rows(atari, 4 * 1_000_000, 4) == 2048
    assert import_shard_rows(atari, 4 * 1_000_000, 4) * 84 * 84 <= 16 << 20
    small = es.Spec.create(obs=es.Field(SHAPE, np.uint8, stack=K), action=es.Field((), np.int64))
    assert import_shard_rows(small, 1_000_000, 1) == auto_shard_rows(1_000_000, 1)
    write_run(tmp_path / "run", checkpoints=1)
    import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1, shard_rows=64)
    with es.open(tmp_path / "s.zarr") as s:
        assert s.layout.shard_rows == 64


def test_small_blocks_through_the_worker_ring_keep_every_row(tmp_path):
    """Blocks inflate into a reused ring of buffers: with blocks of a few rows (many ring
    laps per shard, wrapped checkpoints read twice) the rows equal a one-block import."""
    write_run(tmp_path / "run", checkpoints=3)
    import_dopamine(tmp_path / "run", tmp_path / "small.zarr", workers=2, block_rows=7)
    import_dopamine(tmp_path / "run", tmp_path / "whole.zarr", workers=1, block_rows=1000)
    with es.open(tmp_path / "small.zarr") as a, es.open(tmp_path / "whole.zarr") as b:
        same_rows(a, b)


def test_lane_writer_opens_without_indexing_the_other_lanes(tmp_path):
    """An import worker opens its lane with index_all=False: the lanes other checkpoints
    filled are not read (they appear empty to it until refresh), its own lane is whole."""
    write_run(tmp_path / "run", checkpoints=3)
    import_dopamine(tmp_path / "run", tmp_path / "s.zarr", workers=1)
    with es.open(tmp_path / "s.zarr") as full:
        per_lane = [int(full.index.count[i]) for i in range(3)]
        total = len(full)
    assert min(per_lane) > 0
    w = es.open(tmp_path / "s.zarr", "r+", lane=1, index_all=False)
    try:
        assert [int(c) for c in w.index.count] == [0, per_lane[1], 0]
        w.refresh()  # the others are indexed on demand
        assert [int(c) for c in w.index.count] == per_lane and len(w) == total
    finally:
        w.close()

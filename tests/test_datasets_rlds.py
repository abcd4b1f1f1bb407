"""RLDS import/export without TensorFlow: a dataset written by TFDS's own writer
(tests/data/rlds_tiny, made by tests/_rlds_builder.py) pins the published layout (TFRecord
framing, feature encodings, features.json); round trips, resuming, bad input, the CLI.
The same against TensorFlow itself: tests/test_rlds_interop.py (marker ``interop``)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from _rlds_builder import episodes
from test_datasets_dopamine import same_rows
from test_datasets_dopamine_run import _crash_lane, _lane_counts

import expstore as es
from expstore.cli import main
from expstore.datasets import export_rlds, import_rlds, store_episodes
from expstore.datasets.rlds.records import frame, masked_crc, parse_features, read_records
from expstore.errors import DatasetFormatError
from expstore.field import Field
from expstore.spec import Spec

TINY = Path(__file__).parent / "data" / "rlds_tiny" / "tiny" / "1.0.0"
TRAIN = TINY / "tiny-train.tfrecord-00000-of-00001"


def test_tfrecord_framing_is_tensorflows():
    """The fixture was written by TensorFlow's RecordWriter: our framing of its records
    gives the file byte for byte, and its first header is length + masked crc32c."""
    raw = TRAIN.read_bytes()
    n, crc = struct.unpack("<QI", raw[:12])
    assert crc == masked_crc(raw[:8]) and n == len(raw[12:12 + n])
    with open(TRAIN, "rb") as f:
        records = list(read_records(f, str(TRAIN)))
    assert len(records) == 3 and b"".join(frame(r) for r in records) == raw
    assert masked_crc(b"") == 0xA282EAD8  # crc32c("") = 0, masked
    feats = parse_features(records[0], "r0")
    assert feats["steps/is_first"].WhichOneof("kind") == "int64_list"
    assert list(feats["steps/is_first"].int64_list.value) == [1, 0, 0]
    assert feats["steps/observation/image"].bytes_list.value[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert feats["steps/jpg"].bytes_list.value[0][:2] == b"\xff\xd8"


def _episodes_of(store: es.Store) -> list[dict[str, np.ndarray]]:
    """Every complete episode: ``{field: (T + 1, ...)}`` in lane, step order."""
    out = []
    for lane, first, T in store_episodes(store):
        steps = np.arange(first, first + T + 1)
        rows = store.index.lane_rows(lane, steps)
        out.append({n: store.read(n, rows, steps) for n in store.spec.fields})
    return out


def test_import_of_a_tfds_written_dataset_holds_its_values(tmp_path):
    summary = import_rlds(TINY, tmp_path / "s.zarr", split="train", workers=1)
    store = es.open(tmp_path / "s.zarr")
    got = sorted(_episodes_of(store), key=lambda g: int(g["episode_metadata.id"][0]))
    want = episodes("train")  # TFDS shuffles episodes on write: matched by id
    assert len(got) == 3 and summary.episodes == 3 and summary.steps == 3 + 4 + 5 - 3
    for e, (g, w) in enumerate(zip(got, want)):
        steps = w["steps"]
        n = len(steps)
        assert len(g["obs.image"]) == n  # n - 1 transitions + the final row
        np.testing.assert_array_equal(g["obs.image"], [s["observation"]["image"] for s in steps])
        np.testing.assert_array_equal(g["obs.state.joint"],
                                      [s["observation"]["state"]["joint"] for s in steps])
        assert g["obs.state.grip"].dtype == np.float64
        np.testing.assert_array_equal(g["obs.state.grip"], np.arange(n))
        np.testing.assert_array_equal(g["action"][:-1], [s["action"] for s in steps[:-1]])
        np.testing.assert_array_equal(g["action"][-1], 0)  # the final row holds none
        np.testing.assert_array_equal(g["reward"][:-1], np.arange(n - 1))
        np.testing.assert_array_equal(g["discount"], 1.0)
        np.testing.assert_array_equal(g["u8"], [s["u8"] for s in steps])
        np.testing.assert_array_equal(g["episode_metadata.id"], e)
        assert g["jpg"].shape == (n, 4, 4, 1)  # JPEG: decoded once, lossy by nature
        terminal = e % 2 == 0
        assert g["terminated"][n - 2] == terminal and g["truncated"][n - 2] == (not terminal)
        assert not g["terminated"][:n - 2].any() and not g["truncated"][:n - 2].any()
    notes = "\n".join(summary.notes)
    assert "steps/language_instruction (Text)" in notes
    assert "episode_metadata/file_path (Text)" in notes
    assert "steps/observation/state/joint -> obs.state.joint" in notes
    assert "3 episode(s) had a non-zero action or reward on their last step" in notes


def test_a_bad_crc_names_the_file_and_record(tmp_path):
    src = tmp_path / "ds"
    shutil.copytree(TINY, src)
    shard = src / TRAIN.name
    raw = bytearray(shard.read_bytes())
    n0 = struct.unpack("<Q", raw[:8])[0]
    raw[12 + n0 + 4 + 12 + 40] ^= 0xFF  # a byte of record 1's data
    shard.write_bytes(bytes(raw))
    with pytest.raises(DatasetFormatError, match=r"tiny-train.tfrecord-00000-of-00001: "
                                                 r"record 1: bad data crc32c"):
        import_rlds(src, tmp_path / "s.zarr", split="train", workers=1)


def test_unknown_split_and_missing_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="'valid' is not a split.*train, test"):
        import_rlds(TINY, tmp_path / "s.zarr", split="valid")
    with pytest.raises(FileNotFoundError, match="dataset_info.json: missing"):
        import_rlds(tmp_path, tmp_path / "s.zarr")


def _store(url: Path, lanes: int = 2, episodes: int = 5, seed: int = 0) -> es.Store:
    """Episodes of image + float64 observations, int actions, a discount and a float64
    user field; terminated and truncated episodes in every lane."""
    spec = Spec.create(obs={"image": Field((16, 16, 3), np.uint8),
                            "state": Field((4,), np.float64)},
                       action=Field((), np.int64), reward=Field((), np.float64),
                       extras={"discount": Field((), np.float32), "logp": Field((2,), np.float64),
                               "mask": Field((32, 32), np.uint8)})  # 1 KiB a row: zlib
    store = es.create(url, spec, 4096, lanes=lanes)
    rng = np.random.default_rng(seed)
    for lane in range(lanes):
        for e in range(episodes):
            T = int(rng.integers(2, 9))
            obs = {"image": rng.integers(0, 256, (T + 1, 16, 16, 3), dtype=np.uint8),
                   "state": rng.standard_normal((T + 1, 4))}
            term = np.zeros(T, bool)
            trunc = np.zeros(T, bool)
            (term if e % 2 else trunc)[-1] = True
            logp = rng.standard_normal((T + 1, 2))
            disc = rng.random(T + 1).astype(np.float32)
            mask = rng.integers(0, 3, (T + 1, 32, 32), dtype=np.uint8)
            store.extend({"obs": {k: v[:-1] for k, v in obs.items()},
                          "next_obs": {k: v[1:] for k, v in obs.items()},
                          "action": rng.integers(0, 6, T), "reward": rng.random(T),
                          "terminated": term, "truncated": trunc, "logp": logp[:-1],
                          "next_logp": logp[1:], "discount": disc[:-1],
                          "next_discount": disc[1:], "mask": mask[:-1],
                          "next_mask": mask[1:]}, lane=lane)
    store.flush()
    return store


def test_store_to_rlds_to_store_is_exact(tmp_path):
    src = _store(tmp_path / "a.zarr")
    out = export_rlds(tmp_path / "a.zarr", tmp_path / "ds", name="mine", shard_bytes=20_000)
    assert out.episodes == 10 and len(out.outputs) > 1  # several shards
    assert Path(out.outputs[0]).name == f"mine-train.tfrecord-00000-of-{len(out.outputs):05d}"
    import_rlds(tmp_path / "ds", tmp_path / "b.zarr", workers=2)
    b = es.open(tmp_path / "b.zarr")
    assert b.spec.fields["obs.state"].dtype == np.float64
    assert b.spec.fields["reward"].dtype == np.float64  # raw bytes: not rounded to float32
    got, want = _episodes_of(b), _episodes_of(src)
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=name)
    # and again: the imported store's own export imports to the same rows
    export_rlds(tmp_path / "b.zarr", tmp_path / "ds2", name="mine", shard_bytes=20_000)
    import_rlds(tmp_path / "ds2", tmp_path / "c.zarr", workers=1)
    c = es.open(tmp_path / "c.zarr")
    assert c.spec.same_as(b.spec)
    for x, y in zip(_episodes_of(c), got):
        for name in y:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_frame_stacking_bounds_and_codecs_survive_the_round_trip(tmp_path):
    """What TFDS has no place for travels in expstore_spec.json beside the dataset."""
    spec = Spec.create(obs=Field((84, 84), np.uint8, stack=4, padding="zero",
                                 codec={"name": "zstd", "level": 3}),
                       action=Field((), np.int64, low=0, high=5))
    a = es.create(tmp_path / "a.zarr", spec, 1000)
    rng = np.random.default_rng(1)
    for T in (30, 12):
        obs = rng.integers(0, 256, (T + 1, 84, 84), dtype=np.uint8)
        term = np.zeros(T, bool)
        term[-1] = True
        a.extend(obs=obs[:-1], next_obs=obs[1:], action=rng.integers(0, 6, T),
                 reward=rng.random(T), terminated=term, truncated=np.zeros(T, bool))
    a.close()
    export_rlds(tmp_path / "a.zarr", tmp_path / "ds")
    assert (tmp_path / "ds" / "expstore_spec.json").exists()
    a = es.open(tmp_path / "a.zarr", "r")
    import_rlds(tmp_path / "ds", tmp_path / "b.zarr", workers=1)
    b = es.open(tmp_path / "b.zarr")
    for name in ("obs", "action"):
        assert b.spec.fields[name] == a.spec.fields[name], name
    assert b.sample(8, np.random.default_rng(0))["obs"].shape == (8, 4, 84, 84)
    for g, w in zip(_episodes_of(b), _episodes_of(a)):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=name)


@pytest.mark.parametrize("count", [7, 1])  # inside an episode; inside the first one
def test_resume_ends_with_the_rows_of_an_uninterrupted_import(tmp_path, count):
    _store(tmp_path / "a.zarr", episodes=8)
    export_rlds(tmp_path / "a.zarr", tmp_path / "ds", shard_bytes=20_000)
    import_rlds(tmp_path / "ds", tmp_path / "full.zarr", workers=1)
    import_rlds(tmp_path / "ds", tmp_path / "s.zarr", workers=1)
    full = es.open(tmp_path / "full.zarr")
    assert full.lanes >= 2
    _crash_lane(tmp_path / "s.zarr", 1, count)
    s = import_rlds(tmp_path / "ds", tmp_path / "s.zarr", workers=2)
    assert any("were already imported" in n for n in s.notes), s.notes
    same_rows(es.open(tmp_path / "s.zarr"), full)
    with pytest.raises(FileExistsError, match="overwrite"):  # complete: never resumed into
        import_rlds(tmp_path / "ds", tmp_path / "s.zarr")


def test_cli_import_export_and_formats(tmp_path, capsys):
    assert main(["import", "rlds", str(TINY), str(tmp_path / "s.zarr"), "-q",
                 "-o", "split=test", "-o", "workers=1"]) == 0
    out = capsys.readouterr().out
    assert "rlds import" in out and "dropped" in out and "1 episodes" in out
    assert main(["export", str(tmp_path / "s.zarr"), "rlds", str(tmp_path / "ds"), "-q",
                 "-o", "name=again"]) == 0
    assert (tmp_path / "ds" / "again-train.tfrecord-00000-of-00001").exists()
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "rlds" in out and "image_format" in out and "split=" in out


def test_a_fsspec_source_imports_like_a_local_one(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    for p in TINY.iterdir():
        fs.pipe(f"/rlds_tiny_{tmp_path.name}/{p.name}", p.read_bytes())
    import_rlds(f"memory:///rlds_tiny_{tmp_path.name}", tmp_path / "m.zarr", split="train",
                workers=1)
    import_rlds(TINY, tmp_path / "l.zarr", split="train", workers=1)
    same_rows(es.open(tmp_path / "m.zarr"), es.open(tmp_path / "l.zarr"))


def test_sequence_examples_read_like_examples(tmp_path):
    """A SequenceExample episode (steps as feature lists, one Feature per step; episode
    features in the context) imports like the Example holding the same values."""
    from expstore.datasets.rlds.records import Example, SequenceExample

    src = tmp_path / "ds"
    shutil.copytree(TINY, src)
    shard = src / TRAIN.name
    with open(TRAIN, "rb") as f:
        records = list(read_records(f, str(TRAIN)))
    out = []
    for data in records:
        ex = Example.FromString(data)
        n = len(ex.features.feature["steps/is_first"].int64_list.value)
        seq = SequenceExample()
        for key, feat in ex.features.feature.items():
            if not key.startswith("steps/"):
                seq.context.feature[key].CopyFrom(feat)
                continue
            kind = feat.WhichOneof("kind")
            vals = list(getattr(feat, kind).value)
            per = len(vals) // n
            flist = seq.feature_lists.feature_list[key]
            for t in range(n):
                getattr(flist.feature.add(), kind).value.extend(vals[t * per:(t + 1) * per])
        out.append(frame(seq.SerializeToString()))
    shard.write_bytes(b"".join(out))
    import_rlds(src, tmp_path / "seq.zarr", split="train", workers=1)
    import_rlds(TINY, tmp_path / "ex.zarr", split="train", workers=1)
    same_rows(es.open(tmp_path / "seq.zarr"), es.open(tmp_path / "ex.zarr"))


@pytest.mark.slow  # ~15 s: builds 3 shards of images, kills an import
def test_killed_import_resumes_to_the_rows_of_an_uninterrupted_one(tmp_path):
    """kill -9 of ``expstore import rlds`` (main process; its workers die with it) mid-run,
    then the same command: the store ends with exactly the rows of an uninterrupted import."""
    import os
    import subprocess
    import sys
    import time

    spec = Spec.create(obs=Field((32, 32, 3), np.uint8), action=Field((), np.int64))
    a = es.create(tmp_path / "a.zarr", spec, 12_000)
    rng = np.random.default_rng(0)
    for _ in range(40):
        T = 250
        obs = rng.integers(0, 256, (T + 1, 32, 32, 3), dtype=np.uint8)
        term = np.zeros(T, bool)
        term[-1] = True
        a.extend(obs=obs[:-1], next_obs=obs[1:], action=rng.integers(0, 4, T),
                 reward=rng.random(T), terminated=term, truncated=np.zeros(T, bool))
    a.flush()
    a.close()
    export_rlds(tmp_path / "a.zarr", tmp_path / "ds", shard_bytes=12 << 20)
    url = tmp_path / "s.zarr"
    root = Path(__file__).parent.parent
    cmd = [sys.executable, "-c", "import sys; from expstore.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "import", "rlds", str(tmp_path / "ds"), str(url),
           "-q", "-o", "workers=2", "-o", "shard_rows=256"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    lanes = len(list((tmp_path / "ds").glob("*.tfrecord-*")))
    assert lanes >= 2
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (url / "zarr.json").exists() and max(_lane_counts(url, lanes)) > 0:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    proc.kill()  # SIGKILL: no cleanup
    proc.wait()
    time.sleep(1.0)
    assert 0 < sum(_lane_counts(url, lanes)) < 40 * 251
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # (a lane killed inside its first episode restarts from 0: nothing to say "resumed")
    assert "rlds import" in res.stdout and "Error" not in res.stderr
    import_rlds(tmp_path / "ds", tmp_path / "full.zarr", workers=1, shard_rows=256)
    same_rows(es.open(url), es.open(tmp_path / "full.zarr"))

"""LeRobot v3.0 import/export against the published layout (datasets written by hand from
LeRobot's documented schema, tests/_lerobot_layout.py): field mapping, exact round trips
(PNG), resume, fsspec sources, bad input, the CLI. Real LeRobot readers and writers, and
video: tests/test_lerobot_interop.py (marker ``interop``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _lerobot_layout import EPISODE_COLUMNS, INFO_KEYS, TASKS, write_v3
from test_datasets_dopamine_run import same_rows

import expstore as es
from expstore.cli import main as cli_main
from expstore.datasets import export_lerobot, import_lerobot, lane_rows
from expstore.errors import DatasetFormatError
from expstore.rows import FLAG_TERMINATED, FLAG_TRUNCATED
from expstore.storage.backends import backend_for
from expstore.storage.format.import_marker import read_import_marker

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("PIL")

LENGTHS = [5, 9, 3, 7, 4]


def lane_values(store: es.Store, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values of every row, flags) of lane 0."""
    lr = lane_rows(store, 0)
    return store.read(name, lr.rows, lr.steps), lr.flags


def steps_of(store: es.Store, name: str) -> np.ndarray:
    """Values of the step rows (final rows left out) of lane 0, oldest first."""
    lr = lane_rows(store, 0)
    keep = np.ones(len(lr.rows), bool)
    keep[np.cumsum(np.array(LENGTHS) + 1) - 1] = False  # one final row after each episode
    return store.read(name, lr.rows[keep], lr.steps[keep])


@pytest.fixture
def v3(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "koch_push"
    return root, write_v3(root, LENGTHS)


def test_import_maps_every_feature(v3, tmp_path):
    root, vals = v3
    s = import_lerobot(root, tmp_path / "s.zarr")
    assert (s.steps, s.rows, s.episodes) == (sum(LENGTHS), sum(LENGTHS) + 5, 5)
    notes = "\n".join(s.notes)
    assert "dropped index" in notes and "dropped language_instruction" in notes
    assert "observation.images.top -> obs.images.top" in notes
    store = es.open(tmp_path / "s.zarr")
    for key, name in [("observation.state", "obs.state"), ("action", "action"),
                      ("next.reward", "reward"), ("timestamp", "timestamp"),
                      ("frame_index", "frame_index"), ("episode_index", "episode_index"),
                      ("task_index", "task_index"),
                      ("observation.images.top", "obs.images.top")]:
        np.testing.assert_array_equal(steps_of(store, name), vals[key], err_msg=key)
    assert store.spec.fields["obs.images.top"].shape == (24, 32, 3)
    assert store.spec.fields["timestamp"].shape == ()
    _, flags = lane_values(store, "reward")
    ends = np.cumsum(np.array(LENGTHS) + 1) - 2  # the last step of each episode
    term = (flags[ends] & FLAG_TERMINATED) != 0
    trunc = (flags[ends] & FLAG_TRUNCATED) != 0
    np.testing.assert_array_equal(term, [True, False, True, False, True])  # next.done
    np.testing.assert_array_equal(trunc, ~term)
    origin = store.spec.structure["lerobot"]
    assert origin["fps"] == 10 and origin["tasks"] == TASKS and origin["robot_type"] == "koch"
    # the final row repeats the last frame (LeRobot stores no observation after it)
    obs, _ = lane_values(store, "obs.state")
    np.testing.assert_array_equal(obs[ends + 1], obs[ends])


def test_import_without_next_done_truncates(tmp_path):
    write_v3(tmp_path / "d", [4, 6], done=False, string_feature=False)
    s = import_lerobot(tmp_path / "d", tmp_path / "s.zarr")
    assert any("no next.done" in n for n in s.notes)
    store = es.open(tmp_path / "s.zarr")
    _, flags = lane_values(store, "reward")
    assert ((flags & FLAG_TRUNCATED) != 0).sum() == 2
    assert ((flags & FLAG_TERMINATED) != 0).sum() == 0


def test_export_writes_the_v3_layout(v3, tmp_path):
    root, vals = v3
    import_lerobot(root, tmp_path / "s.zarr")
    out = tmp_path / "out"
    s = export_lerobot(tmp_path / "s.zarr", out)
    assert (s.steps, s.episodes) == (sum(LENGTHS), 5)
    info = json.loads((out / "meta/info.json").read_text())
    assert set(info) == INFO_KEYS and info["codebase_version"] == "v3.0"
    assert info["fps"] == 10 and info["robot_type"] == "koch" and info["total_frames"] == 28
    assert info["splits"] == {"train": "0:5"}
    assert info["features"]["observation.images.top"] == {
        "dtype": "image", "shape": [24, 32, 3], "names": ["height", "width", "channels"]}
    assert info["features"]["action"]["names"] == ["x", "y"]  # kept from the source
    t = pq.read_table(out / "data/chunk-000/file-000.parquet")
    sch = t.schema
    assert sch.field("observation.state").type == pa.list_(pa.float32(), 6)
    assert sch.field("observation.images.top").type == pa.struct(
        [("bytes", pa.binary()), ("path", pa.string())])
    for k in ("timestamp", "next.reward"):
        assert sch.field(k).type == pa.float32()
    for k in ("frame_index", "episode_index", "index", "task_index"):
        assert sch.field(k).type == pa.int64()
    assert sch.field("next.done").type == pa.bool_()
    np.testing.assert_array_equal(t.column("index").to_numpy(), np.arange(28))
    np.testing.assert_array_equal(t.column("task_index").to_numpy(), vals["task_index"])
    np.testing.assert_array_equal(t.column("next.done").to_numpy(), vals["next.done"])
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
    assert EPISODE_COLUMNS <= set(eps.column_names)
    assert eps.column("length").to_pylist() == LENGTHS
    assert eps.column("tasks").to_pylist() == [[TASKS[e % 2]] for e in range(5)]
    tasks = pq.read_table(out / "meta/tasks.parquet")
    meta = json.loads(tasks.schema.metadata[b"pandas"])
    assert meta["index_columns"] == ["__index_level_0__"]
    assert tasks.column("__index_level_0__").to_pylist() == TASKS
    stats = json.loads((out / "meta/stats.json").read_text())
    np.testing.assert_allclose(stats["action"]["mean"], vals["action"].mean(0), rtol=1e-5)
    assert np.asarray(stats["observation.images.top"]["mean"]).shape == (3, 1, 1)


def test_lerobot_round_trip_is_exact(v3, tmp_path):
    """LeRobot -> store -> LeRobot -> store: the same stores, row for row."""
    root, _ = v3
    import_lerobot(root, tmp_path / "a.zarr")
    export_lerobot(tmp_path / "a.zarr", tmp_path / "out")
    import_lerobot(tmp_path / "out", tmp_path / "b.zarr")
    same_rows(es.open(tmp_path / "a.zarr"), es.open(tmp_path / "b.zarr"))


def _store(url: Path, seed: int = 0) -> None:
    """A store LeRobot never saw: stacked grayscale frames, a dict observation, integer
    actions, real final observations, terminated and truncated episodes."""
    spec = es.Spec.create({"frame": es.Field((12, 10), np.uint8, stack=4, padding="zero"),
                           "vel": es.Field((3,), np.float64)},
                          es.Field((), np.int64, low=0, high=5),
                          extras={"cost": es.Field((), np.float32)})
    rng = np.random.default_rng(seed)
    st = es.create(url, spec, 300)
    for e, T in enumerate([6, 11, 2, 8]):
        obs = {"frame": rng.integers(0, 256, (T + 1, 12, 10), dtype=np.uint8),
               "vel": rng.normal(size=(T + 1, 3))}
        term = np.zeros(T, bool)
        trunc = np.zeros(T, bool)
        (term if e % 2 else trunc)[-1] = True
        st.extend({"obs": {k: v[:-1] for k, v in obs.items()},
                   "next_obs": {k: v[1:] for k, v in obs.items()},
                   "action": rng.integers(0, 6, T), "reward": rng.normal(size=T),
                   "terminated": term, "truncated": trunc,
                   "cost": rng.normal(size=T).astype(np.float32),
                   "next_cost": rng.normal(size=T).astype(np.float32)})
    st.close()


def test_store_round_trip_is_exact(tmp_path):
    """store -> LeRobot (PNG) -> store: every field of every row, final rows included."""
    _store(tmp_path / "a.zarr")
    s = export_lerobot(tmp_path / "a.zarr", tmp_path / "out", fps=15)
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["features"]["observation.frame"]["shape"] == [12, 10, 1]
    assert info["features"]["action"] == {"dtype": "int64", "shape": [1], "names": None}
    assert s.episodes == 4
    imp = import_lerobot(tmp_path / "out", tmp_path / "b.zarr")
    assert any("meta/expstore.json" in n for n in imp.notes)
    same_rows(es.open(tmp_path / "a.zarr"), es.open(tmp_path / "b.zarr"))


def test_codec_option_reaches_the_cameras(tmp_path):
    _store(tmp_path / "a.zarr")
    export_lerobot(tmp_path / "a.zarr", tmp_path / "out")
    zstd = {"name": "blosc", "cname": "zstd", "clevel": 5}
    import_lerobot(tmp_path / "out", tmp_path / "b.zarr", codec=zstd)
    fields = es.open(tmp_path / "b.zarr").spec.fields
    assert fields["obs.frame"].codec == zstd and fields["obs.vel"].codec != zstd


def test_open_episode_is_left_out(tmp_path):
    _store(tmp_path / "a.zarr")
    st = es.open(tmp_path / "a.zarr", "r+")
    st.extend({"obs": {"frame": np.zeros((3, 12, 10), np.uint8), "vel": np.zeros((3, 3))},
               "action": np.zeros(3, np.int64), "reward": np.zeros(3),
               "terminated": np.zeros(3, bool), "truncated": np.zeros(3, bool),
               "cost": np.zeros(3, np.float32)})
    st.close()
    s = export_lerobot(tmp_path / "a.zarr", tmp_path / "out")
    assert s.steps == 27 and any("open episodes" in n for n in s.notes)


def test_interrupted_import_resumes_to_the_same_store(v3, tmp_path):
    root, _ = v3
    import_lerobot(root, tmp_path / "whole.zarr")
    seen = []

    def stop_after_two_blocks(rows: int, nbytes: int) -> None:
        seen.append(rows)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_lerobot(root, tmp_path / "part.zarr", block_rows=4,
                       progress=stop_after_two_blocks)
    be = backend_for(str(tmp_path / "part.zarr"), None, fsync=False)
    assert read_import_marker(be)["status"] == "partial"
    be.close()
    assert 0 < len(es.open(tmp_path / "part.zarr")) < 33
    s = import_lerobot(root, tmp_path / "part.zarr", block_rows=4)
    assert any("resumed" in n for n in s.notes)
    be = backend_for(str(tmp_path / "part.zarr"), None, fsync=False)
    assert read_import_marker(be)["status"] == "complete"
    be.close()
    same_rows(es.open(tmp_path / "whole.zarr"), es.open(tmp_path / "part.zarr"))
    with pytest.raises(FileExistsError):  # complete: not imported over
        import_lerobot(root, tmp_path / "part.zarr")


def test_import_from_an_fsspec_url(v3, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    root, _ = v3
    fs = fsspec.filesystem("memory")
    for p in root.rglob("*"):
        if p.is_file():
            fs.pipe(f"/lerobot/koch_push/{p.relative_to(root).as_posix()}", p.read_bytes())
    try:
        import_lerobot("memory://lerobot/koch_push", tmp_path / "m.zarr")
        import_lerobot(root, tmp_path / "l.zarr")
        same_rows(es.open(tmp_path / "l.zarr"), es.open(tmp_path / "m.zarr"))
    finally:
        fs.rm("/lerobot", recursive=True)


def _edit_info(root: Path, fn) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    fn(info)
    (root / "meta/info.json").write_text(json.dumps(info))


@pytest.mark.parametrize("edit, message", [
    (lambda i: i.update(codebase_version="v2.1"), "codebase_version 'v2.1'"),
    (lambda i: i["features"].pop("action"), "no 'action' feature"),
    (lambda i: i.pop("fps"), "missing 'fps'"),
])
def test_bad_info_is_refused(v3, tmp_path, edit, message):
    root, _ = v3
    _edit_info(root, edit)
    with pytest.raises(DatasetFormatError, match=message):
        import_lerobot(root, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def test_frames_that_disagree_with_the_episodes_are_refused(v3, tmp_path):
    root, _ = v3
    path = root / "data/chunk-000/file-001.parquet"
    t = pq.read_table(path)
    ep = t.column("episode_index").to_numpy().copy()
    ep[1] = 7
    t = t.set_column(t.column_names.index("episode_index"), "episode_index", pa.array(ep))
    pq.write_table(t, path)
    with pytest.raises(DatasetFormatError,
                       match=r"file-001.parquet: rows 0..10 hold episode_index \[2, 3, 7\]"):
        import_lerobot(root, tmp_path / "s.zarr")


def test_done_before_the_last_frame_is_refused(v3, tmp_path):
    root, _ = v3
    path = root / "data/chunk-000/file-000.parquet"
    t = pq.read_table(path)
    done = t.column("next.done").to_numpy().copy()
    done[2] = True
    t = t.set_column(t.column_names.index("next.done"), "next.done", pa.array(done))
    pq.write_table(t, path)
    with pytest.raises(DatasetFormatError, match="episode 0: next.done is set on frame 2"):
        import_lerobot(root, tmp_path / "s.zarr")


def test_export_refuses_a_folder_in_use(tmp_path):
    _store(tmp_path / "a.zarr")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_lerobot(tmp_path / "a.zarr", tmp_path / "out")
    assert (tmp_path / "out/keep.txt").read_text() == "mine"


def test_cli_formats_import_export(v3, tmp_path, capsys):
    root, _ = v3
    assert cli_main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "lerobot" in out and "video=false" in out and "tolerance_s=" in out
    assert cli_main(["import", "lerobot", str(root), str(tmp_path / "s.zarr"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "lerobot import" in out and "note: dropped index" in out
    assert cli_main(["export", str(tmp_path / "s.zarr"), "lerobot", str(tmp_path / "o"),
                     "-o", "png_level=1", "-q"]) == 0
    assert "lerobot export" in capsys.readouterr().out
    assert json.loads((tmp_path / "o/meta/info.json").read_text())["total_frames"] == 28
    shutil.rmtree(tmp_path / "o")


def test_episodes_table_without_its_columns_is_refused(v3, tmp_path):
    root, _ = v3
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["dataset_to_index"]), path)
    with pytest.raises(DatasetFormatError, match=r"missing column\(s\) \['dataset_to_index'\]"):
        import_lerobot(root, tmp_path / "s.zarr")

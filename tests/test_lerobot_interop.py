"""LeRobot's own ``LeRobotDataset`` (lerobot 0.4.4) writing datasets we import, and reading
the datasets we export, images as PNG and as MP4 (marker ``interop``; needs the ``lerobot``
environment that scripts/lerobot_env.sh builds: python 3.11, torch 2.14.1 + torchvision
0.29.1 from this machine's disk, torchcodec 0.13 over the system FFmpeg, lerobot --no-deps).

Run: .venv-lerobot/bin/python -m pytest -m interop tests/test_lerobot_interop.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_datasets_dopamine_run import same_rows

import expstore as es
from expstore.datasets import export_lerobot, import_lerobot, lane_rows

pytestmark = pytest.mark.interop
lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset",
                                      reason="lerobot is not installed (scripts/lerobot_env.sh)")
pytest.importorskip("av")
torch = pytest.importorskip("torch")
LeRobotDataset = lerobot_dataset.LeRobotDataset

H, W = 48, 64
LENGTHS = [12, 7, 15]


def smooth_frames(n: int, seed: int) -> np.ndarray:
    """Camera-like frames (gradients and a moving square), so a video codec's error is the
    one it makes on real footage, not on noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        f = np.stack([(x * 4 + i * 3) % 256, (y * 5 + i) % 256, np.full_like(x, 90)], -1)
        r, c = (i * 2) % (H - 10), (i * 3) % (W - 10)
        f[r:r + 10, c:c + 10] = rng.integers(0, 256, 3)
        out[i] = f
    return out


def record(root, video: bool) -> dict[str, np.ndarray]:
    """A dataset written by LeRobot's own recorder (add_frame / save_episode)."""
    features = {"observation.state": {"dtype": "float32", "shape": (4,), "names": None},
                "observation.images.cam": {"dtype": "video" if video else "image",
                                           "shape": (H, W, 3),
                                           "names": ["height", "width", "channels"]},
                "action": {"dtype": "float32", "shape": (2,), "names": None},
                "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
                "next.done": {"dtype": "bool", "shape": (1,), "names": None}}
    ds = LeRobotDataset.create("local/rec", fps=20, features=features, root=root,
                               robot_type="sim", use_videos=video)
    rng = np.random.default_rng(1)
    frames = smooth_frames(sum(LENGTHS), 2)
    k = 0
    for e, T in enumerate(LENGTHS):
        for t in range(T):
            ds.add_frame({"observation.state": rng.normal(size=4).astype(np.float32),
                          "observation.images.cam": frames[k],
                          "action": rng.normal(size=2).astype(np.float32),
                          "next.reward": np.array([t / 10], np.float32),
                          "next.done": np.array([t == T - 1 and e != 1]),
                          "task": ["pick", "place"][e % 2]})
            k += 1
        ds.save_episode()
    ds.finalize()
    return {"frames": frames}


def step_rows(store: es.Store) -> tuple[np.ndarray, np.ndarray]:
    lr = lane_rows(store, 0)
    keep = np.ones(len(lr.rows), bool)
    keep[np.cumsum(np.array(LENGTHS) + 1) - 1] = False
    return lr.rows[keep], lr.steps[keep]


def as_hwc_uint8(t: torch.Tensor) -> np.ndarray:
    """LeRobot's camera tensor (C, H, W) float in [0, 1] -> (H, W, C) uint8."""
    return np.round(t.permute(1, 2, 0).numpy() * 255).astype(np.uint8)


@pytest.mark.parametrize("video", [False, True], ids=["png", "mp4"])
def test_import_of_a_dataset_lerobot_recorded(tmp_path, video):
    record(tmp_path / "rec", video)
    s = import_lerobot(tmp_path / "rec", tmp_path / "s.zarr")
    assert (s.steps, s.episodes) == (sum(LENGTHS), 3)
    ds = LeRobotDataset("local/rec", root=tmp_path / "rec")
    store = es.open(tmp_path / "s.zarr")
    rows, steps = step_rows(store)
    cam = store.read("obs.images.cam", rows, steps)
    worst = 0
    for i in range(len(ds)):
        item = ds[i]
        np.testing.assert_array_equal(store.read("obs.state", rows[i:i + 1], steps[i:i + 1])[0],
                                      item["observation.state"].numpy())
        np.testing.assert_array_equal(store.read("action", rows[i:i + 1], steps[i:i + 1])[0],
                                      item["action"].numpy())
        assert store.read("reward", rows[i:i + 1], steps[i:i + 1])[0] == \
            item["next.reward"].item()
        theirs = as_hwc_uint8(item["observation.images.cam"])
        worst = max(worst, int(np.abs(cam[i].astype(int) - theirs.astype(int)).max()))
    # PNG: the same pixels; MP4: PyAV's and torchcodec's yuv420p -> RGB conversions agree
    # to within rounding
    assert worst <= (2 if video else 0), worst
    flags = lane_rows(store, 0).flags
    ends = np.cumsum(np.array(LENGTHS) + 1) - 2
    assert [bool(f & es.rows.FLAG_TERMINATED) for f in flags[ends]] == [True, False, True]
    assert store.spec.structure["lerobot"]["tasks"] == ["pick", "place"]


def exported_store(url) -> es.Store:
    spec = es.Spec.create({"state": es.Field((4,), np.float32),
                           "images.cam": es.Field((H, W, 3), np.uint8)},
                          es.Field((2,), np.float32))
    st = es.create(url, spec, 100)
    rng = np.random.default_rng(0)
    frames = smooth_frames(sum(LENGTHS) + 3, 5)
    k = 0
    for T in LENGTHS:
        f = frames[k:k + T + 1]
        s = rng.normal(size=(T + 1, 4)).astype(np.float32)
        term = np.zeros(T, bool)
        term[-1] = True
        st.extend({"obs": {"state": s[:-1], "images.cam": f[:-1]},
                   "next_obs": {"state": s[1:], "images.cam": f[1:]},
                   "action": rng.normal(size=(T, 2)).astype(np.float32),
                   "reward": rng.normal(size=T).astype(np.float32),
                   "terminated": term, "truncated": np.zeros(T, bool)})
        k += T + 1
    st.close()
    return es.open(url)


@pytest.mark.parametrize("video", [False, True], ids=["png", "mp4"])
def test_lerobot_loads_our_export(tmp_path, video):
    store = exported_store(tmp_path / "a.zarr")
    export_lerobot(tmp_path / "a.zarr", tmp_path / "out", fps=20, video=video)
    ds = LeRobotDataset("local/out", root=tmp_path / "out")
    assert (len(ds), ds.num_episodes, ds.fps) == (sum(LENGTHS), 3, 20)
    rows, steps = step_rows(store)
    cam = store.read("obs.images.cam", rows, steps)
    state = store.read("obs.state", rows, steps)
    reward = store.read("reward", rows, steps)
    err = []
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
    i = 0
    for batch in loader:
        n = len(batch["index"])
        np.testing.assert_array_equal(batch["observation.state"].numpy(), state[i:i + n])
        np.testing.assert_array_equal(batch["next.reward"].numpy(), reward[i:i + n])
        theirs = np.round(batch["observation.images.cam"].permute(0, 2, 3, 1).numpy() * 255)
        err.append(np.abs(theirs - cam[i:i + n]))
        i += n
    assert i == len(ds)
    err = np.concatenate(err)
    if not video:
        assert err.max() == 0
    else:  # lossy, but the frames are the right ones: small mean error
        assert err.mean() < 6, err.mean()
        print(f"mp4 round trip: max abs error {err.max():.0f}, mean {err.mean():.2f}")
    import_lerobot(tmp_path / "out", tmp_path / "b.zarr")
    if not video:
        same_rows(store, es.open(tmp_path / "b.zarr"))


def test_gray_camera_as_video(tmp_path):
    """A (H, W) uint8 field (Atari frames) goes out as an MP4 (gray in RGB) and comes back
    (H, W); LeRobot decodes it too."""
    spec = es.Spec.create(es.Field((H, W), np.uint8, stack=4, padding="zero"),
                          es.Field((), np.int64, low=0, high=3),
                          extras={"task_index": es.Field((), np.int64)})
    st = es.create(tmp_path / "a.zarr", spec, 100)
    frames = smooth_frames(31, 3)[..., 0]
    T = 30
    st.extend({"obs": frames[:-1], "next_obs": frames[1:], "action": np.arange(T) % 4,
               "reward": np.ones(T, np.float32), "terminated": np.eye(T, dtype=bool)[-1],
               "truncated": np.zeros(T, bool), "task_index": np.arange(T) // 20,
               "next_task_index": np.arange(1, T + 1) // 20})
    st.close()
    export_lerobot(tmp_path / "a.zarr", tmp_path / "out", video=True, fps=10)
    ds = LeRobotDataset("local/out", root=tmp_path / "out")
    assert [ds[i]["task"] for i in (0, 25)] == ["task 0", "task 1"]
    theirs = np.stack([as_hwc_uint8(ds[i]["observation.image"])[..., 0] for i in range(T)])
    import_lerobot(tmp_path / "out", tmp_path / "b.zarr")
    b = es.open(tmp_path / "b.zarr")
    lr = lane_rows(b, 0)
    ours = b.read("obs", lr.rows[:T], lr.steps[:T])
    assert ours.shape == (T, H, W) and b.spec.fields["obs"].stack == 4
    assert np.abs(ours.astype(int) - frames[:T]).mean() < 6
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 2

"""RLDS against TensorFlow Datasets itself (marker ``interop``; run in the venv that
``bash scripts/test.sh -m interop`` makes, with tensorflow-cpu and tensorflow-datasets):
a dataset TFDS's writer made, imported and compared value by value with what TFDS's
``as_dataset`` yields; our exports read back by ``tfds.builder_from_directory`` step by
step."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
from expstore.datasets import export_rlds, import_rlds

pytestmark = pytest.mark.interop
tfds = pytest.importorskip("tensorflow_datasets")

from _rlds_builder import write_tiny  # noqa: E402
from test_datasets_rlds import _episodes_of as _store_episodes  # noqa: E402
from test_datasets_rlds import _store  # noqa: E402


def _tfds_episodes(directory: str, split: str) -> list[dict]:
    """Every episode as TFDS yields it: ``{"steps": [step dict, ...], ...}``."""
    ds = tfds.builder_from_directory(directory).as_dataset(split=split)
    out = []
    for ep in tfds.as_numpy(ds):
        ep = dict(ep)
        ep["steps"] = list(ep["steps"])  # a nested dataset, iterated as numpy
        out.append(ep)
    return out


def _flat(step: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in step.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = np.asarray(v)
    return out


def _same_jpeg(ours: np.ndarray, tf_decoded: np.ndarray) -> None:
    """JPEG pixels: Pillow decodes with libjpeg's accurate integer DCT, TensorFlow with its
    fast one (``dct_method=""``): a few levels apart, never more (docs/datasets.md)."""
    assert ours.shape == tf_decoded.shape and ours.dtype == tf_decoded.dtype
    diff = np.abs(ours.astype(int) - tf_decoded.astype(int))
    assert diff.max() <= JPEG_LEVELS, diff.max()


#: most a pixel of a JPEG image differs between Pillow's and TensorFlow's decoders
JPEG_LEVELS = 8


@pytest.mark.parametrize("split", ["train", "test"])
def test_tfds_written_dataset_imports_as_tfds_reads_it(tmp_path, split):
    directory = write_tiny(str(tmp_path / "data"))
    import_rlds(directory, tmp_path / "s.zarr", split=split, workers=1)
    ours = _store_episodes(es.open(tmp_path / "s.zarr"))
    theirs = _tfds_episodes(directory, split)
    key = {int(e["episode_metadata"]["id"]): e for e in theirs}
    assert len(ours) == len(theirs) > 0
    for g in ours:
        ep = key[int(g["episode_metadata.id"][0])]
        steps = [_flat(s) for s in ep["steps"]]
        n = len(steps)
        assert len(g["obs.image"]) == n
        for rlds_key, field in (("observation/image", "obs.image"),
                                ("observation/state/joint", "obs.state.joint"),
                                ("observation/state/grip", "obs.state.grip"),
                                ("discount", "discount"), ("u8", "u8")):
            want = np.stack([s[rlds_key] for s in steps])
            np.testing.assert_array_equal(g[field], want, err_msg=field)
        _same_jpeg(g["jpg"], np.stack([s["jpg"] for s in steps]))
        for rlds_key in ("action", "reward"):
            want = np.stack([s[rlds_key] for s in steps[:-1]])
            np.testing.assert_array_equal(g[rlds_key][:-1], want, err_msg=rlds_key)
        assert bool(g["terminated"][n - 2]) == bool(steps[-1]["is_terminal"])
        assert bool(g["truncated"][n - 2]) == (not steps[-1]["is_terminal"])


def test_our_export_reads_back_in_tfds_step_for_step(tmp_path):
    store = _store(tmp_path / "a.zarr", episodes=4)
    export_rlds(tmp_path / "a.zarr", tmp_path / "ds", name="mine", shard_bytes=20_000)
    theirs = _tfds_episodes(str(tmp_path / "ds"), "train")
    ours = _store_episodes(store)
    assert len(theirs) == len(ours) == 8
    for g, ep in zip(ours, theirs):  # our shards keep the store's episode order
        steps = [_flat(s) for s in ep["steps"]]
        T = len(steps) - 1
        assert len(g["action"]) == T + 1
        for rlds_key, field in (("observation/image", "obs.image"),
                                ("observation/state", "obs.state"), ("discount", "discount"),
                                ("logp", "logp"), ("mask", "mask")):
            want = np.stack([s[rlds_key] for s in steps])
            assert want.dtype == g[field].dtype, field
            np.testing.assert_array_equal(g[field], want, err_msg=field)
        np.testing.assert_array_equal(g["action"][:T], [s["action"] for s in steps[:T]])
        np.testing.assert_array_equal(g["reward"][:T], [s["reward"] for s in steps[:T]])
        assert [bool(s["is_first"]) for s in steps] == [True] + [False] * T
        assert [bool(s["is_last"]) for s in steps] == [False] * T + [True]
        assert bool(steps[-1]["is_terminal"]) == bool(g["terminated"][T - 1])
        assert not any(bool(s["is_terminal"]) for s in steps[:-1])


def test_tfds_reads_our_export_of_a_tfds_dataset_as_the_original(tmp_path):
    """TFDS dataset -> store -> RLDS: TFDS yields the same steps from both directories
    (the original's JPEG pixels as decoded, now PNG; the last step's action and reward
    zero, as the store keeps none)."""
    directory = write_tiny(str(tmp_path / "data"))
    import_rlds(directory, tmp_path / "s.zarr", split="train", workers=1)
    export_rlds(tmp_path / "s.zarr", tmp_path / "ds", name="tiny")
    a = {int(e["episode_metadata"]["id"]): e for e in _tfds_episodes(directory, "train")}
    b = {int(e["episode_metadata"]["id"]): e for e in _tfds_episodes(str(tmp_path / "ds"),
                                                                      "train")}
    assert set(a) == set(b)
    for i in a:
        sa = [_flat(s) for s in a[i]["steps"]]
        sb = [_flat(s) for s in b[i]["steps"]]
        assert len(sa) == len(sb)
        for k in sb[0]:
            for t, (x, y) in enumerate(zip(sa, sb)):
                if k in ("action", "reward") and t == len(sa) - 1:
                    np.testing.assert_array_equal(y[k], 0)
                elif k == "jpg":
                    _same_jpeg(y[k][None], x[k][None])
                else:
                    np.testing.assert_array_equal(x[k], y[k], err_msg=f"{k} step {t}")
        assert "language_instruction" not in sb[0]  # text: dropped on import

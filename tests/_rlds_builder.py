"""A tiny RLDS dataset written by TFDS's own writer (``GeneratorBasedBuilder``), and the
values it holds (recomputed without TensorFlow, for tests/data/rlds_tiny).

Regenerate the fixture (needs tensorflow-datasets):
``python tests/_rlds_builder.py tests/data/rlds_tiny``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

#: episodes per split; episode e has 3 + e steps, terminal when e is even
SPLITS = {"train": 3, "test": 1}


def episode(e: int, rng: np.random.Generator) -> dict[str, Any]:
    """Episode ``e`` as TFDS's builder is given it (draws from ``rng`` in a fixed order)."""
    T = 3 + e
    steps = []
    for t in range(T):
        steps.append({
            "observation": {"image": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
                            "state": {"joint": rng.random(3).astype(np.float32),
                                      "grip": float(t)}},
            "action": rng.random(2).astype(np.float32), "reward": float(t), "discount": 1.0,
            "is_first": t == 0, "is_last": t == T - 1,
            "is_terminal": t == T - 1 and e % 2 == 0, "language_instruction": "pick",
            "jpg": rng.integers(0, 255, (4, 4, 1), dtype=np.uint8),
            "u8": np.full((2, 2), t, np.uint8)})
    return {"steps": steps, "episode_metadata": {"file_path": f"/x/{e}", "id": e}}


def episodes(split: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [episode(e, rng) for e in range(SPLITS[split])]


def write_tiny(data_dir: str) -> str:
    """Write the dataset with TFDS under ``data_dir``; returns its version directory."""
    import tensorflow_datasets as tfds

    class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self) -> Any:
            F = tfds.features
            return tfds.core.DatasetInfo(builder=self, features=F.FeaturesDict({
                "steps": F.Dataset({
                    "observation": {"image": F.Image(shape=(8, 8, 3), encoding_format="png"),
                                    "state": {"joint": F.Tensor(shape=(3,), dtype=np.float32),
                                              "grip": F.Scalar(dtype=np.float64)}},
                    "action": F.Tensor(shape=(2,), dtype=np.float32),
                    "reward": F.Scalar(dtype=np.float32),
                    "discount": F.Scalar(dtype=np.float32),
                    "is_first": F.Scalar(dtype=np.bool_), "is_last": F.Scalar(dtype=np.bool_),
                    "is_terminal": F.Scalar(dtype=np.bool_),
                    "language_instruction": F.Text(),
                    "jpg": F.Image(shape=(4, 4, 1), encoding_format="jpeg"),
                    "u8": F.Tensor(shape=(2, 2), dtype=np.uint8)}),
                "episode_metadata": {"file_path": F.Text(), "id": F.Scalar(dtype=np.int64)}}))

        def _split_generators(self, dl_manager: Any) -> Any:
            return {s: self._generate_examples(s) for s in SPLITS}

        def _generate_examples(self, split: str) -> Any:
            for e, ep in enumerate(episodes(split)):
                yield f"ep{e}", ep

    b = Tiny(data_dir=data_dir)
    b.download_and_prepare()
    return str(b.data_dir)


if __name__ == "__main__":
    print(write_tiny(sys.argv[1]))

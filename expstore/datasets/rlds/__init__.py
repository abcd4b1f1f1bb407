"""RLDS datasets (TFDS directories of episodes of steps, e.g. Open X-Embodiment) <->
expstore stores, without TensorFlow: :func:`import_rlds`, :func:`export_rlds`.

A TFDS directory holds ``dataset_info.json`` (splits, shard counts), ``features.json``
(:mod:`.features`) and TFRecord shards ``<name>-<split>.tfrecord-000NN-of-000MM``
(:mod:`.records`: the framing with its CRCs, the Example messages). An RLDS episode is one
Example whose step features are ``steps/<path>`` lists.

Mapping (the table in docs/datasets.md): an episode of ``n`` steps is ``n - 1``
transitions and a final row holding the last step's observation; ``steps/observation``
(nested dicts flattened to ``obs.<a>.<b>``), ``steps/action``, ``steps/reward`` are the
store's fields, ``is_terminal`` on the last step is *terminated*, ``is_last`` without it
*truncated*; other numeric step features (``discount``, ...) are user fields named by
their path, numeric episode features ``episode_metadata.<key>`` fields on every row of
the episode. Strings (``Text``) and variable-shape features are dropped, and the last
step's action and reward (the final row holds none). Images are decoded once into the
store; export PNG-encodes them (lossless). Store -> RLDS -> store is exact.
"""

from .export import export_rlds
from .importer import import_rlds

__all__ = ["export_rlds", "import_rlds"]

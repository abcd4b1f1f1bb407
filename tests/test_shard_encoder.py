"""``shard.encoder``: the writer's fast encode path gives exactly the codec's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from expstore.storage.format.shard import Checked, encoder, make_codec  # internals: the shard codec

CONFIGS = [{"name": "blosc", "cname": "lz4hc", "clevel": 5},
           {"name": "blosc", "cname": "lz4", "clevel": 1},
           {"name": "blosc", "cname": "zstd", "clevel": 3},
           {"name": "zstd", "level": 1},
           {"name": "none"}]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("dtype,shape", [(np.uint8, (1, 84, 84)), (np.float32, (1024,)),
                                         (np.int64, (1024,))])
def test_encoder_bytes_equal_the_codec(cfg, checksum, dtype, shape):
    rng = np.random.default_rng(0)
    arr = (rng.integers(0, 4, shape) * 50).astype(dtype)  # compressible
    codec = make_codec(cfg, np.dtype(dtype).itemsize)
    if checksum:
        codec = Checked(codec)
    enc = encoder(codec)
    blob = enc(np.ascontiguousarray(arr))
    assert bytes(blob) == bytes(codec.encode(arr))
    out = np.empty_like(arr)
    codec.decode(blob, out=out)
    np.testing.assert_array_equal(out, arr)

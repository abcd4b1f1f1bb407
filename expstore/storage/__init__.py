"""Storage: where bytes live, and what they mean. Knows rows as numbered slots with a step
id and nothing of sampling or of what priorities mean. Its rooms, bottom first, each
entered through its own face (``tests/test_architecture.py``, ``STORAGE_ROOMS``):

- ``faults``: named crash points a test can arm (a leaf every room may call);
- ``native``: the C kernels (batch reads, per-step writes) and their loaders;
- ``backends``: where bytes live (local disk, memory, fsspec, S3, GCS, Azure) by URL
  scheme, and the local shard cache in front of remote ones;
- ``format``: what the bytes are (zarr layout and metadata, shards, lane states, the
  quarantine, the import marker, saved priorities);
- ``ownership``: who may write a lane (leases, fences);
- ``write``: the append path (lane writers, background threads, shared-memory staging);
- ``read``: the read path (the shard reader and its caches, rows staged by other writers).

This face names the backend plug-in API only; everything else comes from its room.
"""

from .backends import Backend, backend_for, known_backends, register_backend

__all__ = ["Backend", "backend_for", "known_backends", "register_backend"]

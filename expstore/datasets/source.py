"""Where dataset files are read from (Dopamine checkpoints, RLDS shards): a local folder or
any fsspec URL.

:class:`SourceFolder` lists a folder once and opens its files for sequential reading:
local paths with plain ``open``, ``s3://``, ``gs://``, ``https://`` ... through fsspec with
a read-ahead buffer of :data:`READ_AHEAD` bytes per open file, so a file streams
from the bucket without a local copy. It pickles as its URL and options, so import worker
processes can reopen it.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

#: bytes fetched per request from remote storage (Dopamine's gzip'd frames inflate ~100x:
#: one request feeds ~200 MB of frames; each open file holds about two of these)
READ_AHEAD = 2 << 20


class SourceFolder:
    """A folder of files at a local path or an fsspec URL (``storage_options`` for fsspec)."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        from fsspec.core import split_protocol

        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        protocol, rest = split_protocol(self.url)
        self.remote = protocol not in (None, "file", "local")
        self._names: list[str] | None = None
        if self.remote:
            import fsspec

            self.fs = fsspec.filesystem(protocol, **self.storage_options)
            self.root = self.fs._strip_protocol(self.url).rstrip("/")
        else:
            self.fs = None
            self.root = os.path.abspath(rest if protocol else self.url)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceFolder, (self.url, self.storage_options))

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        """The folder's last path component (for progress bars)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def is_dir(self) -> bool:
        if not self.remote:
            return os.path.isdir(self.root)
        try:
            return bool(self.names())
        except (FileNotFoundError, NotADirectoryError):
            return False

    def names(self) -> list[str]:
        """File names directly in the folder (listed once, then cached)."""
        if self._names is None:
            if self.remote:
                entries = self.fs.ls(self.root, detail=False)
                self._names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in entries)
            else:
                self._names = sorted(os.listdir(self.root))
        return self._names

    def exists(self, name: str) -> bool:
        return name in self.names()

    def location(self, name: str) -> str:
        """``name``'s full path or URL (for messages)."""
        if self.remote:
            return f"{self.url.rstrip('/')}/{name}"
        return os.path.join(self.root, name)

    def open(self, name: str, read_ahead: int = READ_AHEAD) -> BinaryIO:
        """``name`` opened for reading (``FileNotFoundError`` naming it when missing);
        remote files fetch ``read_ahead`` bytes per request."""
        try:
            if not self.remote:
                return open(os.path.join(self.root, name), "rb")  # noqa: SIM115
            path = f"{self.root}/{name}"
            try:
                return self.fs.open(path, "rb", block_size=read_ahead, cache_type="readahead")
            except TypeError:  # a filesystem without these options
                return self.fs.open(path, "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.location(name)}: file not found") from None

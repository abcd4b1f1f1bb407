"""Camera frames of a LeRobot dataset: PNG/JPEG structs in parquet (:func:`decode_images`,
:func:`encode_png`) and MP4 streams (:class:`VideoReader`, :class:`VideoWriter`, PyAV)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ...errors import DatasetFormatError


def decode_images(values: list[Any], shape: tuple[int, ...], where: str) -> np.ndarray:
    """``{"bytes", "path"}`` structs (PNG, JPEG, ...) -> ``(n, *shape)`` uint8 (HWC)."""
    from PIL import Image

    out = np.empty((len(values), *shape), np.uint8)
    for i, v in enumerate(values):
        data = v.get("bytes") if isinstance(v, dict) else v
        if not data:
            raise DatasetFormatError(f"{where}: frame {i} holds no image bytes (path "
                                     f"{v.get('path') if isinstance(v, dict) else None!r})")
        with Image.open(io.BytesIO(data)) as im:
            a = np.asarray(im)
        if a.ndim == 2 and len(shape) == 3:  # grayscale PNG of an (H, W, 1) camera
            a = a[:, :, None]
        if a.shape != shape:
            raise DatasetFormatError(f"{where}: frame {i} decodes to {a.shape}, info.json "
                                     f"says {shape}")
        out[i] = a
    return out


def encode_png(frame: np.ndarray, level: int) -> bytes:
    """One HWC (or HW) uint8 frame as PNG (``level``: zlib 0..9)."""
    from PIL import Image

    a = frame[:, :, 0] if frame.ndim == 3 and frame.shape[2] == 1 else frame
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG", compress_level=int(level))
    return buf.getvalue()


class VideoReader:
    """Frames of one MP4 file by time, read forward (episodes follow each other in a file,
    so an import decodes each file once); a time behind the decoder reopens the file."""

    def __init__(self, opener: Any, where: str, tolerance_s: float) -> None:
        self.opener = opener
        self.where = where
        self.tol = tolerance_s
        self._container: Any = None
        self._frames: Any = None
        self._cur: Any = None  # (time, array) of the frame the decoder is at
        self.bytes = 0

    def _open(self) -> None:
        import av

        self.close()
        self._file = self.opener()
        self._container = av.open(self._file)
        stream = self._container.streams.video[0]
        stream.thread_type = "AUTO"
        self._frames = self._container.decode(stream)
        self._cur = None

    def _next(self) -> bool:
        try:
            f = next(self._frames)
        except StopIteration:
            self._cur = None
            return False
        self._cur = (float(f.time), f.to_ndarray(format="rgb24"))
        return True

    def frame(self, t: float) -> np.ndarray:
        """The frame at ``t`` s (within ``tolerance_s``), HWC uint8 RGB."""
        if self._container is None or (self._cur is not None and self._cur[0] > t + self.tol):
            self._open()
        while self._cur is None or self._cur[0] < t - self.tol:
            if not self._next():
                raise DatasetFormatError(f"{self.where}: no frame at {t:.6f} s (the video "
                                         "ends before it)")
        if abs(self._cur[0] - t) > self.tol:
            raise DatasetFormatError(f"{self.where}: no frame within {self.tol} s of {t:.6f} s "
                                     f"(nearest: {self._cur[0]:.6f} s)")
        return self._cur[1]

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._file.close()
            self._container = None


class VideoWriter:
    """One MP4 stream of HWC uint8 frames at ``fps`` (PyAV): frame ``i`` at ``i / fps`` s."""

    def __init__(self, path: str, fps: float, shape: tuple[int, ...], codec: str, crf: int,
                 gop: int, pix_fmt: str = "yuv420p") -> None:
        from fractions import Fraction

        import av

        self.path = path
        self.frames = 0
        self.bytes = 0  # encoded bytes so far
        self._container = av.open(path, "w")
        rate = Fraction(fps).limit_denominator(1000)
        options = {"crf": str(crf), "g": str(gop)}
        if codec == "libsvtav1":
            options["preset"] = "12"
        self._stream = self._container.add_stream(codec, rate=rate, options=options)
        self._stream.width, self._stream.height = int(shape[1]), int(shape[0])
        self._stream.pix_fmt = pix_fmt
        self._stream.time_base = Fraction(1, 1) / rate
        self.gray = len(shape) == 2 or shape[2] == 1

    def write(self, frames: np.ndarray) -> None:
        import av

        for a in frames:
            if self.gray:
                a = np.repeat(a.reshape(a.shape[0], a.shape[1], 1), 3, axis=2)
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="rgb24")
            vf.pts = self.frames
            self.frames += 1
            for packet in self._stream.encode(vf):
                self.bytes += packet.size
                self._container.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()

"""The import marker: ``_state/import.json``, what a dataset import into a store has done.

An importer writes it before the first row (``status: "partial"``), updates the per-lane
progress after each commit and sets ``status: "complete"`` at the end. A store whose
marker says ``"partial"`` was interrupted (killed, Ctrl-C, a lost connection): its rows are
intact but the dataset is not all there. ``expstore info`` and ``expstore verify`` say so,
and re-running the same import command resumes it. The marker is plain JSON::

    {"format": "dopamine", "source": "s3://.../replay_logs", "status": "partial",
     "options": {...}, "lanes": {"0": {"checkpoint": 0, "done": true, ...}, ...}}

``options`` holds what must match for a resume (the importer decides); ``lanes`` holds each
lane's progress (``done``, plus importer-specific fields).
"""

from __future__ import annotations

import json
from typing import Any

from ..backends import Backend

MARKER_KEY = "_state/import.json"


def read_import_marker(backend: Backend) -> dict[str, Any] | None:
    """The marker, or ``None`` when the store was not made by an import (or it is unreadable
    JSON: then ``{"status": "unreadable", ...}``, which never counts as complete)."""
    raw = backend.get(MARKER_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        return {"status": "unreadable", "error": f"{MARKER_KEY}: {e}", "lanes": {}}
    return doc


def write_import_marker(backend: Backend, doc: dict[str, Any]) -> None:
    """Replace the marker atomically."""
    backend.put(MARKER_KEY, json.dumps(doc, sort_keys=True, indent=1).encode())


def import_is_partial(doc: dict[str, Any] | None) -> bool:
    """``True`` when an import started and did not finish."""
    return doc is not None and doc.get("status") != "complete"


def describe_import(doc: dict[str, Any] | None) -> str | None:
    """One line about the import that made a store (``None``: none recorded)."""
    if doc is None:
        return None
    if doc.get("status") == "unreadable":
        return f"import marker unreadable ({doc.get('error')}); the import may be partial"
    lanes = doc.get("lanes") or {}
    done = sum(1 for v in lanes.values() if v.get("done"))
    what = f"{doc.get('format', '?')} import of {doc.get('source', '?')}"
    if doc.get("status") == "complete":
        return f"complete {what} ({done} lane(s))"
    return (f"PARTIAL {what}: {done} of {len(lanes)} lane(s) done; re-run the same import "
            "command to resume it")

"""Every python snippet in README.md runs, in order, in a fresh folder."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_snippets_run(tmp_path, monkeypatch, s3_url):
    monkeypatch.chdir(tmp_path)
    url, options = s3_url
    ns: dict = {"S3_URL": url, "S3_OPTIONS": options}
    blocks = snippets()
    assert len(blocks) >= 7
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"README.md snippet {i}", "exec"), ns)
        except Exception as e:
            raise AssertionError(f"README snippet {i} failed:\n{code}") from e
    assert (tmp_path / "runs" / "atari_d4rl.hdf5").exists()

"""A local Azure Blob Storage endpoint for tests and examples: azurite (npm).

:class:`Azurite` runs ``azurite-blob`` in memory on loopback, on a free port, with the
well-known development account (``devstoreaccount1``). The binary is looked up in
``$EXPSTORE_AZURITE``, then in the project's ``.cache/node`` (where ``scripts/test.sh``
installs it), then on ``PATH``; :func:`install_azurite` installs it there with npm.
azurite 3 honours ``If-None-Match: *`` and ``If-Match`` on Put Blob and Get Blob.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .server import ServerProcess

ACCOUNT = "devstoreaccount1"
#: azurite's published development key (not a secret)
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")
#: npm package spec :func:`install_azurite` installs
AZURITE_PACKAGE = "azurite@3"
_SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: project-local npm prefix (``scripts/test.sh`` installs azurite there): ``.cache/node`` of
#: the source checkout, or of the working folder for an installed package
NODE_PREFIX = (_SOURCE_ROOT if (_SOURCE_ROOT / "pyproject.toml").is_file() else Path.cwd()) \
    / ".cache" / "node"


def connection_string(endpoint: str) -> str:
    """Connection string of the development account at ``endpoint`` (``http://host:port``)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={endpoint}/{ACCOUNT};")


def azure_options(endpoint: str) -> dict[str, Any]:
    """``storage_options`` for adlfs against a local azurite."""
    return {"connection_string": connection_string(endpoint)}


def azurite_binary() -> str | None:
    """Path of ``azurite-blob``, or ``None`` when it is not installed."""
    env = os.environ.get("EXPSTORE_AZURITE")
    if env:
        return env if os.access(env, os.X_OK) else None
    local = NODE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
    if os.access(local, os.X_OK):
        return str(local)
    return shutil.which("azurite-blob")


def install_azurite(timeout: float = 300.0) -> str:
    """Install azurite into :data:`NODE_PREFIX` with npm (if missing); its binary's path.
    ``RuntimeError`` saying why when it cannot be installed."""
    found = azurite_binary()
    if found:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("azurite is not installed and npm is not on PATH "
                           f"(install node, then: npm install --prefix {NODE_PREFIX} "
                           f"{AZURITE_PACKAGE})")
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([npm, "install", "--prefix", str(NODE_PREFIX), "--no-audit",
                        "--no-fund", "--silent", AZURITE_PACKAGE],
                       capture_output=True, text=True, timeout=timeout)
    found = azurite_binary()
    if r.returncode != 0 or not found:
        raise RuntimeError(f"npm install {AZURITE_PACKAGE} failed (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-500:]}")
    return found


class Azurite(ServerProcess):
    """``azurite-blob`` in memory on ``host:port`` (a free port by default)."""

    name = "azurite"
    http_error_is_up = True  # it answers the unauthenticated probe with 403

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 binary: str | None = None) -> None:
        super().__init__(port, host)
        self.binary = binary

    @property
    def storage_options(self) -> dict[str, Any]:
        return azure_options(self.endpoint)

    def prepare(self) -> None:
        self.binary = self.binary or install_azurite()

    def command(self) -> list[str]:
        return [str(self.binary), "--blobHost", self.host, "--blobPort", str(self.port),
                "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry",
                "--silent"]

    def probe_url(self) -> str:
        return f"{self.endpoint}/{ACCOUNT}?comp=list"

    def create_container(self, name: str) -> str:
        """Create container ``name`` (3-63 lowercase letters, digits, dashes)."""
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(
                connection_string(self.endpoint)) as client:
            client.create_container(name)
        return name

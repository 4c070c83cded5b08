"""A real S3-speaking server on loopback for the artifact store's tests: moto's standalone
server (``python -m moto.server``, the dev extra's ``moto[server]``) in its own process.

MinIO would be the closer match to a deployment, but no PyPI package ships its binary;
moto's server speaks the same REST API (signed requests, multipart uploads, ListObjectsV2,
batch deletes), which is all the store uses.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.mlflow_server import free_port, stop_group

START_TIMEOUT_S = 60.0
# moto accepts any credentials; the store signs its requests with these like with real ones.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "rlaas-test",
    "AWS_SECRET_ACCESS_KEY": "rlaas-test-secret",
    "AWS_REGION": "us-east-1",
}


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Start a server, yield its endpoint (``http://127.0.0.1:<port>``), stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="rlaas-test-s3-")) / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto server exited: {log_path.read_text()[-2000:]}")
            try:
                httpx.get(f"{url}/moto-api/", timeout=2.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server not up in {START_TIMEOUT_S}s") from None
                time.sleep(0.2)
        yield url
    finally:
        stop_group(process)
        log.close()


def new_bucket(endpoint: str) -> str:
    """A fresh, empty bucket (moto takes an unsigned CreateBucket); its name."""
    name = f"rlaas-{uuid.uuid4().hex[:12]}"
    httpx.put(f"{endpoint}/{name}", timeout=10.0).raise_for_status()
    return name

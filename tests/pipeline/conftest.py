"""Fixtures of the pipeline tests: a real S3 endpoint over HTTP (moto's server)."""
from __future__ import annotations

import socket

import fsspec
import pytest

from raymt.pipeline.storage import storage_options


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on localhost; the AWS variables point s3fs (driver and Ray workers) at it."""
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    fs = fsspec.filesystem("s3", **storage_options("s3://"))
    if fs.exists("corpus-bucket"):  # moto keeps its state per process, across servers: start empty
        fs.rm("corpus-bucket", recursive=True)
    fs.invalidate_cache()
    if not fs.exists("corpus-bucket"):
        fs.mkdir("corpus-bucket")
    yield fs
    server.stop()

"""A real S3 HTTP API on 127.0.0.1 for the tests: moto's standalone server, started by the tests
themselves (no mock of boto3: every call goes over HTTP as it would to AWS, MinIO or Ceph).

The server keeps its buckets in this process, so one stopped and started again on the same port
(``S3Server.stop`` / ``start``) still holds them: the tests of an unreachable store use that."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import uuid
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from moto.server import ThreadedMotoServer

# Credentials of the standard AWS chain: the environment, as an operator would set them. The
# Mediator reads none of them from its own configuration.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "mediator-test",
    "AWS_SECRET_ACCESS_KEY": "mediator-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the server's line per request


class S3Server:
    """moto's server on 127.0.0.1 (a free port unless one is given)."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: ThreadedMotoServer | None = None

    def start(self) -> S3Server:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def use_test_credentials() -> None:
    """Put the test credentials into this process's environment (the AWS chain's first link)."""
    for k, v in AWS_ENV.items():
        os.environ.setdefault(k, v)


@functools.cache
def shared_server() -> S3Server:
    """One server for the whole test session, stopped when it ends."""
    use_test_credentials()
    server = S3Server().start()
    atexit.register(server.stop)
    return server


def s3_client(url: str) -> Any:
    use_test_credentials()
    config = BotoConfig(
        s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2
    )
    return boto3.session.Session().client("s3", endpoint_url=url, config=config)


def new_bucket(url: str) -> str:
    """A fresh, empty bucket on the server at ``url``."""
    name = f"mediator-{uuid.uuid4().hex[:20]}"
    s3_client(url).create_bucket(Bucket=name)
    return name


def bucket_keys(url: str, bucket: str) -> list[str]:
    keys: list[str] = []
    for page in s3_client(url).get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.extend(o["Key"] for o in page.get("Contents", ()))
    return keys

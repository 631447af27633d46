"""A real S3-compatible server for the tests: moto's, started on 127.0.0.1 in this process (its own thread), with the
environment a hydrali run needs to reach it (DALI's AWS SDK and boto3 read the same variables)."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import free_ports

ACCESS_KEY, SECRET_KEY = "hydrali-test", "hydrali-test-secret"  # moto takes any credentials


class S3Server:
    """`with S3Server() as s3:` a running server; `s3.env` the variables that point a run at it; `s3.upload(folder,
    bucket, prefix)` copies a folder's files into a bucket (created)."""

    def __enter__(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        (self.port,) = free_ports(1)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        # an IP address: the AWS SDK in DALI puts the bucket into the host name of any other endpoint
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",
            "AWS_EC2_METADATA_DISABLED": "true",  # no credential lookup on an instance metadata service
        }
        # no credentials anywhere: the variables empty, no shared files
        self.without_credentials = {
            "AWS_ACCESS_KEY_ID": "",
            "AWS_SECRET_ACCESS_KEY": "",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent",
        }
        return self

    def client(self):
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def upload(self, folder: Path, bucket: str, prefix: str) -> None:
        """Every file under `folder` into s3://bucket/prefix/<its relative path>."""
        client = self.client()
        client.create_bucket(Bucket=bucket)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")

    def __exit__(self, *exc) -> None:
        self.server.stop()

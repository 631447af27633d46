"""Data roots in object storage (`s3://bucket/prefix`) beside local folders.

DALI's readers read `s3://` URLs themselves, through the AWS SDK and its usual environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY (or a profile), AWS_REGION, and AWS_ENDPOINT_URL for an S3-compatible server (MinIO, Ceph, a
local test server). DALI reads that environment once per process and tells a missing bucket, a missing object and a
refused credential apart in no way, so hydrali reads its small files (a manifest) and checks that the shards exist
through boto3, with the same environment, before a pipeline is built: a mistake is one line naming what to fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from hydrali.core.errors import HydraliError
from hydrali.core.files import write_atomically

S3 = "s3://"
CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"


def is_remote(location: str) -> bool:
    """Whether `location` names an object in S3-compatible storage rather than a local path."""
    return str(location).startswith(S3)


def join(root: str, *parts: str) -> str:
    """`root` / parts: a URL joined with '/', a local path as the operating system joins it."""
    if is_remote(root):
        return "/".join([str(root).rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(root, *parts))


def _bucket_and_key(url: str) -> tuple[str, str]:
    bucket, _, key = url[len(S3) :].partition("/")
    return bucket, key


def _client():
    """boto3's S3 client as the environment configures it (AWS_ENDPOINT_URL, AWS_REGION, credentials), as DALI's."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.client("s3")
    except (BotoCoreError, ValueError) as err:  # an unknown AWS_PROFILE, a malformed AWS_ENDPOINT_URL, ...
        raise HydraliError(
            f"object storage is not configured as boto3 and DALI read it ({err}): check AWS_ENDPOINT_URL (a URL such "
            f"as http://10.0.0.5:9000), AWS_PROFILE and AWS_REGION"
        ) from err


def _explain(err: Exception, url: str) -> HydraliError:
    """One line for what boto3 raised while reading `url`."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    bucket, key = _bucket_and_key(url)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "AWS")
    if isinstance(err, NoCredentialsError):
        return HydraliError(f"{url}: no credentials for object storage: set {CREDENTIALS}")
    if isinstance(err, EndpointConnectionError):
        return HydraliError(f"{url}: cannot reach {endpoint}: check AWS_ENDPOINT_URL and the network")
    if isinstance(err, ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket" or (code == "404" and err.operation_name == "HeadBucket"):
            return HydraliError(f"{url}: the bucket {bucket} does not exist at {endpoint}: check data.root")
        if code in ("404", "NoSuchKey", "NotFound"):
            return HydraliError(f"{url}: no such object in bucket {bucket} at {endpoint}: check data.root")
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"):
            return HydraliError(
                f"{url}: access refused by {endpoint} ({code}): check {CREDENTIALS} and the bucket's permissions"
            )
        return HydraliError(f"{url}: {endpoint} answered {code or err}")
    return HydraliError(f"{url}: {err}")


def _error_for(client, err: Exception, url: str) -> HydraliError:
    """One line for what boto3 raised while reading `url`; a 404 tells a missing bucket from a missing object."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(err, ClientError) and str(err.response.get("Error", {}).get("Code", "")) in ("404", "NotFound"):
        bucket, _ = _bucket_and_key(url)
        try:
            client.head_bucket(Bucket=bucket)
        except (BotoCoreError, ClientError) as other:
            return _explain(other, url)
    return _explain(err, url)


def read_bytes(location: str) -> bytes:
    """The contents of a local file or an S3 object; a missing one, or storage that refuses, is one line."""
    if not is_remote(location):
        return Path(location).read_bytes()
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_and_key(location)
    client = _client()
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (BotoCoreError, ClientError) as err:
        raise _error_for(client, err, location) from err


def check_readable(locations: list[str]) -> None:
    """Fail in one line, naming it, at the first of `locations` (local paths or S3 URLs) that cannot be read."""
    for loc in locations:
        if not is_remote(loc) and not Path(loc).is_file():
            raise HydraliError(f"{loc} is missing: the shards and their index files must stay beside manifest.json")
    remote = [loc for loc in locations if is_remote(loc)]
    if not remote:
        return
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client()
    folders: dict[tuple[str, str], list[str]] = {}  # (bucket, folder prefix) -> the URLs expected in it
    for loc in remote:
        bucket, key = _bucket_and_key(loc)
        folders.setdefault((bucket, key.rpartition("/")[0] + "/"), []).append(loc)
    for (bucket, prefix), expected in folders.items():  # one listing per folder, not a request per file
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            listed = {f"{S3}{bucket}/{item['Key']}" for page in pages for item in page.get("Contents", ())}
        except (BotoCoreError, ClientError) as err:
            raise _error_for(client, err, expected[0]) from err
        missing = [loc for loc in expected if loc not in listed]
        if missing:
            raise HydraliError(
                f"{missing[0]} is missing (and {len(missing) - 1} more): the shards and their index files must stay "
                f"beside manifest.json"
            )


def write_local_copy(location: str, path: Path) -> Path:
    """The object (or file) at `location` copied to the local `path`, atomically: another process of the job
    reading `path` meanwhile finds the previous copy or this one, whole, never a file being written."""
    return write_atomically(path, read_bytes(location))

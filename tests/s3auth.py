"""An S3-protocol server that checks credentials and IAM policies, and what AWS requires of each request.

AWS authorizes each S3 request by an IAM action that is not always the name of the API operation: HeadObject
needs ``s3:GetObject``, ListObjects(V2) and HeadBucket need ``s3:ListBucket``, the multipart upload steps need
``s3:PutObject`` (the S3 API Reference, "Permissions" of each operation; the Service Authorization Reference
defines no ``s3:HeadObject`` or ``s3:ListObjectsV2`` action). :data:`IAM_ACTION` is that table.

moto 5.2.5 checks those actions. moto 5.2.6 checks the operation's own name instead (its request routing now
names the action by the botocore operation, undoing getmoto/moto#8334 for HeadObject and doing the same to
listing), so a policy that works on AWS is refused there: a reader with ``s3:GetObject`` + ``s3:ListBucket``
cannot HEAD or list. The users made here get the policy AWS needs; on a server found (by a probe, not by its
version) to check operation names, each user also gets the names of the operations its actions cover on AWS,
and :attr:`AuthS3.checks_operation_names` says so. What AWS needs of the read and write paths is pinned
independently of the server by mapping each logged request through :data:`IAM_ACTION`
(``tests/test_object_lake.py``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

#: the IAM action AWS checks for each S3 operation a lake's read and write paths make
IAM_ACTION = {
    "GetObject": "s3:GetObject", "HeadObject": "s3:GetObject",
    "ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket", "HeadBucket": "s3:ListBucket",
    "PutObject": "s3:PutObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject", "DeleteObjects": "s3:DeleteObject",
}

#: the policies the README documents: what a lake's readers and writers need
READER_ACTIONS = ("s3:GetObject", "s3:ListBucket")
WRITER_ACTIONS = (*READER_ACTIONS, "s3:PutObject", "s3:DeleteObject")
USERS = {"admin": ("s3:*", "iam:PutUserPolicy"), "writer": WRITER_ACTIONS, "reader": READER_ACTIONS,
         "getter": ("s3:GetObject",)}

_LIST_PARAMS = {"list-type", "prefix", "delimiter", "encoding-type", "continuation-token", "start-after", "max-keys",
                "fetch-owner", "marker"}
_LOG_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/1\.[01]"\s+(?P<status>\d{3})')
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Request:
    """One request the server logged."""

    method: str
    target: str
    status: int

    @property
    def operation(self) -> str:
        """The S3 API operation, or ``"unknown METHOD target"`` for one the lake should not be making."""
        return s3_operation(self.method, self.target)


def s3_operation(method: str, target: str) -> str:
    """The S3 API operation of a path-style request (``/bucket[/key][?query]``)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    bucket, _, key = parts.path.lstrip("/").partition("/")
    unknown = f"unknown {method} {target}"
    if not bucket:
        return unknown
    if not key:
        if method == "HEAD" and not query:
            return "HeadBucket"
        if method == "GET" and set(query) <= _LIST_PARAMS:
            return "ListObjectsV2" if query.get("list-type") == ["2"] else "ListObjects"
        return "DeleteObjects" if method == "POST" and set(query) == {"delete"} else unknown
    ops = {("HEAD", frozenset()): "HeadObject", ("GET", frozenset()): "GetObject",
           ("PUT", frozenset()): "PutObject", ("DELETE", frozenset()): "DeleteObject",
           ("POST", frozenset({"uploads"})): "CreateMultipartUpload",
           ("PUT", frozenset({"partNumber", "uploadId"})): "UploadPart",
           ("POST", frozenset({"uploadId"})): "CompleteMultipartUpload",
           ("DELETE", frozenset({"uploadId"})): "AbortMultipartUpload"}
    return ops.get((method, frozenset(query)), unknown)


def lake_policy(bucket: str, prefix: str, actions: Sequence[str]) -> dict[str, object]:
    """An IAM policy granting ``actions`` on a lake: ``s3:ListBucket`` on its bucket, the rest on its objects."""
    on_bucket = [a for a in actions if a == "s3:ListBucket"]
    on_objects = [a for a in actions if a != "s3:ListBucket"]
    statements = [{"Effect": "Allow", "Action": on_bucket, "Resource": f"arn:aws:s3:::{bucket}"},
                  {"Effect": "Allow", "Action": on_objects, "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*"}]
    return {"Version": "2012-10-17", "Statement": [st for st in statements if st["Action"]]}


def operation_names(actions: Sequence[str]) -> list[str]:
    """``s3:<Operation>`` for every operation whose IAM action is among ``actions`` (for servers that check names)."""
    return sorted(f"s3:{op}" for op, action in IAM_ACTION.items()
                  if action in actions and f"s3:{op}" not in actions)


@dataclass(frozen=True)
class AuthS3:
    """A moto server that checks credentials and IAM policies (``INITIAL_NO_AUTH_ACTION_COUNT``)."""

    endpoint: str
    bucket: str
    keys: dict[str, tuple[str, str]]  # user -> (access key id, secret), policies in USERS
    log: Path  # the server's request log (werkzeug's access lines)
    checks_operation_names: bool  # the server checks s3:<Operation>, not AWS's IAM action (moto 5.2.6)

    def options(self, user: str) -> dict[str, str]:
        key, secret = self.keys[user]
        return {"endpoint_url": self.endpoint, "key": key, "secret": secret, "region": "us-east-1"}

    def env(self, user: str, tmp: Path) -> dict[str, str]:
        """The variables of a ``cubelake`` command run as ``user``, with its cache and staging under ``tmp``."""
        key, secret = self.keys[user]
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "CUBELAKE_CACHE": str(tmp / "cache"),
                "CUBELAKE_STAGING": str(tmp / "staging")}

    def mark(self) -> int:
        """A place in the request log: :meth:`requests_since` it gives what came after."""
        return self.log.stat().st_size

    def requests_since(self, mark: int) -> list[Request]:
        text = _COLOUR.sub("", self.log.read_bytes()[mark:].decode("utf-8", "replace"))
        return [Request(m["method"], m["target"], int(m["status"])) for m in _LOG_LINE.finditer(text)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)


def _policy(actions: Sequence[str]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": list(actions),
                                                               "Resource": "*"}]})


def _make_users(endpoint: str) -> dict[str, tuple[str, str]]:
    """The users of :data:`USERS` with their policies (made before authentication starts: 3 calls a user)."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                       region_name="us-east-1")
    keys = {}
    for user, actions in USERS.items():
        iam.create_user(UserName=user)
        k = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
        iam.put_user_policy(UserName=user, PolicyName="aws", PolicyDocument=_policy(actions))
    return keys


def _checks_operation_names(endpoint: str, bucket: str, keys: dict[str, tuple[str, str]]) -> bool:
    """Whether a HEAD by the reader (``s3:GetObject``, as on AWS) is refused: the server checks ``s3:HeadObject``."""
    import boto3
    from botocore.exceptions import ClientError

    def s3(user: str):  # type: ignore[no-untyped-def]
        return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=keys[user][0],
                            aws_secret_access_key=keys[user][1], region_name="us-east-1")

    s3("admin").put_object(Bucket=bucket, Key="probe/head", Body=b"x")
    try:
        s3("reader").head_object(Bucket=bucket, Key="probe/head")
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] != 403:
            raise
        return True
    finally:
        s3("admin").delete_object(Bucket=bucket, Key="probe/head")
    return False


def _grant_operation_names(endpoint: str, keys: dict[str, tuple[str, str]]) -> None:
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id=keys["admin"][0],
                       aws_secret_access_key=keys["admin"][1], region_name="us-east-1")
    for user, actions in USERS.items():
        if names := operation_names(actions):
            iam.put_user_policy(UserName=user, PolicyName="operation-names", PolicyDocument=_policy(names))


def serve(log_dir: Path, bucket: str = "authed") -> Iterator[AuthS3]:
    """moto's server in its own process with authentication on, its users made and ``bucket`` created."""
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = log_dir / "requests.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(3 * len(USERS))}
    with log.open("wb") as sink:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        _wait_for(port)
        keys = _make_users(endpoint)
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=keys["admin"][0],
                     aws_secret_access_key=keys["admin"][1], region_name="us-east-1").create_bucket(Bucket=bucket)
        by_name = _checks_operation_names(endpoint, bucket, keys)
        if by_name:
            _grant_operation_names(endpoint, keys)
        yield AuthS3(endpoint, bucket, keys, log, by_name)
    finally:
        server.terminate()
        server.wait(10)

"""Where a job folder lives: a local directory or ``s3://bucket/prefix/<job>``, one interface.

The hook writes through ``Store.put``; the trial API reads through ``get``/``get_range``.
boto3 is imported and its client created lazily, on first use, in whichever thread uses
it first (the hook's uploader thread), so ``import trainguard`` never imports boto3 and a
local job never needs it. ``AWS_ENDPOINT_URL`` is honoured by boto3 itself (the local mode
sets it to its moto server).
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

#: bounded network waits: a slow or dead S3 must fail fast so data spills instead of piling up
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 30.0


class StoreError(OSError):
    """Reading or writing the job folder failed (the message names the key and the cause)."""


class ObjectNotFound(StoreError, KeyError):
    """No object at that key."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")`` (no trailing slash)."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}; expected s3://bucket/prefix/<job>")
    return bucket, prefix.strip("/")


class Store(ABC):
    """A job folder. Keys are relative to it (``steps/000000000001/worker-00000.safetensors``)."""

    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]:
        """Bytes ``[start, end)`` of an object (fewer at its end) and the object's full size."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix``, sorted."""


class LocalStore(Store):
    """A local directory with the same layout as S3. Writes are atomic (temp file + rename)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"key {key!r} escapes the job folder")
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        # a name unique to this process and thread: no mkstemp (it costs more than the write)
        tmp = path.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{path.name}")
        try:
            handle = open(tmp, "wb")  # noqa: SIM115 - closed below, before the rename
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(tmp, "wb")  # noqa: SIM115
        try:
            with handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self.url}/{key}: no such object") from None

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]:
        path = self._path(key)
        try:
            with path.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(start)
                return handle.read(max(0, end - start)), size
        except FileNotFoundError:
            raise ObjectNotFound(f"{self.url}/{key}: no such object") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        keys = [
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        ]
        return sorted(keys)


class S3Store(Store):
    """``s3://bucket/prefix``: boto3 client made on first use (one per store, thread-safe)."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config

                    # one PUT per step: skip client-side work that buys nothing here
                    # (our own code builds every request; TLS already protects the body)
                    config = Config(
                        connect_timeout=S3_CONNECT_TIMEOUT_S,
                        read_timeout=S3_READ_TIMEOUT_S,
                        retries={"max_attempts": 2, "mode": "standard"},
                        parameter_validation=False,
                        request_checksum_calculation="when_required",
                    )
                    self._client = boto3.session.Session().client("s3", config=config)
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:
            raise StoreError(f"PUT {self.url}/{key} failed: {exc}") from exc

    def get(self, key: str) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(response["Body"].read())
        except Exception as exc:
            raise _read_error(self.url, key, exc) from exc

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]:
        if end <= start:
            return b"", self._size(key)
        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}"
            )
        except Exception as exc:
            if _error_code(exc) == "InvalidRange":
                return b"", self._size(key)
            raise _read_error(self.url, key, exc) from exc
        body = bytes(response["Body"].read())
        content_range = str(response.get("ContentRange", ""))
        size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(body)
        return body, size

    def _size(self, key: str) -> int:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as exc:
            raise _read_error(self.url, key, exc) from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            # Without s3:ListBucket (the training-job policy grants none, so that a job
            # cannot list other jobs' keys), S3 answers 403 for a key that does not exist.
            if _error_code(exc) in ("404", "NoSuchKey", "NotFound", "403", "AccessDenied", "Forbidden"):
                return False
            raise StoreError(f"HEAD {self.url}/{key} failed: {exc}") from exc

    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0
        keys: list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(item["Key"][strip:] for item in page.get("Contents", []))
        except Exception as exc:
            raise StoreError(f"LIST {self.url}/{prefix} failed: {exc}") from exc
        return sorted(keys)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


#: S3 error codes after which retrying the same request cannot succeed by itself
_PERMANENT_CODES = {
    "NoSuchBucket": "the bucket {bucket} does not exist",
    "AccessDenied": "access denied: these credentials may not write (s3:PutObject) to {url}",
    "403": "access denied: these credentials may not write (s3:PutObject) to {url}",
    "AllAccessDisabled": "all access to the bucket {bucket} is disabled",
    "InvalidAccessKeyId": "the AWS access key is not valid (InvalidAccessKeyId)",
    "SignatureDoesNotMatch": "the AWS secret key does not match the access key (SignatureDoesNotMatch)",
    "ExpiredToken": "the AWS credentials have expired (ExpiredToken)",
    "InvalidToken": "the AWS session token is not valid (InvalidToken)",
    "InvalidBucketName": "{bucket} is not a valid bucket name",
    "KMS.AccessDeniedException": "the bucket's KMS key may not be used by these credentials",
}


def describe_failure(url: str, exc: BaseException) -> tuple[bool, str]:
    """A failed write in plain words: (permanent, "cannot write to <url>: <why>").

    Permanent: retrying cannot help until someone fixes something (a missing bucket, no
    access, no or bad credentials, a read-only folder). Otherwise a transient failure
    (timeouts, throttling, a connection reset) that retries usually get past.
    """
    cause: BaseException = exc
    while cause.__cause__ is not None and not _error_code(cause):
        cause = cause.__cause__
    code = _error_code(cause)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if code in _PERMANENT_CODES:
        return True, f"cannot write to {url}: " + _PERMANENT_CODES[code].format(bucket=bucket, url=url)
    name = type(cause).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return True, f"cannot write to {url}: no AWS credentials were found ({name})"
    if name in ("EndpointConnectionError", "ConnectTimeoutError"):
        return False, f"cannot write to {url}: the S3 endpoint cannot be reached ({cause})"
    if isinstance(cause, PermissionError):
        return True, f"cannot write to {url}: permission denied ({cause})"
    if isinstance(cause, OSError) and cause.errno in (30, 28):  # EROFS, ENOSPC
        return True, f"cannot write to {url}: {cause.strerror or cause}"
    detail = str(exc)[:300]
    return False, f"cannot write to {url}: {detail}"


def _read_error(url: str, key: str, exc: Exception) -> StoreError:
    if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
        return ObjectNotFound(f"{url}/{key}: no such object")
    return StoreError(f"GET {url}/{key} failed: {exc}")


def open_store(out_dir: str | os.PathLike[str]) -> Store:
    """A store for ``out_dir``: ``s3://...`` or a local path."""
    text = os.fspath(out_dir)
    if text.startswith("s3://"):
        return S3Store(text)
    if "://" in text:
        raise ValueError(f"unsupported out_dir {text!r}: use s3://bucket/prefix/<job> or a local folder")
    return LocalStore(text)

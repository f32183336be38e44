"""The command line's error contract: what an expected failure says, and its exit code.

Every expected failure of a ``trainguard`` command is one line on stderr,
``trainguard <command>: <what is wrong and what to do>``, and exit code :data:`EXIT_USAGE`
(2). A traceback is printed only with ``--debug``. An unexpected exception (a bug) is one
line too, naming its type, with exit code :data:`EXIT_BUG` (1) and the hint to rerun with
``--debug``.

Commands raise :class:`CommandError` for what they check themselves (a missing folder, an
unsupported URL); :func:`explain` turns the exceptions of the libraries underneath (botocore's
credential, region, endpoint and service errors, file-system errors) into the same kind of
sentence, following ``__cause__`` so a wrapped error (a store's ``StoreError``) is explained
by its cause.
"""

from __future__ import annotations

import json
from typing import Any

from trainguard.text import validation_text

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130

CREDENTIALS_HINT = (
    "configure AWS credentials (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
)


class CommandError(Exception):
    """An expected failure; the message says what is wrong and what to do."""


def explain(exc: BaseException) -> str | None:
    """One sentence for an expected failure, or None when ``exc`` looks like a bug."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = _explain_one(current)
        if message is not None:
            return message
        current = current.__cause__
    return None


def _explain_one(exc: BaseException) -> str | None:
    if isinstance(exc, CommandError):
        return str(exc)
    aws = _explain_botocore(exc)
    if aws is not None:
        return aws
    if _is_validation_error(exc):  # a document read from a job or a file: its fields, no URLs
        return f"{getattr(exc, 'title', 'document')} is not valid: {validation_text(exc)}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file or folder"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or exc}: permission denied"
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename or exc}: is a folder, expected a file"
    if isinstance(exc, NotADirectoryError):
        return f"{exc.filename or exc}: is not a folder"
    from trainguard.format.layout import LayoutError
    from trainguard.hook.storage import ObjectNotFound, StoreError
    from trainguard.rules.plugins import PluginError

    if isinstance(exc, ObjectNotFound):
        return str(exc).strip("'\"")
    if isinstance(exc, PluginError | LayoutError):
        return str(exc)
    if isinstance(exc, StoreError) and exc.__cause__ is None:
        return str(exc)
    return None


def _is_validation_error(exc: BaseException) -> bool:
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a dependency of the package
        return False
    return isinstance(exc, ValidationError)


def _explain_botocore(exc: BaseException) -> str | None:
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover - boto3 is a dependency of the package
        return None
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return f"no usable AWS credentials ({exc}): {CREDENTIALS_HINT}, or use a local job folder"
    if isinstance(exc, bx.NoRegionError):
        return (
            "no AWS region configured: pass --region, or set AWS_DEFAULT_REGION (or region in ~/.aws/config)"
        )
    if isinstance(exc, bx.ProfileNotFound):
        return f"{exc}: check AWS_PROFILE and ~/.aws/config"
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError):
        url = exc.kwargs.get("endpoint_url", "the AWS endpoint")
        return (
            f"cannot reach {url}: check the network and the region"
            " (if AWS_ENDPOINT_URL is set: is the local trainguard it names still running?)"
        )
    if isinstance(exc, bx.ClientError):
        return _client_error(exc)
    return None


_CREDENTIAL_CODES = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidAccessKeyId",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "RequestExpired",
}
_DENIED_CODES = {"AccessDenied", "AccessDeniedException", "403", "Forbidden", "AllAccessDisabled"}


def _client_error(exc: Any) -> str:
    error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
    code = str(error.get("Code", "") or "")
    text = str(error.get("Message", "") or "").rstrip(".")
    operation = getattr(exc, "operation_name", "") or "the request"
    if code in _CREDENTIAL_CODES:
        return (
            f"AWS rejected the credentials in use ({code} on {operation}): refresh them or {CREDENTIALS_HINT}"
        )
    if code in _DENIED_CODES:
        return (
            f"access denied on {operation}: the credentials in use lack the permission "
            "(attach the stack's managed policy for reading jobs, see docs/deploy.md)"
        )
    if code == "NoSuchBucket":
        bucket = error.get("BucketName")
        named = f" {bucket}" if bucket else ""
        return f"the bucket{named} does not exist (in this account and region): check the s3:// URL"
    if code in ("ResourceNotFoundException", "ValidationError") and operation in (
        "DescribeTable",
        "GetItem",
        "Scan",
        "Query",
        "DescribeStacks",
    ):
        return f"{text or code} ({operation}): check the name (--table, --stack) and the region (--region)"
    return f"AWS {operation} failed: {code}: {text}" if text else f"AWS {operation} failed: {code}"

"""Where a local MME gets its tarballs: a folder or an S3 prefix. A target is a key under it, as SageMaker's
TargetModel is, and `TargetError` is how anything about a target turns into an HTTP answer."""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from tritonpack.errors import TritonpackError

MAX_TARGET_LENGTH = 1024  # SageMaker's limit on TargetModel
THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}
SOURCE_RETRY_S = 5.0


def default_code(status: int) -> str:
    """SageMaker's error code for a status the gateway chose (Triton's own answers keep ModelError)."""
    if status == 424:
        return "ModelError"
    return "ServiceUnavailable" if status >= 500 else "ValidationError"


class TargetError(TritonpackError):
    """The target cannot be served: the HTTP `status` and SageMaker error `code` to answer with, and
    `retry_after` (seconds) when the same call may succeed later."""

    def __init__(self, status: int, message: str, problems: list | None = None, code: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.problems = status, message, list(problems or [])
        self.code = code or default_code(status)
        self.retry_after = retry_after


def unreachable(location: str, error: Exception) -> TargetError:
    """The answer when the source did not say whether a target is there: 503 with Retry-After where it is throttled
    or failing (a 5xx), 502 otherwise (an endpoint down, a refusal)."""
    response = getattr(error, "response", None) or {}  # botocore's ClientError
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    reason = " ".join(str(error).split())  # one line
    if status >= 500 or response.get("Error", {}).get("Code") in THROTTLED:
        return TargetError(503, f"{location} did not answer for now: {reason}", retry_after=SOURCE_RETRY_S)
    return TargetError(502, f"could not fetch {location}: {reason}")


def validate_target(target: str | None) -> str:
    """A target is a relative key under the models prefix, as SageMaker's TargetModel is (UTF-8 text)."""
    if not target:
        raise TargetError(400, "missing X-Amzn-SageMaker-Target-Model header: a multi-model endpoint needs "
                               "the name of the tarball to invoke")
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:  # the HTTP server keeps undecodable header bytes as surrogates
        raise TargetError(400, f"target model {target!r} is not UTF-8 text") from None
    # SageMaker's pattern for TargetModel is \A\S[\p{Print}]*\z; an S3 key is not normalised, so "./a.tar.gz" or
    # "a//b.tar.gz" name no tarball there (here they would load a second copy of one)
    if len(target) > MAX_TARGET_LENGTH or target[0].isspace() or not target.isprintable() \
            or any(part in ("", ".", "..") for part in target.split("/")):
        raise TargetError(400, f"invalid target model {target!r}: expected a relative key such as "
                               f"'model.tar.gz' (no '.', '..' or empty path parts, no leading space, only printable "
                               f"characters, at most {MAX_TARGET_LENGTH} characters)")
    return target


def target_hash(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:32]


class LocalSource:
    """Tarballs in a folder; a target is a path relative to it. They are read where they lie, never copied."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        if self.root.is_file():
            raise FileNotFoundError(f"--models {root}: a file; --models takes the folder holding the tarballs "
                                    f"(--models {Path(root).parent}), each invoked by its name there")
        if not self.root.is_dir():
            raise FileNotFoundError(f"--models {root}: no such folder")

    def __str__(self) -> str:
        return str(self.root)

    def _path(self, target: str) -> Path:
        # `validate_target` refused absolute paths and '..'; links the owner put in the folder are followed.
        return self.root / validate_target(target)

    def version(self, target: str) -> str | None:
        """A string that changes when the tarball changes; None when there is no such tarball."""
        path = self._path(target)
        try:
            stat = path.stat()
        except OSError:
            return None
        return f"{stat.st_size}-{stat.st_mtime_ns}" if path.is_file() else None

    def fetch(self, target: str, staging: Path) -> Path:
        """The tarball as a local file: here, the file itself (`staging` is not used)."""
        return self._path(target)

    def location(self, target: str) -> str:
        return str(self.root / target)


class S3Source:
    """Tarballs under `s3://bucket/prefix/`, read with boto3 (`endpoint_url` for S3-compatible stores, moto)."""

    def __init__(self, url: str, endpoint_url: str | None = None, client=None):
        import boto3

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not url.startswith("s3://") or not bucket:
            raise ValueError(f"expected s3://bucket/prefix, got {url!r}")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, target: str) -> str:
        return f"{self.prefix}/{target}" if self.prefix else target

    def version(self, target: str) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(target))
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (403, 404):
                return None
            raise unreachable(self.location(target), e) from e
        except BotoCoreError as e:  # the endpoint down, a timeout, no credentials
            raise unreachable(self.location(target), e) from e
        return f"{head.get('ContentLength')}-{head.get('ETag', '').strip(chr(34))}"

    def fetch(self, target: str, staging: Path) -> Path:
        """Download the tarball into `staging` (the caller removes it), under its own name so that problems
        found in it name it."""
        dest = Path(staging) / PurePosixPath(target).name
        self.client.download_file(self.bucket, self.key(target), str(dest))
        return dest

    def location(self, target: str) -> str:
        return f"s3://{self.bucket}/{self.key(target)}"


def open_source(models: str, endpoint_url: str | None = None):
    return S3Source(models, endpoint_url) if str(models).startswith("s3://") else LocalSource(Path(models))



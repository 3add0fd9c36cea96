"""One error hierarchy. The command line prints a `UserError` as one line and exits 2; any other `TritonpackError`
(an operation that failed, such as a server that would not start) as one line naming its log, exit 1; anything
else is a bug and keeps its traceback; a full disk (`disk_full`) and a path that is not there or not the user's to
write (an OSError naming it) are limits of the environment, printed as one line too."""

from __future__ import annotations

import errno


class TritonpackError(Exception):
    """Base of every error tritonpack raises on purpose."""


class UserError(TritonpackError):
    """A mistake in what the user asked for, or a limit of their environment; the message says what to do."""


class SpecError(UserError):
    """A recipe, serving setting or spec that Triton would reject, caught before anything is written."""


class EnvError(UserError):
    """An environment that cannot be built or packed as asked."""


class ToolUnavailable(UserError):
    """A tool a step needs is missing here (TensorRT, a CUDA GPU, a native backend)."""


class PayloadError(UserError):
    """A request or response body that does not follow the KServe v2 protocol."""


class ServerError(TritonpackError):
    """tritonserver failed to start, answer or stop; the message names its log."""


def disk_full(e: BaseException) -> bool:
    """No space left where a file was being written (or no quota)."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)

"""TensorFlow imported without its C++ start-up notices, for the commands that print one line per step.

TensorFlow 2.21 logs through absl before absl is initialised, and such lines go to the process's stderr whatever
`TF_CPP_MIN_LOG_LEVEL` says ("All log messages before absl::InitializeLog() …", "oneDNN custom operations are on"),
twice per import. They say nothing about the user's model, so the import runs with file descriptor 2 captured and
only those notices are dropped: anything else it writes there is written back.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

_STARTUP_NOTICE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) |I\d{4} \d\d:\d\d:[\d.]+ ")


def import_tensorflow():
    if (tf := sys.modules.get("tensorflow")) is not None:
        return tf
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the notices logged after absl starts: CPU flags, devices
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        stderr = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not _STARTUP_NOTICE.match(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    return tf

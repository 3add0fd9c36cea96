"""How much failure the local MME absorbs before it refuses: a restart budget for tritonserver and a crash
ledger per target. Both are pure bookkeeping over a clock, so they are tested without a server."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tritonpack.mme.metrics import Metrics
from tritonpack.mme.sources import TargetError

log = logging.getLogger("tritonpack.mme")


@dataclass(frozen=True)
class FaultPolicy:
    """Bounds on failure. A target that kills its python stub or tritonserver `crashes_to_quarantine` times within
    `crash_window_s` is refused for `quarantine_s` (answered at once, other targets unaffected); tritonserver is
    restarted at most `restarts` times in a burst, and one more restart becomes available every `restart_refill_s`.
    A server death is charged to the targets that had work in it and had not yet answered a call since their load
    (when there were several, to those among them that were suspects of the previous death as well).
    """

    crashes_to_quarantine: int = 3
    crash_window_s: float = 300.0
    quarantine_s: float = 300.0
    restarts: int = 3
    restart_refill_s: float = 120.0
    dead_unload_timeout_s: float = 10.0  # a target whose stub died must unload within this, else a restart
    slot_wait_s: float = 60.0  # how long a first call waits for a model slot while every loaded target is busy
    load_refusal_s: float = 30.0  # a tarball Triton would not load is answered with that failure, not loaded again

    def __post_init__(self) -> None:
        if self.crashes_to_quarantine < 1 or self.restarts < 0:
            raise ValueError("crashes_to_quarantine must be at least 1 and restarts at least 0")
        if min(self.crash_window_s, self.quarantine_s, self.restart_refill_s, self.dead_unload_timeout_s,
               self.slot_wait_s, self.load_refusal_s) <= 0:
            raise ValueError("fault policy durations must be positive")


class RestartBudget:
    """A token bucket: `capacity` restarts at once, then one more every `refill_s` seconds."""

    def __init__(self, capacity: int, refill_s: float, clock: Callable[[], float] = time.monotonic):
        self.capacity, self.refill_s, self.clock = capacity, refill_s, clock
        self._tokens, self._since = float(capacity), clock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._since) / self.refill_s)
        self._since = now

    def take(self) -> bool:
        """Spend one restart if one is available."""
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def refund(self) -> None:
        """Give back the restart just taken (it did not happen)."""
        self._refill()
        self._tokens = min(self.capacity, self._tokens + 1)

    def wait_s(self) -> float:
        """Seconds until the next restart is available (0 if one is now)."""
        self._refill()
        return max(0.0, (1 - self._tokens) * self.refill_s)


class CrashLedger:
    """Crashes per target in a sliding window; a target with too many is quarantined for a while. A quarantine
    starts the count afresh, so a target that comes back gets `crashes_to_quarantine` more chances. Thread-safe."""

    def __init__(self, policy: FaultPolicy, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.policy, self.metrics, self.clock = policy, metrics or Metrics(), clock
        self._lock = threading.Lock()
        self._crashes: dict[str, deque[float]] = {}
        self._until: dict[str, float] = {}
        self._last_reason: dict[str, str] = {}

    def record(self, target: str, reason: str) -> bool:
        """Note a crash of `target`; True when this one puts it in quarantine."""
        with self._lock:
            now = self.clock()
            crashes = self._crashes.setdefault(target, deque())
            crashes.append(now)
            while crashes and crashes[0] <= now - self.policy.crash_window_s:
                crashes.popleft()
            self._last_reason[target] = reason
            quarantined = len(crashes) >= self.policy.crashes_to_quarantine
            if quarantined:
                crashes.clear()
                self._until[target] = now + self.policy.quarantine_s
                self.metrics.inc("ModelQuarantines")
            self._count_quarantined()
        self.metrics.inc("ModelCrashes")
        log.warning("%s crashed (%s)%s", target, reason, "; quarantined" if quarantined else "")
        return quarantined

    def refuse_if_quarantined(self, target: str) -> None:
        if (error := self.quarantine(target)) is not None:
            raise error

    def quarantine(self, target: str) -> TargetError | None:
        """424 ModelError naming `target` while it is quarantined, with how long that lasts; else None."""
        with self._lock:
            left = self._until.get(target, 0.0) - self.clock()
            self._count_quarantined()
            reason = self._last_reason.get(target, "")
        if left <= 0:
            return None
        policy = self.policy
        return TargetError(424, f"target model {target!r} is quarantined for {left:.0f} s more: it crashed "
                                f"{policy.crashes_to_quarantine} times within {policy.crash_window_s:g} s "
                                f"(last: {reason}); other targets are served", code="ModelError", retry_after=left)

    def quarantined(self) -> list[str]:
        with self._lock:
            return self._count_quarantined()

    def _count_quarantined(self) -> list[str]:
        now = self.clock()
        for target in [t for t, until in self._until.items() if until <= now]:
            del self._until[target]
        self.metrics.set("QuarantinedModelCount", len(self._until))
        return sorted(self._until)

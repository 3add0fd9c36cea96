"""tritonserver's life as the model manager sees it: calls that meet a dead or restarted server, restarts within
the budget, deaths charged to the targets that had work in the server, and a watchdog that notices a death (and
the processes it leaves) without waiting for the next call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from tritonpack.mme.container import Container, Reply, TritonUnavailable
from tritonpack.mme.health import FaultPolicy, RestartBudget
from tritonpack.mme.metrics import Metrics
from tritonpack.mme.sources import TargetError

if TYPE_CHECKING:
    from tritonpack.mme.manager import ModelManager

log = logging.getLogger("tritonpack.mme")
T = TypeVar("T")
WATCH_INTERVAL_S = 0.5
DYING_S = 1.0
REQUESTS_END_S = 10.0  # a request to a stopped server fails at once; this only bounds the wait
# A call that has waited this long on a target one of whose python stubs is dead will not be answered (Triton 2.51
# fails calls in a dead stub's `execute` within ~2 s, never those a model queued to answer later): restart
STRANDED_CALL_S = 5.0
# Waits after the 1st, 2nd, ... start in a row that failed (a port taken, no memory): the restart budget bounds
# servers that start and die, so a start that never got ready gives its restart back and waits this instead
START_RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


class RetryReason(Enum):
    TARGET_GONE = "Triton no longer had the target loaded"
    STUB_DIED = "a python stub of the target died; the target is loaded again"
    PLANNED_RESTART = "the gateway restarted tritonserver during the call"
    OUT_OF_MEMORY = "Triton answered 507 and an idle target was unloaded to make room"


class NoAnswer(TargetError):
    """tritonserver is up but did not answer within the request's timeout: it may still be working on it."""


class Retry(Exception):
    """An attempt failed for `reason`; `outcome` (an error to raise or a reply) is the answer if none is left."""

    def __init__(self, reason: RetryReason, outcome: TargetError | Reply):
        super().__init__(reason.value)
        self.reason, self.outcome = reason, outcome

    def give_up(self) -> Reply:
        if isinstance(self.outcome, Reply):
            return self.outcome
        raise self.outcome from None


class Recovery:
    def __init__(self, manager: ModelManager, container: Container, policy: FaultPolicy, metrics: Metrics):
        self.manager, self.container, self.metrics = manager, container, metrics
        self.budget = RestartBudget(policy.restarts, policy.restart_refill_s)
        self.stopping = False
        self.last_exit: int | None = None
        self._lock = threading.Lock()
        self._planned_stop = 0  # start number of the last server the gateway stopped on purpose
        self._charged = 0  # start number of the last dead server whose death was charged to its targets
        self._previous_suspects: set[str] = set()
        self._failed_starts, self._next_start, self._start_failure = 0, 0.0, ""
        self._done = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="mme-watchdog", daemon=True)

    def call(self, request: Callable[[], T]) -> T:
        """`request()` to tritonserver; a server that died or was restarted meanwhile becomes a TargetError (503,
        the server restarted if the budget allows) or a `Retry` (the gateway restarted it on purpose), one still up
        that did not answer in time a `NoAnswer`."""
        generation = self.container.starts
        try:
            return request()
        except TritonUnavailable as e:
            if self._still_running(generation):
                raise NoAnswer(502, f"tritonserver did not answer: {e}") from e
            if self._planned_stop == generation:
                raise Retry(RetryReason.PLANNED_RESTART,
                            TargetError(503, "tritonserver was restarted during the call", retry_after=1)) from e
            try:
                self.ensure_running()
                state = "it was restarted (models load again on first use)"
            except TargetError as restart:
                state = restart.message
            raise TargetError(503, f"tritonserver exited with {self.last_exit} during the call; {state}",
                              retry_after=1 if self.container.alive() else self._restart_wait_s()) from e

    def _still_running(self, generation: int) -> bool:
        """Whether server start `generation` is still up; a dying one closes its sockets before it exits, so it
        gets a second to be seen gone."""
        deadline = time.monotonic() + DYING_S
        while self.container.alive() and self.container.starts == generation:
            if time.monotonic() > deadline:
                return True
            time.sleep(0.05)
        return False

    def ensure_running(self) -> None:
        """Restart a dead tritonserver, charging its death to the targets that had work in it; TargetError (503,
        with the wait) when shutting down or the restart budget is spent."""
        if self.container.alive():
            return
        with self._lock:
            if self.container.alive():
                return
            if self._charged != self.container.starts:
                self._charged = self.container.starts
                self.last_exit = self.container.exit_code()
                self._charge(set(self.manager.slots.drop_all()), f"tritonserver exited with {self.last_exit}")
            self._restart(f"tritonserver exited with {self.last_exit}", planned=False)

    def _charge(self, suspects: set[str], why: str) -> None:
        """Charge a server death to its suspects (`SlotTable.drop_all`). Of several, only those that were suspects
        of the previous death too: the culprit is in every death it causes, a bystander seldom in two."""
        charged = suspects if len(suspects) <= 1 else suspects & self._previous_suspects
        self._previous_suspects = suspects
        log.warning("%s; suspects: %s; charged: %s", why, ", ".join(sorted(suspects)) or "-",
                    ", ".join(sorted(charged)) or "-")
        for target in sorted(charged):
            self.manager.crashes.record(target, f"{why} while it was in use")

    def restart(self, why: str, generation: int) -> None:
        """Stop tritonserver start `generation` on purpose and start it again (calls it cuts short are tried
        again); nothing when that server is gone already."""
        with self._lock:
            if self.container.starts == generation and self.container.alive():
                self._restart(why, planned=True)

    def _restart(self, why: str, planned: bool) -> None:
        if self.stopping:
            raise TargetError(503, f"{why}; the local MME is shutting down", retry_after=5)
        wait = self._next_start - time.monotonic()
        if wait > 0:
            raise TargetError(503, f"{why}; tritonserver did not start ({self._start_failure}); next try in "
                                   f"{wait:.0f} s", retry_after=wait)
        if not self.budget.take():
            wait = self.budget.wait_s()
            raise TargetError(503, f"{why}; tritonserver is not restarted for {wait:.0f} s more: its restart budget "
                                   f"({self.budget.capacity}, one more every {self.budget.refill_s:g} s) is spent; "
                                   f"log {self.container.log_path}", retry_after=wait)
        if planned:
            self._planned_stop = self.container.starts
        with self.manager.slots.restarting():
            self.manager.slots.drop_all()
            self.metrics.inc("TritonRestarts")
            log.warning("restarting tritonserver: %s", why)
            try:
                self.container.stop(timeout_s=3.0)  # a dead stub's model never unloads: no exit grace
                if not self.manager.slots.wait_for_requests(REQUESTS_END_S):
                    log.warning("loads or unloads sent to the stopped tritonserver still in flight after %g s",
                                REQUESTS_END_S)
                self.container.start()
            except Exception as e:  # noqa: BLE001 - reported to the caller as the reason
                self.budget.refund()
                self._failed_starts += 1
                delay = START_RETRY_S[min(self._failed_starts, len(START_RETRY_S)) - 1]
                self._next_start = time.monotonic() + delay
                self._start_failure = (str(e).splitlines() or [type(e).__name__])[0]  # the log's tail stays in the log
                log.warning("tritonserver did not start: %s; next try in %g s", self._start_failure, delay)
                raise TargetError(503, f"{why}; restarting tritonserver failed: {self._start_failure}",
                                  retry_after=delay) from e
        self._failed_starts = 0

    @property
    def restarting(self) -> bool:
        return self._lock.locked()

    def _restart_wait_s(self) -> float:
        return max(self.budget.wait_s(), self._next_start - time.monotonic(), 1.0)

    def start(self) -> None:
        self._watchdog.start()

    def _watch(self) -> None:
        """Restart a server that died between calls (its stubs, orphaned to us, are reaped by the restart), note
        the stubs of a live one, so that their /dev/shm regions are removed at stop even if they die, and restart
        one that holds calls a dead stub had taken (`ModelManager.charge_stranded_targets`)."""
        while not self._done.wait(WATCH_INTERVAL_S):
            if self.container.alive():
                self.container.track_stubs()
                self._end_stranded_calls()
            else:
                with suppress(TargetError):
                    self.ensure_running()

    def _end_stranded_calls(self) -> None:
        """A restart cuts the calls short and they are tried again (`RetryReason.PLANNED_RESTART`)."""
        generation = self.container.starts
        if stranded := self.manager.charge_stranded_targets(STRANDED_CALL_S):
            with suppress(TargetError):
                self.restart(f"a python stub of {', '.join(stranded)} died holding calls Triton does not answer",
                             generation)

    def shutdown(self) -> None:
        """No restart from now on; stop tritonserver."""
        with self._lock:
            self.stopping = True
        self._done.set()
        if self._watchdog.is_alive():
            self._watchdog.join()
        self.manager.slots.wake_all()
        self.container.stop()

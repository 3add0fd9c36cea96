"""The model slots: every target Triton holds, or is loading or unloading, occupies one, and the table never has more
than `max_models` of them, whatever the interleaving of calls. All state changes happen here, under one lock; the
model manager does the (slow) Triton calls between them."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from tritonpack.mme.container import Reply
from tritonpack.mme.metrics import Metrics
from tritonpack.mme.sources import TargetError
from tritonpack.mme.store import Prepared


class Phase(Enum):
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"


@dataclass(eq=False)
class Slot:
    """One load of one target in Triton, from the load request to the end of its unload."""

    prepared: Prepared
    phase: Phase = Phase.LOADING
    active: int = 0  # calls using this load now
    broken: str | None = None  # why calls through this load fail (its stub died, Triton forgot it): load again
    handover: str | None = None  # while unloading: the target that takes this slot afterwards
    served: bool = False  # this load has answered a call

    @property
    def target(self) -> str:
        return self.prepared.target


class SlotTable:
    def __init__(self, max_models: int, metrics: Metrics):
        if max_models < 1:
            raise ValueError("max_models must be at least 1")
        self.max_models, self.metrics = max_models, metrics
        self._slots: OrderedDict[str, Slot] = OrderedDict()  # least recently used first
        self._requests_in_flight = 0  # loads and unloads being sent to tritonserver (`send`)
        self._restarting = False  # no slot is taken while tritonserver restarts (`restarting`)
        self._cond = threading.Condition()

    def use_loaded(self, target: str) -> Slot | None:
        """`target`'s healthy loaded slot, now in use; None when there is none."""
        with self._cond:
            slot = self._slots.get(target)
            if slot is not None and slot.phase is Phase.LOADED and not slot.broken:
                return self._use(slot)
            return None

    def claim(self, prepared: Prepared, slot_deadline: float, stopping: Callable[[], bool],
              refusal: Callable[[], TargetError | None] = lambda: None) -> tuple[Slot, Slot | None]:
        """(slot, None) when the target is loaded (the slot is now in use); otherwise (new, old): the caller loads
        `new`, which is in the table already (old is None) or takes `old`'s place once the caller has unloaded it.
        Waits while the target is being loaded or unloaded, while every slot is busy and while tritonserver
        restarts (until `slot_deadline`).
        Raises `refusal()` when the target may not be loaded now (Triton refused this version meanwhile, or it was
        quarantined while this call waited), before taking or emptying any slot for it."""
        with self._cond:
            while True:
                if stopping():
                    raise TargetError(503, "the local MME is shutting down", retry_after=5)
                if (refused := refusal()) is not None:
                    raise refused
                taken = self._take(prepared)
                if not isinstance(taken, str):
                    return taken
                if time.monotonic() >= slot_deadline:  # no wait is unbounded: an unload may never finish
                    raise TargetError(503, taken, retry_after=1)
                self._cond.wait(timeout=0.5)

    def hand_over(self, old: Slot, new: Slot) -> bool:
        """Replace the unloaded `old` by `new` in one step (the count never goes up); False if `old` is gone."""
        with self._cond:
            if self._slots.get(old.target) is not old:
                return False
            del self._slots[old.target]
            self._slots[new.target] = new
            self._changed()
            return True

    def reserve(self, prepared: Prepared) -> Slot | None:
        """A new slot for `prepared` if its target has none (nor is taking another's) and one is free."""
        with self._cond:
            if self._restarting or not self._unclaimed(prepared.target) or len(self._slots) >= self.max_models:
                return None
            slot = self._slots[prepared.target] = Slot(prepared)
            self._changed()
            return slot

    def loaded(self, slot: Slot, use: bool) -> set[str] | None:
        """`slot` finished loading (and is in use if `use`): the targets in the table, or None if `slot` is no
        longer in it (a restart emptied the table meanwhile)."""
        with self._cond:
            if self._slots.get(slot.target) is not slot:
                return None
            slot.phase = Phase.LOADED
            if use:
                self._use(slot)
            self._changed()
            return set(self._slots)

    def send(self, slot: Slot, request: Callable[[], Reply]) -> Reply | None:
        """`request()`, a load or unload of `slot`'s target, if `slot` is still in the table; None when a restart
        emptied the table meanwhile. A restart waits for the requests in flight (`wait_for_requests`) before it starts
        the next server: what one server's table counts never changes what the next one holds."""
        with self._cond:
            if self._slots.get(slot.target) is not slot:
                return None
            self._requests_in_flight += 1
        try:
            return request()
        finally:
            with self._cond:
                self._requests_in_flight -= 1
                if not self._requests_in_flight:
                    self._cond.notify_all()

    def wait_for_requests(self, timeout_s: float) -> bool:
        """Wait until no load or unload is in flight (the server they went to is stopped: they fail at once); False
        if some still are after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._requests_in_flight:
                if time.monotonic() >= deadline:
                    return False
                self._cond.wait(timeout=deadline - time.monotonic())
            return True

    def start_unloading(self, keep: str | None = None, slot: Slot | None = None, wait_s: float = 0.0) -> Slot | None:
        """Mark `slot` (once it is idle, waiting up to `wait_s`; if it is still loaded and current) or else the least
        recently used idle target other than `keep` as unloading; the slot to unload, or None."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            if slot is not None:
                while slot.active and time.monotonic() < deadline:
                    self._cond.wait(timeout=deadline - time.monotonic())
                current = self._slots.get(slot.target) is slot and slot.phase is Phase.LOADED and not slot.active
                victim = slot if current else None
            else:
                victim = self._idle(keep)
            if victim is not None:
                victim.phase = Phase.UNLOADING
                self._changed()
            return victim

    def keep_stuck(self, slot: Slot) -> None:
        """`slot` did not load or unload and tritonserver could not be restarted: it keeps its place, handed to
        nobody, until a restart empties the table."""
        with self._cond:
            slot.handover = None
            self._cond.notify_all()

    def mark_broken(self, slot: Slot, why: str) -> bool:
        """Calls through this load cannot succeed any more; True for the first call to notice."""
        with self._cond:
            first = slot.broken is None
            slot.broken = slot.broken or why
            return first

    def mark_target_broken(self, target: str, why: str) -> bool:
        """`mark_broken` for `target`'s slot, by name; False when it has none."""
        with self._cond:
            slot = self._slots.get(target)
            return slot is not None and self.mark_broken(slot, why)

    def release(self, slot: Slot, served: bool = False) -> None:
        with self._cond:
            slot.served = slot.served or served
            slot.active -= 1
            self._cond.notify_all()

    def drop(self, slot: Slot) -> None:
        with self._cond:
            if self._slots.get(slot.target) is slot:
                del self._slots[slot.target]
                self._changed()

    @contextmanager
    def restarting(self) -> Iterator[None]:
        """While tritonserver restarts, no slot is taken: a load sent now would reach the server being stopped
        (which answers it as a failure of its own) or, queued, the next one."""
        with self._cond:
            self._restarting = True
        try:
            yield
        finally:
            with self._cond:
                self._restarting = False
                self._cond.notify_all()

    def drop_all(self) -> list[str]:
        """Forget every slot (tritonserver is gone or going); the targets that had work in it and had not answered
        a call since they were loaded. A target that kills the server never answers; targets that were serving
        beside it are not blamed for its deaths (nor for a server killed from outside)."""
        with self._cond:
            suspects = [t for t, s in self._slots.items() if (s.active or s.phase is Phase.LOADING) and not s.served]
            self._slots.clear()
            self._changed()
            return suspects

    def held_targets(self) -> set[str]:
        """The targets with a slot: loaded, loading or unloading (Triton may be reading their files)."""
        with self._cond:
            return set(self._slots)

    def loaded_targets(self) -> list[str]:
        with self._cond:
            return [t for t, s in self._slots.items() if s.phase is Phase.LOADED]

    def phase(self, target: str) -> Phase | None:
        """Where `target`'s slot stands; None when it has none."""
        with self._cond:
            slot = self._slots.get(target)
            return slot.phase if slot is not None else None

    def snapshot(self) -> list[Slot]:
        """Copies of the slots, least recently used first (for tests and diagnostics)."""
        with self._cond:
            return [Slot(s.prepared, s.phase, s.active, s.broken, s.handover, s.served)
                    for s in self._slots.values()]

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # under the lock
    def _unclaimed(self, target: str) -> bool:
        """No slot is `target`'s, and none is being unloaded to be handed to it."""
        return target not in self._slots and not any(s.handover == target for s in self._slots.values())

    def _take(self, prepared: Prepared) -> tuple[Slot, Slot | None] | str:
        """`claim`'s answer if it can be given now, else what it waits for."""
        if self._restarting:  # a load now would reach the server being stopped
            return "tritonserver was still being restarted"
        target = prepared.target
        slot = self._slots.get(target)
        if slot is not None and slot.phase is Phase.LOADED:
            if not slot.broken:
                return self._use(slot), None
            if not slot.active:  # its last load broke: unload it once no call is in it, load it again
                slot.phase, slot.handover = Phase.UNLOADING, target
                self._changed()
                return Slot(prepared), slot
        if not self._unclaimed(target):  # another call is loading it, or unloading it (or the target it replaces)
            return f"{target!r} was still being loaded or unloaded by another call"
        if len(self._slots) < self.max_models:
            new = self._slots[target] = Slot(prepared)
            self._changed()
            return new, None
        victim = self._idle()
        if victim is None:
            return f"all {self.max_models} model slots stayed busy"
        victim.phase, victim.handover = Phase.UNLOADING, target
        self._changed()
        return Slot(prepared), victim

    def _idle(self, keep: str | None = None) -> Slot | None:
        return next((s for s in self._slots.values() if s.phase is Phase.LOADED and not s.active
                     and s.target != keep), None)

    def _use(self, slot: Slot) -> Slot:
        slot.active += 1
        self._slots.move_to_end(slot.target)  # the table's order is least recently used first
        return slot

    def _changed(self) -> None:
        self.metrics.set("LoadedModelCount", sum(s.phase is Phase.LOADED for s in self._slots.values()))
        self._cond.notify_all()

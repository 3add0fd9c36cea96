"""Loads targets into Triton on first use, keeps at most `max_models` there, and contains the targets that crash.

A first call takes a free model slot (`slots.SlotTable`), or the slot of the least recently used idle target once
that target has been unloaded, or waits. A tarball is fetched and checked before any slot is touched, and a load
Triton refuses gives the evicted target its slot back: a failed load leaves the loaded set as it was. A target whose
python stub dies is unloaded and loaded again (tritonserver is restarted only when that unload does not finish); one
that keeps crashing its stub or the server is quarantined (`health.FaultPolicy`). Triton may still be running a call
or a load it did not answer in time: that call's target is unloaded like one whose stub died, and that load is ended
by a restart, so that no slot is freed while Triton may still hold its model. A call Triton will never answer,
because the stub that had taken it died, is ended by a restart too (`charge_stranded_targets`, `Recovery`'s watchdog). A
failed attempt is tried again when its `RetryReason` says another may succeed, once per reason: that loop is in
`invoke`, nowhere else.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tritonpack import proc
from tritonpack.mme.container import Container, Reply
from tritonpack.mme.health import CrashLedger, FaultPolicy
from tritonpack.mme.metrics import Metrics
from tritonpack.mme.recovery import NoAnswer, Recovery, Retry, RetryReason
from tritonpack.mme.slots import Phase, Slot, SlotTable
from tritonpack.mme.sources import TargetError, target_hash, validate_target
from tritonpack.mme.store import INSUFFICIENT_STORAGE, TargetStore

log = logging.getLogger("tritonpack.mme")
# Triton 2.51 keeps a model whose python stub died registered and ready; every request through it then fails with
# this (500 on Triton's HTTP front-end, 400 on its SageMaker front-end), within about a second.
STUB_UNHEALTHY = re.compile(r"Stub process '[^']*' is not healthy")
# Triton could not resolve the name of a target the table holds loaded: 400 on Triton 2.51's SageMaker front-end
# (seen in a CI run while a neighbour was being loaded again). With model namespacing its core looks each request's
# model name up in a map that every load or unload of any model replaces, and reads it without the lock the
# replacement holds, so a lookup racing another target's load misses a name that is there: the same call succeeds
# at once. A target really gone (restart, unload behind our back) keeps failing, and is loaded again.
MODEL_GONE = re.compile(r"Request for unknown model: '[^']*' is not found")
# A load that failed because a disk is full (the python backend unpacks each packed environment under /tmp): the
# host's state, not the tarball's fault.
NO_DISK_SPACE = re.compile(r"No space left on device|Failed to create environment directory")
# The python backend's traceback after a model's error (paths in the cache, frames of importlib): not for clients
PYTHON_FRAMES = re.compile(r"\n\nAt:\n(?:  .*(?:\n|$))*")
NO_BACKEND = re.compile(r"unable to find backend library for backend")  # the bundled Triton has only python's


def _mb(kb: int) -> float:
    return round(kb / proc.KB_PER_MB, 1)


def _owner(model_file: Path, folders: dict[str, Path]) -> str | None:
    """The target (of `ModelManager._folders`) whose folder holds a python stub's `model_file`."""
    model_file = model_file.resolve()
    return next((target for target, folder in folders.items() if model_file.is_relative_to(folder)), None)


def model_gone(reply: Reply) -> bool:
    """Triton did not resolve the target's name (its answer is 400; a 200's output may hold any text)."""
    return reply.status != 200 and MODEL_GONE.search(reply.message) is not None


class ModelManager:
    def __init__(self, store: TargetStore, container: Container, max_models: int, metrics: Metrics | None = None,
                 policy: FaultPolicy | None = None):
        self.store, self.container, self.max_models = store, container, max_models
        self.metrics = metrics or Metrics()
        self.policy = policy or FaultPolicy()
        self.slots = SlotTable(max_models, self.metrics)
        self.crashes = CrashLedger(self.policy, self.metrics)
        self.recovery = Recovery(self, container, self.policy, self.metrics)
        self._in_triton: dict[object, tuple[str, float]] = {}  # calls sent to Triton, unanswered: → target, since
        self._in_triton_lock = threading.Lock()

    def invoke(self, target: str, body: bytes, content_type: str | None) -> Reply:
        """Triton's answer for `body` sent to `target`; raises TargetError when the target cannot be served."""
        target = validate_target(target)
        tried: set[RetryReason] = set()
        while True:
            try:
                return self._attempt(target, body, content_type)
            except Retry as retry:
                if retry.reason in tried:
                    return retry.give_up()
                tried.add(retry.reason)
                self.metrics.inc("InvocationRetries")
                log.info("%s: trying again: %s", target, retry.reason.value)

    def _attempt(self, target: str, body: bytes, content_type: str | None) -> Reply:
        slot, reply = self._acquire(target), None

        def call() -> Reply:
            call_id = object()
            with self._in_triton_lock:
                self._in_triton[call_id] = (target, time.monotonic())
            try:
                return self.recovery.call(lambda: self.container.invoke(target_hash(target), target, body,
                                                                        content_type))
            finally:
                with self._in_triton_lock:
                    del self._in_triton[call_id]

        try:
            reply = call()
            if model_gone(reply):  # a name lookup that raced another target's load: once more
                self.metrics.inc("InvocationRetries")
                log.info("%s: trying again: Triton did not resolve the name (%s)", target, reply.message)
                reply = call()
        except NoAnswer:  # an unload now would wait for the call Triton may still be running
            self.slots.mark_broken(slot, "a call got no answer in time: Triton may still be running it")
            raise
        finally:
            self.slots.release(slot, served=reply is not None and reply.status == 200)
        if reply.status == 200:
            return reply
        if (reply.status == 404 and not reply.body) or model_gone(reply):
            self.slots.mark_broken(slot, "Triton no longer knows the target")
            raise Retry(RetryReason.TARGET_GONE, TargetError(503, f"Triton lost {target!r} twice during the call"))
        if STUB_UNHEALTHY.search(reply.message):
            raise self._stub_died(slot, reply.message)
        if reply.status == INSUFFICIENT_STORAGE and self._evict_idle(keep=target):
            raise Retry(RetryReason.OUT_OF_MEMORY, reply)
        return reply

    def _acquire(self, target: str) -> Slot:
        """`target`'s loaded slot, marked in use; loads it first (making room) when it is not loaded."""
        self.crashes.refuse_if_quarantined(target)
        self.recovery.ensure_running()
        slot = self.slots.use_loaded(target)
        if slot is not None:
            self.metrics.inc("ModelCacheHit")
            return slot
        started = time.monotonic()
        # a bad tarball is refused before Triton's loaded set is touched
        prepared = self.store.prepare(target, self.slots.held_targets)
        self.metrics.inc("ModelCacheMiss")
        reloaded = None  # why the target is loaded again, when its last load broke
        while True:
            new, old = self.slots.claim(prepared, started + self.policy.slot_wait_s, lambda: self.recovery.stopping,
                                        lambda: self.store.refusal(prepared) or self.crashes.quarantine(target))
            if new.phase is Phase.LOADED:
                break
            if old is not None:
                reloaded = old.broken if old.target == target else reloaded
                self._unload(old)
                if not self.slots.hand_over(old, new):
                    continue  # a restart emptied the table meanwhile: claim afresh
            try:
                if self._load(new, use=True):
                    break
            except TargetError as e:
                if old is not None and old.target != target and e.status < 500:  # Triton refused the target
                    self._restore(old)
                raise
        if reloaded:
            self.metrics.inc("ModelReloads")
            log.warning("%s: loaded again (%s)", target, reloaded)
        self.metrics.observe("ModelLoadingWaitTime", time.monotonic() - started)
        return new

    def _load(self, slot: Slot, use: bool) -> bool:
        """Load `slot`'s target. True when it is loaded (in use if `use`); False when a restart emptied the table
        meanwhile. When Triton refuses it, the slot is given up and TargetError raised; when Triton does not answer
        in time, tritonserver is restarted (the slot goes with its table) and TargetError raised."""
        target, url = slot.target, slot.prepared.model_dir

        def load() -> Reply | None:
            reply = self._send(slot, lambda: self.container.load(target_hash(target), target, url))
            if reply is None or reply.status == 200 or not NO_DISK_SPACE.search(reply.message):
                return reply
            self.store.evict(self.slots.held_targets(), full_disk=True)
            return Reply(INSUFFICIENT_STORAGE, reply.body, reply.content_type)  # room may be made: never refused

        generation, started = self.container.starts, time.monotonic()
        try:
            reply = load()
            if reply is not None and reply.status == 409:
                # registered already (a load that outlived our bookkeeping): start clean
                self._send(slot, lambda: self.container.unload(target_hash(target), target))
                reply = load()
            while reply is not None and reply.status == INSUFFICIENT_STORAGE and self._evict_idle(keep=target):
                reply = load()
        except NoAnswer as e:  # Triton may still be loading it: only a restart frees its slot
            self._restart_stuck(slot, f"{target!r} did not load ({e.message})", generation)
            raise TargetError(502, f"Triton did not load {target!r} in time ({e.message}); tritonserver was "
                                   f"restarted to end that load") from e
        except BaseException:
            self.slots.drop(slot)
            raise
        if reply is None:
            return False
        if reply.status != 200:
            self.metrics.inc("ModelLoadFailures")
            error = self._load_failure(slot, reply)  # refused before the slot is free: a call waiting for it sees it
            self.slots.drop(slot)
            raise error
        took = time.monotonic() - started
        self.metrics.observe("ModelLoadingTime", took)
        log.info("%s: loaded by Triton in %.2f s", target, took)
        in_table = self.slots.loaded(slot, use)
        if in_table is None:
            return False
        self.store.evict(in_table)
        return True

    def _load_failure(self, slot: Slot, reply: Reply) -> TargetError:
        """What to answer for a load Triton did not complete; the tarball is refused where the failure is its own."""
        target = slot.target
        if not slot.prepared.model_dir.is_dir():  # a full disk made the cache remove it while this load waited
            return TargetError(503, f"{target!r} was removed from the full disk cache before Triton loaded it; try "
                                    f"again", retry_after=1)
        if reply.status == 409:  # still registered after the clearing unload: Triton's state, not the tarball's
            return TargetError(503, f"Triton still holds an earlier load of {target!r}: {reply.message}",
                               retry_after=1)
        hint = ""
        if NO_DISK_SPACE.search(reply.message):
            hint = "; a disk is full: free space there"
        elif NO_BACKEND.search(reply.message):  # a `cpu` or `gpu` build
            hint = "; the local Triton has only the python backend: a `portable` build (TARGET=portable) serves here"
        refused = reply.status == 400  # most likely the model's own fault: not loaded again for a while
        again = f" (not loaded again for {self.policy.load_refusal_s:g} s unless the tarball changes)" \
            if refused else ""
        # Triton names each model of the target `<its folder>::<model>` (namespacing): the model names say it all
        reason = reply.message.replace(f"{slot.prepared.model_dir}::", "")
        reason = PYTHON_FRAMES.sub(" ", reason).strip().rstrip(";")
        error = TargetError(reply.status if 400 <= reply.status < 600 else 502,
                            f"Triton could not load {target!r}{again}: {reason}{hint}")
        if refused:
            self.store.refuse(slot.prepared, error, self.policy.load_refusal_s)
        return error

    def _send(self, slot: Slot, request: Callable[[], Reply]) -> Reply | None:
        """`request()`, a load or unload of `slot`'s target; None when a restart emptied the table meanwhile."""
        return self.recovery.call(lambda: self.slots.send(slot, request))

    def _restore(self, evicted: Slot) -> None:
        """Load `evicted` again after the load that was to take its slot failed."""
        try:
            slot = self.slots.reserve(self.store.prepare(evicted.target, self.slots.held_targets))
            if slot is not None:
                self._load(slot, use=False)
        except (TargetError, Retry) as e:
            log.warning("%s: could not be loaded again after a failed load took its slot: %s", evicted.target, e)

    def _unload(self, slot: Slot) -> None:
        """Unload `slot` (phase UNLOADING), which no call is using. Triton 2.51's SageMaker front-end holds one of
        its HTTP threads for the whole unload, and a reply due on that thread waits for it: an unload that waits for
        a request in flight never finishes. So a target is unloaded only once none of its calls is in Triton, and one
        that still does not unload in time (its stub died), or that Triton refuses to unload, gets tritonserver
        restarted, which empties the table: a slot is never handed on while Triton may still hold its model. A
        broken target (a dead stub, or a call Triton may still be running) gets a short timeout."""
        timeout = self.policy.dead_unload_timeout_s if slot.broken else None
        generation, started = self.container.starts, time.monotonic()
        try:
            reply = self._send(slot, lambda: self.container.unload(target_hash(slot.target), slot.target,
                                                                   timeout=timeout))
        except NoAnswer as e:
            failure = e.message
        except (TargetError, Retry):
            return  # tritonserver died or was restarted meanwhile, and the table with it
        else:
            if reply is None:
                return  # a restart emptied the table meanwhile
            if reply.status in (200, 404):
                self.metrics.observe("ModelUnloadingTime", time.monotonic() - started)
                log.info("unloaded %s%s", slot.target, f" ({slot.broken})" if slot.broken else "")
                return
            failure = f"HTTP {reply.status}: {reply.message}"
        self._restart_stuck(slot, f"{slot.target!r} did not unload ({failure})", generation)

    def _restart_stuck(self, slot: Slot, why: str, generation: int) -> None:
        """Restart tritonserver start `generation`, which may still be loading or unloading `slot`'s target; when
        the restart is refused, `slot` keeps its place until a later one."""
        try:
            self.recovery.restart(why, generation)
        except TargetError:
            self.slots.keep_stuck(slot)
            raise

    def _evict_idle(self, keep: str) -> bool:
        """Unload the least recently used idle target other than `keep` (Triton ran out of memory)."""
        victim = self.slots.start_unloading(keep=keep)
        if victim is None:
            return False
        self._unload(victim)
        self.slots.drop(victim)
        return True

    def _stub_died(self, slot: Slot, message: str) -> Exception:
        """A python stub of `slot`'s target died: one crash per load, however many calls were in it."""
        target = slot.target
        quarantined = self.slots.mark_broken(slot, f"a python stub died: {message}") \
            and self.crashes.record(target, message)
        if quarantined and self.slots.start_unloading(slot=slot, wait_s=self.policy.dead_unload_timeout_s):
            self._unload(slot)  # its slot is free for others at once, not when it is evicted
            self.slots.drop(slot)
        try:
            self.crashes.refuse_if_quarantined(target)
        except TargetError as e:
            return e
        return Retry(RetryReason.STUB_DIED, TargetError(
            424, f"{target}: a python stub died during the call, and again after the target was loaded again "
                 f"({message}); log: {self.container.log_path}", code="ModelError"))

    def charge_stranded_targets(self, waited_s: float) -> list[str]:
        """Targets with a call that has waited `waited_s` for Triton while a python stub of the target is dead,
        each charged with a crash of its stub (once per load, as `_stub_died` charges it). A model that answers
        through response senders (portable `bert`, whose encoder reads the text and queues requests) has taken such
        calls before its stub died, and Triton 2.51 never answers them: only a restart ends them. Calls that did
        not reach the stub are failed by Triton about a second apart, so behind a few of them a call also waits this
        long: the restart ends those too, and they are retried as the others."""
        now = time.monotonic()
        with self._in_triton_lock:
            waiting = {target for target, since in self._in_triton.values() if now - since >= waited_s}
        if not waiting:
            return []
        folders = self._folders(waiting)
        stranded = sorted(waiting & {_owner(f, folders) for f in self.container.dead_stub_files()})
        why = "a python stub died holding calls Triton does not answer"
        for target in stranded:
            if self.slots.mark_target_broken(target, why):
                self.crashes.record(target, why)
        return stranded

    def loaded_targets(self) -> list[str]:
        return self.slots.loaded_targets()

    def memory_mb(self, targets: list[str]) -> dict:
        """PSS in MB (10^6 bytes) of the whole server, of tritonserver alone and of the python stubs of each of
        `targets` (loaded ones), as `GET /models` shows them. A page several processes map (Python, numpy, an
        environment's libraries that loaded targets share) counts 1/n to each of its n processes, so a target's
        figure falls as other loaded targets come to share its libraries."""
        if (memory := self.container.memory()) is None:
            return {}
        folders = self._folders(targets)
        loaded = dict.fromkeys(folders, 0)
        for model_file, kb in memory.stubs.items():
            if (owner := _owner(model_file, folders)) is not None:
                loaded[owner] += kb
        return {"total": _mb(memory.total), "tritonserver": _mb(memory.tritonserver),
                "loaded": {target: _mb(kb) for target, kb in loaded.items()}}

    def _folders(self, targets) -> dict[str, Path]:
        """Each target's folder in the cache, where its python stubs' model.py files are."""
        return {target: self.store.cache.model_dir(target).resolve() for target in targets}

    def loaded(self, target: str) -> bool:
        return self.slots.phase(target) is Phase.LOADED

    def loading(self, target: str) -> bool:
        """Whether a load of `target` is in Triton now (a call waiting for a slot or an unload is not loading)."""
        return self.slots.phase(target) is Phase.LOADING

    def ready(self) -> bool:
        """For /ping: tritonserver is up and answering, not in the middle of a (re)start, and the gateway is not
        shutting down."""
        return not self.recovery.stopping and not self.recovery.restarting and self.container.alive() \
            and self.container.ping()

    def start(self) -> ModelManager:
        self.recovery.start()
        return self

    def shutdown(self) -> None:
        self.recovery.shutdown()

"""`worker run --processes N`: N worker processes, kept running, stopped together.

The supervisor starts N children, each a plain `worker run` (its own event loop, connections
and heartbeat row in `worker.workers`), and then only watches them: a child that exits while
the supervisor runs is logged (pid, exit code or signal) and started again after a capped,
doubling delay, so a child that dies at every start does not spin. SIGTERM or SIGINT to the
supervisor is passed to every child as SIGTERM, and each stops as a lone worker does: running
jobs get `WORKER_SHUTDOWN_GRACE` to finish, the rest are handed back. A child whose supervisor
is gone (killed by SIGKILL) stops the same way by itself (`stop_when_orphaned`). Given `cpus`
(WORKER_PIN_CPUS), child k runs on the k-th of them from its start, every thread of it
included: threads that pass the GIL among them keep to one CPU, where unpinned they left CPUs
idle between them (measured in docs/benchmarks.md).

What this does not do: it holds no database connection and knows nothing of jobs. A child's
jobs, when it dies, are rescued by the other workers' rescuers after the lease, as for any
dead worker; the supervisor only starts a new child in its place.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from worker.db.backoff import Backoff
from worker.logs import fields

log = logging.getLogger("worker.supervisor")

# The wait before a dead child starts again: from half a second, doubling up to half a minute.
RESTART_FIRST, RESTART_CAP = 0.5, 30.0
# A child that ran this long before it died is not in a crash loop: its next wait starts over.
STEADY_SECONDS = 30.0
# How often the supervisor looks at its children; a signal is acted on at the next look.
TICK = 0.1
# Past the shutdown grace, how long a child may take to write its outcomes and deregister
# before the supervisor kills it.
STOP_MARGIN = 30.0
# How often a child checks that its supervisor still runs.
ORPHAN_CHECK = 1.0


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order (Linux: `WORKER_PIN_CPUS` is checked first)."""
    return sorted(os.sched_getaffinity(0))


def cpu_of(slot: int, cpus: Sequence[int]) -> int:
    """The CPU that worker process `slot` (1 to N) is pinned to: the slot-th of `cpus`, round
    robin when there are more processes than CPUs.

    >>> [cpu_of(slot, [0, 1]) for slot in (1, 2, 3)]
    [0, 1, 0]
    """
    return cpus[(slot - 1) % len(cpus)]


def pin(cpu: int) -> None:
    """Run this process, and every thread it starts from now on, on `cpu` alone."""
    os.sched_setaffinity(0, {cpu})


def describe_exit(returncode: int) -> str:
    """How a child ended, in words: its exit code or the signal that killed it.

    >>> describe_exit(0), describe_exit(1), describe_exit(-9)
    ('exited with code 0', 'exited with code 1', 'was killed by SIGKILL')
    """
    if returncode >= 0:
        return f"exited with code {returncode}"
    return f"was killed by {signal_name(returncode)}"


def signal_name(returncode: int) -> str | None:
    """The name of the signal that killed a child (None if it exited by itself)."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def stopped_cleanly(returncode: int) -> bool:
    """Whether a child asked to stop ended well: exit code 0, or killed by the stop signal
    itself before it had set up its handler (so before it claimed anything)."""
    return returncode in (0, -signal.SIGTERM, -signal.SIGINT)


@dataclass
class Child:
    """One of the N places: the process in it now, and its restart delays."""

    slot: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(RESTART_FIRST, RESTART_CAP))


class Supervisor:
    """Keeps `count` children of `command` running until `request_stop`, then stops them all.

    `env_for(slot)` is the environment of the child in `slot` (1 to `count`); with `cpus`, it
    runs on `cpu_of(slot, cpus)`. A child that has not exited `stop_timeout` seconds after the
    stop signal is killed.
    """

    def __init__(
        self,
        command: Sequence[str],
        count: int,
        *,
        env_for: Callable[[int], Mapping[str, str]],
        stop_timeout: float,
        cpus: Sequence[int] | None = None,
        burst: bool = False,
    ) -> None:
        self.command = list(command)
        # Burst mode: a child that exits is not started again; the supervisor ends when all
        # have, 0 if each exited 0.
        self.burst = burst
        self.ended: dict[int, int] = {}  # burst: each ended child's exit code, by slot
        self.cpus = cpus
        self.count = count
        self.env_for = env_for
        self.stop_timeout = stop_timeout
        self.children = [Child(slot) for slot in range(1, count + 1)]
        self._stopping = False

    def request_stop(self) -> None:
        """Stop restarting children and tell every child to stop."""
        self._stopping = True

    def run(self) -> int:
        """Supervise until SIGTERM or SIGINT; 0 when every child stopped cleanly, else 1."""
        handled = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.getsignal(sig) for sig in handled}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        for sig in handled:
            signal.signal(sig, on_signal)
        try:
            log.info(
                "supervisor (pid %d) starting %d worker processes",
                os.getpid(),
                self.count,
                extra=fields("supervisor.starting", pid=os.getpid(), processes=self.count),
            )
            for child in self.children:
                self._start(child)
            while not self._stopping and len(self.ended) < self.count:
                self._look()
                time.sleep(TICK)
            clean = self._stop_all() == 0
            return 0 if clean and not any(self.ended.values()) else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _start(self, child: Child) -> None:
        cpu = None if self.cpus is None else cpu_of(child.slot, self.cpus)
        child.proc = subprocess.Popen(
            self.command,
            env=dict(self.env_for(child.slot)),
            # Pinned between fork and exec, before the child has a thread (the supervisor has
            # none either, which is what makes a preexec_fn safe).
            preexec_fn=None if cpu is None else lambda: pin(cpu),
        )
        child.started_at = time.monotonic()
        log.info(
            "worker process %d of %d started (pid %d)%s",
            child.slot,
            self.count,
            child.proc.pid,
            "" if cpu is None else f" on CPU {cpu}",
            extra=fields("supervisor.child_started", slot=child.slot, pid=child.proc.pid, cpu=cpu),
        )

    def _look(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.proc is None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            returncode = child.proc.poll()
            if returncode is None:
                continue
            if self.burst:
                self._exited(
                    child, returncode, logging.INFO if returncode == 0 else logging.WARNING
                )
                child.proc, child.restart_at = None, math.inf
                self.ended[child.slot] = returncode
                continue
            if now - child.started_at >= STEADY_SECONDS:
                child.backoff.reset()
            delay = child.backoff.next()
            self._exited(child, returncode, logging.WARNING, f"; starting again in {delay:g} s")
            child.proc, child.restart_at = None, now + delay

    def _exited(self, child: Child, returncode: int, level: int, then: str = "") -> None:
        assert child.proc is not None
        log.log(
            level,
            "worker process %d (pid %d) %s%s",
            child.slot,
            child.proc.pid,
            describe_exit(returncode),
            then,
            extra=fields(
                "supervisor.child_exited",
                slot=child.slot,
                pid=child.proc.pid,
                exit_code=returncode if returncode >= 0 else None,
                signal=signal_name(returncode),
            ),
        )

    def _stop_all(self) -> int:
        running = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        log.info(
            "supervisor stopping: SIGTERM to %d worker processes",
            len(running),
            extra=fields("supervisor.stopping", running=len(running)),
        )
        for child in running:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        clean = True
        deadline = time.monotonic() + self.stop_timeout
        for child in self.children:
            if child.proc is None:  # dead, waiting to start again: nothing to stop
                continue
            try:
                returncode = child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error(
                    "worker process %d (pid %d) still runs %g s after SIGTERM: killing it",
                    child.slot,
                    child.proc.pid,
                    self.stop_timeout,
                    extra=fields("supervisor.child_killed", slot=child.slot, pid=child.proc.pid),
                )
                child.proc.kill()
                returncode = child.proc.wait()
            ok = stopped_cleanly(returncode)
            clean = clean and ok
            self._exited(child, returncode, logging.INFO if ok else logging.WARNING)
        log.info(
            "supervisor stopped",
            extra=fields("supervisor.stopped", clean=clean),
        )
        return 0 if clean else 1


async def stop_when_orphaned(supervisor_pid: int, stop: Callable[[], None]) -> None:
    """In a child: call `stop` (the worker's, as SIGTERM would) once its supervisor is gone,
    killed by SIGKILL say, so that no worker process runs on that nothing supervises."""
    while os.getppid() == supervisor_pid:
        await asyncio.sleep(ORPHAN_CHECK)
    log.warning(
        "the supervisor (pid %d) is gone: stopping",
        supervisor_pid,
        extra=fields("supervisor.gone", supervisor_pid=supervisor_pid),
    )
    stop()

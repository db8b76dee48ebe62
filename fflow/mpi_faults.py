"""Noticing failed, finished and divergent MPI ranks instead of hanging.

Every fflow collective on MPI is started non-blocking and waited for here. While it
waits, a rank also watches a small control channel on COMM_WORLD (reserved tags,
tiny metadata messages only; no array data ever goes this way):

* LEAVE: a rank that finished its script tells every other rank (`leave_world`,
  run by `fflow.launch` at the end of each rank). A rank waiting in a collective
  with a rank that left can never finish, so it raises `RankError` at once, naming
  that rank and where both were.
* WHERE / HERE: when a collective waits longer than `collective_timeout` seconds
  (config, `FFLOW_COLLECTIVE_TIMEOUT`, default 600), the waiting rank asks the other
  members of its group where they are; ranks waiting in fflow answer with their
  current collective. The timeout error lists every answer (or "no answer": that
  rank is computing, or hung outside fflow).

Ranks killed by a signal or by `os._exit` are reported by the launcher (each rank
runs under a small supervisor process, see fflow/launch.py).
"""

import functools
import os
import time

from fflow.config import config
from fflow.errors import FflowError

TAG_LEAVE, TAG_WHERE, TAG_HERE = 31001, 31002, 31003
_SPIN = 16  # Test() calls between looks at the clock (and yields of the CPU)
_POLL_EVERY = 0.005  # seconds between looks at the control channel

config.define("collective_timeout", 600.0)


class RankError(FflowError):
    """A distributed failure: a rank left, diverged or did not arrive in time.

    `reporter` is the rank that prints it when several ranks detect the same
    failure (the launcher shows one traceback).
    """

    def __init__(self, message, reporter=None):
        super().__init__(message)
        self.reporter = reporter


class Control:
    """This rank's view of the others: who left, and where this rank is now."""

    def __init__(self, world):
        from mpi4py import MPI  # loaded only when MPI is used

        self.MPI = MPI
        self.world = world
        self.rank = world.Get_rank()
        self.left = {}  # rank -> what it said when it left
        self.where = "outside any fflow collective"
        self._sends = []

    # -- the control messages ----------------------------------------------------
    def _send(self, dest, tag, payload):
        self._sends.append(self.world.isend(payload, dest=dest, tag=tag))

    def poll(self):
        """Handle every pending control message (answer WHERE, record LEAVE)."""
        MPI = self.MPI
        status = MPI.Status()
        answers = {}
        while self.world.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            src, tag = status.Get_source(), status.Get_tag()
            if tag not in (TAG_LEAVE, TAG_WHERE, TAG_HERE):
                break  # not ours (a user's message on COMM_WORLD): leave it alone
            msg = self.world.recv(source=src, tag=tag)
            if tag == TAG_LEAVE:
                self.left[src] = msg
            elif tag == TAG_WHERE:
                here = self.where
                self._send(src, TAG_HERE, here if isinstance(here, str) else f"waiting at {here}")
            else:
                answers[src] = msg
        self._sends = [r for r in self._sends if not r.Test()]
        return answers

    # -- waiting for a collective --------------------------------------------------
    def check_group(self, ranks, what):
        gone = [r for r in ranks if r in self.left]
        if gone:
            r = gone[0]
            raise RankError(
                f"rank {r} finished its script ({self.left[r]}) while rank {self.rank} "
                f"waits at {what}. The ranks ran different numbers of steps or different "
                "programs. Fix: make every rank run the same sequence of sharded calls "
                "(same loop counts, same branches).",
                reporter=self.rank,
            )

    def wait(self, reqs, ranks, what):
        """Wait for MPI requests `reqs` of a collective over world `ranks`."""
        MPI = self.MPI
        if len(reqs) == 1:  # Request.Test costs a quarter of Testall([request])
            test = reqs[0].Test
            if test():
                return
        else:
            if MPI.Request.Testall(reqs):
                return
            test = functools.partial(MPI.Request.Testall, reqs)
        self.where = what  # described (str) only when asked or on an error
        start = time.monotonic()
        last_poll = start
        try:
            while True:
                for _ in range(_SPIN):
                    if test():
                        return
                # let a peer on the same core run: ranks often outnumber free cores (a
                # yield costs ~1 us when no one else wants the core; spinning through a
                # peer's whole time slice cost a 4 ms floor at 4 ranks on 2 cores)
                os.sched_yield()
                now = time.monotonic()
                if now - last_poll > _POLL_EVERY:
                    last_poll = now
                    self.poll()
                    if any(r in self.left for r in ranks) and self._completes(reqs):
                        return  # the peer finished after doing its part of this collective
                    self.check_group(ranks, what)
                    # (read here, not per wait: a config read costs ~0.4 us, most waits
                    # end before their first poll)
                    timeout = float(config.collective_timeout)
                    if now - start > timeout:
                        self._timed_out(reqs, ranks, what, timeout)
        finally:
            self.where = "outside any fflow collective"

    def _completes(self, reqs, grace=1.0):
        """Whether `reqs` complete within `grace` seconds (MPI may need a moment of
        progress for data a peer sent just before it left)."""
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if self.MPI.Request.Testall(reqs):
                return True
            os.sched_yield()
        return False

    def _timed_out(self, reqs, ranks, what, timeout):
        others = [r for r in ranks if r != self.rank]
        for r in others:
            self._send(r, TAG_WHERE, None)
        answers = {}
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and len(answers) < len(others):
            if self.MPI.Request.Testall(reqs):
                return  # it finished after all
            answers.update(self.poll())
            time.sleep(0.001)
        lines = [f"  rank {self.rank}: waiting at {what}"]
        for r in others:
            said = answers.get(r)
            if r in self.left:
                said = f"finished its script ({self.left[r]})"
            lines.append(f"  rank {r}: {said or 'no answer (computing, or hung outside fflow)'}")
        raise RankError(
            f"rank {self.rank} waited {timeout:g} s at {what}; the other ranks did not "
            "arrive. Where each rank is:\n" + "\n".join(lines) + "\nFix: make every rank "
            "run the same sharded calls; raise fflow.config collective_timeout "
            "(FFLOW_COLLECTIVE_TIMEOUT) if a rank legitimately computes that long.",
            reporter=self.rank,
        )

    # -- the end of a rank -----------------------------------------------------------
    def leave(self, summary):
        """Tell every rank this one finished; wait until every other rank finished too."""
        size = self.world.Get_size()
        self.where = f"finished its script ({summary})"
        for r in range(size):
            if r != self.rank:
                self._send(r, TAG_LEAVE, summary)
        while len(self.left) < size - 1:
            self.poll()
            time.sleep(0.002)
        self.MPI.Request.Waitall(self._sends)
        self._sends = []


_control = None


def control():
    """The control channel of this process (created on first use)."""
    global _control
    if _control is None:
        from mpi4py import MPI  # loaded only when MPI is used

        _control = Control(MPI.COMM_WORLD)
    return _control


def leave_world(summary):
    control().leave(summary)

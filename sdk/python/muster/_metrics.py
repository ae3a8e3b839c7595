"""log_metrics(): points from inside a run, sent by a daemon thread."""

from __future__ import annotations


import atexit
import collections
import math
import os
import random
import re
import sys
import threading
from time import time as _time
from typing import Optional

from ._client import Client
from ._errors import MusterError

_METRICS_KEEP = 100000   # values that may wait for the controller
_METRICS_CALL = 4000     # values sent in one call at most (well under 1 MiB)
_STEP_END = 1 << 63
_METRICS_TRIES_500 = 5    # a call the controller fails (500) that often is dropped
_METRIC_NAME = re.compile(r"[A-Za-z0-9_.\-/:]{1,64}")


class _MetricsSender:
    """Sends what :func:`log_metrics` queued, from a daemon thread, once a
    second: the training loop only appends to a deque. A controller that
    is away costs a line on stderr; up to 100,000 values wait for it (the
    oldest go past that), and are sent once it answers."""

    def __init__(self, url, run_id, token, rank, interval=1.0):
        self.path = "/api/v1/runs/%s/metrics" % run_id
        self.rank = rank
        self.interval = interval
        self.queue = collections.deque()
        self.pending = collections.deque()  # points taken from the queue, not yet sent
        self.waiting = 0           # their values
        self.good_names = set()    # names already checked
        self.inflight = None       # (seq, points, values) of the call not yet answered
        self.sender = "py-%08x-%d" % (random.getrandbits(32), os.getpid())
        self.seq = 0
        self.tries = 0
        self.stopped = False
        self.sent = self.dropped = 0
        self.told = self.told_bad = False
        self.client = Client(url=url, token=token, session="metrics", timeout=10, lease=False)
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="muster-metrics", daemon=True)
        self.thread.start()
        atexit.register(self.flush, 2.0)

    @staticmethod
    def _number(v):
        """v as a number JSON carries, or None (NaN, infinity, not a
        number): numpy's and torch's scalars convert; a bool is no number."""
        if isinstance(v, bool):
            return None
        try:
            v = float(v)
        except Exception:  # a user's object's __float__ may raise anything
            return None
        return v if math.isfinite(v) else None

    def _take(self):
        """Moves what was logged to pending, as the API's points: a point
        the controller would refuse (and its whole call with it) is dropped
        here instead, saying why once."""
        q, good, number, pending, rank = self.queue, self.good_names, self._number, \
            self.pending, self.rank
        while q:
            step, at, epoch, values = q.popleft()
            if type(step) is not int or not 0 <= step < _STEP_END or not values or \
                    len(values) > 64 or \
                    not good.issuperset(values):
                if not self._admit(step, values):
                    continue
            # Floats (the usual) as they are; anything else through float().
            vals = {k: v if type(v) is float and v - v == 0 else number(v)
                    for k, v in values.items()}
            point = {"step": step, "rank": rank, "at": at, "values": vals}
            if epoch is not None:
                e = number(epoch)
                if e is not None:
                    point["epoch"] = e
            pending.append(point)
            self.waiting += len(vals)
        while self.waiting + (self.inflight[2] if self.inflight else 0) > _METRICS_KEEP \
                and self.pending:
            gone = self.pending.popleft()
            self.waiting -= len(gone["values"])
            self.dropped += len(gone["values"])

    def _admit(self, step, values):
        """The slow check of a point the fast one did not pass: True if the
        controller takes it (its names are remembered as good)."""
        why = None
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < _STEP_END:
            why = "step %r is not an int from 0 to 2**63 - 1" % (step,)
        elif not values or len(values) > 64:
            why = "a point takes 1 to 64 values, not %d" % len(values)
        else:
            bad = [k for k in values if not _METRIC_NAME.fullmatch(k)]
            if bad:
                why = "%r is not a metric's name (1 to 64 of A-Z a-z 0-9 _ . - / :)" % bad[0]
        if why is None:
            self.good_names.update(values)
            return True
        self.dropped += max(1, len(values))
        if not self.told_bad:
            print("muster: log_metrics(): %s; that point is dropped" % why, file=sys.stderr)
            self.told_bad = True
        return False

    def _send(self, timeout, wait_lock=-1):
        """Sends what waits; False when the controller did not answer. A
        call keeps its points and number (seq) until it is answered, so
        that a retry of one that was stored is stored once."""
        if not self.lock.acquire(timeout=wait_lock):
            return False
        try:
            self._take()
            while self.inflight or self.pending:
                if not self.inflight:
                    batch, n = [], 0
                    while self.pending and (not batch or n + len(self.pending[0]["values"])
                                            <= _METRICS_CALL):
                        batch.append(self.pending.popleft())
                        n += len(batch[-1]["values"])
                    self.waiting -= n
                    self.seq += 1
                    self.inflight = (self.seq, batch, n)
                seq, batch, n = self.inflight
                self.client.timeout = timeout
                try:
                    self.client._request("POST", self.path, body=batch,
                                         query=[("sender", self.sender), ("seq", str(seq))])
                    self.sent += n
                    self.told = False
                except MusterError as e:
                    if e.status == 413 and len(batch) > 1:
                        # Too large for one call: the same points go in
                        # halves (the call was not stored: same number).
                        half = len(batch) // 2
                        rest = batch[half:]
                        self.pending.extendleft(reversed(rest))
                        self.waiting += sum(len(p["values"]) for p in rest)
                        self.inflight = (seq, batch[:half],
                                         sum(len(p["values"]) for p in batch[:half]))
                        continue
                    # Away, or failing now and then: again later. A call
                    # it fails over and over (500) would block every
                    # later one: dropped after a few tries.
                    self.tries += 1
                    if e.code in ("unreachable", "timeout") or (e.status or 0) >= 500 and not (
                            e.status == 500 and self.tries >= _METRICS_TRIES_500):
                        if not self.told and not self.stopped:
                            print("muster: could not send metrics (%s); they are kept (up to "
                                  "%d values) and sent once the controller answers" %
                                  (e, _METRICS_KEEP), file=sys.stderr)
                        self.told = True
                        return False
                    self.dropped += n
                    if not self.told:
                        print("muster: metrics refused (%s); %d values dropped" % (e, n),
                              file=sys.stderr)
                    self.told = True
                self.inflight = None
                self.tries = 0
            return True
        finally:
            self.lock.release()

    def _loop(self):
        while not self.stopped:
            self.wake.wait(self.interval)
            if self.stopped:
                return
            self.wake.clear()
            try:
                self._send(10)
            except Exception as e:  # never let the sender die silently
                print("muster: metrics sender: %r" % (e,), file=sys.stderr)

    def flush(self, timeout=5.0):
        """Sends what waits now, each call waiting at most ``timeout`` s;
        False if the sender's thread held on longer than that, or the
        controller did not answer."""
        return True if self.stopped else self._send(timeout, wait_lock=timeout)

    def close(self):
        """Stops sending (what waits is left)."""
        self.stopped = True
        self.wake.set()
        atexit.unregister(self.flush)


_metrics_sender = None
_metrics_append = None   # the sender's queue's append, once it runs
_metrics_lock = threading.Lock()


def _metrics_start():
    global _metrics_sender, _metrics_append
    with _metrics_lock:
        if _metrics_sender is None:
            url = os.environ.get("MUSTER_CONTROLLER_URL") or os.environ.get("MUSTER_URL")
            run_id = os.environ.get("MUSTER_RUN_ID")
            token = os.environ.get("MUSTER_RUN_TOKEN") or os.environ.get("MUSTER_TOKEN")
            if not (url and run_id and token):
                raise MusterError("not_found", "log_metrics() needs a run: MUSTER_RUN_ID and "
                                  "MUSTER_RUN_TOKEN are set in the workers of a run "
                                  "(muster run, run_cluster())", field="run")
            rank = 0
            for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
                if os.environ.get(var, "").isdigit():
                    rank = int(os.environ[var])
                    break
            _metrics_sender = _MetricsSender(url, run_id, token, rank)
            _metrics_append = _metrics_sender.queue.append
    return _metrics_append


def _metrics_forget():
    """In a forked child: the parent's sender is the parent's (its thread
    is not here, its numbers would collide); the child starts its own."""
    global _metrics_sender, _metrics_append
    if _metrics_sender is not None:
        atexit.unregister(_metrics_sender.flush)
    _metrics_sender = _metrics_append = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_metrics_forget)


def log_metrics(step: int, epoch: Optional[float] = None, **values: float) -> None:
    """Logs one point of the run this process is part of: ``step`` (an int),
    optionally ``epoch``, and named numbers, e.g.
    ``log_metrics(step, loss=0.31, accuracy=0.92)``.

    It appends to a queue and returns (about a microsecond): a thread sends
    the queue to the controller once a second, with the run's own token
    (``MUSTER_RUN_TOKEN``, which every worker of a run has), as this
    process's rank (``RANK`` or Open MPI's). A controller that is down or
    slow never blocks or fails the training loop: a line on stderr says so,
    and the points wait (up to 100,000 values) until it answers. A NaN or
    infinity is sent as null, which the controller skips.

    Raises:
        MusterError: ``not_found`` outside a run (no ``MUSTER_RUN_ID``).
    """
    (_metrics_append or _metrics_start())((step, _time(), epoch, values))


def flush_metrics(timeout: float = 5.0) -> bool:
    """Sends what :func:`log_metrics` queued now (at the end of a script
    this happens by itself). Returns False if the controller did not
    answer."""
    return _metrics_sender.flush(timeout) if _metrics_sender else True

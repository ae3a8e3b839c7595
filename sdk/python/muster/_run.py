"""The run that run_cluster() returns, or attach_run() finds again."""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import signal
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._display import WorkerList, _link, esc, fields_html, fields_text, html_table, status_html
from ._errors import MusterError

_ENDED = ("succeeded", "failed", "stopped")


class RunOutput:
    """What ``muster run`` says, read line by line: the run's failure, a
    refusal of its own, restarts, the run's id and rank 0's last line."""

    def __init__(self) -> None:
        self.last: Optional[str] = None       # worker 0's / rank 0's last line
        self.failure: Optional[str] = None    # "muster run: FAILED: ..." and its quote
        self.run_id: Optional[str] = None
        self.restarts = 0
        self.refused: Optional[List[str]] = None  # [code, words] of "muster run: ERROR:"
        self.said: Optional[str] = None       # its first "muster: " line
        self._quoting = False

    def feed(self, line: str) -> None:
        # The lines of a worker's stderr that its failure quotes follow it,
        # indented.
        if self._quoting and line.startswith("  "):
            self.failure = (self.failure or "") + "\n" + line[2:]
            return
        self._quoting = False
        if line.startswith("muster run: FAILED: "):
            self.failure = line[len("muster run: FAILED: "):]
            self._quoting = True
        elif line.startswith("muster run: ERROR: "):
            # A call of muster run's own failed ("muster run: ERROR:
            # exceeds_capacity: 3 workers × 1 core = 3 cores, but ..."): its
            # code and words. Only this prefix: mpirun's untagged lines pass
            # through as they are, and the rsh agent's "muster: poll: ..." is
            # not muster run's error.
            code_words = line[len("muster run: ERROR: "):].split(": ", 1)
            if len(code_words) == 2 and re.match(r"^[a-z_]+$", code_words[0]):
                self.refused = code_words
        elif line.startswith("muster: ") and self.said is None:
            # muster run's own first word on a usage error (exit 2) or an
            # unreachable controller (exit 5), before mpirun or any worker ran.
            self.said = line[len("muster: "):]
        elif line.startswith("muster run: restart "):
            self.restarts += 1
        elif line.startswith("muster run: the workers were stopped; the run is "):
            run_id = line.split("the run is ", 1)[1].split(";", 1)[0]
            if re.fullmatch(r"r-[a-z0-9]{10}", run_id):
                self.run_id = run_id
        elif line.startswith(("[worker-0] ", "[rank-0] ")):
            self.last = line.split("] ", 1)[1]

    def summary(self) -> Any:
        """Rank 0's last line, parsed if it is JSON."""
        if self.last:
            try:
                return json.loads(self.last)
            except ValueError:
                pass
        return self.last

    def error(self, code: int) -> Optional[MusterError]:
        """The MusterError of a muster run that exited with code, or None
        for a training failure (or success)."""
        if code != 0 and self.failure is None and self.refused is not None:
            m = re.match(r"^(.*) \(field: ([a-z_]+)\)$", self.refused[1])
            return MusterError(self.refused[0], m.group(1) if m else self.refused[1],
                               m and m.group(2))
        if code in (2, 5) and self.failure is None and self.said is not None:
            return MusterError("invalid_value" if code == 2 else "unreachable", self.said)
        return None


def _when(s: Any) -> Optional[datetime.datetime]:
    if not isinstance(s, str):
        return None
    try:
        return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def _duration(record: Dict[str, Any]) -> str:
    start, end = _when(record.get("created_at")), _when(record.get("finished_at"))
    if not start:
        return "-"
    end = end or datetime.datetime.now(datetime.timezone.utc)
    s = max(0.0, (end - start).total_seconds())
    return "%.1f s" % s if s < 120 else "%d min %02d s" % (s // 60, s % 60)


def _value(v: Any) -> str:
    return ("%.4g" % v) if isinstance(v, float) else str(v)


def _latest(v: Any) -> str:
    """A name's latest value ({"step", "value", "ranks"}) as "0.25 (step 40)"."""
    if isinstance(v, dict):
        return "%s (step %s)" % (_value(v.get("value")), v.get("step"))
    return _value(v)


class Run(dict):
    """A training run: what :meth:`Client.run_cluster` returns, a dict
    (``exit_code``, ``summary``, ``run``, ``restarts``) that also reads the
    run back from the controller.

    - ``status``: the run's status now (``running``, ``succeeded``,
      ``failed``, ``stopped``);
    - ``workers``: its last attempt's workers (a table in a notebook);
    - ``wait(timeout)``: until the run ends;
    - ``logs(rank)``: what rank ``rank`` wrote (``"ps"`` mode: worker
      ``rank``; ``role="ps"`` for a parameter server's), kept in its
      worker's log after the cell's printout is gone;
    - ``metrics()``: its points, one row per step and rank (a pandas
      DataFrame where pandas is installed);
    - ``stop()``: stops its live workers.

    A failed run's :class:`MusterError` carries the same object as ``.run``.
    """

    def __init__(self, client: Any, values: Dict[str, Any], n_workers: Optional[int] = None,
                 n_ps: int = 0):
        super().__init__(values)
        self._client = client
        self._size: Optional[Tuple[int, int]] = (
            (int(n_workers), int(n_ps)) if n_workers is not None else None)
        self._record: Optional[Dict[str, Any]] = None
        # A muster run still going on in the background (an interrupted
        # run_cluster): its process and the thread that reads its output.
        self._proc: Any = None
        self._reader: Optional[threading.Thread] = None
        self._watch: Any = None   # what finds the run's id (run_cluster's)
        self._output: "collections.deque[str]" = collections.deque()

    @property
    def output(self) -> List[str]:
        """The lines ``muster run`` printed (the last 10,000), for a run this
        client started: a copy, taken now."""
        return list(self._output)

    # --- what the controller knows ---------------------------------------

    @property
    def id(self) -> Optional[str]:
        """The run's id (``r-...``), or None if it was not recorded."""
        return self.get("run")

    def refresh(self) -> Dict[str, Any]:
        """The run's record, read now (``GET /api/v1/runs/{id}``)."""
        if not self.id:
            raise MusterError("not_found", "the run was not recorded, so the controller "
                              "knows nothing of it")
        self._record = self._client.get_run(self.id)
        return self._record

    @property
    def status(self) -> str:
        """``running``, ``succeeded``, ``failed`` or ``stopped``."""
        if not self.id:
            if self._reader is not None and self._reader.is_alive():
                return "running"
            return "succeeded" if self.get("exit_code") == 0 else "failed"
        return str(self.refresh().get("status"))

    def _last_attempt(self, record: Dict[str, Any]) -> List[str]:
        """The ids of the last attempt's workers in a record of the run, in
        launch order (parameter servers first). A run found by its id: each
        attempt launched as many workers."""
        ids = record.get("workers") or []
        n = sum(self._size) if self._size else len(ids) // (int(record.get("restarts") or 0) + 1)
        return ids[len(ids) - n:] if n else []

    def _split(self, last: List[str], by_id: Optional[Dict[str, Dict[str, Any]]] = None
               ) -> Tuple[List[str], List[str]]:
        """last as (parameter servers, workers): by the sizes run_cluster
        knew, else by the workers' roles (by_id, read here if not given)."""
        if self._size:
            return last[:self._size[1]], last[self._size[1]:]
        if by_id is None:
            by_id = {w["id"]: w for w in self._run_workers()}
        ps = [i for i in last if by_id.get(i, {}).get("role") == "ps"]
        return ps, [i for i in last if i not in ps]

    def _run_workers(self, timeout: Any = None) -> List[Dict[str, Any]]:
        """Every worker of the run, of every attempt, in one call."""
        query = [("run", self.id), ("limit", "5000")]
        if timeout is None:
            answer = self._client._request("GET", "/api/v1/workers", query=query)
        else:
            answer = self._client._request("GET", "/api/v1/workers", query=query, timeout=timeout)
        return [w for w in (answer.get("workers") or []) if isinstance(w, dict)]

    def worker_ids(self, role: str = "worker") -> List[str]:
        """The ids of the last attempt's workers of ``role`` (``"worker"``
        or ``"ps"``), rank (or index) order."""
        ps, workers = self._split(self._last_attempt(self.refresh()))
        return ps if role == "ps" else workers

    @property
    def workers(self) -> WorkerList:
        """The last attempt's workers (parameter servers first), as dicts."""
        by_id = {w["id"]: w for w in self._run_workers()}
        ps, workers = self._split(self._last_attempt(self.refresh()), by_id)
        return WorkerList([by_id[i] for i in ps + workers if i in by_id], self._client.url)

    def logs(self, rank: int = 0, stream: str = "stdout", role: str = "worker") -> str:
        """What rank ``rank`` (worker ``rank`` of ``role``) of the last
        attempt wrote to ``stream`` (``"stdout"`` or ``"stderr"``)."""
        ids = self.worker_ids(role)
        if not isinstance(rank, int) or not 0 <= rank < len(ids):
            raise MusterError("invalid_value", "rank must be 0..%d (the run had %d %s%s), not %r"
                              % (len(ids) - 1, len(ids), role, "" if len(ids) == 1 else "s", rank),
                              field="rank")
        return self._client.worker_logs(ids[rank], stream)

    def metrics(self, names: Optional[Sequence[str]] = None,
                max_points: Optional[int] = None) -> Any:
        """The run's metric points, one row per (step, rank): ``{"step",
        "rank", "epoch", "at", <name>: value, ...}``, by step then rank. A
        pandas DataFrame where pandas can be imported, else a list of dicts.
        ``names``: only these; ``max_points``: at most so many points per
        series (a name of a rank), evenly spread."""
        if not self.id:
            raise MusterError("not_found", "the run was not recorded, so it has no metrics")
        answer = self._client.run_metrics(self.id, names=names, max_points=max_points)
        rows: Dict[Tuple[int, int], Dict[str, Any]] = {}
        for p in answer.get("points", []):
            key = (p.get("step"), p.get("rank"))
            row = rows.setdefault(key, {"step": key[0], "rank": key[1], "epoch": p.get("epoch"),
                                        "at": p.get("at")})
            row.update(p.get("values") or {})
        out = [rows[k] for k in sorted(rows, key=lambda k: (k[0] or 0, k[1] or 0))]
        try:
            import pandas  # type: ignore[import-not-found]
        except Exception:  # noqa: BLE001 (not there, or broken: the rows as they are)
            return out
        return pandas.DataFrame(out)

    # --- waiting and stopping --------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> "Run":
        """Waits until the run has ended (at most ``timeout`` s: None, no
        limit) and returns it; MusterError ``timeout`` if it had not."""
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        if self._reader is not None:
            self._reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if self._reader.is_alive():
                raise MusterError("timeout", "run %s had not ended after %s s" % (
                    self.id or "(not yet recorded)", timeout))
        if self._reader is not None:
            return self  # muster run has ended: the run is what it recorded
        # A run found by its id: its record, read once a second (a
        # controller away for a moment is waited for too).
        while self.id:
            try:
                if self.status in _ENDED:
                    return self
            except MusterError as e:
                if e.code not in ("unreachable", "timeout"):
                    raise
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise MusterError("timeout", "run %s was still %s after %s s" % (
                    self.id, self._record.get("status") if self._record else "running", timeout))
            time.sleep(min(1.0, left) if left is not None else 1.0)
        return self

    def stop(self) -> WorkerList:
        """Ends the run as ``stopped`` and stops its live workers (of every
        attempt; ``muster run``, if still going, ends with them). Returns
        the workers, stopped."""
        if not self.id and self._watch is not None:
            self["run"] = self._watch.find(timeout=5)
        if not self.id and self._proc is not None and self._proc.poll() is None:
            # Not recorded yet, or not found: muster run ends (before it
            # launched, or its workers end with this client's lease).
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except OSError:  # it ended meanwhile
                pass
            raise MusterError("not_found", "the run's record was not found; its muster run was "
                              "ended, and its workers end with this client (stop_workers())")
        if self.refresh().get("status") not in _ENDED:
            try:
                self._client._request("POST", "/api/v1/runs/%s/end" % self.id,
                                      {"status": "stopped", "failure": "stopped by Run.stop()"})
            except MusterError as e:
                if e.code != "conflict":  # it ended meanwhile: as it ended
                    raise
        # Read again: no worker joins an ended run, so this list is whole.
        ids = list(self.refresh().get("workers") or [])
        if not ids:
            return WorkerList([], self._client.url)
        return self._client.stop_workers(ids)

    # --- how it looks ------------------------------------------------------

    def _rows(self, read: bool) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]],
                                         Dict[str, Any]]:
        """(text rows, HTML rows, record) for display, the record read now
        if read (else as last read); never raises."""
        record, err = self._record or {}, None
        if read and self.id:
            try:
                record = self._client._request("GET", "/api/v1/runs/" + self.id, timeout=5)
                self._record = record
            except MusterError as e:
                err = str(e)
        if record.get("status"):
            status = str(record["status"])
        elif self._reader is not None and self._reader.is_alive():
            status = "running"
        else:
            status = "succeeded" if self.get("exit_code") == 0 else "failed"
        latest = record.get("latest") or {}
        latest_s = ", ".join("%s %s" % (k, _latest(v)) for k, v in sorted(latest.items()))
        n = len(self._last_attempt(record))
        rows = [("run", self.id or "(not recorded)"), ("status", status),
                ("mode", str(record.get("mode") or "-")),
                ("workers", str(n) if record else "-"),
                ("restarts", str(record.get("restarts", self.get("restarts", 0)))),
                ("duration", _duration(record) if record else "-"),
                ("latest", latest_s or "-")]
        summary = self.get("summary")
        if summary is None:
            summary = record.get("summary")
        if summary is not None:
            rows.append(("summary", json.dumps(summary) if not isinstance(summary, str)
                         else summary))
        if record.get("failure"):
            rows.append(("failure", str(record["failure"])))
        if record.get("stall_count"):
            rows.append(("stalls", str(record["stall_count"])))
        if err:
            rows.append(("note", "could not read the run now: " + err))
        html_rows = [(k, status_html(v) if k == "status" else
                      _link(self._client.url, "runs/" + v, v) if k == "run" and self.id else
                      '<span style="white-space:pre-wrap">%s</span>' % esc(v, keep_lines=True))
                     for k, v in rows]
        return rows, html_rows, record

    def __repr__(self) -> str:
        # No call to the controller: a repr is printed in logs and tracebacks.
        rows, _, _ = self._rows(read=False)
        return fields_text(rows, "Run")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        rows, _, _ = self._rows(read=True)
        p.text(fields_text(rows, "Run"))

    def _repr_html_(self) -> str:
        _, html_rows, record = self._rows(read=True)
        out = fields_html(html_rows, "muster run")
        if record and self.id:
            try:
                # From the record just read, in one call: the last attempt's.
                by_id = {w["id"]: w for w in self._run_workers(timeout=5)}
                ps, workers = self._split(self._last_attempt(record), by_id)
                out += html_table([by_id[i] for i in ps + workers if i in by_id],
                                  self._client.url)
            except Exception:  # noqa: BLE001 (a display never raises)
                pass
        return out

"""Client: one connection to a muster controller, and its session's lease."""

from __future__ import annotations


import atexit
import http.client
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._common import (DEFAULT_TIMEOUT, _CLIENT_TIMEOUT, _HOW_TO_START, WorkerRef, Workers,
                      _env_lease, _launch_where, _own_kernel, _own_session, _read_small_file,
                      _state_dir, _worker_id, _worker_ids)
from ._errors import MusterError
from . import _cluster
from ._cluster import cli_args
from ._display import (AwaitResult, Worker, WorkerList, _link, counts, counts_text, esc,
                       fields_html, fields_text, status_html)
from ._progress import Progress
from ._run import Run
from ._version import __version__

class Client:
    """A connection to one muster controller.

    ``Client()`` finds the controller as the ``muster`` command line tool
    does: ``url`` from ``MUSTER_URL`` or the file ``$MUSTER_STATE_DIR/url``
    (default state directory ``~/.muster``), ``token`` from ``MUSTER_TOKEN``
    or ``$MUSTER_STATE_DIR/token``, ``session`` from ``MUSTER_SESSION`` or a
    session of the process's own. Arguments given explicitly win over the
    environment.

    Parameters:
        url (str): the controller, e.g. ``"http://127.0.0.1:8470"``.
        token (str): the API token (the controller's ``token`` file).
        session (str): the session that launched workers belong to, and that
            :meth:`stop_workers` with no ids and :meth:`list_workers` act on.
        timeout (float): seconds one call may take (await adds its own).
        lease (bool): hold the session's lease from the first launch on, so
            that the workers end with this process (default: on, unless
            ``MUSTER_LEASE=0``). ``False`` for workers meant to outlive it.
        lease_ttl (float): the lease's ttl in seconds (default 30, or
            ``MUSTER_LEASE_TTL``).

    Raises:
        MusterError: ``unreachable`` if no controller URL can be found.
    """

    def __init__(self, url=None, token=None, session=None, timeout=DEFAULT_TIMEOUT, lease=None,
                 lease_ttl=None):
        state_dir = _state_dir()
        if not url:
            url = os.environ.get("MUSTER_URL") or None
        if not url:
            url = _read_small_file(os.path.join(state_dir, "url"))
        if not url:
            raise MusterError(
                "unreachable",
                "no muster controller was found: MUSTER_URL is not set and %s "
                "does not exist. %s." % (os.path.join(state_dir, "url"), _HOW_TO_START))
        if token is None:
            token = os.environ.get("MUSTER_TOKEN") or None
        if token is None:
            token = _read_small_file(os.path.join(state_dir, "token"))
        if not session:
            session = os.environ.get("MUSTER_SESSION") or _own_session()
        env_on, env_ttl = _env_lease()
        # Code inside a worker inherits its launcher's session (whose holder
        # keeps its lease): no lease of its own by default.
        if lease is None and os.environ.get("MUSTER_WORKER_ID"):
            env_on = False
        self.lease = env_on if lease is None else bool(lease)
        self.lease_ttl = float(lease_ttl) if lease_ttl is not None else env_ttl
        if not 3 <= self.lease_ttl <= 86400:
            raise MusterError("invalid_value", "lease_ttl must be 3 to 86400 seconds (got %r)"
                              % self.lease_ttl, field="lease_ttl")
        self._lease_thread = None
        self._lease_stop = None
        self._lease_pid = None
        self._lease_holder = None
        self._part_expired = None
        self.lease_expired = False
        self._lease_lock = threading.Lock()
        self._launched = []  # ids this client launched in its session, for close()
        self._runs = []  # runs this client started, while they go on (_keep())
        self.lease_error = None

        url = url.strip().rstrip("/")
        if "://" not in url:
            url = "http://" + url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise MusterError("invalid_value",
                              "the controller URL must look like http://HOST:PORT "
                              "(got %r)" % url, field="url")
        self.url = url
        self.token = token
        self.session = session
        self.timeout = timeout
        self._parsed = parsed

    def __repr__(self):
        return "Client(url=%r, session=%r)" % (self.url, self.session)

    def _display_rows(self):
        """(name, text, HTML) rows that describe this client and its
        controller now; never raises (an unreachable controller is a row)."""
        rows = [("controller", self.url, _link(self.url, "", self.url)),
                ("session", self.session, esc(self.session))]
        lease = ("on (ttl %g s): the session's workers end with this process" % self.lease_ttl
                 if self.lease else "off: the workers outlive this process")
        rows.append(("lease", lease, esc(lease)))
        try:
            h = self._request("GET", "/api/v1/health", timeout=5)
            about = "muster %s, %s backend, %s" % (h.get("version"), h.get("backend"),
                                                   h.get("isolation") or "no isolation")
            rows.append(("server", about, esc(about)))
            answer = self._request("GET", "/api/v1/workers",
                                   query=[("session", self.session), ("limit", "500")], timeout=5)
            c = counts(answer.get("workers") or [])
            words = counts_text(c)
            rows.append(("workers", words, " ".join(
                status_html(s, "%d %s" % (n, s)) for s, n in c.items()) or "none"))
        except Exception as e:  # noqa: BLE001 (a display never raises)
            rows.append(("server", str(e), esc(str(e))))
        return rows

    def _repr_pretty_(self, p, cycle):
        p.text(fields_text([(k, v) for k, v, _ in self._display_rows()],
                           "muster Client"))

    def _repr_html_(self):
        return fields_html([(k, h) for k, _, h in self._display_rows()], "muster Client")

    # --- the session's lease ---------------------------------------------

    def _lease_path(self):
        return "/api/v1/sessions/%s/lease" % urllib.parse.quote(self.session, safe="")

    def _lease_body(self):
        return {"ttl_seconds": self.lease_ttl, "holder": self._lease_holder}

    def _hold_lease(self):
        """Takes this client's part of the session's lease (once) and starts
        renewing it. The session's lease is the union of its holders'
        parts: other clients of the same session hold parts of their own."""
        if not self.lease:
            return
        with self._lease_lock:
            if self._lease_thread is not None:
                return
            # A holder id of this process's own (a forked child that takes
            # a lease gets another).
            self._lease_holder = _own_session()
            self._request("PUT", self._lease_path(), self._lease_body())
            # Each renewal thread has its own stop: a close racing a new
            # launch never leaves an old thread running.
            stop = threading.Event()
            t = threading.Thread(target=self._renew, args=(stop,), name="muster-lease", daemon=True)
            self._lease_thread, self._lease_stop, self._lease_pid = t, stop, os.getpid()
            t.start()
            atexit.register(self._close_at_exit)

    def _close_at_exit(self):
        try:
            self.close()
        except MusterError as e:
            sys.stderr.write("muster: could not stop session %s's workers at exit (%s); they "
                             "stop when its lease runs out\n" % (self.session, e))

    def _renew(self, stop):
        wait = self.lease_ttl / 3
        while not stop.wait(wait):
            try:
                status = []
                ans = self._request("PUT", self._lease_path(), self._lease_body(),
                                    timeout=min(10.0, self.lease_ttl / 3), status_out=status)
                error = self._part_expired
                if status == [201] and self._lease_thread is not None:
                    # This holder's part had run out (this process stalled,
                    # or the controller was unreachable too long); it is
                    # held again. Said from now on.
                    if isinstance(ans, dict) and ans.get("workers_stopped"):
                        self.lease_expired = True  # the session's workers were stopped
                    else:
                        # Said from now on, as the C client does.
                        error = self._part_expired = (
                            "this client's part of session %s's lease had expired; other "
                            "holders kept the workers" % self.session)
                self.lease_error, wait = error, self.lease_ttl / 3
            except MusterError as e:
                # Tried again every second: a controller that restarts
                # gives the lease a full ttl of grace.
                self.lease_error, wait = str(e), 1.0

    def close(self, stop_workers: bool = True) -> None:
        """Ends the client's lease: stops the live workers this client
        launched (unless ``stop_workers=False``) and gives the lease back.
        Called at interpreter exit; does nothing if the client holds no
        lease, or in a process forked from the one that took it."""
        with self._lease_lock:
            t, self._lease_thread = self._lease_thread, None
            if t is None:
                return
            self._lease_stop.set()
            launched, self._launched = self._launched, []
            holder = self._lease_holder
        atexit.unregister(self._close_at_exit)
        if os.getpid() != self._lease_pid:
            return  # a forked child: the lease and the workers are its parent's
        # The renewal in flight ends first (bounded by its timeout): one left
        # on the wire could take the lease again after the DELETE.
        t.join(timeout=15)
        if stop_workers:
            # Runs going on in the background: their workers are under this
            # lease, which muster run (--no-lease) does not hold.
            for run in [r for r in self._runs if r._reader is not None and r._reader.is_alive()]:
                try:
                    run.stop()
                except MusterError as e:
                    sys.stderr.write("muster: could not stop run %s (%s)\n" % (run.id, e))
        if stop_workers and launched:
            # The live ones (ended workers may have been pruned since).
            mine = set(launched)
            live = [w["id"] for w in self.list_workers(status=["scheduling", "starting", "running"])
                    if w["id"] in mine]
            if live:
                self._request("POST", "/api/v1/workers/stop", {"ids": live})
        # Only this client's part ends: other holders of the session keep
        # theirs.
        try:
            self._request("DELETE", self._lease_path(), query={"holder": holder})
        except MusterError as e:
            if e.code != "not_found":  # it ran out already
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- transport -------------------------------------------------------

    def _tls_context(self):
        """The system's CAs, or MUSTER_CA_FILE's (as the C library and the
        CLI): the controller's --tls-cert is verified, its name too. Made
        once per client."""
        if getattr(self, "_tls", None) is None:
            ca = os.environ.get("MUSTER_CA_FILE") or None
            try:
                self._tls = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as e:
                raise MusterError("unreachable", "MUSTER_CA_FILE %s cannot be read as "
                                  "certificates (%s)" % (ca, e))
        return self._tls

    def _request(self, method, path, body=None, query=None, timeout=_CLIENT_TIMEOUT,
                 want="json", status_out=None):
        """One HTTP call; the decoded JSON (or text) answer, or MusterError."""
        p = self._parsed
        full = (p.path or "") + path
        if query:
            full += "?" + urllib.parse.urlencode(query, doseq=True)
        headers = {"Accept": "application/json" if want == "json" else "text/plain",
                   "User-Agent": "muster-python/" + __version__}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if timeout is _CLIENT_TIMEOUT:
            timeout = self.timeout
        if p.scheme == "https":
            conn = http.client.HTTPSConnection(p.hostname, p.port, timeout=timeout,
                                               context=self._tls_context())
        else:
            conn = http.client.HTTPConnection(p.hostname, p.port, timeout=timeout)
        try:
            try:
                conn.request(method, full, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except ssl.SSLCertVerificationError as e:
                raise MusterError("unreachable",
                                  "the muster controller at %s has a certificate this client "
                                  "cannot verify (%s): set MUSTER_CA_FILE to the file of the "
                                  "CA that signed it" % (self.url, e.verify_message or e))
            except socket.timeout:
                raise MusterError("timeout",
                                  "the muster controller at %s did not answer %s %s "
                                  "within %s s" % (self.url, method, path, timeout))
            except (OSError, http.client.HTTPException) as e:
                why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                       or type(e).__name__)
                raise MusterError("unreachable",
                                  "could not reach the muster controller at %s (%s): "
                                  "is it running? %s." % (self.url, why, _HOW_TO_START))
        finally:
            conn.close()

        status = resp.status
        if status_out is not None:
            status_out.append(status)
        if status >= 400:
            raise self._error_from(status, raw, method, path)
        if want == "text":
            return raw.decode("utf-8", errors="replace")
        if status == 204 or not raw:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise MusterError("protocol_error",
                              "%s %s answered %d with a body that is not JSON: %r"
                              % (method, path, status, raw[:200]), status=status)

    def _error_from(self, status, raw, method, path):
        try:
            err = json.loads(raw.decode("utf-8"))["error"]
            code, message = err["code"], err["message"]
            field = err.get("field")
            if not isinstance(code, str) or not isinstance(message, str):
                raise TypeError
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            return MusterError("protocol_error",
                               "%s %s answered HTTP %d with a body that is not a muster "
                               "error: %r" % (method, path, status, raw[:200]),
                               status=status)
        if code == "unauthorized" and not self.token:
            message += (" (no API token was found: set MUSTER_TOKEN, or MUSTER_STATE_DIR "
                        "to the controller's state directory)")
        return MusterError(code, message, field=field, status=status)

    @staticmethod
    def _expect(answer, key, method, path):
        if not isinstance(answer, dict) or not isinstance(answer.get(key), list):
            raise MusterError("protocol_error",
                              "%s %s answered without a %r list: %r"
                              % (method, path, key, answer))
        return answer[key]

    # --- the API -----------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """The controller's health: ``{"status": "ok", "version", "workers", "backend",
        "isolation"}`` (docs/design.md)."""
        return self._request("GET", "/api/v1/health")

    def launch_workers(self, n: int, cpu: float, memory: float, nvidia_gpu: int = 0,
                       kernel: Optional[str] = "python3", script: str = "", code: str = "",
                       env: Dict[str, str] = {}, args: Optional[List[str]] = None,
                       secret_env: Optional[Dict[str, str]] = None,
                       command: Optional[List[str]] = None, role: Optional[str] = None,
                       name: Optional[str] = None, session: Optional[str] = None,
                       cwd: Optional[str] = None, path: Optional[str] = None) -> WorkerList:
        """Launches worker engines.

        Each worker runs ``script`` (a file, run with ``kernel``), or
        ``code`` (inline source run with ``kernel``; code starting with
        ``!`` runs as a shell command), or ``command`` (an argv); with none
        of the three it is an idle worker that stays running until stopped.

        Parameters:
            n (int): the number of workers to launch (1..1024).
            cpu (float): CPU cores for each worker (fractional allowed).
            memory (float): memory in GiB for each worker (CML says GB).
            nvidia_gpu (int, optional): GPUs for each worker. Default 0.
            kernel (str, optional): the interpreter of ``script`` / ``code``:
                ``"python3"`` (default) is this process's own interpreter
                (``sys.executable``, so that packages installed from the
                notebook are there); or ``"bash"``, ``"sh"``, a path, or any
                program on the PATH.
            script (str, optional): the script file each worker runs; a
                relative path resolves against ``cwd``.
            code (str, optional): the source each worker runs (instead of
                ``script``).
            env (dict, optional): environment variables for the workers.
            args (list of str, optional): arguments of the script, code or
                command.
            secret_env (dict, optional): environment variables that reach the
                workers but are never shown back (only their names are).
            command (list of str, optional): an argv run directly.
            role (str, optional): a role label (default ``"worker"``).
            name (str, optional): a name for the workers.
            session (str, optional): the session they belong to (default: the
                client's session).
            cwd (str, optional): the absolute directory the workers start in
                (default: this process's working directory, as CML's workers
                start in the project directory; ``""``, or ``MUSTER_SEND_CWD=0``
                in the environment: the controller's ``--workdir``).
            path (str, optional): the PATH their commands are looked up on
                (default: this process's ``PATH`` less its empty and ``.``
                entries; ``""``, or ``MUSTER_SEND_PATH=0`` in the environment:
                the worker's own). A cwd or PATH that is not UTF-8 raises
                ``MusterError`` naming it.

        Returns:
            list of dict: the launched workers, as the REST API describes
            them (``id``, ``status``, ``ip_address``, ...). Their
            ``ip_address`` is known once :func:`await_workers` says they are
            running.

        Raises:
            MusterError: e.g. ``invalid_value`` naming the field, or
            ``exceeds_capacity`` for a request that could never fit.
        """
        body = {"n": n, "cpu": cpu, "memory": memory, "nvidia_gpu": nvidia_gpu}
        if kernel == "python3":
            kernel = _own_kernel()
        if kernel is not None:
            body["kernel"] = kernel
        cwd, path = _launch_where(cwd, path)
        # Empty strings and dicts are "not given"; an empty command or args
        # list is the caller's (and the controller says what is wrong).
        given = {"cwd": cwd or None, "path": path or None, "script": script or None,
                 "code": code or None, "command": command, "args": args, "env": env or None,
                 "secret_env": secret_env or None, "role": role, "name": name}
        body.update((k, v) for k, v in given.items() if v is not None)
        body["session"] = session or self.session
        if body["session"] == self.session:
            self._hold_lease()
        answer = self._request("POST", "/api/v1/workers", body)
        workers = self._expect(answer, "workers", "POST", "/api/v1/workers")
        if body["session"] == self.session and self.lease:
            with self._lease_lock:
                self._launched.extend(w["id"] for w in workers if isinstance(w, dict))
        return WorkerList(workers, self.url)

    def await_workers(self, ids: Workers, wait_for_completion: bool = True,
                      timeout_seconds: float = 60, progress: Optional[bool] = None) -> AwaitResult:
        """Waits for workers to come up, or to finish.

        Parameters:
            ids: the workers: a list of worker ids or of worker dicts (as
                returned by :func:`launch_workers`), or a single one.
            wait_for_completion (bool, optional): if True (default), wait
                until every worker has finished; if False, until every one is
                running (its ``ip_address`` known) or has finished.
            timeout_seconds (int, optional): give up after this many seconds
                (default 60; 0 waits without limit). Workers still pending
                then are not stopped.

            progress (bool, optional): show how many are scheduling,
                starting and running, and why any still waits, updated in
                place (default: in a notebook, or when stderr is a terminal;
                never with ``MUSTER_PROGRESS=0``).

        A KeyboardInterrupt (the notebook's stop button, ^C) ends the wait at
        once, leaves the workers as they are and says how to stop them.

        Returns:
            dict (shown as a table): ``{"workers": [...], "failures": [...], "timed_out": bool,
            "waiting_for": {id: why}}``.
            ``workers`` holds the workers that reached the target (running,
            or succeeded with ``wait_for_completion``); ``failures`` every
            other one: failed, stopped, finished before it ran, or still
            pending when the timeout hit. ``waiting_for`` says, for each one
            still ``scheduling`` at the timeout, what it waits for (e.g.
            ``"1 core (0 free of 2)"``); :func:`run_cluster` raises with it.

        Raises:
            MusterError: e.g. ``not_found`` for an unknown id.
        """
        wanted = _worker_ids(ids)
        body = {"ids": wanted, "wait_for_completion": bool(wait_for_completion),
                "timeout_seconds": timeout_seconds}
        pm = Progress("await_workers", len(wanted), progress)
        number = (isinstance(timeout_seconds, (int, float))
                  and not isinstance(timeout_seconds, bool) and timeout_seconds >= 0)
        try:
            if pm.mode is None or not number:
                answer = self._await_once(body, timeout_seconds)
            else:
                # Half-second waits, the display redrawn between them.
                deadline = time.monotonic() + timeout_seconds if timeout_seconds else None
                answer = None
                while True:
                    left = None if deadline is None else deadline - time.monotonic()
                    if answer is not None and left is not None and left <= 0:
                        break
                    part = 0.5 if left is None else max(0.001, min(0.5, left))
                    answer = self._await_once(dict(body, timeout_seconds=part), part)
                    if not isinstance(answer, dict) or not answer.get("timed_out"):
                        break  # (what is not a dict: _expect says so below)
                    self._show(pm, list(answer.get("workers") or []) +
                               list(answer.get("failures") or []))
        except KeyboardInterrupt:
            pm.close("interrupted")
            shown = (", ".join(repr(w) for w in wanted) if len(wanted) <= 3 else
                     "<the %d workers you awaited>" % len(wanted))
            raise KeyboardInterrupt(
                "await_workers was interrupted; the %d worker%s %s left as %s %s%s. Stop "
                "%s with stop_workers(%s), or every worker of this session with "
                "stop_workers()" % (
                    len(wanted), "" if len(wanted) == 1 else "s",
                    "is" if len(wanted) == 1 else "are", "it" if len(wanted) == 1 else "they",
                    "is" if len(wanted) == 1 else "are",
                    " (%s)" % pm.counts if pm.counts else "",
                    "it" if len(wanted) == 1 else "them", shown)) from None
        path = "/api/v1/workers/await"
        failures = self._expect(answer, "failures", "POST", path)
        done = AwaitResult({
            "workers": WorkerList(self._expect(answer, "workers", "POST", path), self.url),
            "failures": WorkerList(failures, self.url),
            "timed_out": bool(answer.get("timed_out", False)),
            "waiting_for": {w["id"]: w["waiting_for"] for w in failures
                            if isinstance(w, dict) and w.get("status") == "scheduling"
                            and w.get("waiting_for")}})
        if pm.mode:
            self._show(pm, done._all())
            pm.close("timed out" if done["timed_out"] else "done")
        return done

    @staticmethod
    def _show(pm, workers):
        """Redraws the progress display; one that fails (a broken display,
        a closed stderr) is turned off, never the wait."""
        try:
            pm.update(workers)
        except Exception as e:  # noqa: BLE001
            pm.mode = None
            sys.stderr.write("muster: the progress display failed (%s); waiting without it\n" % e)

    def _await_once(self, body, timeout_seconds):
        """One POST /workers/await, its socket given the wait and 30 s more."""
        sock_timeout = None
        if isinstance(timeout_seconds, (int, float)) and not isinstance(timeout_seconds, bool) \
                and timeout_seconds > 0:
            sock_timeout = float(timeout_seconds) + 30.0
        elif timeout_seconds != 0:
            sock_timeout = self.timeout  # the server refuses the value at once
        return self._request("POST", "/api/v1/workers/await", body, timeout=sock_timeout)

    def stop_workers(self, *worker_id: Workers) -> WorkerList:
        """Stops workers.

        Parameters:
            *worker_id: the workers to stop, as ids or worker dicts (a list
                of them is accepted too). With none, every live worker of
                the client's session is stopped.

        Returns:
            list of dict: the workers, now stopped (or already finished).
        """
        ids = _worker_ids(worker_id, "worker_id") if worker_id else []
        body = {"ids": ids} if ids else {"session": self.session}
        answer = self._request("POST", "/api/v1/workers/stop", body)
        return WorkerList(self._expect(answer, "workers", "POST", "/api/v1/workers/stop"),
                          self.url)

    def list_workers(self, status: Union[str, Sequence[str], None] = None,
                     role: Optional[str] = None, all_sessions: bool = False) -> WorkerList:
        """Lists the workers of the client's session, newest first.

        Parameters:
            status (str or list of str, optional): only workers in these
                states (``"scheduling"``, ``"starting"``, ``"running"``,
                ``"succeeded"``, ``"failed"``, ``"stopped"``).
            role (str, optional): only workers with this role.
            all_sessions (bool, optional): list the workers of every session.

        Returns:
            list of dict: the workers.
        """
        query = []
        if not all_sessions:
            query.append(("session", self.session))
        if status:
            for s in ([status] if isinstance(status, str) else status):
                query.append(("status", s))
        if role:
            query.append(("role", role))
        # The controller answers in pages (newest first); gather them all.
        query.append(("limit", "5000"))
        workers, cursor = [], None
        while True:
            page = query + ([("before", cursor)] if cursor else [])
            answer = self._request("GET", "/api/v1/workers", query=page)
            workers.extend(self._expect(answer, "workers", "GET", "/api/v1/workers"))
            cursor = answer.get("next") if isinstance(answer, dict) else None
            if not cursor:
                return WorkerList(workers, self.url)

    def get_worker(self, worker_id: WorkerRef) -> Worker:
        """Returns one worker (a dict), given its id or its worker dict."""
        wid = _worker_id(worker_id, "id")
        answer = self._request("GET", "/api/v1/workers/" + urllib.parse.quote(wid, safe=""))
        if not isinstance(answer, dict) or "id" not in answer:
            raise MusterError("protocol_error", "GET of worker %s answered %r" % (wid, answer))
        return Worker(answer, self.url)

    def run_cluster(self, n_workers: int, n_ps: int, cpu: float, memory: float,
                    nvidia_gpu: int = 0, worker_script: Optional[str] = None,
                    timeout_seconds: float = 60, mode: Optional[str] = None,
                    command: Optional[List[str]] = None, port: int = 2222,
                    output: Optional[Callable[[str], Any]] = None,
                    ps_cpu: Optional[float] = None, ps_memory: Optional[float] = None,
                    max_restarts: int = 0, progress: Optional[bool] = None,
                    wait: bool = True) -> Run:
        """Launches a cluster, trains across it and stops it, as CML's
        ``cdsw_tensorflow_utils.run_cluster`` did (with no shared file system
        and no SSH).

        ``mode`` is ``"ps"`` (the default when ``n_ps`` > 0: the command runs on
        every parameter server and worker with ``TF_CONFIG``), ``"allreduce"``
        (``mpirun`` here, the MPI daemons started inside the workers) or
        ``"exec"`` (the command on every worker with torchrun's ``MASTER_ADDR``,
        ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``). The command is
        ``python3 worker_script`` or ``command`` (a list).

        Output is printed as it comes, prefixed with role and index (or handed
        to ``output(line)``), and kept in each worker's log. Returns a
        :class:`Run`: ``{"exit_code": 0, "summary": <the last line of worker 0
        / rank 0, parsed if JSON>, "run": <the run's id>, "restarts": <how
        many>}``, whose ``logs(rank)`` reads a rank's output back; raises
        :class:`MusterError` (code ``"training_failed"``, with the same
        :class:`Run` as ``.run``) naming the worker that failed and why (every
        cause, after restarts; workers that did not start in
        ``timeout_seconds``: what each waited for), or with the launch's
        refusal (``"exceeds_capacity"``: workers that could never run at once,
        with the arithmetic), or with the code of any other call of ``muster
        run``'s own that failed (``"unreachable"``, ``"conflict"``, ...: its
        ``muster run: ERROR: <code>: ...`` line). The workers are stopped in
        every case.

        ``max_restarts`` (torchrun's ``--max-restarts``): when a worker or a
        rank fails, every worker is stopped, new ones start and the command
        runs again, up to that many times; ``muster-train`` resumes from its
        last checkpoint. The run is recorded (:func:`list_runs`), and lasts
        no longer than this process: it runs under the client's lease.

        ``progress`` (default: in a notebook or on a terminal): a display of
        how many workers are scheduling, starting and running, and why any
        waits, updated in place. ``wait=False`` returns as soon as the run
        is recorded; it goes on in the background (``run.wait()``,
        ``run.output``). A KeyboardInterrupt (the notebook's stop button)
        ends the wait at once and leaves the run going on, saying how to get
        it back (:meth:`attach_run`) and stop it.

        It runs the ``muster`` command line tool (``muster run``): from
        ``MUSTER_CLI``, beside this source tree's build, or on the PATH.
        """
        args = cli_args(self, n_workers, n_ps, cpu, memory, nvidia_gpu, worker_script,
                        timeout_seconds, mode, command, port, ps_cpu, ps_memory, max_restarts)
        return _cluster.run_cluster(self, n_workers, n_ps, args, mode, output, progress, wait)

    def _keep(self, run):
        """Remembers a run while it goes on: attach_run() finds it, close()
        stops it."""
        self._runs = [r for r in self._runs if r._reader is not None and r._reader.is_alive()]
        self._runs.append(run)

    def attach_run(self, run_id: str) -> Run:
        """A :class:`Run` for a run by its id: the one this client started
        in the background (``run_cluster(wait=False)``, or one a
        KeyboardInterrupt left going on), else the run as the controller
        knows it."""
        for run in reversed(self._runs):
            if run.id == run_id:
                return run
        record = self.get_run(run_id)
        return Run(self, {"exit_code": None, "summary": record.get("summary"), "run": run_id,
                          "restarts": record.get("restarts", 0)})

    def list_runs(self, status: Optional[str] = None,
                  all_sessions: bool = False) -> List[Dict[str, Any]]:
        """Lists the runs of the client's session (of all, with
        ``all_sessions``), newest first: dicts with ``id``, ``mode``,
        ``status``, ``command``, ``workers``, ``restarts``, ``causes``,
        ``summary``, ``failure``, ..."""
        query = [("limit", "5000")]
        if not all_sessions:
            query.append(("session", self.session))
        if status:
            query.append(("status", status))
        runs, cursor = [], None
        while True:
            answer = self._request("GET", "/api/v1/runs",
                                   query=query + ([("before", cursor)] if cursor else []))
            runs.extend(self._expect(answer, "runs", "GET", "/api/v1/runs"))
            cursor = answer.get("next") if isinstance(answer, dict) else None
            if not cursor:
                return runs

    def get_run(self, run_id: str) -> Dict[str, Any]:
        """Returns one run (a dict), given its id."""
        if not isinstance(run_id, str) or not re.fullmatch(r"r-[a-z0-9]{10}", run_id):
            raise MusterError("invalid_value", "not a run id: %r" % (run_id,), field="run_id")
        return self._request("GET", "/api/v1/runs/" + run_id)

    def run_metrics(self, run_id: str, names: Union[str, Sequence[str], None] = None,
                    since: int = 0, max_points: Optional[int] = None) -> Dict[str, Any]:
        """A run's metrics: ``{"points": [{"step", "epoch", "rank", "at",
        "values": {name: value}}, ...], "next_since"}``, grouped by series
        (a name of a rank), each in order. ``names``: a list or comma string
        of the names wanted; ``since``: an earlier answer's ``next_since``;
        ``max_points``: at most so many points per series (a point that
        merges several adds ``"min"``, ``"max"`` and ``"n"``)."""
        self.get_run(run_id)  # checks the id, and that the run is there
        query = [("since", str(int(since)))]
        if names:
            query.append(("names", names if isinstance(names, str) else ",".join(names)))
        if max_points:
            query.append(("max_points", str(int(max_points))))
        return self._request("GET", "/api/v1/runs/%s/metrics" % run_id, query=query)

    def worker_logs(self, worker_id: WorkerRef, stream: str = "stdout",
                    offset: Optional[int] = None) -> str:
        """Returns what a worker wrote to ``stream`` (``"stdout"`` or ``"stderr"``).

        Parameters:
            worker_id: the worker's id, or its dict.
            stream (str, optional): ``"stdout"`` (default) or ``"stderr"``.
            offset (int, optional): skip this many bytes of the log.

        Returns:
            str: the log, decoded as UTF-8.
        """
        wid = _worker_id(worker_id, "id")
        query = [("stream", stream)]
        if offset is not None:
            query.append(("offset", str(offset)))
        return self._request("GET", "/api/v1/workers/%s/logs" % urllib.parse.quote(wid, safe=""),
                             query=query, want="text")


# --- module-level functions, as in CML's cdsw module -------------------------


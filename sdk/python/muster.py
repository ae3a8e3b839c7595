"""muster: launch, await and stop workers from a notebook.

A stdlib-only client for the muster controller's REST API (see docs/design.md).
It mirrors the workers API of Cloudera CML's ``cdsw`` module, so that code
written for CML runs unchanged after one import::

    import muster as cdsw

    workers = cdsw.launch_workers(n=2, cpu=0.2, memory=0.5,
                                  code="print('Hello from a worker')")
    done = cdsw.await_workers(workers, wait_for_completion=True)
    for w in done["workers"]:
        print(w["id"], w["ip_address"])
    cdsw.stop_workers()

Where the controller is (the same rules as the ``muster`` command line tool):

- URL: ``MUSTER_URL``, else the file ``url`` in the controller's state
  directory (``MUSTER_STATE_DIR``, default ``~/.muster``);
- token: ``MUSTER_TOKEN``, else the file ``token`` in that directory;
- session: ``MUSTER_SESSION``, else one of the process's own, named after
  the host, the process id and a random suffix (so two notebooks never list
  or stop each other's workers).

Workers end with the process that launched them, as in CML: from its first
launch on, a client holds its session's lease and renews it from a daemon
thread (every ttl/3; ttl 30 s, or ``MUSTER_LEASE_TTL``). A clean exit (or
:meth:`Client.close`) stops the workers this client launched at once; a
process that dies (a kernel restart, ``kill -9``) stops renewing, and the
controller stops them when the lease runs out. For workers meant to outlive
the notebook, pass ``lease=False`` to :func:`configure` or :class:`Client`
(or set ``MUSTER_LEASE=0``).

Every failure raises :class:`MusterError`, whose ``code`` is the REST error
name (``invalid_value``, ``unauthorized``, ``not_found``, ...),
``unreachable`` when no controller answers, ``timeout`` when it does not
answer in time, ``protocol_error`` when the answer is not what the API
promises, ``io_error`` for a local file, or ``training_failed`` from
:meth:`Client.run_cluster`.
"""

import atexit
import collections
import http.client
import json
import math
import os
import random
import re
import socket
import ssl
import sys
import threading
import urllib.parse
from time import time as _time

__all__ = [
    "MusterError",
    "Client",
    "Run",
    "configure",
    "default_client",
    "launch_workers",
    "await_workers",
    "stop_workers",
    "list_workers",
    "get_worker",
    "worker_logs",
    "run_cluster",
    "list_runs",
    "get_run",
    "run_metrics",
    "log_metrics",
    "flush_metrics",
]

__version__ = "0.2.0"

DEFAULT_LEASE_TTL = 30.0
"""Seconds a client's lease lasts without a renewal (renewed every ttl/3)."""
DEFAULT_TIMEOUT = 30.0
"""Seconds one HTTP call may take (await adds its own timeout to this)."""

_CLIENT_TIMEOUT = object()  # "use the client's timeout"

_HOW_TO_START = (
    "Start one with `muster-controller` (it writes its URL and token to "
    "~/.muster, or with --state-dir DIR to DIR: then set MUSTER_STATE_DIR=DIR), "
    "or set MUSTER_URL and MUSTER_TOKEN to reach a running controller"
)


def _visible(text, keep_lines=False):
    """text with its control characters written out (\\x1b, \\r; the C1
    controls as \\u0080...), newlines and tabs too unless keep_lines: what a
    worker or a launch set, shown so that it cannot drive a terminal."""
    if not isinstance(text, str):
        return text
    out = []
    for ch in text:
        n = ord(ch)
        if keep_lines and ch in "\n\t":
            out.append(ch)
        elif n < 0x20 or 0x7f <= n <= 0x9f:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
                ch, "\\x%02x" % n if n < 0x80 else "\\u%04x" % n))
        else:
            out.append(ch)
    return "".join(out)


class MusterError(Exception):
    """An error from the muster controller, or on the way to it.

    Attributes:
        code: the REST error name, e.g. ``"invalid_value"``, ``"unauthorized"``,
            ``"not_found"``; ``"unreachable"`` when no controller answered,
            ``"timeout"`` when it did not answer in time, ``"protocol_error"``
            when its answer was not the JSON the API promises.
        message: the sentence saying what was wrong.
        field: the request field the error is about, or ``None``.
        status: the HTTP status of the answer, or ``None`` if there was none.
        run: for a failed :meth:`Client.run_cluster`, its :class:`Run` (to read
            each rank's output back); else ``None``.
    """

    def __init__(self, code, message, field=None, status=None):
        self.run = None
        self.code = code
        self.message = message
        self.field = field
        self.status = status
        super().__init__(self.__str__())

    def __str__(self):
        # A message may quote a worker's failure (its stderr's tail): its
        # control characters are written out, so that a traceback cannot
        # drive the reader's terminal; its lines stay lines.
        s = "%s: %s" % (self.code, _visible(self.message, keep_lines=True))
        if self.field:
            s += " (field: %s)" % _visible(self.field)
        return s

    def __repr__(self):
        return "MusterError(code=%r, message=%r, field=%r, status=%r)" % (
            self.code, self.message, self.field, self.status)


def _state_dir():
    d = os.environ.get("MUSTER_STATE_DIR")
    if d:
        return d
    return os.path.join(os.path.expanduser("~"), ".muster")


def _read_small_file(path):
    """The stripped content of path, or None if it is missing or empty."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            s = f.read(4096).strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise MusterError("io_error", "could not read %s: %s" % (path, e.strerror or e))
    return s or None


def _worker_id(w, what="ids"):
    """The id of w, a worker id string or a worker dict."""
    if isinstance(w, str) and w:
        return w
    if isinstance(w, dict):
        wid = w.get("id")
        if isinstance(wid, str) and wid:
            return wid
        raise MusterError("invalid_value",
                          "a worker dict must carry its \"id\" (got keys %s)"
                          % sorted(w.keys()), field=what)
    raise MusterError("invalid_value",
                      "a worker must be given as its id string or as the worker "
                      "dict (got %s %r)" % (type(w).__name__, w), field=what)


def _worker_ids(ws, what="ids"):
    """Ids of ws: one id/dict, or a list/tuple of them (nested lists flattened)."""
    if isinstance(ws, (str, dict)):
        return [_worker_id(ws, what)]
    out = []
    try:
        items = list(ws)
    except TypeError:
        raise MusterError("invalid_value",
                          "expected a worker id, a worker dict or a list of them "
                          "(got %s)" % type(ws).__name__, field=what)
    for w in items:
        if isinstance(w, (list, tuple)):
            out.extend(_worker_ids(w, what))
        else:
            out.append(_worker_id(w, what))
    return out


def _own_session():
    """A session name of this process's own: host, pid, random suffix."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname() or "host")[:40] or "host"
    suffix = "".join(random.SystemRandom().choice("abcdefghijklmnopqrstuvwxyz0123456789")
                     for _ in range(6))
    return "%s-%d-%s" % (host, os.getpid(), suffix)


def _env_lease():
    """The lease settings from the environment: (on, ttl)."""
    on = os.environ.get("MUSTER_LEASE", "").strip().lower() not in ("0", "off", "no", "false")
    try:
        ttl = float(os.environ.get("MUSTER_LEASE_TTL") or DEFAULT_LEASE_TTL)
    except ValueError:
        raise MusterError("invalid_value", "MUSTER_LEASE_TTL must be a number of seconds (got %r)"
                          % os.environ.get("MUSTER_LEASE_TTL"), field="MUSTER_LEASE_TTL")
    return on, ttl


class Run(dict):
    """What :meth:`Client.run_cluster` returns: a dict (``exit_code``,
    ``summary``, ``run``, ``restarts``) that also reads the run's output back.

    Every rank's output is kept in its worker's log, so it can be read after
    the run, the cell's printout gone: ``run.logs(1)`` is rank 1's (in
    ``"ps"`` mode: worker 1's; ``role="ps"`` for a parameter server's).
    A failed run's :class:`MusterError` carries the same object as ``.run``.
    """

    def __init__(self, client, values, n_workers, n_ps):
        super().__init__(values)
        self._client = client
        self._size = (int(n_workers), int(n_ps))

    def worker_ids(self, role="worker"):
        """The ids of the last attempt's workers of ``role`` (``"worker"``
        or ``"ps"``), rank (or index) order."""
        if not self.get("run"):
            raise MusterError("not_found", "the run was not recorded, so its workers are unknown")
        n_workers, n_ps = self._size
        ids = self._client.get_run(self["run"])["workers"][-(n_workers + n_ps):]
        return ids[:n_ps] if role == "ps" else ids[n_ps:]

    def logs(self, rank=0, stream="stdout", role="worker"):
        """What rank ``rank`` (worker ``rank`` of ``role``) of the last
        attempt wrote to ``stream`` (``"stdout"`` or ``"stderr"``)."""
        ids = self.worker_ids(role)
        if not isinstance(rank, int) or not 0 <= rank < len(ids):
            raise MusterError("invalid_value", "rank must be 0..%d (the run had %d %s%s), not %r" % (
                len(ids) - 1, len(ids), role, "" if len(ids) == 1 else "s", rank), field="rank")
        return self._client.worker_logs(ids[rank], stream)


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
            import sys
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

    def close(self, stop_workers=True):
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

    def health(self):
        """The controller's health: ``{"status": "ok", "version", "workers", "backend",
        "isolation"}`` (docs/design.md)."""
        return self._request("GET", "/api/v1/health")

    def launch_workers(self, n, cpu, memory, nvidia_gpu=0, kernel="python3", script="",
                       code="", env={}, args=None, secret_env=None, command=None,
                       role=None, name=None, session=None, cwd=None, path=None):
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
        if cwd:
            body["cwd"] = cwd
        if path:
            body["path"] = path
        if script:
            body["script"] = script
        if code:
            body["code"] = code
        if command is not None:
            body["command"] = command
        if args is not None:
            body["args"] = args
        if env:
            body["env"] = env
        if secret_env:
            body["secret_env"] = secret_env
        if role is not None:
            body["role"] = role
        if name is not None:
            body["name"] = name
        body["session"] = session or self.session
        if body["session"] == self.session:
            self._hold_lease()
        answer = self._request("POST", "/api/v1/workers", body)
        workers = self._expect(answer, "workers", "POST", "/api/v1/workers")
        if body["session"] == self.session and self.lease:
            with self._lease_lock:
                self._launched.extend(w["id"] for w in workers if isinstance(w, dict))
        return workers

    def await_workers(self, ids, wait_for_completion=True, timeout_seconds=60):
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

        Returns:
            dict: ``{"workers": [...], "failures": [...], "timed_out": bool,
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
        body = {"ids": _worker_ids(ids), "wait_for_completion": bool(wait_for_completion),
                "timeout_seconds": timeout_seconds}
        sock_timeout = None
        if isinstance(timeout_seconds, (int, float)) and not isinstance(timeout_seconds, bool) \
                and timeout_seconds > 0:
            sock_timeout = float(timeout_seconds) + 30.0
        elif timeout_seconds != 0:
            sock_timeout = self.timeout  # the server refuses the value at once
        answer = self._request("POST", "/api/v1/workers/await", body, timeout=sock_timeout)
        path = "/api/v1/workers/await"
        failures = self._expect(answer, "failures", "POST", path)
        return {"workers": self._expect(answer, "workers", "POST", path),
                "failures": failures,
                "timed_out": bool(answer.get("timed_out", False)),
                "waiting_for": {w["id"]: w["waiting_for"] for w in failures
                                if isinstance(w, dict) and w.get("status") == "scheduling"
                                and w.get("waiting_for")}}

    def stop_workers(self, *worker_id):
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
        return self._expect(answer, "workers", "POST", "/api/v1/workers/stop")

    def list_workers(self, status=None, role=None, all_sessions=False):
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
                return workers

    def get_worker(self, worker_id):
        """Returns one worker (a dict), given its id or its worker dict."""
        wid = _worker_id(worker_id, "id")
        answer = self._request("GET", "/api/v1/workers/" + urllib.parse.quote(wid, safe=""))
        if not isinstance(answer, dict) or "id" not in answer:
            raise MusterError("protocol_error", "GET of worker %s answered %r" % (wid, answer))
        return answer

    def run_cluster(self, n_workers, n_ps, cpu, memory, nvidia_gpu=0, worker_script=None,
                    timeout_seconds=60, mode=None, command=None, port=2222, output=None,
                    ps_cpu=None, ps_memory=None, max_restarts=0):
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

        It runs the ``muster`` command line tool (``muster run``): from
        ``MUSTER_CLI``, beside this file's build, or on the PATH.
        """
        import subprocess
        import shutil

        if command is None:
            if not worker_script:
                raise MusterError("invalid_value", "give worker_script or command", "worker_script")
            # (relative to this process's directory, where muster run starts
            # the workers)
            command = [_own_kernel(), worker_script]
        if isinstance(command, str):
            raise MusterError("invalid_value", "command must be a list of strings", "command")
        if mode is None:
            mode = "ps" if n_ps else "allreduce"
        if mode not in ("ps", "allreduce", "exec"):
            raise MusterError("invalid_value", "mode must be ps, allreduce or exec", "mode")
        here = os.path.dirname(os.path.abspath(__file__))
        cli = os.environ.get("MUSTER_CLI") or next(
            (c for c in (os.path.join(here, "..", "..", "build", "muster"),) if os.access(c, os.X_OK)),
            None) or shutil.which("muster")
        if not cli:
            raise MusterError("unreachable", "the muster command line tool was not found: set "
                              "MUSTER_CLI or put muster on the PATH")
        args = [cli, "run", "--mode", mode, "--workers", str(int(n_workers)), "--cpu", str(cpu),
                "--memory", str(memory), "--gpu", str(int(nvidia_gpu)), "--port", str(int(port)),
                "--timeout", str(timeout_seconds)]
        if mode == "ps":
            args += ["--ps", str(int(n_ps))]
            if ps_cpu:
                args += ["--ps-cpu", str(ps_cpu)]
            if ps_memory:
                args += ["--ps-memory", str(ps_memory)]
        if max_restarts:
            args += ["--max-restarts", str(int(max_restarts))]
        if self.lease:
            # The run's workers are the session's: the client's lease
            # covers them (muster run must not give it back at its end).
            self._hold_lease()
            args += ["--no-lease"]
        args += ["--"] + [str(a) for a in command]
        env = dict(os.environ, MUSTER_URL=self.url, MUSTER_TOKEN=self.token,
                   MUSTER_SESSION=self.session)
        # UTF-8 whatever the locale (the arithmetic of a refusal has "×").
        with subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              encoding="utf-8", errors="replace", bufsize=1) as proc:
            last, failure, run_id, restarts, refused = None, None, None, 0, None
            said = None
            quoting = False
            for line in proc.stdout:
                line = line.rstrip("\n")
                (output or print)(line)
                # The lines of a worker's stderr that its failure quotes
                # follow it, indented.
                if quoting and line.startswith("  "):
                    failure += "\n" + line[2:]
                    continue
                quoting = False
                if line.startswith("muster run: FAILED: "):
                    failure = line[len("muster run: FAILED: "):]
                    quoting = True
                elif line.startswith("muster run: ERROR: "):
                    # A call of muster run's own failed ("muster run: ERROR:
                    # exceeds_capacity: 3 workers × 1 core = 3 cores, but
                    # ..."): its code and words. Only this prefix: mpirun's
                    # untagged lines pass through as they are, and the rsh
                    # agent's "muster: poll: ..." is not muster run's error.
                    code_words = line[len("muster run: ERROR: "):].split(": ", 1)
                    if len(code_words) == 2 and re.match(r"^[a-z_]+$", code_words[0]):
                        refused = code_words
                elif line.startswith("muster: ") and said is None:
                    # muster run's own first word on a usage error (exit 2)
                    # or an unreachable controller (exit 5), before mpirun
                    # or any worker ran.
                    said = line[len("muster: "):]
                elif line.startswith("muster run: restart "):
                    restarts += 1
                elif line.startswith("muster run: the workers were stopped; the run is "):
                    run_id = line.split("the run is ", 1)[1].split(";", 1)[0]
                elif line.startswith(("[worker-0] ", "[rank-0] ")):
                    last = line.split("] ", 1)[1]
            code = proc.wait()
        n_ps = int(n_ps) if mode == "ps" else 0
        if code != 0 and failure is None and refused is not None:
            m = re.match(r"^(.*) \(field: ([a-z_]+)\)$", refused[1])
            raise MusterError(refused[0], m.group(1) if m else refused[1], m and m.group(2))
        if code in (2, 5) and failure is None and said is not None:
            raise MusterError("invalid_value" if code == 2 else "unreachable", said)
        if code != 0:
            err = MusterError("training_failed",
                              failure or "muster run exited with code %d" % code)
            err.run = Run(self, {"exit_code": code, "summary": None, "run": run_id,
                                 "restarts": restarts}, n_workers, n_ps)
            raise err
        summary = last
        if last:
            try:
                summary = json.loads(last)
            except ValueError:
                pass
        return Run(self, {"exit_code": 0, "summary": summary, "run": run_id, "restarts": restarts},
                   n_workers, n_ps)

    def list_runs(self, status=None, all_sessions=False):
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

    def get_run(self, run_id):
        """Returns one run (a dict), given its id."""
        if not isinstance(run_id, str) or not re.fullmatch(r"r-[a-z0-9]{10}", run_id):
            raise MusterError("invalid_value", "not a run id: %r" % (run_id,), field="run_id")
        return self._request("GET", "/api/v1/runs/" + run_id)

    def run_metrics(self, run_id, names=None, since=0, max_points=None):
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

    def worker_logs(self, worker_id, stream="stdout", offset=None):
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

_default_client = None


def configure(url=None, token=None, session=None, timeout=DEFAULT_TIMEOUT, lease=None,
              lease_ttl=None):
    """Sets the client the module functions use, and returns it.

    Arguments left out are found as :class:`Client` finds them (environment,
    then the controller's state directory).
    """
    global _default_client
    _default_client = Client(url=url, token=token, session=session, timeout=timeout, lease=lease,
                             lease_ttl=lease_ttl)
    return _default_client


def default_client():
    """The client the module functions use, created at first use from the
    environment (see :class:`Client`)."""
    global _default_client
    if _default_client is None:
        _default_client = Client()
    return _default_client


def _own_kernel():
    """This process's interpreter (sys.executable), where it is a python
    (its name starts with "python": not the host program of an embedded
    interpreter such as uwsgi) that can be run, and the controller takes it
    as a kernel (a path of letters, digits and . _ - + /, at most 255
    characters); else "python3"."""
    exe = sys.executable or ""
    if (exe and len(exe) <= 255 and re.fullmatch(r"[A-Za-z0-9._+/-]+", exe)
            and os.path.basename(exe).startswith("python") and os.access(exe, os.X_OK)):
        return exe
    return "python3"


def _sends(name):
    """Whether the environment variable name (MUSTER_SEND_CWD or
    MUSTER_SEND_PATH) lets a launch send this process's cwd or PATH: any
    value but "0"."""
    return os.environ.get(name) != "0"


def _client_path(path):
    """path without its empty and "." entries (which would search the
    workers' cwd)."""
    return ":".join(e for e in path.split(":") if e and e != ".")


def _utf8(value, field):
    """value, or MusterError naming field where it is not UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MusterError("invalid_value", "%s %r is not UTF-8: give %s" % (field, value, field),
                          field) from None
    return value


def _launch_where(cwd, path):
    """The cwd and PATH a launch sends: by default this process's working
    directory and PATH (unless MUSTER_SEND_CWD=0 / MUSTER_SEND_PATH=0);
    "" sends none (the controller's --workdir, the worker's own PATH)."""
    if cwd is None:
        cwd = ""
        if _sends("MUSTER_SEND_CWD"):
            try:
                cwd = os.getcwd()
            except OSError as e:
                raise MusterError("invalid_value",
                                  "the notebook's working directory no longer exists (%s): "
                                  "pass cwd=" % (e.strerror or e), "cwd") from None
    if path is None:
        path = _client_path(os.environ.get("PATH", "")) if _sends("MUSTER_SEND_PATH") else ""
    return _utf8(cwd, "cwd"), _utf8(path, "path")


def launch_workers(n, cpu, memory, nvidia_gpu=0, kernel="python3", script="", code="",
                   env={}, args=None, secret_env=None, command=None, role=None, name=None,
                   session=None, cwd=None, path=None):
    """Launches worker engines.

    Parameters:
        n (int): the number of workers to launch.
        cpu (float): CPU cores for each worker.
        memory (float): memory in GiB for each worker (CML says GB).
        nvidia_gpu (int, optional): GPUs for each worker. Default 0.
        kernel (str, optional): the kernel/interpreter of ``script`` or
            ``code``. Default ``"python3"``: this process's own interpreter
            (``sys.executable``, where it is a python; an explicit
            ``"python3"`` is taken the same way: give ``"/usr/bin/python3"``
            or ``"python3.X"`` to insist on another).
        script (str, optional): the script each worker runs (a relative
            path resolves against ``cwd``: this process's directory).
        code (str, optional): the source each worker runs, instead of a
            script (``!`` first: a shell command).
        env (dict, optional): environment variables for the workers.
        args, secret_env, command, role, name, session, cwd, path: muster
            extras, see :meth:`Client.launch_workers`.

    Returns:
        list of dict: the launched workers (``id``, ``status``, ...).
    """
    return default_client().launch_workers(
        n, cpu, memory, nvidia_gpu=nvidia_gpu, kernel=kernel, script=script, code=code,
        env=env, args=args, secret_env=secret_env, command=command, role=role, name=name,
        session=session, cwd=cwd, path=path)


def await_workers(ids, wait_for_completion=True, timeout_seconds=60):
    """Waits for workers to either reach the running state or complete.

    Parameters:
        ids: a list of worker ids or worker dicts (or a single one).
        wait_for_completion (bool, optional): wait until they finish (True,
            default) or only until they are running (False).
        timeout_seconds (int, optional): seconds to wait at most; 0 means no
            limit. Default 60.

    Returns:
        dict: ``{"workers": [...], "failures": [...], "timed_out": bool,
        "waiting_for": {id: why}}``: the workers that reached the target
        state (running, or succeeded), the ones that did not (failed,
        stopped, or still pending at the timeout), and what each one still
        ``scheduling`` waits for (``"1 core (0 free of 2)"``).
    """
    return default_client().await_workers(ids, wait_for_completion=wait_for_completion,
                                          timeout_seconds=timeout_seconds)


def stop_workers(*worker_id):
    """Stops workers.

    Parameters:
        *worker_id: the ids (or dicts) of the workers to stop. With none,
            every live worker of the current session is stopped.

    Returns:
        list of dict: the stopped workers.
    """
    return default_client().stop_workers(*worker_id)


def list_workers(status=None, role=None, all_sessions=False):
    """Returns all workers of the current session (newest first).

    Parameters:
        status, role (optional): filters; see :meth:`Client.list_workers`.
        all_sessions (bool, optional): include other sessions' workers.

    Returns:
        list of dict: the workers.
    """
    return default_client().list_workers(status=status, role=role, all_sessions=all_sessions)


def get_worker(worker_id):
    """Returns one worker (a dict), given its id or its dict."""
    return default_client().get_worker(worker_id)


def worker_logs(worker_id, stream="stdout", offset=None):
    """Returns the ``stdout`` (default) or ``stderr`` log of a worker as a str."""
    return default_client().worker_logs(worker_id, stream=stream, offset=offset)


def run_cluster(n_workers, n_ps, cpu, memory, nvidia_gpu=0, worker_script=None,
                timeout_seconds=60, mode=None, command=None, port=2222, output=None,
                ps_cpu=None, ps_memory=None, max_restarts=0):
    """Launches a cluster, trains across it, stops it: see
    :meth:`Client.run_cluster` (CML's ``cdsw_tensorflow_utils.run_cluster``)."""
    return default_client().run_cluster(n_workers, n_ps, cpu, memory, nvidia_gpu, worker_script,
                                         timeout_seconds, mode, command, port, output,
                                         ps_cpu, ps_memory, max_restarts)


def list_runs(status=None, all_sessions=False):
    """Lists the current session's runs (see :meth:`Client.list_runs`)."""
    return default_client().list_runs(status=status, all_sessions=all_sessions)


def get_run(run_id):
    """Returns one run (a dict)."""
    return default_client().get_run(run_id)


def run_metrics(run_id, names=None, since=0, max_points=None):
    """A run's metrics (see :meth:`Client.run_metrics`)."""
    return default_client().run_metrics(run_id, names=names, since=since,
                                        max_points=max_points)


# --- metrics from inside a run ---------------------------------------------

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


def log_metrics(step, epoch=None, **values):
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


def flush_metrics(timeout=5.0):
    """Sends what :func:`log_metrics` queued now (at the end of a script
    this happens by itself). Returns False if the controller did not
    answer."""
    return _metrics_sender.flush(timeout) if _metrics_sender else True

"""What the client finds out for itself: the controller's state directory, the
session, the lease settings, worker ids, and where a launch starts."""

import os
import random
import re
import socket
import sys
from typing import Any, Dict, Sequence, Union

from ._errors import MusterError

WorkerRef = Union[str, Dict[str, Any]]
"""A worker: its id, or its dict (as the API answers it)."""
Workers = Union[WorkerRef, Sequence[WorkerRef]]
"""One worker, or a list of them."""

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

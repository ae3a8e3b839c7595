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
    "attach_run",
    "list_runs",
    "get_run",
    "run_metrics",
    "log_metrics",
    "flush_metrics",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_TIMEOUT",
    "__version__",
]

from ._client import Client
from ._common import DEFAULT_LEASE_TTL, DEFAULT_TIMEOUT
from ._errors import MusterError
from ._metrics import flush_metrics, log_metrics
from ._run import Run
from ._version import __version__

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


def await_workers(ids, wait_for_completion=True, timeout_seconds=60, progress=None):
    """Waits for workers to either reach the running state or complete.

    Parameters:
        ids: a list of worker ids or worker dicts (or a single one).
        wait_for_completion (bool, optional): wait until they finish (True,
            default) or only until they are running (False).
        timeout_seconds (int, optional): seconds to wait at most; 0 means no
            limit. Default 60.
        progress (bool, optional): show the wait's progress, updated in
            place (default: in a notebook or on a terminal).

    A KeyboardInterrupt ends the wait at once and leaves the workers as
    they are.

    Returns:
        dict (a table in a notebook): ``{"workers": [...], "failures": [...], "timed_out": bool,
        "waiting_for": {id: why}}``: the workers that reached the target
        state (running, or succeeded), the ones that did not (failed,
        stopped, or still pending at the timeout), and what each one still
        ``scheduling`` waits for (``"1 core (0 free of 2)"``).
    """
    return default_client().await_workers(ids, wait_for_completion=wait_for_completion,
                                          timeout_seconds=timeout_seconds, progress=progress)


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
                ps_cpu=None, ps_memory=None, max_restarts=0, progress=None, wait=True):
    """Launches a cluster, trains across it, stops it, and returns its
    :class:`Run`: see :meth:`Client.run_cluster` (CML's
    ``cdsw_tensorflow_utils.run_cluster``)."""
    return default_client().run_cluster(n_workers, n_ps, cpu, memory, nvidia_gpu, worker_script,
                                         timeout_seconds, mode, command, port, output,
                                         ps_cpu, ps_memory, max_restarts, progress, wait)


def attach_run(run_id):
    """A :class:`Run` for a run by its id (see :meth:`Client.attach_run`)."""
    return default_client().attach_run(run_id)


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

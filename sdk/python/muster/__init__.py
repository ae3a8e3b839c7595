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

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union


__all__ = [
    "MusterError",
    "Client",
    "Run",
    "WorkerList",
    "Worker",
    "AwaitResult",
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
from ._common import DEFAULT_LEASE_TTL, DEFAULT_TIMEOUT, WorkerRef, Workers
from ._display import AwaitResult, Worker, WorkerList
from ._errors import MusterError
from ._metrics import flush_metrics, log_metrics
from ._run import Run
from ._version import __version__

# --- module-level functions, as in CML's cdsw module -------------------------

_default_client = None


def configure(url: Optional[str] = None, token: Optional[str] = None,
              session: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
              lease: Optional[bool] = None, lease_ttl: Optional[float] = None) -> Client:
    """Sets the client the module functions use, and returns it.

    Arguments left out are found as :class:`Client` finds them (environment,
    then the controller's state directory).
    """
    global _default_client
    _default_client = Client(url=url, token=token, session=session, timeout=timeout, lease=lease,
                             lease_ttl=lease_ttl)
    return _default_client


def default_client() -> Client:
    """The client the module functions use, created at first use from the
    environment (see :class:`Client`)."""
    global _default_client
    if _default_client is None:
        _default_client = Client()
    return _default_client


def launch_workers(n: int, cpu: float, memory: float, nvidia_gpu: int = 0,
                   kernel: Optional[str] = "python3", script: str = "", code: str = "",
                   env: Dict[str, str] = {}, args: Optional[List[str]] = None,
                   secret_env: Optional[Dict[str, str]] = None,
                   command: Optional[List[str]] = None, role: Optional[str] = None,
                   name: Optional[str] = None, session: Optional[str] = None,
                   cwd: Optional[str] = None, path: Optional[str] = None) -> WorkerList:
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


def await_workers(ids: Workers, wait_for_completion: bool = True,
                  timeout_seconds: float = 60, progress: Optional[bool] = None) -> AwaitResult:
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


def stop_workers(*worker_id: Workers) -> WorkerList:
    """Stops workers.

    Parameters:
        *worker_id: the ids (or dicts) of the workers to stop. With none,
            every live worker of the current session is stopped.

    Returns:
        list of dict: the stopped workers.
    """
    return default_client().stop_workers(*worker_id)


def list_workers(status: Union[str, Sequence[str], None] = None, role: Optional[str] = None,
                 all_sessions: bool = False) -> WorkerList:
    """Returns all workers of the current session (newest first).

    Parameters:
        status, role (optional): filters; see :meth:`Client.list_workers`.
        all_sessions (bool, optional): include other sessions' workers.

    Returns:
        list of dict: the workers.
    """
    return default_client().list_workers(status=status, role=role, all_sessions=all_sessions)


def get_worker(worker_id: WorkerRef) -> Worker:
    """Returns one worker (a dict), given its id or its dict."""
    return default_client().get_worker(worker_id)


def worker_logs(worker_id: WorkerRef, stream: str = "stdout",
                offset: Optional[int] = None) -> str:
    """Returns the ``stdout`` (default) or ``stderr`` log of a worker as a str."""
    return default_client().worker_logs(worker_id, stream=stream, offset=offset)


def run_cluster(n_workers: int, n_ps: int, cpu: float, memory: float, nvidia_gpu: int = 0,
                worker_script: Optional[str] = None, timeout_seconds: float = 60,
                mode: Optional[str] = None, command: Optional[List[str]] = None, port: int = 2222,
                output: Optional[Callable[[str], Any]] = None, ps_cpu: Optional[float] = None,
                ps_memory: Optional[float] = None, max_restarts: int = 0,
                progress: Optional[bool] = None, wait: bool = True) -> Run:
    """Launches a cluster, trains across it, stops it, and returns its
    :class:`Run`: see :meth:`Client.run_cluster` (CML's
    ``cdsw_tensorflow_utils.run_cluster``)."""
    return default_client().run_cluster(n_workers, n_ps, cpu, memory, nvidia_gpu, worker_script,
                                         timeout_seconds, mode, command, port, output,
                                         ps_cpu, ps_memory, max_restarts, progress, wait)


def attach_run(run_id: str) -> Run:
    """A :class:`Run` for a run by its id (see :meth:`Client.attach_run`)."""
    return default_client().attach_run(run_id)


def list_runs(status: Optional[str] = None, all_sessions: bool = False) -> List[Dict[str, Any]]:
    """Lists the current session's runs (see :meth:`Client.list_runs`)."""
    return default_client().list_runs(status=status, all_sessions=all_sessions)


def get_run(run_id: str) -> Dict[str, Any]:
    """Returns one run (a dict)."""
    return default_client().get_run(run_id)


def run_metrics(run_id: str, names: Union[str, Sequence[str], None] = None, since: int = 0,
                max_points: Optional[int] = None) -> Dict[str, Any]:
    """A run's metrics (see :meth:`Client.run_metrics`)."""
    return default_client().run_metrics(run_id, names=names, since=since,
                                        max_points=max_points)

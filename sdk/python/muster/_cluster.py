"""run_cluster(): a training run through the ``muster run`` command line
tool, its output printed as it comes, its progress shown, and a Run back."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import threading
from typing import Any, Callable, List, Optional

from ._common import _own_kernel
from ._errors import MusterError
from ._progress import Progress
from ._run import Run, RunOutput

_KEEP_LINES = 10000  # lines of a background run's output kept in run.output


def find_cli() -> str:
    """The muster command line tool: MUSTER_CLI, the build beside this
    source tree, or the PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    cli = os.environ.get("MUSTER_CLI") or next(
        (c for c in (os.path.join(here, "..", "..", "..", "build", "muster"),)
         if os.access(c, os.X_OK)), None) or shutil.which("muster")
    if not cli:
        raise MusterError("unreachable", "the muster command line tool was not found: set "
                          "MUSTER_CLI or put muster on the PATH")
    return cli


def cli_args(client: Any, n_workers: int, n_ps: int, cpu: float, memory: float, nvidia_gpu: int,
             worker_script: Optional[str], timeout_seconds: float, mode: Optional[str],
             command: Optional[List[str]], port: int, ps_cpu: Optional[float],
             ps_memory: Optional[float], max_restarts: int) -> List[str]:
    """The argv of ``muster run`` for run_cluster's arguments, checked."""
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
    args = [find_cli(), "run", "--mode", mode, "--workers", str(int(n_workers)), "--cpu",
            str(cpu), "--memory", str(memory), "--gpu", str(int(nvidia_gpu)), "--port",
            str(int(port)), "--timeout", str(timeout_seconds)]
    if mode == "ps":
        args += ["--ps", str(int(n_ps))]
        if ps_cpu:
            args += ["--ps-cpu", str(ps_cpu)]
        if ps_memory:
            args += ["--ps-memory", str(ps_memory)]
    if max_restarts:
        args += ["--max-restarts", str(int(max_restarts))]
    if client.lease:
        # The run's workers are the session's: the client's lease covers
        # them (muster run must not give it back at its end).
        client._hold_lease()
        args += ["--no-lease"]
    return args + ["--"] + [str(a) for a in command]


class _Watch:
    """Finds the run that a muster run process recorded (by its lease
    holder: host-PID-random) and shows its workers' progress, every half
    second until stopped."""

    def __init__(self, client: Any, proc: Any, size: int, progress: Progress):
        self.client, self.proc, self.size, self.progress = client, proc, size, progress
        self.run_id: Optional[str] = None
        self.found = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="muster-run-watch", daemon=True)
        self.thread.start()

    def _find(self) -> Optional[str]:
        for r in self.client.list_runs(status="running"):
            holder = str(r.get("holder") or "")
            parts = holder.rsplit("-", 2)
            if len(parts) == 3 and parts[1] == str(self.proc.pid):
                return r.get("id")
        return None

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                if self.run_id is None:
                    self.run_id = self._find()
                    if self.run_id:
                        self.found.set()
                if self.run_id and not self.progress.mode:
                    return
                if self.run_id and self.progress.mode:
                    answer = self.client._request("GET", "/api/v1/workers",
                                                  query=[("run", self.run_id), ("limit", "5000")])
                    # The newest attempt's workers (the list is newest first).
                    ws = (answer.get("workers") or [])[:self.size]
                    all_up = ws and all(w.get("status") not in ("scheduling", "starting")
                                        for w in ws)
                    self.progress.update(ws, "training" if all_up else "")
            except MusterError:
                pass  # the controller away for a moment: the next round tells
            self.stop.wait(0.5)


def run_cluster(client: Any, n_workers: int, n_ps: int, args: List[str], mode: Optional[str],
                output: Optional[Callable[[str], Any]], progress: Optional[bool],
                wait: bool) -> Run:
    """Runs ``muster run`` (args) and returns its Run: when it has ended,
    or with wait=False once the run is recorded (it goes on in the
    background). A KeyboardInterrupt leaves the run going on."""
    n_ps = int(n_ps) if (mode or ("ps" if n_ps else "allreduce")) == "ps" else 0
    env = dict(os.environ, MUSTER_URL=client.url, MUSTER_TOKEN=client.token or "",
               MUSTER_SESSION=client.session)
    # Its own session: a terminal's ^C reaches this process only, and the
    # run goes on (its workers end with this client's lease).
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            encoding="utf-8", errors="replace", bufsize=1,
                            start_new_session=True)
    out = RunOutput()
    pm = Progress("run_cluster", int(n_workers) + n_ps, progress if wait else False)
    watch = _Watch(client, proc, int(n_workers) + n_ps, pm)
    run = Run(client, {"exit_code": None, "summary": None, "run": None, "restarts": 0},
              n_workers, n_ps)
    show = output or print
    try:
        if not wait:
            return _background(client, run, proc, out, watch, output)
        for line in proc.stdout:
            line = line.rstrip("\n")
            pm.line(line, show)
            out.feed(line)
        code = proc.wait()
    except KeyboardInterrupt:
        watch.found.wait(0.5)
        run["run"] = watch.run_id
        pm.close("interrupted")
        _background(client, run, proc, out, watch, output, found=False)
        ids = ""
        if run.id:
            ids = ("Get it back with run = muster.attach_run(%r) (run.wait(), run.logs(0)); "
                   "stop it with run.stop()" % run.id)
        else:
            ids = "Stop it with stop_workers() (every worker of this session)"
        raise KeyboardInterrupt("run_cluster was interrupted; the run %sgoes on, and its workers "
                                "are left as they are. %s." % (
                                    run.id + " " if run.id else "", ids)) from None
    finally:
        if wait:
            watch.stop.set()
            if proc.returncode is not None:
                proc.stdout.close()
    watch.thread.join(2)
    _end(run, out, code)
    pm.close(run.status if run.id else ("succeeded" if code == 0 else "failed"))
    err = out.error(code)
    if err is not None:
        raise err
    if code != 0:
        e = MusterError("training_failed", out.failure or "muster run exited with code %d" % code)
        e.run = run
        raise e
    return run


def _end(run: Run, out: RunOutput, code: int) -> None:
    run.update({"exit_code": code, "summary": out.summary() if code == 0 else None,
                "run": out.run_id or run.get("run"), "restarts": out.restarts})


def _background(client: Any, run: Run, proc: Any, out: RunOutput, watch: _Watch,
                output: Optional[Callable[[str], Any]], found: bool = True) -> Run:
    """Lets proc go on: a thread reads its output into run.output (and to
    output, if given) and fills the run in when it ends. found: wait until
    the run is recorded first (or muster run has ended)."""
    run.output = collections.deque(maxlen=_KEEP_LINES)  # type: ignore[assignment]
    run._proc = proc

    def read() -> None:
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                run.output.append(line)
                out.feed(line)
                if output:
                    output(line)
            _end(run, out, proc.wait())
            proc.stdout.close()
        finally:
            watch.stop.set()

    run._reader = threading.Thread(target=read, name="muster-run-output", daemon=True)
    run._reader.start()
    client._runs.append(run)
    if found:
        while not watch.found.wait(0.2):
            if not run._reader.is_alive():
                break
        run["run"] = watch.run_id or run.get("run")
        if run._reader.is_alive() is False and run.get("exit_code") not in (None, 0):
            err = out.error(run["exit_code"])
            if err is not None:
                raise err
    return run

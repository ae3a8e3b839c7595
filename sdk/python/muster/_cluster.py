"""run_cluster(): a training run through the ``muster run`` command line
tool, its output printed as it comes, its progress shown, and a Run back."""

from __future__ import annotations

import collections
import os
import queue
import shutil
import signal
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

    def find(self) -> Optional[str]:
        """The run's id, looked up now if not known yet (None: not found)."""
        if self.run_id is None:
            for r in self.client.list_runs(status="running"):
                parts = str(r.get("holder") or "").rsplit("-", 2)
                if len(parts) == 3 and parts[1] == str(self.proc.pid):
                    self.run_id = r.get("id")
                    self.found.set()
                    break
        return self.run_id

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                if self.find() and not self.progress.mode:
                    return
                if self.run_id:
                    answer = self.client._request("GET", "/api/v1/workers",
                                                  query=[("run", self.run_id), ("limit", "5000")])
                    # The newest attempt's workers (the list is newest first).
                    ws = [w for w in (answer.get("workers") or [])[:self.size]
                          if isinstance(w, dict)]
                    all_up = ws and all(w.get("status") not in ("scheduling", "starting")
                                        for w in ws)
                    if not self.stop.is_set():
                        self.progress.update(ws, "training" if all_up else "")
            except Exception:  # noqa: BLE001 (a thread's: the controller away for a
                pass           # moment, an odd answer; the next round tells)
            self.stop.wait(0.5)


class _Reader:
    """Reads muster run's output from its start to its end, whatever the
    caller does meanwhile: each line into the run (run.output, and what
    RunOutput takes from it) and, while someone waits in the foreground,
    onto a queue for them; at the end the run's result, the process reaped
    and its pipe closed."""

    _END = object()

    def __init__(self, run: Run, proc: Any, out: RunOutput, watch: _Watch,
                 output: Optional[Callable[[str], Any]]):
        self.run, self.proc, self.out, self.watch = run, proc, out, watch
        self.output = output        # called here once nobody waits in the foreground
        self.foreground = True      # lines go onto the queue
        self.lines: "queue.Queue[Any]" = queue.Queue()
        run.output = collections.deque(maxlen=_KEEP_LINES)  # type: ignore[assignment]
        run._proc = proc
        run._reader = threading.Thread(target=self._main, name="muster-run-output", daemon=True)
        run._reader.start()

    def _main(self) -> None:
        try:
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self.run.output.append(line)
                self.out.feed(line)
                if self.foreground:
                    self.lines.put(line)
                elif self.output:
                    try:
                        self.output(line)
                    except Exception:  # noqa: BLE001 (the caller's; the output is kept)
                        self.output = None
            code = self.proc.wait()
            self.run.update({"exit_code": code,
                             "summary": self.out.summary() if code == 0 else None,
                             "run": self.out.run_id or self.run.get("run") or self.watch.run_id,
                             "restarts": self.out.restarts})
        finally:
            self.proc.stdout.close()
            self.watch.stop.set()
            self.lines.put(self._END)

    def background(self) -> None:
        """Nobody waits in the foreground any more: lines go to output."""
        self.foreground = False
        while True:  # what was queued, to output too
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is self._END:
                return
            if self.output:
                try:
                    self.output(line)
                except Exception:  # noqa: BLE001
                    self.output = None


def _abandon(run: Run, watch: _Watch) -> None:
    """The caller's own code failed while the run went on: stop the run
    (its record ends as stopped, its workers stop) and muster run."""
    try:
        run["run"] = run.get("run") or watch.find()
        if run.id:
            run.stop()
    except Exception:  # noqa: BLE001 (the caller's error is the one to raise)
        pass
    try:
        os.killpg(run._proc.pid, signal.SIGTERM)
    except OSError:
        pass


def run_cluster(client: Any, n_workers: int, n_ps: int, args: List[str], mode: Optional[str],
                output: Optional[Callable[[str], Any]], progress: Optional[bool],
                wait: bool) -> Run:
    """Runs ``muster run`` (args) and returns its Run: when it has ended,
    or with wait=False once the run is recorded (it goes on in the
    background). A KeyboardInterrupt leaves the run going on; any other
    exception of the caller's (output) stops it."""
    n_ps = int(n_ps) if (mode or ("ps" if n_ps else "allreduce")) == "ps" else 0
    env = dict(os.environ, MUSTER_URL=client.url, MUSTER_TOKEN=client.token or "",
               MUSTER_SESSION=client.session)
    size = int(n_workers) + n_ps
    run = Run(client, {"exit_code": None, "summary": None, "run": None, "restarts": 0},
              n_workers, n_ps)
    pm = Progress("run_cluster", size, progress if wait else False)
    out = RunOutput()
    # Its own session: a terminal's ^C reaches this process only, and the
    # run goes on (its workers end with this client's lease). The reader
    # starts at once, so that the pipe is drained whatever happens here.
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            encoding="utf-8", errors="replace", bufsize=1,
                            start_new_session=True)
    watch = _Watch(client, proc, size, pm)
    reader = _Reader(run, proc, out, watch, output)
    client._keep(run)
    show = output or print
    try:
        if not wait:
            reader.background()
            while not watch.found.wait(0.2) and run._reader.is_alive():
                pass
        else:
            while True:
                line = reader.lines.get()
                if line is _Reader._END:
                    break
                pm.line(line, show)
    except KeyboardInterrupt:
        reader.background()
        watch.stop.set()
        try:
            run["run"] = run.get("run") or watch.find()
        except Exception:  # noqa: BLE001 (the sentence says what it can)
            pass
        pm.close("interrupted")
        if run.id:
            how = ("Get it back with run = muster.attach_run(%r) (run.wait(), run.logs(0)); "
                   "stop it with run.stop()" % run.id)
        else:
            how = "Stop it with stop_workers() (every worker of this session)"
        raise KeyboardInterrupt("run_cluster was interrupted; the run %sgoes on, and its workers "
                                "are left as they are. %s." % (
                                    run.id + " " if run.id else "", how)) from None
    except BaseException:
        reader.background()
        watch.stop.set()
        pm.close("stopped")
        _abandon(run, watch)
        raise
    if not wait:
        run["run"] = run.get("run") or watch.run_id
        code = run.get("exit_code")
        if code not in (None, 0) and out.error(code) is not None:
            raise out.error(code)  # muster run refused it before it ran
        return run
    run._reader.join()
    watch.stop.set()
    code = run["exit_code"]
    pm.close("succeeded" if code == 0 else "failed")
    err = out.error(code)
    if err is not None:
        raise err
    if code != 0:
        e = MusterError("training_failed", out.failure or "muster run exited with code %d" % code)
        e.run = run
        raise e
    return run

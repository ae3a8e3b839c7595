/* cmd_run.c: the commands for training runs: muster run (a cluster
 * launched, trained across and stopped, by libmuster's
 * muster_run_cluster()) and muster runs (the recorded runs). */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_run[] =
    "usage: muster run --mode ps|allreduce|exec [--ps K] [--workers N] [--cpu C]\n"
    "                  [--memory G] [--gpu K] [--ps-cpu C] [--ps-memory G] [--port P]\n"
    "                  [--timeout S] [--session S] [--max-restarts K] [--lease-ttl S]\n"
    "                  [--no-lease] [--run-dir DIR] [--cwd DIR] [--path P|--no-path]\n"
    "                  [--stall-timeout S] [--on-stall report|fail]\n"
    "                  -- COMMAND [ARGS...]\n"
    "\n"
    "Launches K parameter servers (ps mode only; one or more) and N workers\n"
    "(default 2) of C cores (default 1), G GiB (default 1) and --gpu K GPUs (default\n"
    "0) each (parameter servers: no GPU, --ps-cpu and --ps-memory, default the\n"
    "workers'), awaits them, and runs COMMAND (--port P, default 2222, in TF_CONFIG):\n"
    "  ps         on every PS and worker, with TF_CONFIG and MUSTER_CLUSTER\n"
    "  allreduce  as mpirun -np N COMMAND here, one rank inside each worker: Open\n"
    "             MPI's daemons and ranks start through the exec channels (one\n"
    "             daemon per host, so ranks on one host share memory), with RANK,\n"
    "             LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set\n"
    "  exec       on every worker, with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,\n"
    "             LOCAL_RANK (torchrun's) and TF_CONFIG\n"
    "Output comes prefixed with role and index. When any worker fails the rest are\n"
    "stopped and the failure is reported; every worker is stopped at the end.\n"
    "Exit code 0 only if the training succeeded. --timeout (default 60 s) bounds\n"
    "the wait for the workers to start; while they wait, what for is printed. A\n"
    "run's workers must all run at once: a run that could never fit is refused.\n"
    "The workers and their ranks start here (--cwd DIR: there; --cwd - or '', or\n"
    "MUSTER_SEND_CWD=0: in the controller's --workdir) and find COMMAND on this\n"
    "shell's PATH (--path P: on P; --no-path, --path '' or MUSTER_SEND_PATH=0: on\n"
    "the worker's own).\n"
    "\n"
    "The run is recorded (muster runs). While it lasts it holds its session's lease\n"
    "(ttl --lease-ttl, default 30 s): if this command dies, even by kill -9, the\n"
    "session's workers stop within the ttl (--no-lease: they stay until stopped).\n"
    "Without --session the run has a session of its own; with MUSTER_SESSION set it\n"
    "runs in that session and leaves its lease to its holder (unless --lease-ttl).\n"
    "A worker stopped from outside (muster stop) ends the run: no restart.\n"
    "--max-restarts K: when a worker or rank fails, every worker is stopped, new\n"
    "ones start and the command runs again, up to K times; muster-train resumes\n"
    "from its last checkpoint (--checkpoint, by default in the run's directory:\n"
    "--run-dir, $MUSTER_RUN_DIR or ~/.muster/runs, which the workers must reach),\n"
    "other commands start again with MUSTER_RESTART_COUNT set.\n"
    "\n"
    "A run is stalled when no rank made progress (a new metric point, an output\n"
    "line, or for a run that posts no metrics, CPU time) for --stall-timeout S\n"
    "(default 120; 0: not watched). Then a report names every rank with its\n"
    "worker, last step, state, CPU and stack (muster stack, inside each worker),\n"
    "the rank behind the others first; it is printed here and kept in the run's\n"
    "record. --on-stall fail (default report) fails the run like a failed rank,\n"
    "so that --max-restarts restarts it.\n";

static void run_output(void *arg, const char *role, int index, muster_stream stream,
                       const char *line, size_t len) {
  FILE *f = stream == MUSTER_STDERR ? stderr : stdout;

  (void)arg;
  if (strcmp(role, "mpirun") == 0) {
    /* mpirun --tag-output: "[1,R]<stdout>:text" is rank R's line. */
    int rank, used = 0;
    const char *tag = memchr(line, '>', len);
    if (sscanf(line, "[1,%d]<%*[a-z]>:%n", &rank, &used) == 1 && used > 0 && tag)
      fprintf(f, "[rank-%d] %.*s\n", rank, (int)(len - (size_t)used), line + used);
    else
      fprintf(f, "%.*s\n", (int)len, line);
  } else
    fprintf(f, "[%s-%d] %.*s\n", role, index, (int)len, line);
  fflush(f);
}

static void run_stall(void *arg, const char *report) {
  (void)arg;
  fprintf(stderr, "muster run: STALLED: ");
  print_failure(stderr, report, "  ");
  fflush(stderr);
}

static void run_restart(void *arg, int attempt, const char *cause) {
  const muster_run_opts *o = arg;
  (void)o;
  fprintf(stderr, "muster run: restart %d: ", attempt);
  print_failure(stderr, cause, "  ");
  fflush(stderr);
}

/* What the workers wait for while they are not all running yet (libmuster
 * says so after 2 s, and when the reasons change). */
static void run_waiting(void *arg, const char *what) {
  (void)arg;
  fprintf(stderr, "muster run: not running yet: %s\n", what);
  fflush(stderr);
}

int cmd_run(int argc, char **argv) {
  muster_run_opts o;
  muster_run_result r;
  muster_client *c = NULL;
  char self[PATH_MAX], cwd_abs[PATH_MAX], msg[160];
  int code = EXIT_OK, rc, i;
  long l;
  double d;
  ssize_t n;

  int session_given = 0, ttl_given = 0, mode_given = 0;

  muster_run_opts_init(&o);
  o.session = session_default();
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_run, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "--no-lease") == 0) {
      o.lease_ttl = -1;
    } else if (strcmp(a, "--no-path") == 0) {
      o.path = "";
    } else if (!v) {
      return unknown_option(usage_run, a);
    } else if (strcmp(a, "--mode") == 0) {
      i++;
      if (strcmp(v, "ps") == 0)
        o.mode = MUSTER_RUN_PS;
      else if (strcmp(v, "allreduce") == 0)
        o.mode = MUSTER_RUN_ALLREDUCE;
      else if (strcmp(v, "exec") == 0)
        o.mode = MUSTER_RUN_EXEC;
      else
        return usage_error(usage_run, "--mode must be ps, allreduce or exec, not \"%s\"", v);
      mode_given = 1;
    } else if (strcmp(a, "--workers") == 0 || strcmp(a, "--ps") == 0 || strcmp(a, "--gpu") == 0 ||
               strcmp(a, "--port") == 0) {
      int lo = strcmp(a, "--workers") == 0 ? 1 : 0;
      int hi = strcmp(a, "--port") == 0 ? 65535 : strcmp(a, "--gpu") == 0 ? 64 : 1024;
      i++;
      if (parse_int(v, lo, hi, &l) != 0)
        return usage_error(usage_run, "%s must be a whole number from %d to %d, not \"%s\"", a, lo,
                           hi, v);
      if (a[2] == 'w')
        o.n_workers = (int)l;
      else if (a[3] == 's')
        o.n_ps = (int)l;
      else if (a[2] == 'g')
        o.nvidia_gpu = (int)l;
      else
        o.port = (int)l;
    } else if (strcmp(a, "--cpu") == 0 || strcmp(a, "--memory") == 0 ||
               strcmp(a, "--timeout") == 0 || strcmp(a, "--ps-cpu") == 0 ||
               strcmp(a, "--ps-memory") == 0) {
      i++;
      if (strcmp(a, "--timeout") == 0 && parse_double(v, 0, &d) != 0)
        return usage_error(usage_run, "--timeout must be a number of seconds >= 0, not \"%s\"", v);
      if (strcmp(a, "--timeout") != 0 && parse_resource(a, v, &d, msg, sizeof(msg)) != 0)
        return usage_error(usage_run, "%s", msg);
      if (strcmp(a, "--ps-cpu") == 0)
        o.ps_cpu = d;
      else if (strcmp(a, "--ps-memory") == 0)
        o.ps_memory = d;
      else if (a[2] == 'c')
        o.cpu = d;
      else if (a[2] == 'm')
        o.memory = d;
      else
        o.timeout_seconds = d;
    } else if (strcmp(a, "--session") == 0) {
      i++;
      o.session = v;
      session_given = 1;
    } else if (strcmp(a, "--max-restarts") == 0) {
      i++;
      if (parse_int(v, 0, 1000, &l) != 0)
        return usage_error(usage_run,
                           "--max-restarts must be a whole number from 0 to 1000, not "
                           "\"%s\"",
                           v);
      o.max_restarts = (int)l;
    } else if (strcmp(a, "--lease-ttl") == 0) {
      i++;
      if (parse_double(v, 3, &d) != 0 || d > 86400)
        return usage_error(usage_run, "--lease-ttl must be 3 to 86400 seconds, not \"%s\"", v);
      o.lease_ttl = d;
      ttl_given = 1;
    } else if (strcmp(a, "--stall-timeout") == 0) {
      i++;
      if (parse_double(v, 0, &d) != 0 || d > 86400 * 7)
        return usage_error(usage_run,
                           "--stall-timeout must be a number of seconds (0: not watched), not "
                           "\"%s\"",
                           v);
      o.stall_timeout = d;
    } else if (strcmp(a, "--on-stall") == 0) {
      i++;
      if (strcmp(v, "report") != 0 && strcmp(v, "fail") != 0)
        return usage_error(usage_run, "--on-stall must be report or fail, not \"%s\"", v);
      o.on_stall_fail = strcmp(v, "fail") == 0;
    } else if (strcmp(a, "--run-dir") == 0) {
      i++;
      o.run_dir = v;
    } else if (strcmp(a, "--cwd") == 0) {
      i++;
      if (!*v || strcmp(v, "-") == 0)
        o.cwd = ""; /* the controller's --workdir */
      else if (cli_abs_dir(v, cwd_abs, sizeof(cwd_abs)) != 0)
        return usage_error(usage_run, "--cwd %s is not a directory here: give an absolute path", v);
      else
        o.cwd = cwd_abs;
    } else if (strcmp(a, "--path") == 0) {
      i++;
      o.path = v;
    } else {
      return unknown_option(usage_run, a);
    }
  }
  /* No default: which mode fits is the command's to say, and a ps or
   * exec training run silently run under mpirun fails far from here. */
  if (!mode_given)
    return usage_error(usage_run, "--mode is needed: ps, allreduce or exec");
  if (i >= argc)
    return usage_error(usage_run, "give the command after --");
  if (o.mode == MUSTER_RUN_PS && o.n_ps < 1)
    return usage_error(usage_run, "--mode ps needs --ps K (one or more parameter servers)");
  if (o.mode != MUSTER_RUN_PS && o.n_ps)
    return usage_error(usage_run, "--ps goes with --mode ps only");
  /* A session from MUSTER_SESSION is someone else's (a notebook's, or the
   * worker's this runs in): its holder keeps its lease, not this run. */
  if (o.session && !session_given && !ttl_given)
    o.lease_ttl = -1;
  o.argv = (const char *const *)&argv[i];
  o.argc = (size_t)(argc - i);
  o.on_output = run_output;
  o.on_restart = run_restart;
  o.on_waiting = run_waiting;
  o.on_stall = run_stall;
  /* The rsh agent and the rank launcher are this very program. */
  n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    o.muster_program = self;
  }
  if ((code = connect_client(&c)))
    return code;
  rc = muster_run_cluster(c, &o, &r);
  if (rc) {
    /* Its own line, which no worker's or mpirun's passed-through line
     * can look like: run_cluster (Python) raises with this code. */
    const char *msg = muster_client_errmsg(c), *field = muster_client_errfield(c);
    fprintf(stderr, "muster run: ERROR: %s: %s", muster_error_name(rc),
            msg && *msg ? msg : muster_strerror(rc));
    if (field)
      fprintf(stderr, " (field: %s)", field);
    fputc('\n', stderr);
    muster_client_free(c);
    return exit_code_for(rc);
  }
  if (r.exit_code == 0) {
    char ps[64] = "";
    if (o.mode == MUSTER_RUN_PS)
      snprintf(ps, sizeof(ps), " and %d parameter server%s", o.n_ps, o.n_ps == 1 ? "" : "s");
    fprintf(stderr,
            "muster run: succeeded (%d worker%s%s; %.2f s to start, %.2f s to run; %d restart%s)\n",
            o.n_workers, o.n_workers == 1 ? "" : "s", ps, r.start_s, r.run_s, r.restarts,
            r.restarts == 1 ? "" : "s");
  } else {
    /* A worker's stderr quoted in the failure: its lines indented under it
     * (what the Python client reads back). */
    fprintf(stderr, "muster run: FAILED: ");
    print_failure(stderr, r.failure[0] ? r.failure : "unknown reason", "  ");
    code = EXIT_WORKERS;
  }
  if (r.lease_error[0])
    fprintf(stderr, "muster run: %s\n", r.lease_error);
  fprintf(stderr, "muster run: the workers were stopped; the run is %s; the web UI is at %s/\n",
          r.run_id[0] ? r.run_id : "not recorded", muster_client_url(c));
  muster_run_result_free(&r);
  muster_client_free(c);
  return code;
}

/* muster.c: the muster command-line tool. It uses only libmuster's public
 * API (muster.h), as curl's tool uses only libcurl's, and the header-only
 * lists of common/envlists.h. */
#include "muster.h"
#include "envlists.h"
#include "mpi_agent.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Exit codes. */
enum { EXIT_OK = 0, EXIT_WORKERS = 1, EXIT_USAGE = 2, EXIT_CONTROLLER = 3 };

#define MAX_IDS 65536

static const char *opt_url, *opt_token;

static const char usage_main[] =
    "usage: muster [--url URL] [--token TOKEN] COMMAND [ARGS]\n"
    "\n"
    "Launch, await and stop muster workers.\n"
    "\n"
    "commands:\n"
    "  launch     start workers (idle, or running a script, code or command)\n"
    "  await      wait until workers run (--running) or end (--completion)\n"
    "  ps, ls     list workers\n"
    "  show       show workers in full\n"
    "  stop       stop workers\n"
    "  logs       print (or follow) a worker's output\n"
    "  exec       run a command inside a worker (stdin/stdout relayed; no SSH)\n"
    "  run        launch a cluster, train across it (ps, allreduce, exec), stop it\n"
    "  runs       list runs (muster run's and run_cluster()'s)\n"
    "  rsh        Open MPI's rsh agent on the exec channel (used by muster run)\n"
    "  rank       start an Open MPI rank inside its own worker (used by muster run)\n"
    "\n"
    "The controller is found from --url/--token, MUSTER_URL/MUSTER_TOKEN, or the\n"
    "state directory of the local controller ($MUSTER_STATE_DIR, default ~/.muster).\n"
    "Run 'muster COMMAND --help' for a command's options.\n"
    "\n"
    "exit codes: 0 all good, 1 some workers failed or timed out, 2 usage error,\n"
    "            3 controller unreachable or refused the request\n";

static const char usage_launch[] =
    "usage: muster launch [options] [-- COMMAND [ARGS...]]\n"
    "\n"
    "Starts workers and prints their ids, one per line.\n"
    "\n"
    "  -n N              how many workers (default 1)\n"
    "  --cpu C           cores each (fractional; default 1)\n"
    "  --memory G        GiB each (default 1)\n"
    "  --gpu K           GPUs each (default 0)\n"
    "  --script FILE     run FILE with the kernel\n"
    "  --code STR        run inline code with the kernel ('!cmd' runs a shell command)\n"
    "  --kernel K        interpreter for --script/--code (default python3)\n"
    "  -- CMD ARGS       run a command directly\n"
    "  --arg A           an argument for the script (repeatable)\n"
    "  --env K=V         environment variable (repeatable)\n"
    "  --secret-env K=V  environment variable never shown back (repeatable)\n"
    "  --role R          role name (default worker)\n"
    "  --name N          a name for the workers\n"
    "  --session S       session (default $MUSTER_SESSION or default)\n"
    "  --json            print the workers as JSON\n"
    "  --lease           hold the session's lease and stay until the workers end:\n"
    "                    if this command dies, they stop within the lease's ttl;\n"
    "                    Ctrl-C (or SIGTERM) stops them at once (without --session,\n"
    "                    a session of its own, launch-XXXXXXXX, named on stderr)\n"
    "  --lease-ttl S     the lease's ttl in seconds (default 30)\n"
    "\n"
    "Without --script, --code or a command, the workers are idle until stopped.\n";

static const char usage_await[] =
    "usage: muster await [--running | --completion] [--timeout S] [--json] ID... | -\n"
    "\n"
    "Waits until every worker runs (--running) or has ended (--completion, the\n"
    "default), or the timeout passes (default 60 s; 0: none). '-' reads the ids\n"
    "from standard input (muster launch -n 4 | muster await --running -).\n"
    "Exits 0 if every worker got there, 1 if any failed, stopped or timed out.\n";

static const char usage_ps[] =
    "usage: muster ps [-a] [--session S] [--status S]... [--role R] [--json]\n"
    "\n"
    "Lists workers, newest first: the live ones, or all with -a.\n";

static const char usage_show[] = "usage: muster show [--json] ID...\n\nShows workers in full.\n";

static const char usage_stop[] =
    "usage: muster stop ID... | --all [--session S]\n"
    "\n"
    "Stops workers: the ones named, or with --all every live worker of the\n"
    "session (default $MUSTER_SESSION or default).\n";

static const char usage_logs[] = "usage: muster logs [-f] [--stderr] ID\n"
                                 "\n"
                                 "Prints a worker's output; -f follows it until the worker ends.\n";

static const char usage_exec[] =
    "usage: muster exec [-n] [--env K=V]... [--cwd DIR] ID -- COMMAND [ARGS...]\n"
    "\n"
    "Runs a command inside a running worker through its exec channel (no SSH),\n"
    "relaying standard input (unless -n), output and the exit code.\n";

static const char usage_run[] =
    "usage: muster run --mode ps|allreduce|exec [--ps K] --workers N [--cpu C]\n"
    "                  [--memory G] [--gpu K] [--ps-cpu C] [--ps-memory G] [--port P]\n"
    "                  [--timeout S] [--session S] [--max-restarts K] [--lease-ttl S]\n"
    "                  [--no-lease] [--run-dir DIR] -- COMMAND [ARGS...]\n"
    "\n"
    "Launches K parameter servers and N workers, awaits them, and runs COMMAND:\n"
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
    "the wait for the workers to start.\n"
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
    "other commands start again with MUSTER_RESTART_COUNT set.\n";

static const char usage_runs[] =
    "usage: muster runs [--session S] [--status S] [-n N] [--json]\n"
    "\n"
    "Lists runs, newest first (at most N, default 50; --status running, succeeded,\n"
    "failed or stopped).\n";

static int usage_error(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int usage_error(const char *usage, const char *fmt, ...) {
  va_list ap;

  fputs("muster: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n\n%s", usage);
  return EXIT_USAGE;
}

/* Reports a failed call and returns the exit code for it. */
static int call_failed(muster_client *c, int rc) {
  const char *msg = muster_client_errmsg(c);
  const char *field = muster_client_errfield(c);

  fprintf(stderr, "muster: %s: %s", muster_error_name(rc), msg && *msg ? msg : muster_strerror(rc));
  if (field)
    fprintf(stderr, " (field: %s)", field);
  fputc('\n', stderr);
  return EXIT_CONTROLLER;
}

static int connect_client(muster_client **c) {
  int rc;

  if (opt_url || opt_token) {
    const char *url = opt_url ? opt_url : getenv("MUSTER_URL");
    const char *token = opt_token ? opt_token : getenv("MUSTER_TOKEN");
    if (!url || !token) {
      fprintf(stderr, "muster: --url and --token go together (or set MUSTER_URL and "
                      "MUSTER_TOKEN)\n");
      return EXIT_USAGE;
    }
    rc = muster_client_new(url, token, c);
  } else {
    rc = muster_client_new_default(c);
  }
  if (rc == MUSTER_E_UNREACHABLE) {
    fprintf(stderr, "muster: no controller found: set MUSTER_URL and MUSTER_TOKEN, pass --url "
                    "and --token, or start one (bash scripts/run.sh starts a local one)\n");
    return EXIT_CONTROLLER;
  }
  if (rc == MUSTER_E_UNAUTHORIZED) {
    fprintf(stderr, "muster: no API token: set MUSTER_TOKEN or pass --token (the local "
                    "controller keeps it in its state directory's token file)\n");
    return EXIT_CONTROLLER;
  }
  if (rc) {
    fprintf(stderr, "muster: bad --url or --token: %s\n", muster_strerror(rc));
    return EXIT_USAGE;
  }
  return 0;
}

static const char *session_default(void) {
  const char *s = getenv("MUSTER_SESSION");
  return s && *s ? s : NULL;
}

/* ---- output ---- */

/* The worker object exactly as the controller sent it. */
static void print_worker_json(const muster_worker *w) {
  fputs(w->json ? w->json : "null", stdout);
}

static void print_list_json(const muster_worker_list *l);

/* What muster launch prints: the ids, one per line, or the workers as JSON. */
static void print_launched(const muster_worker_list *l, int as_json) {
  if (as_json)
    print_list_json(l);
  else
    for (size_t i = 0; i < l->count; i++)
      printf("%s\n", l->items[i].id);
}

static void print_list_json(const muster_worker_list *l) {
  printf("[");
  for (size_t i = 0; i < l->count; i++) {
    printf(i ? ",\n " : "");
    print_worker_json(&l->items[i]);
  }
  printf("]\n");
}

/* Seconds since an ISO time of the controller, or -1. */
static double age_of(const char *iso) {
  struct tm tm;
  char *end;
  time_t t;

  if (!iso)
    return -1;
  memset(&tm, 0, sizeof(tm));
  end = strptime(iso, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end)
    return -1;
  t = timegm(&tm);
  return difftime(time(NULL), t);
}

static void fmt_age(double s, char *buf, size_t size) {
  if (s < 0)
    snprintf(buf, size, "-");
  else if (s < 120)
    snprintf(buf, size, "%.0fs", s);
  else if (s < 7200)
    snprintf(buf, size, "%.0fm", s / 60);
  else if (s < 172800)
    snprintf(buf, size, "%.0fh", s / 3600);
  else
    snprintf(buf, size, "%.0fd", s / 86400);
}

/* Bytes in the CLI's few characters: 812K, 408M, 1.5G. */
static void fmt_bytes(long long b, char *buf, size_t size) {
  if (b < 1024LL * 1024)
    snprintf(buf, size, "%lldK", b / 1024);
  else if (b < 1024LL * 1024 * 1024)
    snprintf(buf, size, "%lldM", b / (1024 * 1024));
  else
    snprintf(buf, size, "%.1fG", (double)b / (1024.0 * 1024 * 1024));
}

/* "12.3s/408M": cpu seconds and memory now (peak once it ended), or "-". */
static void fmt_usage(const muster_worker *w, char *buf, size_t size) {
  muster_usage u;
  char mem[32];

  if (!muster_worker_usage(w, &u)) {
    snprintf(buf, size, "-");
    return;
  }
  fmt_bytes(muster_status_terminal(w->status) ? u.memory_peak_bytes : u.memory_bytes, mem,
            sizeof(mem));
  snprintf(buf, size, "%.1fs/%s", u.cpu_seconds, mem);
}

static void print_table(const muster_worker_list *l) {
  printf("%-12s  %-10s  %-8s  %-10s  %-15s  %5s  %6s  %12s  %3s  %5s  %4s  %s\n", "ID", "STATUS",
         "ROLE", "NAME", "IP", "CPU", "MEM", "USED", "GPU", "AGE", "EXIT", "FAILURE");
  for (size_t i = 0; i < l->count; i++) {
    const muster_worker *w = &l->items[i];
    char age[16], code[16], used[40];

    fmt_age(age_of(w->created_at), age, sizeof(age));
    if (w->has_exit_code)
      snprintf(code, sizeof(code), "%d", w->exit_code);
    else if (w->signal)
      snprintf(code, sizeof(code), "sig%d", w->signal);
    else
      snprintf(code, sizeof(code), "-");
    fmt_usage(w, used, sizeof(used));
    printf("%-12s  %-10s  %-8.8s  %-10.10s  %-15s  %5g  %6g  %12s  %3d  %5s  %4s  %s\n", w->id,
           muster_status_name(w->status), w->role ? w->role : "-", w->name ? w->name : "-",
           w->ip_address ? w->ip_address : "-", w->cpu, w->memory, used, w->nvidia_gpu, age, code,
           w->failure ? w->failure : "");
  }
}

static void print_show(const muster_worker *w) {
  printf("id:          %s\n", w->id);
  printf("status:      %s\n", muster_status_name(w->status));
  if (w->failure)
    printf("failure:     %s\n", w->failure);
  printf("session:     %s\n", w->session ? w->session : "-");
  printf("role:        %s\n", w->role ? w->role : "-");
  printf("name:        %s\n", w->name ? w->name : "-");
  printf("resources:   %g cores, %g GiB, %d GPUs\n", w->cpu, w->memory, w->nvidia_gpu);
  {
    muster_usage u;
    if (muster_worker_usage(w, &u))
      printf("usage:       %.2f cpu seconds, %.1f MiB now, %.1f MiB at most\n", u.cpu_seconds,
             (double)u.memory_bytes / 1048576, (double)u.memory_peak_bytes / 1048576);
  }
  if (w->script)
    printf("script:      %s %s\n", w->kernel ? w->kernel : "", w->script);
  if (w->code)
    printf("code:        %s\n", w->code);
  printf("ip_address:  %s\n", w->ip_address ? w->ip_address : "-");
  printf("hostname:    %s\n", w->hostname ? w->hostname : "-");
  if (w->exec_port)
    printf("exec_port:   %d\n", w->exec_port);
  printf("backend:     %s %s\n", w->backend ? w->backend : "-",
         w->backend_ref ? w->backend_ref : "");
  if (w->has_exit_code)
    printf("exit_code:   %d\n", w->exit_code);
  if (w->signal)
    printf("signal:      %d\n", w->signal);
  printf("created_at:  %s\n", w->created_at ? w->created_at : "-");
  printf("running_at:  %s\n", w->running_at ? w->running_at : "-");
  printf("finished_at: %s\n", w->finished_at ? w->finished_at : "-");
}

/* ---- argument helpers ---- */

static MUST_CHECK int parse_double(const char *s, double min, double *out) {
  char *end;
  double v;

  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < min)
    return -1;
  *out = v;
  return 0;
}

static MUST_CHECK int parse_int(const char *s, long min, long max, long *out) {
  char *end;
  long v;

  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

struct strv {
  const char **v;
  size_t n, cap;
};

/* What a command says and exits with when memory runs out. */
static int out_of_memory(void) {
  fprintf(stderr, "muster: out of memory\n");
  return EXIT_CONTROLLER;
}

static MUST_CHECK int strv_push(struct strv *s, const char *x) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    const char **v = realloc(s->v, cap * sizeof(*v));
    if (!v)
      return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  return 0;
}

/* Reads whitespace-separated ids from stdin into ids (the strings are
 * kept in *store, freed by the caller). */
static MUST_CHECK int read_ids_stdin(struct strv *ids, char **store) {
  size_t cap = 0, len = 0;
  char *buf = NULL;
  int ch;

  while ((ch = getchar()) != EOF) {
    if (len + 2 > cap) {
      char *grown;
      cap = cap ? cap * 2 : 4096;
      if (cap > (size_t)MAX_IDS * 16)
        return -1;
      grown = realloc(buf, cap);
      if (!grown)
        return -1;
      buf = grown;
    }
    buf[len++] = (char)ch;
  }
  if (!buf)
    return 0;
  buf[len] = '\0';
  *store = buf;
  /* Whitespace-separated words, cut in place. */
  for (char *p = buf; *p;) {
    p += strspn(p, " \t\r\n");
    if (!*p)
      break;
    if (strv_push(ids, p) != 0)
      return -1;
    p += strcspn(p, " \t\r\n");
    if (*p)
      *p++ = '\0';
  }
  return 0;
}

/* ---- commands ---- */

/* muster launch --lease: a thread that waits for SIGINT, SIGTERM or
 * SIGHUP (blocked in every thread) and cancels the main thread's await. */
struct sigwatch {
  sigset_t set;
  muster_client *c;
  volatile int got;
};

static void *sigwatch_main(void *arg) {
  struct sigwatch *s = arg;
  int sig = 0;

  if (sigwait(&s->set, &sig) == 0 && sig != SIGUSR1) {
    s->got = sig;
    muster_client_cancel(s->c);
  }
  return NULL;
}

/* Launches o holding its session's lease, prints the workers, and stays
 * until they have all ended (exit 0 if all succeeded) or a signal comes
 * (they are stopped at once). If this process dies, the lease runs out
 * and the controller stops them. */
static int launch_leased(muster_client *c, const muster_launch_opts *o, double ttl, int as_json) {
  struct sigwatch sw = {.c = NULL, .got = 0};
  muster_lease *lease = NULL;
  muster_worker_list ws = {0};
  muster_await_result ar;
  const char **ids = NULL;
  pthread_t t;
  int rc, code = EXIT_OK, watching = 0;

  memset(&ar, 0, sizeof(ar));
  sigemptyset(&sw.set);
  sigaddset(&sw.set, SIGINT);
  sigaddset(&sw.set, SIGTERM);
  sigaddset(&sw.set, SIGHUP);
  sigaddset(&sw.set, SIGUSR1);
  /* Before any thread starts, so that all of them inherit the mask. */
  pthread_sigmask(SIG_BLOCK, &sw.set, NULL);
  rc = muster_lease_start(c, o->session, ttl, &lease);
  if (rc)
    return call_failed(c, rc);
  rc = muster_launch(c, o, &ws);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  print_launched(&ws, as_json);
  fflush(stdout);
  ids = calloc(ws.count + 1, sizeof(*ids));
  sw.c = c; /* a signal cancels the await */
  watching = pthread_create(&t, NULL, sigwatch_main, &sw) == 0;
  if (!ids) {
    code = out_of_memory();
    goto out;
  }
  for (size_t i = 0; i < ws.count; i++)
    ids[i] = ws.items[i].id;
  fprintf(stderr,
          "muster launch: holding session %s's lease (ttl %g s) until the workers end; "
          "Ctrl-C stops them\n",
          o->session, ttl);
  /* Until they end: across a restart of the controller, too (the lease
   * thread keeps renewing; the controller gives the lease a ttl of grace). */
  for (;;) {
    rc = muster_await(sw.c, ids, ws.count, 1, 60, &ar);
    if (sw.got || (rc == 0 && !ar.timed_out))
      break;
    if (rc == 0) { /* a minute passed: wait on (each wait is bounded) */
      muster_await_result_free(&ar);
      memset(&ar, 0, sizeof(ar));
      continue;
    }
    if (rc != MUSTER_E_UNREACHABLE && rc != MUSTER_E_PROTOCOL && rc != MUSTER_E_TIMEOUT &&
        rc != MUSTER_E_SHUTTING_DOWN && rc != MUSTER_E_BACKEND_DOWN)
      break;
    sleep(1);
  }
  if (sw.got) {
    fprintf(stderr, "muster launch: %s: stopping the workers\n", strsignal(sw.got));
    code = EXIT_WORKERS;
  } else if (rc) {
    code = call_failed(sw.c, rc);
  } else if (ar.failures.count) {
    code = EXIT_WORKERS;
  }
out:
  /* A clean end (all ended, or a signal): its workers go now (only its
   * own: an explicit --session may hold others'), then the lease. */
  rc = 0;
  if (ws.count && ids) {
    muster_client *s = NULL;
    muster_worker_list stopped;
    /* c may be cancelled (a signal): a client of its own. */
    rc = connect_client(&s) ? MUSTER_E_UNREACHABLE : muster_stop(s, ids, ws.count, NULL, &stopped);
    if (rc == 0)
      muster_worker_list_free(&stopped);
    muster_client_free(s);
  }
  {
    char why[512];
    if (muster_lease_error(lease, why, sizeof(why))[0])
      fprintf(stderr, "muster launch: %s\n", why);
  }
  /* Workers that could not be stopped keep the lease, left to run out: the
   * controller then stops them. */
  if (rc) {
    (void)muster_lease_end(lease, MUSTER_LEASE_ABANDON);
  } else if (muster_lease_end(lease, MUSTER_LEASE_RELEASE) != 0) {
    rc = MUSTER_E_UNREACHABLE;
  }
  if (rc) {
    fprintf(stderr,
            "muster launch: could not stop the workers and give the lease back (%s); "
            "they stop when the lease runs out\n",
            muster_strerror(rc));
    if (code == EXIT_OK)
      code = EXIT_CONTROLLER;
  }
  if (watching) {
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
  }
  muster_await_result_free(&ar);
  muster_worker_list_free(&ws);
  free(ids);
  return code;
}

static int cmd_launch(int argc, char **argv) {
  muster_launch_opts o;
  struct strv env = {0}, secret = {0}, args = {0};
  int as_json = 0, rc, code = EXIT_OK, leased = 0, session_given = 0;
  double lease_ttl = 30;
  muster_client *c = NULL;
  muster_worker_list ws = {0};
  char script_abs[PATH_MAX], own_session[40];
  long l;
  double d;

  muster_launch_opts_init(&o);
  o.session = session_default();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VALUE()                                                                                    \
  do {                                                                                             \
    if (!v) {                                                                                      \
      code = usage_error(usage_launch, "%s needs a value", a);                                     \
      goto out;                                                                                    \
    }                                                                                              \
    i++;                                                                                           \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_launch, stdout);
      goto out;
    } else if (strcmp(a, "-n") == 0) {
      VALUE();
      if (parse_int(v, 1, 1024, &l) != 0) {
        code = usage_error(usage_launch, "-n must be a whole number from 1 to 1024, not \"%s\"", v);
        goto out;
      }
      o.n = (int)l;
    } else if (strcmp(a, "--cpu") == 0 || strcmp(a, "--memory") == 0) {
      VALUE();
      if (parse_double(v, 0, &d) != 0) {
        code = usage_error(usage_launch, "%s must be a number >= 0, not \"%s\"", a, v);
        goto out;
      }
      if (a[2] == 'c')
        o.cpu = d;
      else
        o.memory = d;
    } else if (strcmp(a, "--gpu") == 0) {
      VALUE();
      if (parse_int(v, 0, 64, &l) != 0) {
        code =
            usage_error(usage_launch, "--gpu must be a whole number from 0 to 64, not \"%s\"", v);
        goto out;
      }
      o.nvidia_gpu = (int)l;
    } else if (strcmp(a, "--script") == 0) {
      VALUE();
      /* The controller runs scripts in its own directory: a script given
       * relative to here is passed as an absolute path. */
      o.script = realpath(v, script_abs) ? script_abs : v;
    } else if (strcmp(a, "--code") == 0) {
      VALUE();
      o.code = v;
    } else if (strcmp(a, "--kernel") == 0) {
      VALUE();
      o.kernel = v;
    } else if (strcmp(a, "--arg") == 0) {
      VALUE();
      if (strv_push(&args, v) != 0) {
        code = out_of_memory();
        goto out;
      }
    } else if (strcmp(a, "--env") == 0 || strcmp(a, "--secret-env") == 0) {
      VALUE();
      if (!strchr(v, '=') || v[0] == '=') {
        code = usage_error(usage_launch, "%s takes NAME=value, not \"%s\"", a, v);
        goto out;
      }
      if (strv_push(a[2] == 'e' ? &env : &secret, v) != 0) {
        code = out_of_memory();
        goto out;
      }
    } else if (strcmp(a, "--role") == 0) {
      VALUE();
      o.role = v;
    } else if (strcmp(a, "--name") == 0) {
      VALUE();
      o.name = v;
    } else if (strcmp(a, "--session") == 0) {
      VALUE();
      o.session = v;
      session_given = 1;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--lease") == 0) {
      leased = 1;
    } else if (strcmp(a, "--lease-ttl") == 0) {
      VALUE();
      if (parse_double(v, 3, &lease_ttl) != 0 || lease_ttl > 86400) {
        code = usage_error(usage_launch, "--lease-ttl must be 3 to 86400 seconds, not \"%s\"", v);
        goto out;
      }
      leased = 1;
    } else if (strcmp(a, "--") == 0) {
      if (i + 1 >= argc) {
        code = usage_error(usage_launch, "-- must be followed by a command");
        goto out;
      }
      o.command = (const char *const *)&argv[i + 1];
      o.ncommand = (size_t)(argc - i - 1);
      break;
    } else {
      code = usage_error(usage_launch, "unknown option %s", a);
      goto out;
    }
#undef VALUE
  }
  if (!!o.script + !!o.code + !!o.ncommand > 1) {
    code = usage_error(usage_launch, "give at most one of --script, --code and -- COMMAND");
    goto out;
  }
  o.env = env.v;
  o.nenv = env.n;
  o.secret_env = secret.v;
  o.nsecret_env = secret.n;
  o.args = args.v;
  o.nargs = args.n;
  if ((code = connect_client(&c)))
    goto out;
  if (leased && !session_given) {
    /* A session of its own (not even MUSTER_SESSION's, which may be a
     * notebook's or a worker's): the lease covers these workers only. */
    unsigned long x = (unsigned long)time(NULL) ^ ((unsigned long)getpid() << 16);
    snprintf(own_session, sizeof(own_session), "launch-%08lx", x & 0xffffffffUL);
    o.session = own_session;
    fprintf(stderr, "muster launch: session %s\n", own_session);
  }
  if (leased) {
    code = launch_leased(c, &o, lease_ttl, as_json);
    goto out;
  }
  rc = muster_launch(c, &o, &ws);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  print_launched(&ws, as_json);
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  free(env.v);
  free(secret.v);
  free(args.v);
  return code;
}

/* Live progress of an await, on a terminal: a thread follows the event
 * stream and redraws one line, e.g. "3/4 running, 1 failed". */
struct progress {
  muster_client *c;
  const char *const *ids;
  size_t n;
  muster_status *st;
  int wfc;
  int64_t since;
  pthread_t thread;
};

static void progress_draw(struct progress *p) {
  size_t counts[MUSTER_STATUS_UNKNOWN + 1] = {0};
  char line[256];
  size_t len = 0;

  for (size_t i = 0; i < p->n; i++)
    counts[p->st[i]]++;
  len += (size_t)snprintf(line + len, sizeof(line) - len, "%zu/%zu %s",
                          p->wfc ? counts[MUSTER_SUCCEEDED] : counts[MUSTER_RUNNING], p->n,
                          p->wfc ? "succeeded" : "running");
  for (int s = 0; s <= MUSTER_STATUS_UNKNOWN && len < sizeof(line); s++) {
    if (!counts[s] || s == (p->wfc ? MUSTER_SUCCEEDED : MUSTER_RUNNING) ||
        s == MUSTER_STATUS_UNKNOWN)
      continue;
    len += (size_t)snprintf(line + len, sizeof(line) - len, ", %zu %s", counts[s],
                            muster_status_name((muster_status)s));
  }
  fprintf(stderr, "\r\033[K%s", line);
  fflush(stderr);
}

static int progress_event(void *arg, const muster_event *e) {
  struct progress *p = arg;

  for (size_t i = 0; i < p->n; i++)
    if (strcmp(p->ids[i], e->worker_id) == 0) {
      p->st[i] = e->to;
      progress_draw(p);
    }
  return 0;
}

static void *progress_main(void *arg) {
  struct progress *p = arg;

  progress_draw(p);
  if (muster_events(p->c, p->since, progress_event, p) != 0)
    return NULL;
  return NULL;
}

/* Starts the progress line: reads the workers' current statuses and the
 * event seq of that moment, then follows from there. Best effort. */
static int progress_start(struct progress *p, const char *const *ids, size_t n, int wfc) {
  muster_worker_list all = {0};

  memset(p, 0, sizeof(*p));
  p->ids = ids;
  p->n = n;
  p->wfc = wfc;
  p->st = calloc(n + 1, sizeof(*p->st));
  if (!p->st || muster_client_new_default(&p->c) != 0 ||
      muster_list(p->c, 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING,
                  NULL, NULL, &all, &p->since) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++) {
    p->st[i] = MUSTER_STATUS_UNKNOWN;
    for (size_t k = 0; k < all.count; k++)
      if (strcmp(all.items[k].id, ids[i]) == 0)
        p->st[i] = all.items[k].status;
    /* Not live: it has ended already; ask how (a few at most, usually). */
    if (p->st[i] == MUSTER_STATUS_UNKNOWN && i < 64) {
      muster_worker w;
      if (muster_get(p->c, ids[i], &w) == 0)
        p->st[i] = w.status;
      muster_worker_cleanup(&w);
    }
  }
  muster_worker_list_free(&all);
  if (pthread_create(&p->thread, NULL, progress_main, p) != 0)
    goto fail;
  return 0;
fail:
  muster_worker_list_free(&all);
  muster_client_free(p->c);
  free(p->st);
  p->c = NULL;
  p->st = NULL;
  return -1;
}

static void progress_stop(struct progress *p) {
  if (!p->c)
    return;
  muster_client_cancel(p->c);
  pthread_join(p->thread, NULL);
  fprintf(stderr, "\r\033[K");
  muster_client_free(p->c);
  free(p->st);
}

static int cmd_await(int argc, char **argv) {
  struct strv ids = {0};
  muster_await_result r = {0};
  muster_client *c = NULL;
  struct progress prog = {0};
  double timeout = 60;
  int wfc = 1, as_json = 0, from_stdin = 0, rc, code = EXIT_OK, show_progress;
  char *store = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_await, stdout);
      goto out;
    } else if (strcmp(a, "--running") == 0) {
      wfc = 0;
    } else if (strcmp(a, "--completion") == 0) {
      wfc = 1;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--timeout") == 0) {
      if (i + 1 >= argc || parse_double(argv[i + 1], 0, &timeout) != 0) {
        code = usage_error(usage_await, "--timeout needs a number of seconds >= 0");
        goto out;
      }
      i++;
    } else if (strcmp(a, "-") == 0) {
      from_stdin = 1;
    } else if (a[0] == '-') {
      code = usage_error(usage_await, "unknown option %s", a);
      goto out;
    } else {
      if (strv_push(&ids, a) != 0) {
        code = out_of_memory();
        goto out;
      }
    }
  }
  if (from_stdin && read_ids_stdin(&ids, &store) != 0) {
    code = usage_error(usage_await, "could not read ids from standard input");
    goto out;
  }
  if (ids.n == 0) {
    code = usage_error(usage_await, "name the workers to await (or '-' to read their ids)");
    goto out;
  }
  if ((code = connect_client(&c)))
    goto out;
  show_progress = isatty(2) && !opt_url && !opt_token;
  if (show_progress)
    (void)progress_start(&prog, ids.v, ids.n, wfc); /* best effort */
  rc = muster_await(c, ids.v, ids.n, wfc, timeout, &r);
  if (show_progress)
    progress_stop(&prog);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  if (as_json) {
    printf("{\"workers\": ");
    print_list_json(&r.workers);
    printf(", \"failures\": ");
    print_list_json(&r.failures);
    printf(", \"timed_out\": %s}\n", r.timed_out ? "true" : "false");
  } else {
    for (size_t i = 0; i < r.workers.count; i++)
      printf("%s  %s  %s\n", r.workers.items[i].id, muster_status_name(r.workers.items[i].status),
             r.workers.items[i].ip_address ? r.workers.items[i].ip_address : "-");
    for (size_t i = 0; i < r.failures.count; i++) {
      const muster_worker *w = &r.failures.items[i];
      printf("%s  %s  %s%s%s\n", w->id, muster_status_name(w->status),
             w->ip_address ? w->ip_address : "-", w->failure ? "  " : "",
             w->failure ? w->failure : "");
    }
  }
  if (r.timed_out)
    fprintf(stderr, "muster: timed out after %g s waiting for %zu of %zu workers to %s\n", timeout,
            r.failures.count, ids.n, wfc ? "end" : "run");
  else if (r.failures.count)
    fprintf(stderr, "muster: %zu of %zu workers did not %s\n", r.failures.count, ids.n,
            wfc ? "succeed" : "reach running");
  code = r.failures.count || r.timed_out ? EXIT_WORKERS : EXIT_OK;
out:
  muster_await_result_free(&r);
  muster_client_free(c);
  free(ids.v);
  free(store);
  return code;
}

static int cmd_ps(int argc, char **argv) {
  unsigned statuses = 0;
  const char *session = NULL, *role = NULL;
  int all = 0, as_json = 0, rc, code = EXIT_OK;
  muster_client *c = NULL;
  muster_worker_list ws = {0};

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_ps, stdout);
      goto out;
    } else if (strcmp(a, "-a") == 0 || strcmp(a, "--all") == 0) {
      all = 1;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if ((strcmp(a, "--session") == 0 || strcmp(a, "--role") == 0 ||
                strcmp(a, "--status") == 0) &&
               v) {
      i++;
      if (a[2] == 's' && a[3] == 'e')
        session = v;
      else if (a[2] == 'r')
        role = v;
      else {
        int s;
        for (s = 0; s < MUSTER_STATUS_UNKNOWN; s++)
          if (strcmp(v, muster_status_name((muster_status)s)) == 0)
            break;
        if (s == MUSTER_STATUS_UNKNOWN) {
          code = usage_error(usage_ps,
                             "--status must be scheduling, starting, running, "
                             "succeeded, failed or stopped, not \"%s\"",
                             v);
          goto out;
        }
        statuses |= 1u << s;
      }
    } else {
      code = usage_error(usage_ps, "unknown option or missing value: %s", a);
      goto out;
    }
  }
  if (!statuses && !all)
    statuses = 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING;
  if ((code = connect_client(&c)))
    goto out;
  rc = muster_list(c, statuses, session, role, &ws, NULL);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  if (as_json)
    print_list_json(&ws);
  else
    print_table(&ws);
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  return code;
}

static int cmd_show(int argc, char **argv) {
  int as_json = 0, n = 0, code = EXIT_OK;
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_show, stdout);
      return EXIT_OK;
    }
    if (strcmp(argv[i], "--json") == 0)
      as_json = 1;
    else if (argv[i][0] == '-')
      return usage_error(usage_show, "unknown option %s", argv[i]);
    else
      n++;
  }
  if (!n)
    return usage_error(usage_show, "name the workers to show");
  if ((code = connect_client(&c)))
    return code;
  if (as_json && n > 1)
    printf("[");
  for (int i = 1, shown = 0; i < argc; i++) {
    muster_worker w;
    int rc;
    if (argv[i][0] == '-')
      continue;
    rc = muster_get(c, argv[i], &w);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    if (as_json) {
      printf(shown++ ? ",\n " : "");
      print_worker_json(&w);
    } else {
      printf(shown++ ? "\n" : "");
      print_show(&w);
    }
    muster_worker_cleanup(&w);
  }
  if (as_json)
    printf(n > 1 ? "]\n" : "\n");
  muster_client_free(c);
  return code;
}

static int cmd_stop(int argc, char **argv) {
  struct strv ids = {0};
  const char *session = session_default();
  int all = 0, rc, code = EXIT_OK;
  muster_client *c = NULL;
  muster_worker_list ws = {0};

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_stop, stdout);
      goto out;
    } else if (strcmp(a, "--all") == 0) {
      all = 1;
    } else if (strcmp(a, "--session") == 0 && i + 1 < argc) {
      session = argv[++i];
    } else if (a[0] == '-') {
      code = usage_error(usage_stop, "unknown option or missing value: %s", a);
      goto out;
    } else {
      if (strv_push(&ids, a) != 0) {
        code = out_of_memory();
        goto out;
      }
    }
  }
  if (!all && ids.n == 0) {
    code = usage_error(usage_stop, "name the workers to stop, or give --all");
    goto out;
  }
  if (all && ids.n) {
    code = usage_error(usage_stop, "give either ids or --all, not both");
    goto out;
  }
  if ((code = connect_client(&c)))
    goto out;
  rc = muster_stop(c, ids.v, ids.n, session, &ws);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  for (size_t i = 0; i < ws.count; i++)
    printf("%s  %s\n", ws.items[i].id, muster_status_name(ws.items[i].status));
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  free(ids.v);
  return code;
}

static int write_out(void *arg, const char *data, size_t len) {
  (void)arg;
  if (fwrite(data, 1, len, stdout) != len)
    return 1;
  fflush(stdout);
  return 0;
}

static int cmd_logs(int argc, char **argv) {
  const char *id = NULL;
  int follow = 0, rc, code;
  muster_stream stream = MUSTER_STDOUT;
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_logs, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "-f") == 0 || strcmp(a, "--follow") == 0) {
      follow = 1;
    } else if (strcmp(a, "--stderr") == 0) {
      stream = MUSTER_STDERR;
    } else if (a[0] == '-') {
      return usage_error(usage_logs, "unknown option %s", a);
    } else if (id) {
      return usage_error(usage_logs, "name one worker");
    } else {
      id = a;
    }
  }
  if (!id)
    return usage_error(usage_logs, "name the worker whose output to print");
  if ((code = connect_client(&c)))
    return code;
  rc = muster_logs(c, id, stream, 0, follow, write_out, NULL);
  if (rc)
    code = call_failed(c, rc);
  muster_client_free(c);
  return code;
}

static int cmd_exec(int argc, char **argv) {
  struct strv env = {0};
  const char *id = NULL, *cwd = NULL;
  int no_stdin = 0, code = EXIT_OK, exit_code, rc, i;
  muster_client *c = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  char err[600];

  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_exec, stdout);
      goto out;
    } else if (strcmp(a, "-n") == 0) {
      no_stdin = 1;
    } else if (strcmp(a, "--env") == 0 && i + 1 < argc && strchr(argv[i + 1], '=')) {
      if (strv_push(&env, argv[++i]) != 0) {
        code = out_of_memory();
        goto out;
      }
    } else if (strcmp(a, "--cwd") == 0 && i + 1 < argc) {
      cwd = argv[++i];
    } else if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (a[0] == '-') {
      code = usage_error(usage_exec, "unknown option or missing value: %s", a);
      goto out;
    } else if (!id) {
      id = a;
    } else {
      break;
    }
  }
  if (!id || i >= argc) {
    code = usage_error(usage_exec, "name a worker and a command (muster exec ID -- CMD)");
    goto out;
  }
  if ((code = connect_client(&c)))
    goto out;
  rc = muster_exec_target_get(c, id, &t);
  if (rc == MUSTER_E_CONFLICT) {
    fprintf(stderr, "muster: worker %s is not running (its status says so: muster show %s)\n", id,
            id);
    code = EXIT_WORKERS;
    goto out;
  }
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  muster_exec_opts_init(&o);
  o.argv = (const char *const *)&argv[i];
  o.argc = (size_t)(argc - i);
  o.env = env.v;
  o.nenv = env.n;
  o.cwd = cwd;
  o.stdin_fd = no_stdin ? -1 : 0;
  rc = muster_exec_at(&t, &o, &exit_code, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "muster: %s\n", err);
    code = rc == MUSTER_E_NOT_FOUND ? 127 : EXIT_CONTROLLER;
    goto out;
  }
  if (err[0])
    fprintf(stderr, "muster: %s\n", err);
  code = exit_code;
out:
  muster_client_free(c);
  free(env.v);
  return code;
}

/* Finds host's exec port and token: from muster run's environment, or
 * from the controller (the running worker with that address). */
/* HOST's exec channel: from muster run's environment, or else from the
 * controller (muster rsh run by hand as mpirun's agent). */
static MUST_CHECK int rsh_target(const char *host, muster_exec_target *t) {
  muster_client *c = NULL;
  muster_worker_list ws = {0};
  int rc;

  if (mpi_agent_rsh_target_env(host, t) == 0)
    return 0;
  if ((rc = connect_client(&c)))
    return rc;
  rc = muster_list(c, 1u << MUSTER_RUNNING, NULL, NULL, &ws, NULL);
  if (rc) {
    rc = call_failed(c, rc);
    goto out;
  }
  rc = EXIT_CONTROLLER;
  for (size_t i = 0; i < ws.count; i++)
    if (ws.items[i].ip_address && strcmp(ws.items[i].ip_address, host) == 0) {
      rc = muster_exec_target_get(c, ws.items[i].id, t);
      if (rc)
        rc = call_failed(c, rc);
      goto out;
    }
  fprintf(stderr, "muster rsh: no running worker has the address %s\n", host);
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  return rc;
}

static int cmd_rsh(int argc, char **argv) {
  muster_exec_target t;
  int host, rc;

  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(mpi_agent_usage_rsh, stdout);
    return EXIT_OK;
  }
  host = mpi_agent_rsh_host(argc, argv);
  if (host < 0)
    return usage_error(mpi_agent_usage_rsh, "a host and a command are needed");
  if ((rc = rsh_target(argv[host], &t)))
    return rc;
  return mpi_agent_rsh_at(&t, argc, argv, host + 1, "muster rsh");
}

static int cmd_rank(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(mpi_agent_usage_rank, stdout);
    return EXIT_OK;
  }
  return mpi_agent_rank(argc, argv, "muster rank");
}

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

static void run_restart(void *arg, int attempt, const char *cause) {
  const muster_run_opts *o = arg;
  (void)o;
  fprintf(stderr, "muster run: restart %d: %s\n", attempt, cause);
  fflush(stderr);
}

static int cmd_run(int argc, char **argv) {
  muster_run_opts o;
  muster_run_result r;
  muster_client *c = NULL;
  char self[PATH_MAX];
  int code = EXIT_OK, rc, i;
  long l;
  double d;
  ssize_t n;

  int session_given = 0, ttl_given = 0;

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
    } else if (!v) {
      return usage_error(usage_run, "%s needs a value", a);
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
    } else if (strcmp(a, "--workers") == 0 || strcmp(a, "--ps") == 0 || strcmp(a, "--gpu") == 0 ||
               strcmp(a, "--port") == 0) {
      i++;
      if (parse_int(v, strcmp(a, "--workers") == 0 ? 1 : 0, strcmp(a, "--port") == 0 ? 65535 : 1024,
                    &l) != 0)
        return usage_error(usage_run, "%s must be a whole number, not \"%s\"", a, v);
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
      if (parse_double(v, 0, &d) != 0)
        return usage_error(usage_run, "%s must be a number >= 0, not \"%s\"", a, v);
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
    } else if (strcmp(a, "--no-lease") == 0) {
      o.lease_ttl = -1;
    } else if (strcmp(a, "--run-dir") == 0) {
      i++;
      o.run_dir = v;
    } else {
      return usage_error(usage_run, "unknown option %s", a);
    }
  }
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
    code = call_failed(c, rc);
    muster_client_free(c);
    return code;
  }
  if (r.exit_code == 0) {
    fprintf(stderr,
            "muster run: succeeded (%d workers%s; %.2f s to start, %.2f s to run; %d restart%s)\n",
            o.n_workers, o.mode == MUSTER_RUN_PS ? " and parameter servers" : "", r.start_s,
            r.run_s, r.restarts, r.restarts == 1 ? "" : "s");
  } else {
    fprintf(stderr, "muster run: FAILED: %s\n", r.failure[0] ? r.failure : "unknown reason");
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

static int cmd_runs(int argc, char **argv) {
  const char *session = NULL, *status = NULL;
  int as_json = 0, rc, code = EXIT_OK;
  long limit = 50, got = 0;
  char next[32] = "";
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_runs, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--session") == 0 && v) {
      session = argv[++i];
    } else if (strcmp(a, "--status") == 0 && v) {
      status = argv[++i];
      if (strcmp(status, "running") != 0 && strcmp(status, "succeeded") != 0 &&
          strcmp(status, "failed") != 0 && strcmp(status, "stopped") != 0)
        return usage_error(usage_runs,
                           "--status must be running, succeeded, failed or stopped, not \"%s\"",
                           status);
    } else if (strcmp(a, "-n") == 0 && v) {
      if (parse_int(argv[++i], 1, 1000000, &limit) != 0)
        return usage_error(usage_runs, "-n must be a whole number >= 1, not \"%s\"", v);
    } else {
      return usage_error(usage_runs, "unknown option or missing value: %s", a);
    }
  }
  if ((code = connect_client(&c)))
    return code;
  if (as_json)
    fputs("[", stdout);
  else
    printf("%-13s %-9s %-9s %-8s %-7s %-12s %-8s %s\n", "RUN", "MODE", "STATUS", "RESTARTS",
           "WORKERS", "SESSION", "AGE", "FAILURE");
  /* Page after page, as the controller hands them out, until -n are shown. */
  do {
    muster_run_info_list l;
    long want = limit - got > 5000 ? 5000 : limit - got;
    rc = muster_runs(c, session, status, (int)want, next[0] ? next : NULL, &l, next);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    for (size_t k = 0; k < l.count; k++, got++) {
      const muster_run_info *r = &l.items[k];
      char age[32], restarts[24];
      if (as_json) {
        printf("%s%s", got ? "," : "", r->json ? r->json : "null");
        continue;
      }
      fmt_age(age_of(r->created_at), age, sizeof(age));
      snprintf(restarts, sizeof(restarts), "%d/%d", r->restarts, r->max_restarts);
      printf("%-13s %-9s %-9s %-8s %-7zu %-12.12s %-8s %s\n", r->id, r->mode ? r->mode : "-",
             r->status ? r->status : "-", restarts, r->nworkers, r->session ? r->session : "-", age,
             r->failure ? r->failure : "");
    }
    muster_run_info_list_free(&l);
  } while (next[0] && got < limit);
  if (as_json)
    puts("]");
  muster_client_free(c);
  return code;
}

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} commands[] = {
    {"launch", cmd_launch}, {"await", cmd_await}, {"ps", cmd_ps},     {"ls", cmd_ps},
    {"show", cmd_show},     {"stop", cmd_stop},   {"logs", cmd_logs}, {"exec", cmd_exec},
    {"rsh", cmd_rsh},       {"rank", cmd_rank},   {"run", cmd_run},   {"runs", cmd_runs},
};

int main(int argc, char **argv) {
  int i = 1;

  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_main, stdout);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("muster %s\n", MUSTER_VERSION);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
      opt_url = argv[++i];
    } else if (strcmp(argv[i], "--token") == 0 && i + 1 < argc) {
      opt_token = argv[++i];
    } else {
      return usage_error(usage_main, "unknown option or missing value: %s", argv[i]);
    }
  }
  if (i >= argc)
    return usage_error(usage_main, "a command is needed");
  argc -= i;
  argv += i;
  for (size_t k = 0; k < sizeof(commands) / sizeof(commands[0]); k++)
    if (strcmp(argv[0], commands[k].name) == 0)
      return commands[k].run(argc, argv);
  return usage_error(usage_main, "unknown command \"%s\"", argv[0]);
}

/* mpi_agent.c: Open MPI's rsh and rank agents on the exec channel
 * (mpi_agent.h). Uses only the exec channel's client (sdk/lib/exec.c), never
 * the controller. */
#include "mpi_agent.h"

#include "envlists.h"
#include "exec_words.h"
#include "fault.h"
#include "rank_end.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The exit codes of the CLI's table (sdk/cli/muster.c) that these share. */
enum { AGENT_USAGE = 2, AGENT_NO_MEMORY = 6 }; /* the CLI's usage and internal exit codes */

const char mpi_agent_usage_rsh[] =
    "usage: muster rsh [options] HOST COMMAND...\n"
    "\n"
    "Open MPI's rsh agent (--mca plm_rsh_agent \"muster rsh\"): runs COMMAND (a shell\n"
    "command line) in the worker whose address is HOST, through its exec channel,\n"
    "relaying standard input and output for as long as it runs. HOST's exec port\n"
    "and the token come from MUSTER_EXEC_HOSTS and MUSTER_EXEC_TOKEN (set by muster\n"
    "run), or else from the controller. Options before HOST are ignored.\n";

const char mpi_agent_usage_rank[] =
    "usage: muster rank [--] COMMAND [ARGS...]\n"
    "\n"
    "Used by muster run: started by an Open MPI daemon that serves every worker of\n"
    "a host, it runs COMMAND (rank OMPI_COMM_WORLD_RANK of the job) inside that\n"
    "rank's own worker through its exec channel, with Open MPI's variables (and\n"
    "RANK, LOCAL_RANK), and relays its input, output and exit code. The workers\n"
    "come from MUSTER_EXEC_RANKS (ip:port per rank) and MUSTER_EXEC_TOKEN.\n";

int mpi_agent_rsh_host(int argc, char **argv) {
  int i = 1;

  while (i < argc && argv[i][0] == '-')
    i += strcmp(argv[i], "-l") == 0 || strcmp(argv[i], "-p") == 0 ? 2 : 1;
  return i + 1 < argc ? i : -1;
}

int mpi_agent_rsh_target_env(const char *host, muster_exec_target *t) {
  const char *hosts = getenv("MUSTER_EXEC_HOSTS"), *token = getenv("MUSTER_EXEC_TOKEN");

  return hosts && token && muster_exec_list_find(hosts, host, 0, token, t) == 0 ? 0 : -1;
}

/* Appends s at buf + *off (which has room for it, counted beforehand). */
static void put(char *buf, size_t *off, const char *s) {
  size_t n = strlen(s);

  memcpy(buf + *off, s, n);
  *off += n;
  buf[*off] = '\0';
}

int mpi_agent_rsh_at(const muster_exec_target *t, int argc, char **argv, int first,
                     const char *who) {
  const char *sh[3] = {"/bin/sh", "-c", NULL}, *fwd[8];
  char *line = NULL, err[600];
  size_t len = 0, nfwd = 0, off = 0;
  muster_exec_opts o;
  int exit_code, rc;

  char prefix[512], dir[160];

  /* Open MPI's daemon keeps its session directory under a directory of its
   * host's own: workers in network namespaces of their own are nodes of
   * their own, yet share their session's /tmp and the host's name, and two
   * daemons in one session directory remove each other's files. Its
   * ranks' reports go in a file there (mpi_agent_rank()). */
  rank_ends_dir(argv[first - 1], dir, sizeof(dir));
  snprintf(prefix, sizeof(prefix),
           "OMPI_MCA_orte_tmpdir_base=%s; " RANK_ENDS_ENV "=%s/" RANK_ENDS_FILE ".$$; "
           "export OMPI_MCA_orte_tmpdir_base " RANK_ENDS_ENV "; ",
           dir, dir);
  /* Like ssh: the words form one shell command line (then the daemon's
   * directory goes, where the daemon left it empty: on a host whose /tmp
   * is not the worker's own, a Slurm node's). */
  static const char suffix[] = "\ns=$?; rmdir \"$OMPI_MCA_orte_tmpdir_base\" 2>/dev/null; exit $s";
  len = strlen(prefix) + strlen(suffix);
  for (int k = first; k < argc; k++)
    len += strlen(argv[k]) + 1;
  line = calloc(len + 1, 1);
  if (!line)
    return AGENT_NO_MEMORY;
  put(line, &off, prefix);
  for (int k = first; k < argc; k++) {
    put(line, &off, argv[k]);
    if (k + 1 < argc)
      put(line, &off, " ");
  }
  put(line, &off, suffix);
  sh[2] = line;
  muster_exec_opts_init(&o);
  o.argv = sh;
  o.argc = 3;
  o.stdin_fd = 0;
  for (char **e = environ; *e && nfwd < sizeof(fwd) / sizeof(fwd[0]); e++)
    if (env_rsh_forwards(*e))
      fwd[nfwd++] = *e;
  o.env = fwd;
  o.nenv = nfwd;
  rc = muster_exec_at(t, &o, &exit_code, err, sizeof(err));
  free(line);
  if (rc) {
    fprintf(stderr, "%s: %s\n", who, err);
    return 255; /* what ssh says when it cannot connect */
  }
  return exit_code;
}

/* Writes the report line (common/rank_end.h) to where muster run reads it
 * twice over: on this process's stderr, which the Open MPI daemon relays to
 * mpirun (--tag-output), and appended to the daemon's file of reports
 * (RANK_ENDS_ENV, set by `muster rsh`), which muster run reads through the
 * exec channel once mpirun has failed. The first way alone is lost with
 * the daemon (mpirun then says only "lost communication with a remote
 * daemon", exit 205 or 213); the second does not go through Open MPI.
 * muster run keeps the first report and takes every copy out of the
 * output. A line is under PIPE_BUF: appended whole. */
static void rank_end_write(const char *line, size_t len) {
  const char *ends = getenv(RANK_ENDS_ENV);
  int fd;

  /* Test builds: the relay through Open MPI made to lose the report, or
   * the daemon lost right after it (what Open MPI does on a lost daemon). */
  if (!FAULT_FAILS("rank_end_relay") && write(2, line, len) < 0) {
    /* the daemon's file below may still carry it */
  }
  if (ends && ends[0] == '/') {
    fd = open(ends, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd >= 0) {
      if (write(fd, line, len) < 0) {
        /* the relay's copy above may still go */
      }
      close(fd);
    }
  }
  if (FAULT_FAILS("rank_end_daemon_lost"))
    kill(getppid(), SIGKILL);
}

/* Tells muster run (marker: RANK_END_ENV's value) how rank's command
 * ended (common/rank_end.h): rc and err as muster_exec_at()
 * gave them, else its exit code or signal; program, the command's name.
 * workerd's refusals (a working directory that is not there, a program it
 * may not run, a stopping worker) come with rc 0, exit code 126 and a
 * sentence in err, its losing track of the command with -1: the sentence
 * is the cause, not the code. */
static void rank_end(const char *marker, long rank, int rc, int exit_code, int signo,
                     const char *err, const char *program) {
  char line[PIPE_BUF];
  int n;

  if (rc == MUSTER_E_NOT_FOUND && err[0])
    n = snprintf(line, sizeof(line), "%s %ld error 0 %s\n", marker, rank, exec_words(err));
  else if (rc == MUSTER_E_NOT_FOUND)
    n = snprintf(line, sizeof(line), "%s %ld error 0 %s: not found%s\n", marker, rank, program,
                 strchr(program, '/') ? "" : " on the worker's PATH");
  else if (rc)
    n = snprintf(line, sizeof(line), "%s %ld %s 0 %s\n", marker, rank,
                 rc == MUSTER_E_UNREACHABLE ? "lost" : "error", err);
  else if (err[0])
    n = snprintf(line, sizeof(line), "%s %ld error 0 %s\n", marker, rank, exec_words(err));
  else if (exit_code < 0)
    n = snprintf(line, sizeof(line), "%s %ld error 0 its worker did not say how %s ended\n", marker,
                 rank, program);
  else if (signo)
    n = snprintf(line, sizeof(line), "%s %ld signal %d\n", marker, rank, signo);
  else
    n = snprintf(line, sizeof(line), "%s %ld exit %d\n", marker, rank, exit_code);
  if (n < 0)
    return;
  if ((size_t)n >= sizeof(line)) { /* cut short: the line still ends */
    n = (int)sizeof(line) - 1;
    line[n - 1] = '\n';
  }
  rank_end_write(line, (size_t)n);
}

/* A rank gets what its Open MPI daemon says (env_rank_forwards); the rest
 * of the daemon's environment is its own worker's, and the rank gets its own
 * worker's instead. */
int mpi_agent_rank(int argc, char **argv, const char *who) {
  const char *ranks = getenv("MUSTER_EXEC_RANKS"), *token = getenv("MUSTER_EXEC_TOKEN");
  const char *rank_s = getenv("OMPI_COMM_WORLD_RANK");
  const char *local_s = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char *marker = getenv(RANK_END_ENV);
  char cwd[PATH_MAX], err[600], rank_env[32], local_env[32], *end;
  const char **env = NULL;
  size_t nenv = 0;
  muster_exec_target t;
  muster_exec_opts o;
  long rank;
  int i = 1, exit_code, signo, rc;

  if (i < argc && strcmp(argv[i], "--") == 0)
    i++;
  if (i >= argc) {
    fprintf(stderr, "%s: give the command\n\n%s", who, mpi_agent_usage_rank);
    return AGENT_USAGE;
  }
  if (!rank_s || !ranks || !token) {
    fprintf(stderr, "%s: %s is not set: it is started by muster run's mpirun only\n", who,
            !rank_s  ? "OMPI_COMM_WORLD_RANK"
            : !ranks ? "MUSTER_EXEC_RANKS"
                     : "MUSTER_EXEC_TOKEN");
    return AGENT_USAGE;
  }
  rank = strtol(rank_s, &end, 10);
  if (end == rank_s || *end)
    rank = -1;
  if (rank < 0 || muster_exec_list_find(ranks, NULL, rank, token, &t) != 0) {
    fprintf(stderr, "%s: rank %s has no worker in MUSTER_EXEC_RANKS (%s)\n", who, rank_s, ranks);
    return AGENT_USAGE;
  }

  for (char **e = environ; *e; e++)
    nenv++;
  env = calloc(nenv + 2, sizeof(*env));
  if (!env)
    return AGENT_NO_MEMORY;
  nenv = 0;
  for (char **e = environ; *e; e++)
    if (env_rank_forwards(*e))
      env[nenv++] = *e;
  snprintf(rank_env, sizeof(rank_env), "RANK=%ld", rank);
  env[nenv++] = rank_env;
  if (local_s) {
    snprintf(local_env, sizeof(local_env), "LOCAL_RANK=%s", local_s);
    env[nenv++] = local_env;
  }

  muster_exec_opts_init(&o);
  o.argv = (const char *const *)&argv[i];
  o.argc = (size_t)(argc - i);
  o.env = env;
  o.nenv = nenv;
  o.cwd = getcwd(cwd, sizeof(cwd)) ? cwd : NULL;
  o.stdin_fd = 0;
  rc = muster_exec_at_signal(&t, &o, &exit_code, &signo, err, sizeof(err));
  free(env);
  /* Under muster run, a failure is said once, by muster run, naming the
   * rank's worker and the cause; by hand, here. */
  if (marker && strncmp(marker, RANK_END_PREFIX, strlen(RANK_END_PREFIX)) == 0 &&
      (rc || exit_code != 0))
    rank_end(marker, rank, rc, exit_code, signo, err, argv[i]);
  else if (rc || err[0])
    fprintf(stderr, "%s: rank %ld: %s\n", who, rank, err);
  /* 255: the worker is gone or unreachable (as ssh and muster rsh say). */
  if (rc)
    return rc == MUSTER_E_NOT_FOUND ? 127 : rc == MUSTER_E_UNREACHABLE ? 255 : 126;
  return exit_code;
}

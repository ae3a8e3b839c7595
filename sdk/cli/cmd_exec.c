/* cmd_exec.c: the commands on a worker's exec channel: muster exec, and
 * Open MPI's agents muster rsh and muster rank (mpi_agent.c does the work;
 * muster-launcher has the same two without libcurl). */
#include "cli.h"
#include "mpi_agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_exec[] =
    "usage: muster exec [-n] [--env K=V]... [--cwd DIR] ID -- COMMAND [ARGS...]\n"
    "\n"
    "Runs a command inside a running worker through its exec channel (no SSH),\n"
    "relaying standard input (unless -n), output and the exit code.\n";

int cmd_exec(int argc, char **argv) {
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
    } else if (strcmp(a, "--env") == 0 && i + 1 < argc) {
      code = usage_error(usage_exec, "--env takes NAME=value, not \"%s\"", argv[i + 1]);
      goto out;
    } else if (a[0] == '-') {
      code = unknown_option(usage_exec, a);
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
    code = rc == MUSTER_E_NOT_FOUND ? 127 : exit_code_for(rc);
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
  rc = EXIT_NOT_FOUND;
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

int cmd_rsh(int argc, char **argv) {
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

int cmd_rank(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(mpi_agent_usage_rank, stdout);
    return EXIT_OK;
  }
  return mpi_agent_rank(argc, argv, "muster rank");
}

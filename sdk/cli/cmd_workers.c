/* cmd_workers.c: the commands that start, wait for and stop workers:
 * muster launch, await and stop. */
#include "await_progress.h"
#include "cli.h"
#include "launch_lease.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    "  --cwd DIR         where the workers start and a relative --script is found\n"
    "                    (default: here, unless MUSTER_SEND_CWD=0; --cwd - or '':\n"
    "                    the controller's --workdir)\n"
    "  --path P          the PATH their commands are looked up on (default: this\n"
    "                    shell's, less empty and . entries, unless\n"
    "                    MUSTER_SEND_PATH=0; --no-path or --path '': the worker's own)\n"
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

static const char usage_stop[] =
    "usage: muster stop ID... | --all [--session S]\n"
    "\n"
    "Stops workers: the ones named, or with --all every live worker, of every\n"
    "session (--session S, or $MUSTER_SESSION where set, narrows it to one).\n"
    "Prints each worker it stopped, and with --all how many in which sessions.\n";

int cmd_launch(int argc, char **argv) {
  muster_launch_opts o;
  struct strv env = {0}, secret = {0}, args = {0};
  int as_json = 0, rc, code = EXIT_OK, leased = 0, session_given = 0;
  double lease_ttl = 30;
  muster_client *c = NULL;
  muster_worker_list ws = {0};
  char cwd_abs[PATH_MAX], script_abs[PATH_MAX], own_session[40], msg[160];
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
      if (parse_resource(a, v, &d, msg, sizeof(msg)) != 0) {
        code = usage_error(usage_launch, "%s", msg);
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
      o.script = v;
    } else if (strcmp(a, "--code") == 0) {
      VALUE();
      o.code = v;
    } else if (strcmp(a, "--kernel") == 0) {
      VALUE();
      o.kernel = v;
    } else if (strcmp(a, "--cwd") == 0) {
      VALUE();
      if (!*v || strcmp(v, "-") == 0) {
        o.cwd = ""; /* the controller's --workdir */
      } else if (cli_abs_dir(v, cwd_abs, sizeof(cwd_abs)) != 0) {
        code =
            usage_error(usage_launch, "--cwd %s is not a directory here: give an absolute path", v);
        goto out;
      } else {
        o.cwd = cwd_abs;
      }
    } else if (strcmp(a, "--path") == 0) {
      VALUE();
      o.path = v;
    } else if (strcmp(a, "--no-path") == 0) {
      o.path = "";
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
      code = unknown_option(usage_launch, a);
      goto out;
    }
#undef VALUE
  }
  if (!!o.script + !!o.code + !!o.ncommand > 1) {
    code = usage_error(usage_launch, "give at most one of --script, --code and -- COMMAND");
    goto out;
  }
  /* A relative script resolves against the workers' cwd, which is here
   * unless --cwd says otherwise; one that is here is shown (muster show)
   * as the absolute path it is. */
  if (o.script && o.script[0] != '/' && !o.cwd && realpath(o.script, script_abs))
    o.script = script_abs;
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

int cmd_await(int argc, char **argv) {
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
      code = unknown_option(usage_await, a);
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
    term_safe_list(&r.workers);
    term_safe_list(&r.failures);
    for (size_t i = 0; i < r.workers.count; i++)
      printf("%s  %s  %s\n", r.workers.items[i].id, muster_status_name(r.workers.items[i].status),
             r.workers.items[i].ip_address ? r.workers.items[i].ip_address : "-");
    for (size_t i = 0; i < r.failures.count; i++) {
      const muster_worker *w = &r.failures.items[i];
      char why[200];
      /* Still waiting at the timeout: for what. */
      if (muster_worker_waiting_for(w, why, sizeof(why))) {
        char *safe = term_safe_dup(why, 0);
        printf("%s  %s  %s  waiting for %s\n", w->id, muster_status_name(w->status),
               w->ip_address ? w->ip_address : "-", safe ? safe : "?");
        free(safe);
      } else {
        printf("%s  %s  %s%s", w->id, muster_status_name(w->status),
               w->ip_address ? w->ip_address : "-", w->failure ? "  " : "");
        /* The lines its stderr ended with, indented under it. */
        print_failure(stdout, w->failure ? w->failure : "", "    ");
      }
    }
  }
  if (r.timed_out)
    fprintf(stderr, "muster: timed out after %g s waiting for %zu of %zu worker%s to %s\n", timeout,
            r.failures.count, ids.n, ids.n == 1 ? "" : "s", wfc ? "end" : "run");
  else if (r.failures.count)
    fprintf(stderr, "muster: %zu of %zu worker%s did not %s\n", r.failures.count, ids.n,
            ids.n == 1 ? "" : "s", wfc ? "succeed" : "reach running");
  code = r.failures.count || r.timed_out ? EXIT_WORKERS : EXIT_OK;
out:
  muster_await_result_free(&r);
  muster_client_free(c);
  free(ids.v);
  free(store);
  return code;
}

/* Adds session s to the list ("a, b, c") unless it is there or the list
 * is full. */
static void add_session(char *list, size_t size, const char *s) {
  size_t len = strlen(list), n = strlen(s);

  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && strncmp(p, s, n) == 0)
      return;
    p += k;
    p += strspn(p, ", ");
  }
  if (len + n + 3 < size)
    snprintf(list + len, size - len, "%s%s", len ? ", " : "", s);
}

/* Prints what a stop call answered, "ID  STATUS" a line, and counts the
 * workers stopped and their sessions. */
static void print_stopped(const muster_worker_list *ws, size_t *nstopped, char *sessions,
                          size_t size) {
  for (size_t i = 0; i < ws->count; i++) {
    const muster_worker *w = &ws->items[i];
    printf("%s  %s\n", w->id, muster_status_name(w->status));
    if (w->status == MUSTER_STOPPED) {
      char *safe = term_safe_dup(w->session ? w->session : "-", 0);
      (*nstopped)++;
      add_session(sessions, size, safe ? safe : "?");
      free(safe);
    }
  }
}

/* muster stop --all without a session: every live worker the token may
 * stop, across sessions (listed, then stopped by id, 5000 a call). */
static int stop_everywhere(muster_client *c, size_t *nstopped, char *sessions, size_t size) {
  unsigned live = 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING;
  muster_worker_list all = {0};
  const char **ids = NULL;
  int rc, code = EXIT_OK;

  rc = muster_list(c, live, NULL, NULL, &all, NULL);
  if (rc)
    return call_failed(c, rc);
  ids = calloc(all.count + 1, sizeof(*ids));
  if (!ids) {
    code = out_of_memory();
    goto out;
  }
  for (size_t i = 0; i < all.count; i++)
    ids[i] = all.items[i].id;
  for (size_t at = 0; at < all.count; at += 5000) {
    muster_worker_list ws = {0};
    size_t n = all.count - at > 5000 ? 5000 : all.count - at;
    rc = muster_stop(c, ids + at, n, NULL, &ws);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    print_stopped(&ws, nstopped, sessions, size);
    muster_worker_list_free(&ws);
  }
out:
  free(ids);
  muster_worker_list_free(&all);
  return code;
}

int cmd_stop(int argc, char **argv) {
  struct strv ids = {0};
  const char *session = session_default();
  int all = 0, rc, code = EXIT_OK, from_env = session != NULL;
  muster_client *c = NULL;
  muster_worker_list ws = {0};
  size_t nstopped = 0;
  char sessions[1024] = "";

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_stop, stdout);
      goto out;
    } else if (strcmp(a, "--all") == 0) {
      all = 1;
    } else if (strcmp(a, "--session") == 0 && i + 1 < argc) {
      session = argv[++i];
      from_env = 0;
    } else if (a[0] == '-') {
      code = unknown_option(usage_stop, a);
      goto out;
    } else if (is_run_id(a)) {
      code = usage_error(usage_stop,
                         "%s is a run; muster stop takes worker ids (muster runs lists runs; "
                         "ending muster run stops a run's workers)",
                         a);
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
  if (all && !session) {
    code = stop_everywhere(c, &nstopped, sessions, sizeof(sessions));
  } else {
    rc = muster_stop(c, ids.v, ids.n, session, &ws);
    if (rc) {
      code = call_failed(c, rc);
      goto out;
    }
    print_stopped(&ws, &nstopped, sessions, sizeof(sessions));
  }
  /* --all says what it did, even when there was nothing to stop. */
  if (all && code == EXIT_OK && nstopped == 0 && !session)
    fprintf(stderr, "muster stop: no live workers in any session\n");
  else if (all && code == EXIT_OK && nstopped == 0)
    fprintf(stderr, "muster stop: no live workers in session %s%s\n", session,
            from_env ? " (MUSTER_SESSION)" : "");
  else if (all && code == EXIT_OK)
    fprintf(stderr, "muster stop: stopped %zu worker%s (session%s %s)\n", nstopped,
            nstopped == 1 ? "" : "s", strchr(sessions, ',') ? "s" : "", sessions);
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  free(ids.v);
  return code;
}

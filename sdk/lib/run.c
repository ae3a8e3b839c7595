/* run.c: muster_run_cluster(), see muster.h: the run's session, lease and
 * record, and its attempts (run_attempt.c), restarted from the trainer's
 * checkpoint while max_restarts allows. */
#include "client_internal.h"
#include "internal.h"
#include "muster.h"
#include "run_internal.h"
#include "session_name.h"
#include "utf8.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void muster_run_opts_init(muster_run_opts *o) {
  memset(o, 0, sizeof(*o));
  o->mode = MUSTER_RUN_ALLREDUCE;
  o->n_workers = 2;
  o->cpu = 1;
  o->memory = 1;
  o->port = 2222;
  o->timeout_seconds = 60;
  o->stall_timeout = 120;
}

void muster_run_result_free(muster_run_result *r) {
  if (!r)
    return;
  free(r->summary);
  r->summary = NULL;
}

/* ---- restarts ---- */

/* 1 if argv runs muster-train. */
static int is_trainer(const char *const *argv, size_t argc) {
  const char *base;

  if (argc == 0)
    return 0;
  base = strrchr(argv[0], '/');
  return strcmp(base ? base + 1 : argv[0], "muster-train") == 0;
}

/* The value of option name in argv ("--name V" or "--name=V"), or NULL. */
static const char *arg_value(const char *const *argv, size_t argc, const char *name) {
  size_t n = strlen(name);

  for (size_t i = 1; i < argc; i++) {
    if (strcmp(argv[i], name) == 0 && i + 1 < argc)
      return argv[i + 1];
    if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=')
      return argv[i] + n + 1;
  }
  return NULL;
}

/* The command of an attempt: the options' own, with --checkpoint ckpt when
 * it names none, and on a restart --auto-resume (muster-train resumes from
 * the checkpoint if rank 0 wrote one, on its own file system, else from the
 * command's --resume, if any). argv_out has room for argc + 3. */
static size_t trainer_argv(const muster_run_opts *o, const char *ckpt, int restart,
                           const char **argv_out) {
  size_t n = 0;

  for (size_t i = 0; i < o->argc; i++) {
    if (restart && strcmp(o->argv[i], "--auto-resume") == 0)
      continue;
    argv_out[n++] = o->argv[i];
  }
  if (!arg_value(o->argv, o->argc, "--checkpoint")) {
    argv_out[n++] = "--checkpoint";
    argv_out[n++] = ckpt;
  }
  if (restart)
    argv_out[n++] = "--auto-resume";
  return n;
}

/* The home of the account the workers' code runs as ("~" of a checkpoint
 * muster-train wrote): the one whoami names (this user's), else the one
 * health names (a controller from before users), else this client's own. */
static const char *workers_home(muster_client *c, char *buf, size_t size) {
  json_t *h = NULL;
  const char *acct, *home = getenv("HOME");
  struct passwd *pw;

  /* (a controller whose whoami has no run_as, or no whoami, says it in
   * its health) */
  if (muster_json_call_(c, "GET", "/api/v1/whoami", NULL, &h) != 0 ||
      !json_object_get(h, "run_as")) {
    json_decref(h);
    h = NULL;
    if (muster_json_call_(c, "GET", "/api/v1/health", NULL, &h) != 0) {
      json_decref(h);
      h = NULL;
    }
  }
  if ((acct = json_string_value(json_object_get(h, "run_as"))) != NULL &&
      (pw = getpwnam(acct)) != NULL)
    home = pw->pw_dir;
  snprintf(buf, size, "%s", home ? home : "/");
  json_decref(h);
  return buf;
}

/* Opens the directory path (absolute) without following a link at any
 * step: the workers' account owns what lies below its home, and a root
 * client must not be led elsewhere by a link it put there. Returns the
 * fd, or -1. */
static int open_dir_nofollow(const char *path) {
  char part[256];
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  for (const char *p = path; fd >= 0 && *p;) {
    size_t len;
    int next;

    p += strspn(p, "/");
    len = strcspn(p, "/");
    if (!len)
      break;
    if (len >= sizeof(part)) {
      close(fd);
      return -1;
    }
    memcpy(part, p, len);
    part[len] = '\0';
    p += len;
    next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    fd = next;
  }
  return fd;
}

/* Removes the run's own checkpoint directory (best effort: the client sees
 * it where the workers' file system is shared, as on the local backend):
 * the checkpoint files in it, then the directory, following no link. */
static void remove_run_dir(muster_client *c, const char *ckpt) {
  char dir[1024], home[512];
  char *slash;
  DIR *d;
  struct dirent *e;
  int n, parent, fd;

  if (strncmp(ckpt, "~/", 2) == 0)
    n = snprintf(dir, sizeof(dir), "%s/%s", workers_home(c, home, sizeof(home)), ckpt + 2);
  else if (ckpt[0] != '/' && getcwd(home, sizeof(home)))
    n = snprintf(dir, sizeof(dir), "%s/%s", home, ckpt); /* a relative MUSTER_RUN_DIR */
  else
    n = snprintf(dir, sizeof(dir), "%s", ckpt);
  if (n < 0 || (size_t)n >= sizeof(dir) || dir[0] != '/')
    return;
  slash = strrchr(dir, '/'); /* the checkpoint's file name */
  *slash = '\0';
  slash = strrchr(dir, '/'); /* the run's directory, in its parent */
  if (!slash || !slash[1])
    return;
  *slash = '\0';
  parent = open_dir_nofollow(dir[0] ? dir : "/");
  if (parent < 0)
    return;
  fd = openat(parent, slash + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && (d = fdopendir(fd)) != NULL) {
    /* The checkpoint, and a rank's half-written one (checkpoint.tmp.PID). */
    while ((e = readdir(d)) != NULL)
      if (strncmp(e->d_name, "checkpoint", 10) == 0)
        unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    unlinkat(parent, slash + 1, AT_REMOVEDIR);
  } else if (fd >= 0) {
    close(fd);
  }
  close(parent);
}

/* The earlier causes of a failure after restarts, one line each, take at
 * most this much of it: the last cause has the rest. */
#define CAUSE_LINE_MAX 300
#define CAUSES_MAX 900

/* Appends "(number) line" to causes (size bytes), after "; " if it is not
 * the first; one that does not fit whole is left out, and "; ..." says so
 * once. */
static void add_cause(char *causes, size_t size, int number, const char *line) {
  size_t len = strlen(causes);
  int k;

  /* Room is kept for "; ..." (5 bytes and the NUL). */
  if (len + 6 > size || strcmp(causes, "...") == 0 ||
      (len >= 5 && strcmp(causes + len - 5, "; ...") == 0))
    return;
  k = snprintf(causes + len, size - len - 5, "%s(%d) %s", len ? "; " : "", number, line);
  if (k < 0 || (size_t)k >= size - len - 5)
    snprintf(causes + len, size - len, "%s...", len ? "; " : "");
}

static const char *mode_name(muster_run_mode m) {
  return m == MUSTER_RUN_PS ? "ps" : m == MUSTER_RUN_ALLREDUCE ? "allreduce" : "exec";
}

int muster_run_cluster(muster_client *c, const muster_run_opts *o, muster_run_result *r) {
  char session[SESSION_STORED_MAX], ckpt[1024] = "", causes[CAUSES_MAX] = "",
                                    why[sizeof(r->failure)];
  char why_field[64] = "";
  long status;
  const char **argv = NULL;
  muster_lease *lease = NULL;
  size_t argc = o->argc;
  /* Checkpoints matter only to an allreduce run that may restart
   * (muster-train --mode ps cannot resume: its momentum lives on the
   * parameter servers). */
  int rc, final = 0, own_ckpt = 0,
          trainer = o->max_restarts > 0 && o->mode == MUSTER_RUN_ALLREDUCE &&
                    is_trainer(o->argv, o->argc);

  memset(r, 0, sizeof(*r));
  r->exit_code = 1;
  if (o->n_workers < 1 || o->n_ps < 0 || o->argc == 0 || o->max_restarts < 0 ||
      (o->mode != MUSTER_RUN_PS && o->n_ps))
    return MUSTER_E_INVALID;
  if (o->session) {
    snprintf(session, sizeof(session), "%s", o->session);
  } else {
    /* A session of its own: "stop every live worker of the session" at the
     * end touches nothing else, nor does its lease. */
    unsigned long x = (unsigned long)time(NULL) ^ ((unsigned long)getpid() << 16);
    snprintf(session, sizeof(session), "run-%08lx", x & 0xffffffffUL);
  }
  /* The lease first: from here on, this process dying stops the workers.
   * Without one (lease_ttl < 0) a part that keeps no workers is held all
   * the same: the run is bound to it, and ends when this process dies. */
  rc = muster_lease_start_(c, session, o->lease_ttl >= 0 ? o->lease_ttl : 30, o->lease_ttl >= 0,
                           &lease);
  if (rc)
    return rc;
  rc = muster_run_record_new(c, session, muster_lease_holder(lease), mode_name(o->mode), o->argv,
                             o->argc, o->max_restarts, r->run_id);
  if (rc)
    goto out;
  /* muster-train checkpoints into the run's directory, unless told where;
   * rank 0 makes the directory, where it runs: by default in the home of
   * the account it runs as ("~", which muster-train expands), since the
   * workers' code does not run as this client's account. */
  if (trainer) {
    const char *given = arg_value(o->argv, o->argc, "--checkpoint");
    const char *dir = o->run_dir ? o->run_dir : getenv("MUSTER_RUN_DIR");
    if (given)
      snprintf(ckpt, sizeof(ckpt), "%s", given);
    else if (dir && *dir)
      snprintf(ckpt, sizeof(ckpt), "%s/%s/checkpoint", dir, r->run_id);
    else
      snprintf(ckpt, sizeof(ckpt), "~/.muster/runs/%s/checkpoint", r->run_id);
    own_ckpt = !given;
    argv = calloc(o->argc + 4, sizeof(*argv));
    if (!argv) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    argc = trainer_argv(o, ckpt, 0, argv);
  }

  for (int attempt = 0;; attempt++) {
    char cause[sizeof(r->failure)], line[CAUSE_LINE_MAX], all[sizeof(r->failure) + 1200];

    if (attempt > 0 && trainer)
      argc = trainer_argv(o, ckpt, 1, argv);
    rc = muster_run_attempt_(c, o, r, session, argv ? argv : o->argv, argv ? argc : o->argc,
                             attempt, &final);
    if (rc || !r->failure[0] || final || attempt >= o->max_restarts)
      break;
    /* A restart: every worker of the failed attempt is stopped already.
     * The cause is the failure whole, the lines its stderr ended with too
     * (r->failure is valid UTF-8 and fits what the controller takes). */
    snprintf(cause, sizeof(cause), "%s", r->failure);
    muster_run_failure_line_(cause, line, sizeof(line));
    add_cause(causes, sizeof(causes), attempt + 1, line);
    r->restarts = attempt + 1;
    if (muster_run_record_restart(c, r->run_id, cause) != 0) {
      snprintf(all, sizeof(all), "could not record restart %d (%s): %s", attempt + 1, line,
               muster_client_errmsg(c));
      all[utf8_trim(all, strlen(all))] = '\0';
      muster_run_failure_fit_(all, r->failure, sizeof(r->failure));
      final = 1;
      break;
    }
    if (o->on_restart)
      o->on_restart(o->arg, attempt + 1, cause);
  }
  /* After restarts, the failure names every cause: the earlier ones on its
   * first line, one line each (a sentence and its last stderr line), the
   * last one whole, with the lines its stderr ended with under it. */
  if (!rc && r->failure[0] && r->restarts > 0 && !strstr(r->failure, "could not record")) {
    char all[sizeof(causes) + sizeof(r->failure) + 64];

    snprintf(all, sizeof(all), "failed after %d restart%s: %s; (%d) %s", r->restarts,
             r->restarts == 1 ? "" : "s", causes, r->restarts + 1, r->failure);
    muster_run_failure_fit_(all, r->failure, sizeof(r->failure));
  }
  /* The record's end is best effort: the training's outcome stands. */
  muster_run_failure_fit_(rc ? muster_client_errmsg(c) : r->failure, why, sizeof(why));
  status = c->last_status;
  if (rc && muster_client_errfield(c))
    snprintf(why_field, sizeof(why_field), "%s", muster_client_errfield(c));
  {
    char *summary = NULL;
    if (!why[0] && r->summary)
      summary = strndup(r->summary, 16384); /* the controller keeps at most 64 KiB */
    int erc = muster_run_record_end(c, r->run_id, why[0] ? "failed" : "succeeded", summary,
                                    why[0] ? why : NULL);
    /* Not recorded: the record stays "running" until its session's lease
     * runs out (or forever without one); the training's outcome stands. */
    (void)erc;
    free(summary);
  }
  /* The caller reads the error of the run (a launch refused), not the
   * record's. */
  if (rc) {
    (void)muster_set_errorf_(c, rc, why_field[0] ? why_field : NULL, "%s", why);
    c->last_status = status; /* the launch's 422, not the record's 200 */
  }
  /* A run that succeeded needs its own checkpoint no more; a failed one
   * keeps it (--resume by hand). */
  if (own_ckpt && !why[0])
    remove_run_dir(c, ckpt);
out:
  free(argv);
  if (lease)
    (void)muster_lease_error(lease, r->lease_error, sizeof(r->lease_error));
  /* The workers are stopped: the lease goes back (should that fail, it runs
   * out by itself, with nothing left to stop). If they could not be
   * stopped, it is left to run out: the controller then stops them. */
  (void)muster_lease_end(lease, final == 2 ? MUSTER_LEASE_ABANDON : MUSTER_LEASE_RELEASE);
  return rc;
}

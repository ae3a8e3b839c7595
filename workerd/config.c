/*
 * config.c: muster-workerd's configuration, read once from the environment
 * into wd (MUSTER_CONTROLLER_URL, MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN or
 * MUSTER_WORKER_TOKEN_FD,
 * MUSTER_WORKER_ATTEMPT, MUSTER_BIND_IP, MUSTER_ORPHAN_TIMEOUT,
 * MUSTER_CONFINE, MUSTER_RUN_AS) and the log level (MUSTER_LOG_LEVEL). A
 * bad variable is named in the log, never its value. Of workerd's other
 * modules it calls run_account.c only (the account's ids and groups).
 */
#include "account.h"
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Sets the log level from MUSTER_LOG_LEVEL, if it is set to a known name. */
void log_level_from_env(void) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  const char *v = getenv("MUSTER_LOG_LEVEL");

  if (!v)
    return;
  for (int i = 0; i < 4; i++)
    if (strcmp(v, names[i]) == 0)
      log_verbosity = i;
}

/* Copies the environment variable name into out (size bytes) after checking
 * that it is set, non-empty and short enough. Returns 0 or MUSTER_E_INVALID
 * (logged, naming the variable but never its value). */
MUST_CHECK static int env_copy(const char *name, char *out, size_t size) {
  const char *v = getenv(name);
  size_t n;

  if (!v || !*v) {
    LOG(LOG_ERROR, "%s is not set", name);
    return MUSTER_E_INVALID;
  }
  n = strlen(v);
  if (n >= size) {
    LOG(LOG_ERROR, "%s is longer than %zu characters", name, size - 1);
    return MUSTER_E_INVALID;
  }
  memcpy(out, v, n + 1);
  return 0;
}

/* Reads the token from file descriptor fdtext (one line, within 60 s),
 * then puts /dev/null in its place. Returns 0 or MUSTER_E_INVALID
 * (logged). */
MUST_CHECK static int token_from_fd(const char *fdtext) {
  struct pollfd p = {.events = POLLIN};
  size_t n = 0;
  int64_t until;
  bool long_token;
  long fd;
  int null;

  if (util_parse_long(fdtext, 0, 1024, &fd) != 0) {
    LOG(LOG_ERROR, "MUSTER_WORKER_TOKEN_FD must be a file descriptor number");
    return MUSTER_E_INVALID;
  }
  p.fd = (int)fd;
  /* (partial reads add up; a signal neither ends the wait nor restarts
   * its 60 s) */
  until = util_mono_ms() + 60000;
  while (n < sizeof(wd.token) - 1) {
    int64_t left = until - util_mono_ms();
    ssize_t got;
    int ready;

    if (left <= 0)
      break;
    ready = poll(&p, 1, (int)left);
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      break;
    got = read((int)fd, wd.token + n, sizeof(wd.token) - 1 - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      break;
    n += (size_t)got;
    if (memchr(wd.token, '\n', n))
      break;
  }
  wd.token[n] = '\0';
  long_token = n == sizeof(wd.token) - 1 && !memchr(wd.token, '\n', n);
  wd.token[strcspn(wd.token, "\n")] = '\0';
  null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) {
    (void)dup3(null, (int)fd, 0);
    close(null);
  }
  if (long_token) {
    explicit_bzero(wd.token, sizeof(wd.token));
    LOG(LOG_ERROR, "the token on MUSTER_WORKER_TOKEN_FD (%ld) is longer than %d bytes", fd,
        WD_TOKEN_MAX);
    return MUSTER_E_INVALID;
  }
  if (!wd.token[0]) {
    wd.token_missing = true;
    LOG(LOG_ERROR,
        "no token came on MUSTER_WORKER_TOKEN_FD (%ld): another process may have read it first",
        fd);
    return MUSTER_E_INVALID;
  }
  return 0;
}

/* Reads and checks the configuration from the environment into wd.
 * Returns 0 or MUSTER_E_INVALID (logged). */
MUST_CHECK int config_load(void) {
  const char *bind_ip = getenv("MUSTER_BIND_IP");
  size_t n;
  int rc;

  rc = env_copy("MUSTER_CONTROLLER_URL", wd.url, sizeof(wd.url));
  if (rc)
    goto out;
  rc = env_copy("MUSTER_WORKER_ID", wd.id, sizeof(wd.id));
  if (rc)
    goto out;
  /* A Slurm step's token comes through a pipe (srun's stdin, from
   * muster-workerd --job), never through the environment, which every
   * step of its job could read. */
  wd.rotate = getenv("MUSTER_WORKER_TOKEN_FD") != NULL;
  if (wd.rotate)
    rc = token_from_fd(getenv("MUSTER_WORKER_TOKEN_FD"));
  else
    rc = env_copy("MUSTER_WORKER_TOKEN", wd.token, sizeof(wd.token));
  unsetenv("MUSTER_WORKER_TOKEN_FD");
  if (rc)
    goto out;

  rc = MUSTER_E_INVALID;
  if (strncmp(wd.url, "http://", 7) != 0 && strncmp(wd.url, "https://", 8) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL must start with http:// or https://");
    goto out;
  }
  /* The contract says no trailing slash; tolerate one rather than build
   * "//api/v1" paths. */
  n = strlen(wd.url);
  while (n > 8 && wd.url[n - 1] == '/')
    wd.url[--n] = '\0';
  /* The id goes into URL paths, so it must need no escaping. */
  for (const char *p = wd.id; *p; p++) {
    if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') && !(*p >= '0' && *p <= '9') &&
        *p != '-' && *p != '_') {
      LOG(LOG_ERROR, "MUSTER_WORKER_ID may hold only letters, digits, '-' and '_'");
      goto out;
    }
  }
  /* The token goes into a header line: a control character or a space in it
   * would let it forge other headers. */
  for (const char *p = wd.token; *p; p++) {
    if (*p <= ' ' || *p == 0x7f) {
      LOG(LOG_ERROR, "MUSTER_WORKER_TOKEN holds a space or a control character");
      goto out;
    }
  }
  /* A worker whose controller never comes back must not live forever:
   * after MUSTER_ORPHAN_TIMEOUT seconds (default 600) without any answer it
   * ends itself, as a container would be reaped with its cluster. */
  wd.orphan_ms = 600 * 1000;
  if (getenv("MUSTER_ORPHAN_TIMEOUT")) {
    long secs;
    if (util_parse_long(getenv("MUSTER_ORPHAN_TIMEOUT"), 1, 7 * 86400, &secs) != 0) {
      LOG(LOG_ERROR, "MUSTER_ORPHAN_TIMEOUT must be a number of seconds (1 to 604800)");
      goto out;
    }
    wd.orphan_ms = secs * 1000;
  }
  /* The controller accepts the registration of one start attempt only: a
   * workerd of an earlier one (started before a controller crash) is refused
   * and ends without running anything. */
  if (getenv("MUSTER_WORKER_ATTEMPT") &&
      util_parse_long(getenv("MUSTER_WORKER_ATTEMPT"), 1, 1L << 30, &wd.attempt) != 0) {
    LOG(LOG_ERROR, "MUSTER_WORKER_ATTEMPT must be a start attempt number (1 or more)");
    goto out;
  }
  /* The local backend's isolation: the command gets namespaces of its own
   * and does not see this directory (the controller's state). */
  if (getenv("MUSTER_CONFINE") && *getenv("MUSTER_CONFINE")) {
    if (strlen(getenv("MUSTER_CONFINE")) >= sizeof(wd.confine) ||
        getenv("MUSTER_CONFINE")[0] != '/') {
      LOG(LOG_ERROR, "MUSTER_CONFINE must be an absolute directory path");
      goto out;
    }
    snprintf(wd.confine, sizeof(wd.confine), "%s", getenv("MUSTER_CONFINE"));
    /* (main.c made workerd non-dumpable; its command's user namespace
     * needs it dumpable to write its own uid_map: a workerd not root
     * confines it, whose /proc hides the rest) */
    if (geteuid() != 0)
      prctl(PR_SET_DUMPABLE, 1);
  }
  unsetenv("MUSTER_CONFINE");
  /* The account every command of the worker runs as: never root. A
   * workerd run as root with none named uses the setup script's own. */
  const char *named = getenv("MUSTER_RUN_AS");
  if ((named && *named) || geteuid() == 0) {
    const char *name = named && *named ? named : MUSTER_DEFAULT_ACCOUNT;
    struct run_account acct;
    bool found = run_account_lookup(name, &acct) == 0;

    if (!found && name != named) {
      LOG(LOG_ERROR, "muster-workerd runs as root and never runs a worker's code as root: there "
                     "is no account " MUSTER_DEFAULT_ACCOUNT " on this host (scripts/setup.sh "
                     "makes it), and MUSTER_RUN_AS names no other");
      goto out;
    }
    if (!found || acct.uid == 0 || acct.gid == 0) {
      LOG(LOG_ERROR, "MUSTER_RUN_AS must name an account on this host that is neither root nor "
                     "in root's group");
      goto out;
    }
    if (acct.home_too_long) {
      LOG(LOG_ERROR, "the home directory of account %s is longer than %zu bytes", name,
          sizeof(wd.home) - 1);
      goto out;
    }
    snprintf(wd.run_as, sizeof(wd.run_as), "%s", name);
    wd.run_uid = acct.uid;
    wd.run_gid = acct.gid;
    if (acct.too_many_groups)
      LOG(LOG_WARN, "%s is in more than %d groups: its commands get none of them", name,
          WD_GROUPS_MAX);
    memcpy(wd.run_groups, acct.groups, sizeof(wd.run_groups));
    wd.n_run_groups = acct.n_groups;
    /* Its commands see the account's own name and home, not root's (a
     * launch's env still wins: it goes on top). */
    snprintf(wd.home, sizeof(wd.home), "%s", acct.home);
    if (setenv("HOME", acct.home, 1) != 0 || setenv("USER", name, 1) != 0 ||
        setenv("LOGNAME", name, 1) != 0) {
      LOG(LOG_ERROR, "out of memory");
      goto out;
    }
  }
  if (!wd.run_as[0] && getenv("HOME") && strlen(getenv("HOME")) < sizeof(wd.home))
    snprintf(wd.home, sizeof(wd.home), "%s", getenv("HOME"));
  unsetenv("MUSTER_RUN_AS");
  unsetenv("MUSTER_WORKER_TOKEN"); /* kept in wd.token; no copy left in environ */
  wd.last_contact_ms = util_mono_ms();
  if (bind_ip && *bind_ip) {
    n = strlen(bind_ip);
    if (n >= sizeof(wd.ip)) {
      LOG(LOG_ERROR, "MUSTER_BIND_IP is too long");
      goto out;
    }
    memcpy(wd.ip, bind_ip, n + 1);
  }
  rc = 0;
out:
  return rc;
}

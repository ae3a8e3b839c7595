/* statedir.c: the state directory: its folders, its private modes, the
 * lock that keeps a second controller out, and the API token. See
 * state_internal.h. */
#include "state_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static MUST_CHECK int mkdir_p(const char *path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return -errno;
}

/* Makes path's mode exactly mode (when it exists), saying so when it had
 * to: the state directory holds tokens and secret_env, whatever umask or
 * earlier hand created it. Returns 0 or -errno. */
static MUST_CHECK int tighten(const char *path, mode_t mode) {
  struct stat st;

  if (stat(path, &st) != 0)
    return errno == ENOENT ? 0 : -errno;
  if ((st.st_mode & 07777) == mode)
    return 0;
  if (chmod(path, mode) != 0)
    return -errno;
  LOG(LOG_INFO, "%s was mode %04o; made it %04o (it holds secrets)", path,
      (unsigned)(st.st_mode & 07777), (unsigned)mode);
  return 0;
}

/* The state directory (and a link that names it) must be this process's
 * own: one another account made first (in a sticky /tmp, say, before the
 * first start) is that account's to read, tokens and all. Returns 0, or
 * MUSTER_E_INVALID with err saying whose it is. */
static MUST_CHECK int state_dir_owned(char *err, size_t errlen) {
  struct stat ln, st;

  if (lstat(g.cfg.state_dir, &ln) != 0 || stat(g.cfg.state_dir, &st) != 0) {
    snprintf(err, errlen, "cannot look at the state directory %s: %s", g.cfg.state_dir,
             strerror(errno));
    return MUSTER_E_IO;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || ln.st_uid != geteuid()) {
    snprintf(err, errlen,
             "the state directory %s %s uid %u, not this controller's (uid %u): whoever owns it "
             "could read the tokens it would hold; remove it, or name another with --state-dir",
             g.cfg.state_dir, S_ISLNK(ln.st_mode) ? "is a link owned by" : "belongs to",
             (unsigned)(ln.st_uid != geteuid() ? ln.st_uid : st.st_uid), (unsigned)geteuid());
    return MUSTER_E_INVALID;
  }
  return 0;
}

int secure_state_dir(char *err, size_t errlen) {
  static const char *const files[] = {"muster.db", "muster.db-wal", "muster.db-shm", "token"};
  char path[600];
  int rc = tighten(g.cfg.state_dir, 0700);

  for (size_t i = 0; !rc && i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", g.cfg.state_dir, files[i]);
    rc = tighten(path, 0600);
  }
  if (rc)
    snprintf(err, errlen, "could not make %s private (%s): it holds tokens and secrets",
             g.cfg.state_dir, strerror(-rc));
  return rc ? MUSTER_E_IO : 0;
}

static MUST_CHECK int read_or_create_token(char *err, size_t errlen) {
  char path[600];
  FILE *f;
  int fd;

  snprintf(path, sizeof(path), "%s/token", g.cfg.state_dir);
  f = fopen(path, "re");
  if (f) {
    int ok = fgets(g.api_token, sizeof(g.api_token), f) != NULL;
    fclose(f);
    g.api_token[strcspn(g.api_token, "\r\n")] = '\0';
    if (!ok || strlen(g.api_token) < 16) {
      snprintf(err, errlen, "%s is empty or too short; delete it to get a new token", path);
      return MUSTER_E_IO;
    }
    return 0;
  }
  if (util_random_hex(g.api_token, 24) != 0) {
    snprintf(err, errlen, "could not get random bytes for the API token");
    return MUSTER_E_IO;
  }
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, g.api_token, strlen(g.api_token)) < 0 || write(fd, "\n", 1) < 0) {
    snprintf(err, errlen, "could not write %s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return MUSTER_E_IO;
  }
  close(fd);
  /* Shown once, on a terminal only (see main.c); the log never shows it. */
  g.token_new = 1;
  return 0;
}

/* One controller per state directory: a second one would run the same
 * workers twice. The lock (flock on DIR/lock, which holds the owner's pid)
 * lasts as long as the process, however it ends. */
static int lock_state_dir(char *err, size_t errlen) {
  char path[600], pid[32];
  int fd;
  ssize_t n;

  snprintf(path, sizeof(path), "%s/lock", g.cfg.state_dir);
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "could not open %s: %s", path, strerror(errno));
    return MUSTER_E_IO;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    n = read(fd, pid, sizeof(pid) - 1);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    snprintf(err, errlen, "another muster-controller (pid %s) uses the state directory %s",
             pid[0] ? pid : "?", g.cfg.state_dir);
    close(fd);
    return MUSTER_E_CONFLICT;
  }
  n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)n) != n) {
    /* The lock holds all the same; only the pid in the message is lost. */
  }
  /* Kept open (and locked) for the life of the process. */
  return 0;
}

/* See state_internal.h. */
int statedir_prepare(char *err, size_t errlen) {
  char path[600];
  int rc, fd;

  rc = mkdir_p(g.cfg.state_dir, 0700);
  snprintf(path, sizeof(path), "%s/workers", g.cfg.state_dir);
  if (!rc)
    rc = mkdir_p(path, 0700);
  snprintf(path, sizeof(path), "%s/logs", g.cfg.state_dir);
  if (!rc)
    rc = mkdir_p(path, 0700);
  if (rc) {
    snprintf(err, errlen, "could not create the state directory %s: %s", g.cfg.state_dir,
             strerror(-rc));
    return MUSTER_E_IO;
  }
  rc = state_dir_owned(err, errlen);
  if (!rc)
    rc = secure_state_dir(err, errlen);
  if (rc)
    return rc;
  /* A new database is made private from the start: SQLite gives its WAL and
   * shm files the database's mode, and nothing is left to tighten. */
  snprintf(path, sizeof(path), "%s/muster.db", g.cfg.state_dir);
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0)
    close(fd);
  else if (errno != EEXIST) {
    snprintf(err, errlen, "could not create %s: %s", path, strerror(errno));
    return MUSTER_E_IO;
  }
  rc = lock_state_dir(err, errlen);
  if (rc)
    return rc;
  return read_or_create_token(err, errlen);
}

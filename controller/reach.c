/* reach.c: what the workers' account may write of what runs as root.
 *
 * A worker's code runs as an account of its own (--run-as, muster-worker
 * by default), and that account is a boundary only while it cannot change
 * what root runs or serves: the controller's binary, muster-workerd, the
 * web files every browser loads, the state directory. At start a child
 * that has become the account (its groups too) tries each with
 * access(W_OK), and every directory above it (one it may write lets it
 * rename the thing away and put its own in place; a sticky one such as
 * /tmp does not), and reports the first it could write. */
#include "reach.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 if the account (this process, by now) may write path itself, or
 * rename it away through a directory above it; the one it may is copied
 * to hit (PATH_MAX bytes). */
static int writable_up(const char *path, char *hit) {
  char p[PATH_MAX];
  struct stat sb;
  int self = 1;

  char cwd[PATH_MAX];
  int len;

  /* A relative path (--state-dir s) stands below the directory the
   * controller starts in: that directory counts too. */
  if (path[0] == '/')
    len = snprintf(p, sizeof(p), "%s", path);
  else if (getcwd(cwd, sizeof(cwd)))
    len = snprintf(p, sizeof(p), "%s/%s", cwd, path);
  else
    return 0;
  if (len < 0 || len >= (int)sizeof(p))
    return 0;
  for (;;) {
    /* A path not made yet (a state directory at the first start): what
     * stands above it counts. */
    if (stat(p, &sb) == 0 && access(p, W_OK) == 0 && (self || !(sb.st_mode & S_ISVTX))) {
      snprintf(hit, PATH_MAX, "%s", p);
      return 1;
    }
    char *slash = strrchr(p, '/');
    if (!slash || slash == p)
      break;
    *slash = '\0';
    self = 0;
  }
  if (strcmp(path, "/") != 0 && access("/", W_OK) == 0) {
    snprintf(hit, PATH_MAX, "/");
    return 1;
  }
  return 0;
}

/* writable_up for dir, and for each entry in it (the web files). */
static int writable_dir(const char *dir, char *hit) {
  char p[PATH_MAX];
  DIR *d;
  struct dirent *e;
  int found;

  if (writable_up(dir, hit))
    return 1;
  d = opendir(dir);
  if (!d)
    return 0;
  found = 0;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p))
      continue;
    if (access(p, W_OK) == 0) {
      snprintf(hit, PATH_MAX, "%s", p);
      found = 1;
    }
  }
  closedir(d);
  return found;
}

int reach_check(const char *account, const struct reach_item *items, int n, char *err,
                size_t size) {
  struct passwd *pw = getpwnam(account);
  int fds[2], status;
  pid_t pid;
  char line[PATH_MAX + 8] = "";
  ssize_t got;

  err[0] = '\0';
  if (!pw) {
    snprintf(err, size, "no account \"%s\" on this host", account);
    return -1;
  }
  if (pipe(fds) != 0) {
    snprintf(err, size, "cannot check what %s may write: pipe: %s", account, strerror(errno));
    return -1;
  }
  pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    snprintf(err, size, "cannot check what %s may write: fork: %s", account, strerror(errno));
    return -1;
  }
  if (pid == 0) {
    char hit[PATH_MAX];

    if (n > 255)
      n = 255;
    close(fds[0]);
    if (initgroups(account, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 ||
        setuid(pw->pw_uid) != 0) {
      (void)!write(fds[1], "!", 1);
      _exit(1);
    }
    for (int i = 0; i < n; i++) {
      int w = items[i].dir ? writable_dir(items[i].path, hit) : writable_up(items[i].path, hit);
      if (w) {
        /* Which item (one byte: n is small), then the path it could write. */
        line[0] = (char)i;
        snprintf(line + 1, sizeof(line) - 1, "%s", hit);
        (void)!write(fds[1], line, 1 + strlen(line + 1));
        _exit(0);
      }
    }
    _exit(0);
  }
  close(fds[1]);
  do
    got = read(fds[0], line, sizeof(line) - 1);
  while (got < 0 && errno == EINTR);
  close(fds[0]);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (got <= 0)
    return 0;
  line[got] = '\0';
  if (got == 1 && line[0] == '!') {
    snprintf(err, size, "cannot become %s to check what it may write", account);
    return -1;
  }
  if ((unsigned char)line[0] >= (unsigned)n)
    return 0;
  snprintf(err, size,
           "the workers' account %s can write %s (%s %s): a worker's code could change what "
           "this controller runs or serves; make it writable by root only",
           account, line + 1, items[(unsigned char)line[0]].what,
           items[(unsigned char)line[0]].path);
  return -1;
}

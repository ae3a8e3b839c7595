/* reach.c: what the workers' account may write of what runs as root.
 *
 * A worker's code runs as an account of its own (--run-as, muster-worker
 * by default), and that account is a boundary only while it cannot change
 * what root runs or serves: the controller's binary, muster-workerd, the
 * web files every browser loads, the state directory. At start a child
 * that has become the account (its groups too) tries each, as written and
 * as its links resolve, the web files' whole tree, and every directory
 * above each: one the account may write or owns (and so may chmod) lets it
 * change the thing or rename it away and put its own in place; a sticky
 * one such as /tmp does not, unless it owns it. It reports the first. */
#include "reach.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 if the account (this process, by now) may change the file or
 * directory p: write it, or own it (and so chmod it writable). */
static int changeable(const char *p, const struct stat *sb) {
  return sb->st_uid == getuid() || access(p, W_OK) == 0;
}

/* 1 if the account may change path itself, or rename it away through a
 * directory above it (one it may change, unless sticky and not its own);
 * the one it may is copied to hit (PATH_MAX bytes). path is taken as
 * written (lstat: a link's own directory counts), the walk going up it. */
static int changeable_up(const char *path, char *hit) {
  char p[PATH_MAX], cwd[PATH_MAX];
  struct stat sb;
  int self = 1, len;

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
    if (p[0] && lstat(p, &sb) == 0 && changeable(p, &sb) &&
        (self || !(sb.st_mode & S_ISVTX) || sb.st_uid == getuid())) {
      snprintf(hit, PATH_MAX, "%s", p);
      return 1;
    }
    char *slash = strrchr(p, '/');
    if (!slash)
      break;
    if (slash == p) {
      if (p[1] == '\0')
        break;
      p[1] = '\0'; /* then "/" itself */
    } else {
      *slash = '\0';
    }
    self = 0;
  }
  return 0;
}

/* changeable_up for path as written and, where it is or passes through
 * a link, for the file it resolves to. */
static int changeable_path(const char *path, char *hit) {
  char real[PATH_MAX];

  if (changeable_up(path, hit))
    return 1;
  return realpath(path, real) && strcmp(real, path) != 0 && changeable_up(real, hit);
}

/* changeable for every entry below dir (the web files), depth levels
 * deep at most. */
static int changeable_below(const char *dir, int depth, char *hit) {
  char p[PATH_MAX];
  struct stat sb;
  DIR *d;
  struct dirent *e;
  int found = 0;

  if (depth <= 0 || !(d = opendir(dir)))
    return 0;
  while (!found && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p) || lstat(p, &sb) != 0)
      continue;
    if (changeable(p, &sb)) {
      snprintf(hit, PATH_MAX, "%s", p);
      found = 1;
    } else if (S_ISDIR(sb.st_mode)) {
      found = changeable_below(p, depth - 1, hit);
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
    /* Answers with one tag byte: 'K' (none of them), '!' (could not
     * become the account), or 'W', the item's index and the path. */
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
      char real[PATH_MAX];
      int w = changeable_path(items[i].path, hit);
      if (!w && items[i].dir)
        w = changeable_below(realpath(items[i].path, real) ? real : items[i].path, 8, hit);
      if (w) {
        line[0] = 'W';
        line[1] = (char)i;
        snprintf(line + 2, sizeof(line) - 2, "%s", hit);
        (void)!write(fds[1], line, 2 + strlen(line + 2));
        _exit(0);
      }
    }
    (void)!write(fds[1], "K", 1);
    _exit(0);
  }
  close(fds[1]);
  do
    got = read(fds[0], line, sizeof(line) - 1);
  while (got < 0 && errno == EINTR);
  close(fds[0]);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (got == 1 && line[0] == '!') {
    snprintf(err, size, "cannot become %s to check what it may write", account);
    return -1;
  }
  /* Anything but a clean answer from a child that exited 0 is no answer:
   * the start is refused rather than the check skipped. */
  if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      (line[0] != 'K' && (line[0] != 'W' || got < 3 || (unsigned char)line[1] >= (unsigned)n))) {
    snprintf(err, size, "could not check what %s may write (the check's process failed)", account);
    return -1;
  }
  if (line[0] == 'K')
    return 0;
  line[got] = '\0';
  snprintf(err, size,
           "the workers' account %s can write %s (%s %s): a worker's code could change what "
           "this controller runs or serves; make it writable by root only",
           account, line + 2, items[(unsigned char)line[1]].what,
           items[(unsigned char)line[1]].path);
  return -1;
}

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

/* The paths below dir (the web files), listed as root before the fork:
 * the account may not be able to list a directory it could still reach a
 * file in by name. At most TREE_MAX. */
#define TREE_MAX 4096
struct tree {
  char *path[TREE_MAX];
  int n, too_many;
};

static void tree_list(const char *dir, struct tree *t) {
  char p[PATH_MAX];
  struct stat sb;
  DIR *d = opendir(dir);
  struct dirent *e;

  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p) || lstat(p, &sb) != 0)
      continue;
    if (t->n == TREE_MAX || !(t->path[t->n] = strdup(p))) {
      t->too_many = 1;
      break;
    }
    t->n++;
    if (S_ISDIR(sb.st_mode))
      tree_list(p, t);
  }
  closedir(d);
}

static void tree_free(struct tree *t) {
  for (int i = 0; i < t->n; i++)
    free(t->path[i]);
  t->n = 0;
}

int reach_check(const char *account, const struct reach_item *items, int n, char *err,
                size_t size) {
  struct passwd *pw = getpwnam(account);
  struct tree *trees = NULL;
  int fds[2], status, rc = -1;
  pid_t pid;
  char line[PATH_MAX + 8] = "";
  ssize_t got;

  err[0] = '\0';
  if (!pw) {
    snprintf(err, size, "no account \"%s\" on this host", account);
    return -1;
  }
  if (n > 255)
    n = 255;
  /* Each item's tree, for the items whose entries count too. */
  trees = calloc((size_t)n, sizeof(*trees));
  if (!trees) {
    snprintf(err, size, "cannot check what %s may write: out of memory", account);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (items[i].dir)
      tree_list(items[i].path, &trees[i]);
    if (trees[i].too_many) {
      snprintf(err, size, "cannot check what %s may write: %s holds over %d entries", account,
               items[i].path, TREE_MAX);
      goto out;
    }
  }
  if (pipe(fds) != 0) {
    snprintf(err, size, "cannot check what %s may write: pipe: %s", account, strerror(errno));
    goto out;
  }
  pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    snprintf(err, size, "cannot check what %s may write: fork: %s", account, strerror(errno));
    goto out;
  }
  if (pid == 0) {
    /* Answers with one tag byte: 'K' (none of them), '!' (could not
     * become the account), or 'W', the item's index and the path. */
    char hit[PATH_MAX];

    close(fds[0]);
    if (initgroups(account, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 ||
        setuid(pw->pw_uid) != 0) {
      (void)!write(fds[1], "!", 1);
      _exit(1);
    }
    for (int i = 0; i < n; i++) {
      int w = changeable_path(items[i].path, hit);
      for (int k = 0; !w && k < trees[i].n; k++)
        w = changeable_path(trees[i].path[k], hit);
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
    goto out;
  }
  /* Anything but a clean answer from a child that exited 0 is no answer:
   * the start is refused rather than the check skipped. */
  if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      (line[0] != 'K' && (line[0] != 'W' || got < 3 || (unsigned char)line[1] >= (unsigned)n))) {
    snprintf(err, size, "could not check what %s may write (the check's process failed)", account);
    goto out;
  }
  if (line[0] == 'K') {
    rc = 0;
    goto out;
  }
  line[got] = '\0';
  snprintf(err, size,
           "the workers' account %s can write %s (%s %s): a worker's code could change what "
           "this controller runs or serves; make it writable by root only",
           account, line + 2, items[(unsigned char)line[1]].what,
           items[(unsigned char)line[1]].path);
out:
  for (int i = 0; i < n; i++)
    tree_free(&trees[i]);
  free(trees);
  return rc;
}

/*
 * scratch.c: the private /tmp of each session's workers on a host.
 *
 * A confined worker's /tmp is STATE/scratch/SESSION/tmp, bound over /tmp in
 * its mount namespace (workerd/sandbox.c): every worker of one session on
 * this host shares it (Open MPI's daemon keeps its session directory there,
 * and the ranks started in the session's other workers must find it), and
 * no other session sees it. The state directory is root's and mode 0700,
 * so that the tree is reached only through that bind.
 *
 * Each workerd holds a shared flock on STATE/scratch/SESSION/lock for its
 * life. The last to leave (the one that gets the lock exclusive) renames
 * the directory away and removes it; one that enters meanwhile waits for
 * the rename (microseconds) and makes a new one. A workerd killed outright
 * leaves its tree behind: the controller sweeps, at its start, every tree
 * no workerd holds.
 */
#include "scratch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* How deep a tree removal descends at once: a deeper directory is moved
 * up, beside the tree, and removed after it (the descent holds a
 * descriptor per level). */
#define RMTREE_DEPTH 64

struct rm {
  int top;        /* where deep directories are moved */
  dev_t dev;      /* the file system removed from: no mount is crossed */
  unsigned moved; /* how many were moved up (.gone-deep-PID-N) */
};

static int rmtree_depth(struct rm *r, int parent, const char *name, int depth) {
  struct stat st;
  struct dirent *e;
  DIR *d;
  int fd, rc = 0;

  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode))
    return unlinkat(parent, name, 0) == 0 || errno == ENOENT ? 0 : -1;
  if (st.st_dev != r->dev) {
    errno = EXDEV;
    return -1; /* another file system mounted there */
  }
  if (depth >= RMTREE_DEPTH) {
    char up[64];
    snprintf(up, sizeof(up), ".gone-deep-%ld-%u", (long)getpid(), r->moved);
    if (renameat(parent, name, r->top, up) != 0)
      return -1;
    r->moved++;
    return 0;
  }
  fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0 : -1;
  d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
        rmtree_depth(r, dirfd(d), e->d_name, depth + 1) != 0)
      rc = -1;
  closedir(d);
  if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
    rc = -1;
  return rc;
}

int scratch_rmtree_at(int dirfd, const char *name) {
  struct stat top;
  struct rm r = {.top = dirfd};
  int rc;

  if (fstat(dirfd, &top) != 0)
    return -1;
  r.dev = top.st_dev;
  rc = rmtree_depth(&r, dirfd, name, 0);
  for (unsigned i = 0; i < r.moved; i++) { /* (r.moved grows meanwhile) */
    char up[64];
    snprintf(up, sizeof(up), ".gone-deep-%ld-%u", (long)getpid(), i);
    if (rmtree_depth(&r, dirfd, up, 0) != 0)
      rc = -1;
  }
  return rc;
}

/* The directory of session under STATE/scratch: its name, or "+" and its
 * name where it starts with '.' or '-' (a name no session has: '+' is not
 * one of a session's characters); a user's session "USER/name" is
 * "USER@name" ('@' is in neither a user's nor a session's name). */
static void dir_name(const char *session, char *out, size_t size) {
  snprintf(out, size, "%s%s", session[0] == '.' || session[0] == '-' ? "+" : "", session);
  for (char *c = out; *c; c++)
    if (*c == '/')
      *c = '@';
}

int scratch_session_ok(const char *session) {
  return session_name_ok(session);
}

/* mkdir that accepts a directory already there, owned by this process's
 * euid (no one else may have put it there: its parent is ours). */
static int mkdir_own(int dirfd, const char *name, mode_t mode) {
  struct stat st;

  if (mkdirat(dirfd, name, mode) != 0 && errno != EEXIST)
    return -1;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return -1;
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    errno = EEXIST;
    return -1;
  }
  return 0;
}

/* Mounts, once per session (under mount.lock), an overlay at merged: the
 * host's /tmp below, read-only, and the session's own writable layer
 * (upper) above. Returns 0, or -1 where the kernel refuses (no privilege:
 * a controller not run as root; the state directory itself in /tmp). */
static int overlay_once(int sess, const char *dir) {
  char opts[9000], upper[4300], work[4300], merged[4300];
  struct stat m, d;
  int lk, rc = -1;

  if (strpbrk(dir, ",:\\") || snprintf(upper, sizeof(upper), "%s/upper", dir) >= (int)sizeof(upper))
    return -1; /* (a path the options string cannot carry) */
  snprintf(work, sizeof(work), "%s/work", dir);
  snprintf(merged, sizeof(merged), "%s/merged", dir);
  lk = openat(sess, "mount.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lk < 0)
    return -1;
  while (flock(lk, LOCK_EX) != 0)
    if (errno != EINTR)
      goto out;
  if (fstatat(sess, "merged", &m, AT_SYMLINK_NOFOLLOW) == 0 && fstat(sess, &d) == 0 &&
      m.st_dev != d.st_dev) {
    rc = 0; /* mounted by another of the session's workerds */
    goto out;
  }
  /* the layer as a host's /tmp is: everyone's, sticky */
  if ((mkdirat(sess, "upper", 01777) != 0 && errno != EEXIST) ||
      fchmodat(sess, "upper", 01777, 0) != 0 ||
      (mkdirat(sess, "work", 0700) != 0 && errno != EEXIST) ||
      (mkdirat(sess, "merged", 0755) != 0 && errno != EEXIST))
    goto out;
  snprintf(opts, sizeof(opts), "lowerdir=/tmp,upperdir=%s,workdir=%s", upper, work);
  rc = mount("overlay", merged, "overlay", MS_NOSUID | MS_NODEV, opts);
out:
  close(lk);
  return rc;
}

/* Fills s->tmp with what the session's workers get as /tmp: the overlay
 * where it can be mounted, else a plain directory of the session's own
 * (the host's /tmp then out of sight). */
static int session_tmp(int sess, const char *state, const char *session, struct scratch *s) {
  char dir[4150];

  if (snprintf(dir, sizeof(dir), "%s/scratch/%s", state, session) >= (int)sizeof(dir)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (overlay_once(sess, dir) == 0) {
    snprintf(s->tmp, sizeof(s->tmp), "%s/merged", dir);
    s->overlay = 1;
    return 0;
  }
  s->overlay = 0;
  if ((mkdirat(sess, "tmp", 01777) != 0 && errno != EEXIST) || fchmodat(sess, "tmp", 01777, 0) != 0)
    return -1;
  return 0;
}

int scratch_enter(const char *state, const char *session, struct scratch *s, char *err,
                  size_t errlen) {
  int top = -1, sess = -1;

  s->lock_fd = -1;
  if (!scratch_session_ok(session)) {
    snprintf(err, errlen, "the session id \"%.80s\" cannot name a directory", session);
    return -1;
  }
  dir_name(session, s->name, sizeof(s->name));
  session = s->name;
  if (snprintf(s->tmp, sizeof(s->tmp), "%s/scratch/%s/tmp", state, session) >=
      (int)sizeof(s->tmp)) {
    snprintf(err, errlen, "the state directory's path is too long for a private /tmp");
    return -1;
  }
  {
    char dir[sizeof(s->tmp)];
    snprintf(dir, sizeof(dir), "%s/scratch", state);
    if (mkdir_own(AT_FDCWD, dir, 0700) != 0 ||
        (top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
      snprintf(err, errlen, "could not make %s: %s", dir, strerror(errno));
      return -1;
    }
  }
  for (int tries = 0;; tries++) {
    struct stat held, now;

    if (mkdir_own(top, session, 0700) != 0 ||
        (sess = openat(top, session, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        (s->lock_fd = openat(sess, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
      goto fail;
    while (flock(s->lock_fd, LOCK_SH) != 0)
      if (errno != EINTR)
        goto fail;
    /* The last to leave may have renamed the tree away while this one
     * waited for the lock: the tree locked must be the one at the path. */
    if (fstat(s->lock_fd, &held) == 0 && held.st_nlink > 0 && fstat(sess, &held) == 0 &&
        fstatat(top, session, &now, AT_SYMLINK_NOFOLLOW) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev)
      break;
    close(s->lock_fd);
    close(sess);
    s->lock_fd = sess = -1;
    if (tries == 100) {
      errno = EAGAIN;
      goto fail;
    }
  }
  if (session_tmp(sess, state, session, s) != 0)
    goto fail;
  close(sess);
  close(top);
  return 0;
fail:
  snprintf(err, errlen, "could not make the session's private /tmp in %s/scratch: %s", state,
           strerror(errno));
  if (s->lock_fd >= 0)
    close(s->lock_fd);
  s->lock_fd = -1;
  if (sess >= 0)
    close(sess);
  close(top);
  return -1;
}

/* 1 if session's overlay is mounted (merged is not on its tree's file
 * system). */
static int overlay_mounted(int top, const char *session) {
  char merged[160];
  struct stat m, d;

  snprintf(merged, sizeof(merged), "%s/merged", session);
  return fstatat(top, merged, &m, AT_SYMLINK_NOFOLLOW) == 0 &&
         fstatat(top, session, &d, AT_SYMLINK_NOFOLLOW) == 0 && m.st_dev != d.st_dev;
}

/* If no workerd holds session's tree (its lock is free, or it has none),
 * renames it away and removes it. lock_fd: ours, held shared, or -1. */
static void remove_if_free(int top, const char *session, int lock_fd) {
  char gone[128];
  int own = lock_fd < 0;

  if (own) {
    /* (created if missing: a workerd that made the directory and has yet
     * to make its lock then finds the tree gone and makes another) */
    int sess = openat(top, session, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sess < 0)
      return;
    lock_fd = openat(sess, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    close(sess);
    if (lock_fd < 0)
      return;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (own)
      close(lock_fd);
    return; /* someone else's worker still uses it */
  }
  snprintf(gone, sizeof(gone), ".gone-%s-%ld", session, (long)getpid());
  if (overlay_mounted(top, session)) {
    char merged[128];
    snprintf(merged, sizeof(merged), "/proc/self/fd/%d/%s/merged", top, session);
    /* (a tree whose overlay stays mounted is left for the next sweep) */
    if (umount2(merged, MNT_DETACH | UMOUNT_NOFOLLOW) != 0)
      gone[0] = '\0';
  }
  if (gone[0] && renameat(top, session, top, gone) != 0)
    gone[0] = '\0';
  /* Renamed: one that enters now makes a new tree, without waiting for
   * this one's removal. */
  flock(lock_fd, LOCK_UN);
  if (own)
    close(lock_fd);
  if (gone[0])
    (void)scratch_rmtree_at(top, gone);
}

void scratch_leave(const char *state, struct scratch *s) {
  char dir[4200];
  int top;

  if (s->lock_fd < 0)
    return;
  snprintf(dir, sizeof(dir), "%s/scratch", state);
  top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (top >= 0) {
    remove_if_free(top, s->name, s->lock_fd);
    close(top);
  }
  close(s->lock_fd);
  s->lock_fd = -1;
}

/* Whether name is what dir_name() makes of a session's name. */
static int dir_entry_ok(const char *name) {
  char session[SESSION_STORED_MAX];

  snprintf(session, sizeof(session), "%s", name + (name[0] == '+'));
  for (char *c = session; *c; c++)
    if (*c == '@')
      *c = '/';
  return scratch_session_ok(session);
}

void scratch_sweep(const char *state) {
  char dir[4200];
  struct dirent *e;
  DIR *d;

  snprintf(dir, sizeof(dir), "%s/scratch", state);
  d = opendir(dir);
  if (!d)
    return;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".gone-", 6) == 0)
      (void)scratch_rmtree_at(dirfd(d), e->d_name);
    else if (e->d_name[0] != '.' && dir_entry_ok(e->d_name))
      remove_if_free(dirfd(d), e->d_name, -1);
  }
  closedir(d);
}

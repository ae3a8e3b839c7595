/*
 * slurm_accounts.c: the accounts a root controller's Slurm jobs run as, and
 * the directories their output goes to.
 *
 * A job runs as its user's unix_user (docs/design.md, "Users"), else as
 * --run-as (sb.uid_arg: the default account), else, for a controller that
 * is not root, as the controller's own account. slurmstepd opens a job's
 * output (sbatch --output) as the job's user, who must not enter the state
 * directory: the default account's output goes to STATE-slurm (STATE/slurm
 * for the controller's own), and each user's account's to
 * STATE-slurm-users/ACCOUNT, made on its first job. Each is owned by its
 * account and 0700: only it and root read it. A job's output is read from
 * its own account's directory only (sb_job.out_dir): another account could
 * put a file named after the job's id in its own.
 */
#include "slurm_internal.h"

#include "log.h"
#include "muster_errors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The accounts whose directory is ready (their first job made it), so that
 * a launch costs no fork for the check. */
#define ACCOUNTS_MAX 256
static struct {
  pthread_mutex_t mu;
  char name[ACCOUNTS_MAX][64];
  int n;
} ready = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* 0 if account a can enter and write dir (tried as it, in a child), or
 * -1 (errno set: EACCES for "it cannot"). */
static int account_reaches(const struct sb_account *a, const char *dir) {
  int status;
  pid_t pid = fork();

  if (pid < 0)
    return -1;
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(a->gid) != 0 || setuid(a->uid) != 0)
      _exit(2);
    _exit(access(dir, R_OK | W_OK | X_OK) == 0 ? 0 : 1);
  }
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return 0;
  errno = WIFEXITED(status) && WEXITSTATUS(status) == 1 ? EACCES : EPERM;
  return -1;
}

/* Makes dir (mode 0700) the directory of a's jobs' output. The account
 * owns its contents, never where it points: an existing one must be a
 * directory itself, not a link to one, and is given to the account
 * through the descriptor, so that no swap can redirect that. Returns 0 or
 * MUSTER_E_IO with a sentence in err. */
static int account_dir(const struct sb_account *a, const char *dir, char *err, size_t errlen) {
  struct stat st;
  int fd;

  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    goto fail;
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && (errno == ENOTDIR || errno == ELOOP)) {
    snprintf(err, errlen, "%s, where Slurm jobs write their output, is not a directory", dir);
    return MUSTER_E_IO;
  }
  if (fd < 0)
    goto fail;
  if (fstat(fd, &st) != 0 || fchown(fd, a->uid, a->gid) != 0 || fchmod(fd, 0700) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    goto fail;
  }
  close(fd);
  if (account_reaches(a, dir) != 0) {
    snprintf(err, errlen,
             "%s cannot reach %s, where its Slurm jobs write their output (%s): a directory "
             "above it is not searchable by it. Choose a --state-dir whose parent %s can enter",
             a->user, dir, strerror(errno), a->user);
    return MUSTER_E_IO;
  }
  return 0;
fail:
  snprintf(err, errlen, "could not make %s (where Slurm jobs write their output): %s", dir,
           strerror(errno));
  return MUSTER_E_IO;
}

/* Fills a with the account name's ids, name and home (getpwnam_r: API
 * threads look accounts up meanwhile). Returns 0, or MUSTER_E_INVALID with
 * why. */
static int account_of(const char *name, struct sb_account *a, char *why, size_t whylen) {
  struct passwd pwbuf, *pw = NULL;
  char buf[4096];
  int e = getpwnam_r(name, &pwbuf, buf, sizeof(buf), &pw);

  if (!pw || strlen(pw->pw_name) >= sizeof(a->user) || strlen(pw->pw_dir) >= sizeof(a->home)) {
    snprintf(why, whylen, "cannot look up the account %s that its Slurm job would run as (%s)",
             name,
             pw  ? "its name or home is too long"
             : e ? strerror(e)
                 : "no such account on the controller's host");
    return MUSTER_E_INVALID;
  }
  if (pw->pw_uid == 0 || pw->pw_gid == 0) {
    snprintf(why, whylen,
             "the account %s is root or in root's group; a worker's code never runs so", name);
    return MUSTER_E_INVALID;
  }
  a->uid = pw->pw_uid;
  a->gid = pw->pw_gid;
  snprintf(a->uid_arg, sizeof(a->uid_arg), "--uid=%u", (unsigned)pw->pw_uid);
  snprintf(a->gid_arg, sizeof(a->gid_arg), "--gid=%u", (unsigned)pw->pw_gid);
  snprintf(a->user, sizeof(a->user), "%s", pw->pw_name);
  snprintf(a->home, sizeof(a->home), "%s", pw->pw_dir);
  return 0;
}

int sb_accounts_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  struct sb_account a = {0};

  if (!cfg->run_as[0]) {
    snprintf(sb.out_dir, sizeof(sb.out_dir), "%s/slurm", cfg->state_dir);
    if (mkdir(sb.out_dir, 0700) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "could not make %s (where Slurm jobs write their output): %s",
               sb.out_dir, strerror(errno));
      return MUSTER_E_IO;
    }
    return 0;
  }
  /* (never falls back to the controller's own account: that is root) */
  if (account_of(cfg->run_as, &a, err, errlen) != 0)
    return MUSTER_E_IO;
  snprintf(sb.uid_arg, sizeof(sb.uid_arg), "%s", a.uid_arg);
  snprintf(sb.gid_arg, sizeof(sb.gid_arg), "%s", a.gid_arg);
  snprintf(sb.run_user, sizeof(sb.run_user), "%s", a.user);
  snprintf(sb.run_home, sizeof(sb.run_home), "%s", a.home);
  snprintf(sb.out_dir, sizeof(sb.out_dir), "%s-slurm", cfg->state_dir);
  sb.run_uid = a.uid;
  sb.run_gid = a.gid;
  return account_dir(&a, sb.out_dir, err, errlen);
}

/* STATE-slurm-users: root's, 0711 (each account enters its own below). */
static int users_dir(char *dir, size_t size, char *why, size_t whylen) {
  struct stat st;

  snprintf(dir, size, "%s-slurm-users", sb.cfg.state_dir);
  if (mkdir(dir, 0711) != 0 && errno != EEXIST) {
    snprintf(why, whylen, "could not make %s (where users' Slurm jobs write their output): %s", dir,
             strerror(errno));
    return MUSTER_E_IO;
  }
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 0022) != 0 ||
      chmod(dir, 0711) != 0) {
    snprintf(why, whylen, "%s is not a directory of root's that only root may write", dir);
    return MUSTER_E_IO;
  }
  return 0;
}

int sb_account_get(const char *name, struct sb_account *a, char *why, size_t whylen) {
  char parent[620];
  int known = 0, rc;

  memset(a, 0, sizeof(*a));
  if (!name[0] || (sb.run_user[0] && strcmp(name, sb.run_user) == 0)) {
    snprintf(a->uid_arg, sizeof(a->uid_arg), "%s", sb.uid_arg);
    snprintf(a->gid_arg, sizeof(a->gid_arg), "%s", sb.gid_arg);
    snprintf(a->user, sizeof(a->user), "%s", sb.run_user);
    snprintf(a->home, sizeof(a->home), "%s", sb.run_home);
    snprintf(a->out_dir, sizeof(a->out_dir), "%s", sb.out_dir);
    a->uid = sb.run_uid;
    a->gid = sb.run_gid;
    return 0;
  }
  if (geteuid() != 0) {
    snprintf(why, whylen,
             "its user's unix account %s needs a controller run as root (sbatch --uid), which "
             "this one is not",
             name);
    return MUSTER_E_INVALID;
  }
  if ((rc = account_of(name, a, why, whylen)) != 0)
    return rc;
  if ((rc = users_dir(parent, sizeof(parent), why, whylen)) != 0)
    return rc;
  if ((size_t)snprintf(a->out_dir, sizeof(a->out_dir), "%s/%s", parent, a->user) >=
      sizeof(a->out_dir)) {
    snprintf(why, whylen, "the directory of %s's Slurm output would be too long a path", name);
    return MUSTER_E_INVALID;
  }
  pthread_mutex_lock(&ready.mu);
  for (int i = 0; i < ready.n && !known; i++)
    known = strcmp(ready.name[i], a->user) == 0;
  pthread_mutex_unlock(&ready.mu);
  if (known)
    return 0;
  if ((rc = account_dir(a, a->out_dir, why, whylen)) != 0)
    return rc;
  pthread_mutex_lock(&ready.mu);
  if (ready.n < ACCOUNTS_MAX)
    snprintf(ready.name[ready.n++], sizeof(ready.name[0]), "%s", a->user);
  pthread_mutex_unlock(&ready.mu);
  return 0;
}

int sb_users_have_dirs(void) {
  char parent[620];
  struct stat st;

  snprintf(parent, sizeof(parent), "%s-slurm-users", sb.cfg.state_dir);
  return lstat(parent, &st) == 0;
}

void sb_output_dirs(void (*fn)(const char *dir, void *arg), void *arg) {
  char parent[620], dir[900];
  struct dirent *e;
  struct stat st;
  DIR *d;

  fn(sb.out_dir, arg);
  snprintf(parent, sizeof(parent), "%s-slurm-users", sb.cfg.state_dir);
  d = opendir(parent);
  if (!d)
    return;
  /* (a file system that gives no type, NFS's, says so with DT_UNKNOWN) */
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' &&
        (e->d_type == DT_DIR ||
         (e->d_type == DT_UNKNOWN && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(st.st_mode)))) {
      snprintf(dir, sizeof(dir), "%s/%s", parent, e->d_name);
      fn(dir, arg);
    }
  closedir(d);
}

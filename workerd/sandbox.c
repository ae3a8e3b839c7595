/*
 * sandbox.c: the mounts and capabilities of a confined command (the local
 * backend's isolation), done in the child before it executes: what the
 * command may see and write of the host (a private /tmp, its working
 * directory and home writable, the rest read-only; the state directory,
 * the cgroups and the service managers' sockets out of reach) and the
 * capabilities it keeps. Nothing here allocates: it runs between fork()
 * and exec.
 */
#include "workerd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

static int write_text(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC), ok;

  if (fd < 0)
    return -1;
  ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
  close(fd);
  return ok ? 0 : -1;
}

/* Docker's default capabilities, less NET_RAW (it would let root read the
 * loopback traffic, tokens included) and MKNOD: everything else goes from
 * the bounding set, so that the command (root or not) cannot mount,
 * unmount, trace or reach around the namespaces. */
static bool cap_kept(int cap) {
  switch (cap) {
  case CAP_CHOWN:
  case CAP_DAC_OVERRIDE:
  case CAP_FOWNER:
  case CAP_FSETID:
  case CAP_KILL:
  case CAP_SETGID:
  case CAP_SETUID:
  case CAP_SETPCAP:
  case CAP_NET_BIND_SERVICE:
  case CAP_SYS_CHROOT:
  case CAP_AUDIT_WRITE:
  case CAP_SETFCAP:
    return true;
  default:
    return false;
  }
}

/* Mounts an empty read-only tmpfs over path, if path exists. */
static int cover(const char *path) {
  if (access(path, F_OK) != 0)
    return 0;
  return mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
               "size=4k,mode=0555");
}

/* Makes path read-only in this mount namespace, if it exists, keeping the
 * flags it has (in a user namespace they are locked: a remount that drops
 * one is refused). */
int confine_read_only(const char *path) {
  unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV;
  struct statvfs sv;

  if (access(path, F_OK) != 0)
    return 0;
  if (statvfs(path, &sv) == 0) {
    if (sv.f_flag & ST_NOEXEC)
      flags |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME)
      flags |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME)
      flags |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME)
      flags |= MS_RELATIME;
  }
  if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) != 0)
    return -1;
  return mount(NULL, path, NULL, flags, NULL);
}

/* /sys read-only, submounts included (tracefs, debugfs, bpf...): a fresh
 * sysfs, which has none, where that may be mounted (root); else the host's
 * /sys read-only at its top (a user namespace; its submounts are the
 * host's, and locked). */
static int sys_read_only(void) {
  if (mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0)
    return 0;
  return confine_read_only("/sys");
}

/* Sockets through which a process could ask something outside the
 * namespaces to run a command for it (the service managers, container
 * engines): /dev/null is bound over each that exists. The user's own
 * buses come from child_spec (their paths hold the uid). */
static const char *const outside_sockets[] = {
    "/run/dbus/system_bus_socket", "/var/run/dbus/system_bus_socket",
    "/run/systemd/private",        "/run/docker.sock",
    "/var/run/docker.sock",        "/run/containerd/containerd.sock",
    "/run/podman/podman.sock"};

static int block_socket(const char *path) {
  struct stat st;

  if (stat(path, &st) != 0 || !S_ISSOCK(st.st_mode))
    return 0; /* absent, or not a socket (a directory a container made) */
  return mount("/dev/null", path, NULL, MS_BIND, NULL);
}

/* ---- the file system: read-only, but for a few directories ----
 *
 * The command may write its working directory, its home and a private /tmp
 * (the session's, common/scratch.h); the host's /dev/shm stays shared (Open
 * MPI's ranks in the session's workers meet there). Everything else is
 * read-only, whatever the account's permissions. Each writable directory is
 * bound at its own path, opened before /tmp is replaced: one that lies
 * under the host's /tmp is bound into the private one, below copies of the
 * directories above it (with their owners and modes, so that the account
 * reaches it as it would have). */

#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

#define KEEP_DEPTH 16

struct keep {
  const char *path; /* NULL: nothing to keep */
  int fd;           /* the host's directory (O_PATH) */
  int tree;         /* its clone, bound at its path (cleared of RDONLY last) */
  int depth;        /* components below /tmp; 0 when not under /tmp */
  struct stat st[KEEP_DEPTH];
};

/* The next component of path at *off (skipping '/'), into name; 0 at the
 * end, -1 when it cannot be copied or is "." or "..". */
static int next_name(const char *path, size_t *off, char *name, size_t size) {
  size_t len;

  while (path[*off] == '/')
    (*off)++;
  len = strcspn(path + *off, "/");
  if (len == 0)
    return 0;
  if (len >= size || (len == 1 && path[*off] == '.') ||
      (len == 2 && path[*off] == '.' && path[*off + 1] == '.'))
    return -1;
  memcpy(name, path + *off, len);
  name[len] = '\0';
  *off += len;
  return 1;
}

/* Opens path, following no symbolic link: the account may have made the
 * working directory or its home a link to "/" (or to /var, whose /var/tmp
 * would then be writable). */
static int open_no_links(const char *path) {
  struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                         .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};

  return (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
}

/* Opens k's directory, unless it is reached through a link or is the root
 * of the file system (the whole host would be writable): it then stays
 * read-only, as the rest. */
static void keep_open(struct keep *k, const char *path) {
  char prefix[PATH_MAX], name[NAME_MAX + 1];
  struct stat st, root;
  size_t off = 5;
  int r;

  k->path = NULL;
  k->depth = 0;
  k->tree = -1;
  k->fd = path && path[0] == '/' ? open_no_links(path) : -1;
  if (k->fd < 0)
    return; /* (a missing one: the chdir says why, as the account) */
  if (fstat(k->fd, &st) != 0 || stat("/", &root) != 0 ||
      (st.st_dev == root.st_dev && st.st_ino == root.st_ino)) {
    close(k->fd);
    k->fd = -1;
    return;
  }
  k->path = path;
  if (strncmp(path, "/tmp/", 5) != 0 || strlen(path) >= sizeof(prefix))
    return;
  while ((r = next_name(path, &off, name, sizeof(name))) > 0) {
    if (k->depth == KEEP_DEPTH)
      break;
    memcpy(prefix, path, off);
    prefix[off] = '\0';
    if (stat(prefix, &k->st[k->depth]) != 0)
      break;
    k->depth++;
  }
  if (r != 0) { /* not copied: read-only, as the rest of the host's /tmp */
    close(k->fd);
    k->fd = -1;
    k->path = NULL;
  }
}

/* Binds a clone of k's directory (the one opened: its path is not
 * resolved again) over itself, or, under /tmp (after it was replaced),
 * over the same path in the worker's /tmp. */
static int keep_bind(struct keep *k) {
  char name[NAME_MAX + 1];
  size_t off = 5;
  int dfd, rc;

  k->tree =
      open_tree(k->fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH);
  if (k->tree < 0)
    return -1;
  if (k->depth == 0)
    return move_mount(k->tree, "", k->fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
  dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (int i = 0; dfd >= 0 && i < k->depth; i++) {
    int nfd;

    if (next_name(k->path, &off, name, sizeof(name)) != 1 ||
        (mkdirat(dfd, name, 0700) != 0 && errno != EEXIST))
      nfd = -1;
    else /* (no link: a worker of the session may have left one there) */
      nfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    /* (in a user namespace, an owner it does not map stays its own) */
    if (nfd >= 0 && ((fchown(nfd, k->st[i].st_uid, k->st[i].st_gid) != 0 && errno != EINVAL) ||
                     fchmod(nfd, k->st[i].st_mode & 07777) != 0)) {
      close(nfd);
      nfd = -1;
    }
    close(dfd);
    dfd = nfd;
  }
  if (dfd < 0)
    return -1;
  rc = move_mount(k->tree, "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
  close(dfd);
  return rc;
}

/* Clears the read-only flag of the mount at path (not below it). A mount
 * the host made read-only stays so where it is locked (a user namespace). */
static int writable(const char *path, uint64_t set) {
  struct mount_attr a = {.attr_set = set, .attr_clr = MOUNT_ATTR_RDONLY};

  if (mount_setattr(AT_FDCWD, path, 0, &a, sizeof(a)) == 0 || errno == ENOENT || errno == EPERM)
    return 0;
  return -1;
}

/* Binds the private /tmp and the directories kept writable; the rest of
 * the file system goes read-only in read_only_host(). */
static int private_tmp(const struct child_spec *cs, struct keep keeps[2]) {
  keep_open(&keeps[0], cs->cwd);
  keep_open(&keeps[1], cs->home);
  if (mount(cs->scratch, "/tmp", NULL, MS_BIND, NULL) != 0)
    return -1;
  for (int i = 0; i < 2; i++)
    if (keeps[i].path && keep_bind(&keeps[i]) != 0)
      return -1;
  return 0;
}

static int read_only_host(struct keep keeps[2]) {
  struct mount_attr ro = {.attr_set = MOUNT_ATTR_RDONLY};

  if (mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, &ro, sizeof(ro)) != 0 ||
      writable("/tmp", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) != 0 || writable("/dev/shm", 0) != 0 ||
      writable("/proc", 0) != 0)
    return -1;
  for (int i = 0; i < 2; i++) {
    struct mount_attr rw = {.attr_clr = MOUNT_ATTR_RDONLY};
    /* (one the host made read-only stays so where it is locked) */
    if (keeps[i].tree >= 0 &&
        mount_setattr(keeps[i].tree, "", AT_EMPTY_PATH, &rw, sizeof(rw)) != 0 && errno != EPERM)
      return -1;
  }
  for (int i = 0; i < 2; i++) {
    if (keeps[i].fd >= 0)
      close(keeps[i].fd);
    if (keeps[i].tree >= 0)
      close(keeps[i].tree);
  }
  return 0;
}

/* The namespaces every confined command gets: flags (CLONE_NEWNS, and
 * CLONE_NEWPID for the worker's command) and, without privileges, a user
 * namespace mapping the uid to itself; then the mounts: nothing mounted
 * here reaches the host; the state, the cgroups (their limits would be the
 * command's to raise) and the service managers' sockets are out of reach.
 * Returns 0, or -1 with errno set. */
int confine_mounts(const struct child_spec *cs, int flags) {
  struct keep keeps[2] = {{.fd = -1, .tree = -1}, {.fd = -1, .tree = -1}};

  if (cs->uid_map[0])
    flags |= CLONE_NEWUSER; /* namespaces without privileges */
  if (unshare(flags) != 0)
    return -1;
  if (cs->uid_map[0] && (write_text("/proc/self/setgroups", "deny") != 0 ||
                         write_text("/proc/self/uid_map", cs->uid_map) != 0 ||
                         write_text("/proc/self/gid_map", cs->gid_map) != 0))
    return -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      (cs->scratch && private_tmp(cs, keeps) != 0) || cover(cs->confine) != 0 ||
      sys_read_only() != 0 || cover("/sys/fs/cgroup") != 0)
    return -1;
  for (size_t i = 0; i < sizeof(outside_sockets) / sizeof(outside_sockets[0]); i++)
    if (block_socket(outside_sockets[i]) != 0)
      return -1;
  for (int i = 0; i < 4; i++)
    if (cs->user_sockets[i][0] && block_socket(cs->user_sockets[i]) != 0)
      return -1;
  return cs->scratch ? read_only_host(keeps) : 0;
}

/* The capabilities a confined command keeps (cap_kept()), none inherited
 * past exec, no new privileges. Returns 0, or -1 with errno set. */
int confine_caps(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];

  for (int cap = 0; cap <= 63; cap++)
    if (!cap_kept(cap) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      return -1;
  /* nothing inherited past exec, nothing gained from a setuid file */
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    return -1;
  if (syscall(SYS_capget, &hdr, data) != 0)
    return -1;
  data[0].inheritable = data[1].inheritable = 0;
  if (syscall(SYS_capset, &hdr, data) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return -1;
  return 0;
}

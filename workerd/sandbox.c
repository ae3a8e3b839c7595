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
#include <linux/capability.h>
#include <sched.h>
#include <stdbool.h>
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

/* The namespaces every confined command gets: flags (CLONE_NEWNS, and
 * CLONE_NEWPID for the worker's command) and, without privileges, a user
 * namespace mapping the uid to itself; then the mounts: nothing mounted
 * here reaches the host; the state, the cgroups (their limits would be the
 * command's to raise) and the service managers' sockets are out of reach.
 * Returns 0, or -1 with errno set. */
int confine_mounts(const struct child_spec *cs, int flags) {
  if (cs->uid_map[0])
    flags |= CLONE_NEWUSER; /* namespaces without privileges */
  if (unshare(flags) != 0)
    return -1;
  if (cs->uid_map[0] && (write_text("/proc/self/setgroups", "deny") != 0 ||
                         write_text("/proc/self/uid_map", cs->uid_map) != 0 ||
                         write_text("/proc/self/gid_map", cs->gid_map) != 0))
    return -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 || cover(cs->confine) != 0 ||
      sys_read_only() != 0 || cover("/sys/fs/cgroup") != 0)
    return -1;
  for (size_t i = 0; i < sizeof(outside_sockets) / sizeof(outside_sockets[0]); i++)
    if (block_socket(outside_sockets[i]) != 0)
      return -1;
  for (int i = 0; i < 4; i++)
    if (cs->user_sockets[i][0] && block_socket(cs->user_sockets[i]) != 0)
      return -1;
  return 0;
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

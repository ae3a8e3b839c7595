/* cgroup.c: see cgroup.h. */
#include "cgroup.h"

#include "log.h"
#include "resources.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The controllers muster uses, as a bit set per hierarchy. */
enum { C_MEMORY = 1, C_CPU = 2, C_CPUACCT = 4, C_PIDS = 8, C_FREEZER = 16, C_DEVICES = 32 };
#define CG_HIER_MAX 6
#define CG_GPUS 64
#define CG_CTL_DEVS 16
#define CG_PERIOD_US 100000

static const struct {
  const char *name;
  unsigned bit;
} controllers[] = {{"memory", C_MEMORY}, {"cpu", C_CPU},         {"cpuacct", C_CPUACCT},
                   {"pids", C_PIDS},     {"freezer", C_FREEZER}, {"devices", C_DEVICES}};

struct hier {
  char base[PATH_MAX / 2];
  unsigned ctrl;
  /* v1's devices hierarchy on a host without NVIDIA devices: a worker's
   * own cgroup there could only copy the base's rules (base_devices()), so
   * every worker joins the base itself, and none is made or removed there
   * (a sixth of a launch's cgroup work). */
  int shared;
};

static struct {
  int version;  /* 0: none, 1, 2 */
  int confined; /* workers' commands can get namespaces of their own */
  struct hier h[CG_HIER_MAX];
  int nh;
  /* The host's NVIDIA devices, "c MAJOR:MINOR" (v1's devices rules): GPU i
   * ("" where there is none), and the control devices. */
  char gpu[CG_GPUS][24];
  char ctl_dev[CG_CTL_DEVS][24];
  int nctl;
} cg;

/* Finds the NVIDIA device nodes in $MUSTER_DEV_DIR (default /dev). */
static void find_gpus(void) {
  const char *dir = getenv("MUSTER_DEV_DIR");
  struct dirent *e;
  DIR *d;

  d = opendir(dir && *dir ? dir : "/dev");
  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    char path[PATH_MAX], *end;
    struct stat st;
    long idx;

    if (strncmp(e->d_name, "nvidia", 6) != 0 ||
        (size_t)snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "/dev", e->d_name) >=
            sizeof(path) ||
        stat(path, &st) != 0 || !S_ISCHR(st.st_mode))
      continue;
    errno = 0;
    idx = strtol(e->d_name + 6, &end, 10);
    if (end != e->d_name + 6 && *end == '\0' && !errno && idx >= 0 && idx < CG_GPUS)
      snprintf(cg.gpu[idx], sizeof(cg.gpu[idx]), "c %u:%u", major(st.st_rdev), minor(st.st_rdev));
    else if (end == e->d_name + 6 && cg.nctl < CG_CTL_DEVS) /* nvidiactl, nvidia-uvm... */
      snprintf(cg.ctl_dev[cg.nctl++], sizeof(cg.ctl_dev[0]), "c %u:%u", major(st.st_rdev),
               minor(st.st_rdev));
  }
  closedir(d);
}

const char *cg_mode(void) {
  return cg.version == 2 ? "cgroup v2" : cg.version == 1 ? "cgroup v1" : "none";
}

int cg_enabled(void) {
  return cg.version != 0;
}

/* Why confinement was refused (cg_confine_why()); kept apart from cg,
 * which a failed setup clears. */
static char confine_why[96];

int cg_confined(void) {
  return cg.confined;
}

/* Why commands cannot be confined here ("" when they can, or before
 * cg_setup()). */
const char *cg_confine_why(void) {
  return confine_why;
}

/* Whether a command can be confined here as workerd confines it (mount and
 * PID namespaces, a tmpfs over dir, a /proc of its own): a child tries.
 * Returns 0, or the errno of the step that failed (*step names it). */
static int confine_probe(const char *dir, const char **step) {
  static const char *const steps[] = {"",     "unshare",   "mount --make-rprivate /", "mount tmpfs",
                                      "fork", "mount proc"};
  pid_t pid = fork(), inner;
  int st;

  if (pid == 0) {
    int flags = CLONE_NEWNS | CLONE_NEWPID | (geteuid() != 0 ? CLONE_NEWUSER : 0);
    if (unshare(flags) != 0)
      _exit(1);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
      _exit(2);
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k") != 0)
      _exit(3);
    inner = fork();
    if (inner < 0)
      _exit(4);
    if (inner == 0)
      _exit(mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0 ? 0 : 5);
    _exit(waitpid(inner, &st, 0) == inner && WIFEXITED(st) ? WEXITSTATUS(st) : 4);
  }
  if (pid < 0 || waitpid(pid, &st, 0) != pid) {
    *step = "fork";
    return ECHILD;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  *step = WIFEXITED(st) && WEXITSTATUS(st) < 6 ? steps[WEXITSTATUS(st)] : "the probe";
  return EPERM;
}

/* Writes text to dir/file. Returns 0, or an errno. */
static int put(const char *dir, const char *file, const char *fmt, ...) {
  char path[PATH_MAX], text[128];
  va_list ap;
  ssize_t n;
  int fd, len, e = 0;

  va_start(ap, fmt);
  len = vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (len < 0 || (size_t)len >= sizeof(text) ||
      (size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
    return ENAMETOOLONG;
  fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  n = write(fd, text, (size_t)len);
  if (n != len)
    e = n < 0 ? errno : EIO;
  close(fd);
  return e;
}

/* Reads dir/file into buf (NUL-terminated). Returns its length, or -1. */
static ssize_t get(const char *dir, const char *file, char *buf, size_t len) {
  char path[PATH_MAX];
  ssize_t n;
  int fd;

  if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
    return -1;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  n = read(fd, buf, len - 1);
  close(fd);
  if (n < 0)
    return -1;
  buf[n] = '\0';
  return n;
}

/* A number file (memory.current, cpuacct.usage...), or -1. "max" is 0. */
static long long get_number(const char *dir, const char *file) {
  char buf[64], *end;
  long long v;

  if (get(dir, file, buf, sizeof(buf)) <= 0)
    return -1;
  if (strncmp(buf, "max", 3) == 0)
    return 0;
  errno = 0;
  v = strtoll(buf, &end, 10);
  return errno || end == buf || v < 0 ? -1 : v;
}

/* The number after "key " in a keyed file (cpu.stat, memory.events), or -1. */
static long long get_keyed(const char *dir, const char *file, const char *key) {
  char buf[2048], *line, *end;
  size_t klen = strlen(key);

  if (get(dir, file, buf, sizeof(buf)) <= 0)
    return -1;
  for (line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
      long long v;
      errno = 0;
      v = strtoll(line + klen + 1, &end, 10);
      return errno || end == line + klen + 1 ? -1 : v;
    }
  return -1;
}

static int is_dir(const char *path) {
  struct stat st;

  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether comma-separated list holds tok. */
static int has_token(const char *list, const char *tok) {
  size_t n = strlen(tok);

  for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (strncmp(p, tok, n) == 0 && (p[n] == ',' || p[n] == '\0'))
      return 1;
  return 0;
}

/* This process's cgroup path in the hierarchy of controller ctrl (v1), or
 * in the unified one (ctrl NULL), from /proc/self/cgroup. */
static int own_cgroup(const char *ctrl, char *path, size_t len) {
  char line[1024];
  FILE *f = fopen("/proc/self/cgroup", "re");
  int found = -1;

  if (!f)
    return -1;
  while (found != 0 && fgets(line, sizeof(line), f)) {
    char *c1, *c2;

    line[strcspn(line, "\n")] = '\0';
    c1 = strchr(line, ':');
    c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c1 = *c2 = '\0';
    /* v1: "N:memory:/path"; v2: "0::/path" */
    if (ctrl ? !has_token(c1 + 1, ctrl) : strcmp(line, "0") != 0 || c1[1] != '\0')
      continue;
    if ((size_t)snprintf(path, len, "%s", c2 + 1) < len)
      found = 0;
  }
  fclose(f);
  return found;
}

/* The mount point of the v1 hierarchy holding controller ctrl, or of the
 * unified hierarchy (ctrl NULL), from /proc/self/mounts. */
static int mount_of(const char *ctrl, char *dir, size_t len) {
  char line[1024];
  FILE *f = fopen("/proc/self/mounts", "re");
  int found = -1;

  if (!f)
    return -1;
  while (found != 0 && fgets(line, sizeof(line), f)) {
    char mnt[512], type[32], opts[512];
    if (sscanf(line, "%*s %511s %31s %511s", mnt, type, opts) != 3)
      continue;
    if (ctrl ? strcmp(type, "cgroup") != 0 || !has_token(opts, ctrl) : strcmp(type, "cgroup2") != 0)
      continue;
    if ((size_t)snprintf(dir, len, "%s", mnt) < len)
      found = 0;
  }
  fclose(f);
  return found;
}

/* parent: the controller's own cgroup directory in a hierarchy mounted at
 * mnt, or mnt itself when that is not visible here. */
static void parent_dir(const char *mnt, const char *own, char *dir, size_t len) {
  snprintf(dir, len, "%s%s", mnt, strcmp(own, "/") == 0 ? "" : own);
  if (!is_dir(dir))
    snprintf(dir, len, "%s", mnt);
}

static int make_base(struct hier *h, const char *parent, const char *tag, char *why, size_t len) {
  if ((size_t)snprintf(h->base, sizeof(h->base), "%s/muster-%s", parent, tag) >= sizeof(h->base)) {
    snprintf(why, len, "the cgroup path under %s is too long", parent);
    return -1;
  }
  if (mkdir(h->base, 0755) != 0 && errno != EEXIST) {
    snprintf(why, len, "cannot create %s: %s", h->base, strerror(errno));
    return -1;
  }
  if (access(h->base, W_OK) != 0) {
    snprintf(why, len, "cannot write in %s: %s", h->base, strerror(errno));
    return -1;
  }
  return 0;
}

/* Whether the host has NVIDIA devices (find_gpus()). */
static int nvidia_found(void) {
  for (int i = 0; i < CG_GPUS; i++)
    if (cg.gpu[i][0])
      return 1;
  return cg.nctl > 0;
}

/* Whether cgroup directory dir has a child cgroup or a process (a shared
 * base holds workers' processes, maybe an earlier controller's, and no
 * directory). */
static int in_use(const char *dir) {
  struct dirent *e;
  char any[4];
  int found = get(dir, "cgroup.procs", any, sizeof(any)) > 0;
  DIR *d = found ? NULL : opendir(dir);

  while (d && !found && (e = readdir(d)) != NULL)
    found = e->d_type == DT_DIR && e->d_name[0] != '.';
  if (d)
    closedir(d);
  return found;
}

/* v1 devices: the base denies every device but a container's and the
 * host's GPUs; its worker cgroups copy that when they are made (and can
 * only narrow it), or, shared, hold the workers themselves. Written while
 * the base has no child and no process: changing it later would take
 * devices from the workers of an earlier controller. */
static void base_devices(const struct hier *h) {
  static const char *const allowed[] = {
      "c 1:3 rwm",   /* null */ "c 1:5 rwm",   /* zero */ "c 1:7 rwm",   /* full */
      "c 1:8 rwm",   /* random */ "c 1:9 rwm",                           /* urandom */
      "c 5:0 rwm",   /* tty */ "c 5:2 rwm",    /* ptmx */ "c 136:* rwm", /* pts */
      "c 10:200 rwm" /* tun */};
  int e = 0;

  if (!(h->ctrl & C_DEVICES) || in_use(h->base))
    return;
  e = put(h->base, "devices.deny", "a");
  for (size_t i = 0; !e && i < sizeof(allowed) / sizeof(allowed[0]); i++)
    e = put(h->base, "devices.allow", "%s", allowed[i]);
  for (int i = 0; !e && i < CG_GPUS; i++)
    if (cg.gpu[i][0])
      e = put(h->base, "devices.allow", "%s rwm", cg.gpu[i]);
  for (int i = 0; !e && i < cg.nctl; i++)
    e = put(h->base, "devices.allow", "%s rwm", cg.ctl_dev[i]);
  if (e)
    LOG(LOG_WARN, "cannot restrict the devices of %s: %s", h->base, strerror(e));
}

static int setup_v2(const char *tag, char *why, size_t len) {
  char mnt[512], own[512], parent[PATH_MAX / 2], have[512];
  struct hier *h = &cg.h[0];
  int e;

  if (mount_of(NULL, mnt, sizeof(mnt)) != 0 || own_cgroup(NULL, own, sizeof(own)) != 0)
    return 1; /* no unified hierarchy: try v1 */
  parent_dir(mnt, own, parent, sizeof(parent));
  have[0] = '\0';
  (void)get(parent, "cgroup.controllers", have, sizeof(have));
  have[strcspn(have, "\n")] = '\0';
  for (char *p = have; *p; p++)
    if (*p == ' ')
      *p = ','; /* a list has_token() reads */
  if (!has_token(have, "memory"))
    return 1; /* the controllers are v1's (a hybrid host) */
  if (!has_token(have, "cpu") || !has_token(have, "pids")) {
    snprintf(why, len, "cgroup v2 at %s offers only \"%.*s\" (memory, cpu and pids needed)", parent,
             (int)strcspn(have, "\n"), have);
    return -1;
  }
  /* Children get the controllers only if their parent hands them down,
   * which a cgroup that holds processes cannot (the root excepted). In a
   * cgroup delegated to it (systemd-run --scope -p Delegate=yes), the
   * controller is that process: it moves itself into a leaf of its own
   * first, as container managers do. */
  e = put(parent, "cgroup.subtree_control", "+memory +cpu +pids");
  if (e == EBUSY) {
    char self[PATH_MAX];
    if ((size_t)snprintf(self, sizeof(self), "%s/muster-controller-%s", parent, tag) <
            sizeof(self) &&
        (mkdir(self, 0755) == 0 || errno == EEXIST) && put(self, "cgroup.procs", "0") == 0)
      e = put(parent, "cgroup.subtree_control", "+memory +cpu +pids");
  }
  if (e != 0) {
    snprintf(why, len,
             "cannot enable memory, cpu and pids below %s (%s): run the controller in a cgroup "
             "delegated to it (systemd-run --scope -p Delegate=yes muster-controller ...)",
             parent, strerror(e));
    return -1;
  }
  if (make_base(h, parent, tag, why, len) != 0)
    return -1;
  if ((e = put(h->base, "cgroup.subtree_control", "+memory +cpu +pids")) != 0) {
    snprintf(why, len, "cannot enable memory, cpu and pids below %s: %s", h->base, strerror(e));
    return -1;
  }
  h->ctrl = C_MEMORY | C_CPU | C_CPUACCT | C_PIDS | C_FREEZER;
  cg.nh = 1;
  cg.version = 2;
  return 0;
}

static int setup_v1(const char *tag, char *why, size_t len) {
  char mounts[CG_HIER_MAX][512];

  cg.nh = 0;
  for (size_t i = 0; i < sizeof(controllers) / sizeof(controllers[0]); i++) {
    char mnt[512], own[512], parent[PATH_MAX / 2];
    int k;

    if (mount_of(controllers[i].name, mnt, sizeof(mnt)) != 0 ||
        own_cgroup(controllers[i].name, own, sizeof(own)) != 0) {
      if (controllers[i].bit & (C_MEMORY | C_CPU)) {
        snprintf(why, len, "no cgroup hierarchy with the %s controller is mounted",
                 controllers[i].name);
        return -1;
      }
      continue; /* optional: no pids limit, or kills without freezing */
    }
    for (k = 0; k < cg.nh && strcmp(mounts[k], mnt) != 0; k++)
      ;
    if (k == cg.nh) { /* a hierarchy not seen yet ("cpu,cpuacct" is one) */
      snprintf(mounts[k], sizeof(mounts[k]), "%s", mnt);
      parent_dir(mnt, own, parent, sizeof(parent));
      if (make_base(&cg.h[k], parent, tag, why, len) != 0)
        return -1;
      cg.nh++;
    }
    cg.h[k].ctrl |= controllers[i].bit;
  }
  cg.version = 1;
  return 0;
}

/* STATE/cgroups lists the base directories, one a line: where to look
 * (and what a test removes after itself). */
static void record_bases(const char *state_dir) {
  char path[PATH_MAX];
  FILE *f;

  if ((size_t)snprintf(path, sizeof(path), "%s/cgroups", state_dir) >= sizeof(path) ||
      !(f = fopen(path, "we")))
    return;
  for (int i = 0; i < cg.nh; i++)
    fprintf(f, "%s\n", cg.h[i].base);
  if (fclose(f) != 0)
    LOG(LOG_WARN, "could not write %s", path);
}

int cg_setup(enum cg_isolation want, const char *state_dir, char *why, size_t len) {
  uint64_t h = 1469598103934665603ULL;
  char tag[20];
  int rc;

  memset(&cg, 0, sizeof(cg));
  why[0] = '\0';
  if (want == CG_OFF) {
    snprintf(why, len, "--isolation none");
    return 0;
  }
  for (const char *p = state_dir; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  snprintf(tag, sizeof(tag), "%012llx", (unsigned long long)(h & 0xffffffffffffULL));
  find_gpus();
  rc = setup_v2(tag, why, len);
  if (rc > 0)
    rc = setup_v1(tag, why, len);
  if (rc != 0) {
    const char *step = "";

    memset(&cg, 0, sizeof(cg));
    if (want == CG_FORCE)
      return -1;
    /* No cgroups (a controller run by an ordinary user, say): the
     * commands can still get namespaces of their own, the state directory
     * out of their sight, where the kernel lets this user make them. */
    if (confine_probe(state_dir, &step) == 0)
      cg.confined = 1;
    else
      snprintf(confine_why, sizeof(confine_why), "%s refused", step);
    return 0;
  }
  for (int i = 0; i < cg.nh && cg.version == 1; i++) {
    cg.h[i].shared = cg.h[i].ctrl == C_DEVICES && !nvidia_found();
    base_devices(&cg.h[i]);
  }
  record_bases(state_dir);
  {
    const char *step = "";
    if (confine_probe(state_dir, &step) == 0)
      cg.confined = 1;
    else
      snprintf(confine_why, sizeof(confine_why), "%s refused", step);
    if (!cg.confined)
      LOG(LOG_WARN,
          "isolation: workers' commands cannot get namespaces of their own here (%s "
          "refused): they run in their cgroups, but can see the state directory",
          step);
  }
  for (int i = 0; i < CG_GPUS && cg.version == 2; i++)
    if (cg.gpu[i][0]) {
      LOG(LOG_WARN, "cgroup v2: GPU devices are not restricted to the workers given them "
                    "(that takes a BPF device program, which muster does not load)");
      break;
    }
  return 0;
}

static int hier_dir(const struct hier *h, const char *name, char *dir, size_t len) {
  return (size_t)snprintf(dir, len, "%s/%s", h->base, name) < len ? 0 : -1;
}

/* The directory of worker name in the hierarchy with controller bit. */
static int dir_with(unsigned bit, const char *name, char *dir, size_t len) {
  for (int i = 0; i < cg.nh; i++)
    if (cg.h[i].ctrl & bit)
      return hier_dir(&cg.h[i], name, dir, len);
  return -1;
}

static int set_limits(const struct hier *h, const char *dir, const struct cg_limits *l) {
  /* 0: no limit (the launch ranges keep a worker's above 0); the
   * conversions saturate, and the quota is at least the kernel's 1 ms. */
  long long bytes = l->memory > 0 ? res_memory_bytes(l->memory) : 0;
  long long quota = l->cpu > 0 ? res_cpu_quota_us(l->cpu, CG_PERIOD_US) : 0;
  int e;

  if (cg.version == 2) {
    if (bytes > 0 && (e = put(dir, "memory.max", "%lld", bytes)) != 0)
      return e;
    if (bytes > 0)
      (void)put(dir, "memory.swap.max", "0"); /* absent without swap accounting */
    if (quota > 0 && (e = put(dir, "cpu.max", "%lld %d", quota, CG_PERIOD_US)) != 0)
      return e;
    return put(dir, "pids.max", "%d", CG_PIDS_MAX);
  }
  if ((h->ctrl & C_MEMORY) && bytes > 0) {
    if ((e = put(dir, "memory.limit_in_bytes", "%lld", bytes)) != 0)
      return e;
    /* Past its memory a worker is killed, not swapped out. */
    (void)put(dir, "memory.memsw.limit_in_bytes", "%lld", bytes);
    (void)put(dir, "memory.swappiness", "0");
  }
  /* (the period is the kernel's default, 100 ms, in a new cgroup) */
  if ((h->ctrl & C_CPU) && quota > 0 && (e = put(dir, "cpu.cfs_quota_us", "%lld", quota)) != 0)
    return e;
  if ((h->ctrl & C_PIDS) && (e = put(dir, "pids.max", "%d", CG_PIDS_MAX)) != 0)
    return e;
  /* The base allows a container's devices and every GPU (base_devices);
   * a worker is denied the GPUs it was not given, and the control devices
   * when it was given none. On a host without GPUs: nothing to write. */
  if (h->ctrl & C_DEVICES) {
    for (int i = 0; i < CG_GPUS; i++)
      if (cg.gpu[i][0] && !(l->gpus & (1ULL << i)) &&
          (e = put(dir, "devices.deny", "%s rwm", cg.gpu[i])) != 0)
        return e;
    for (int i = 0; i < cg.nctl && !l->gpus; i++)
      if ((e = put(dir, "devices.deny", "%s rwm", cg.ctl_dev[i])) != 0)
        return e;
  }
  return 0;
}

int cg_create(const char *name, const struct cg_limits *l, char *dirs, size_t dirs_len, char *err,
              size_t errlen) {
  size_t used = 0;
  int made = 0;

  dirs[0] = '\0';
  if (!cg.version)
    return 0;
  if (hier_dir(&cg.h[0], name, dirs, dirs_len) == 0 && is_dir(dirs) &&
      cg_destroy(name, 1000) != 0) {
    snprintf(err, errlen, "its cgroup %s is left over and holds processes that will not die", name);
    return -1;
  }
  for (; made < cg.nh; made++) {
    char dir[PATH_MAX];
    int e, n;

    if (hier_dir(&cg.h[made], name, dir, sizeof(dir)) != 0) {
      snprintf(err, errlen, "the cgroup path of %s is too long", name);
      goto undo;
    }
    if (cg.h[made].shared) {
      snprintf(dir, sizeof(dir), "%s", cg.h[made].base); /* joined as it is */
    } else if (mkdir(dir, 0755) != 0) {
      snprintf(err, errlen, "cannot create the cgroup %s: %s", dir, strerror(errno));
      goto undo;
    }
    if (!cg.h[made].shared && (e = set_limits(&cg.h[made], dir, l)) != 0) {
      snprintf(err, errlen, "cannot set the limits of cgroup %s: %s", dir, strerror(e));
      made++;
      goto undo;
    }
    n = snprintf(dirs + used, dirs_len - used, "%s\n", dir);
    if (n < 0 || (size_t)n >= dirs_len - used) {
      snprintf(err, errlen, "the cgroup paths of %s are too long", name);
      made++;
      goto undo;
    }
    used += (size_t)n;
  }
  return 0;
undo:
  while (made-- > 0) {
    char dir[PATH_MAX];
    if (!cg.h[made].shared && hier_dir(&cg.h[made], name, dir, sizeof(dir)) == 0)
      (void)rmdir(dir);
  }
  dirs[0] = '\0';
  return -1;
}

/* 1 if dir/cgroup.procs lists a process, 0 if none (or no such cgroup). */
static int holds_any(const char *dir) {
  char path[PATH_MAX];
  long pid;
  int any;
  FILE *f;

  if ((size_t)snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >= sizeof(path))
    return 1; /* (cannot tell: as if it held some) */
  f = fopen(path, "re");
  if (!f)
    return 0;
  any = fscanf(f, "%ld", &pid) == 1;
  fclose(f);
  return any;
}

/* Sends SIGKILL to every process listed in dir/cgroup.procs. Returns how
 * many were listed (-1: no such cgroup). */
static int kill_listed(const char *dir) {
  char path[PATH_MAX];
  int n = 0;
  long pid;
  FILE *f;

  if ((size_t)snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >= sizeof(path))
    return -1;
  f = fopen(path, "re");
  if (!f)
    return -1;
  while (fscanf(f, "%ld", &pid) == 1)
    if (pid > 1) {
      kill((pid_t)pid, SIGKILL);
      n++;
    }
  fclose(f);
  return n;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

int cg_destroy(const char *name, int timeout_ms) {
  char dir[PATH_MAX], fz[PATH_MAX], state[32];
  int left = 0;

  if (!cg.version)
    return 0;
  if (cg.version == 2) {
    if (hier_dir(&cg.h[0], name, dir, sizeof(dir)) != 0 || !is_dir(dir))
      return 0;
    if (put(dir, "cgroup.kill", "1") != 0)
      (void)kill_listed(dir); /* before Linux 5.14 */
  } else if (dir_with(C_FREEZER, name, fz, sizeof(fz)) == 0 && is_dir(fz) && holds_any(fz)) {
    /* Frozen, nothing in it can fork a process that the kill misses.
     * An empty one, the usual end (its workerd reaped), is not frozen:
     * nothing can join it by forking, and a freeze and thaw each switch
     * a kernel static key while no other cgroup is frozen, which patches
     * the kernel's code on every CPU (a sixth of the machine's CPU during
     * a stop of 1,000 idle workers on a paravirtualised host). */
    if (put(fz, "freezer.state", "FROZEN") == 0)
      for (int i = 0; i < 100; i++) {
        if (get(fz, "freezer.state", state, sizeof(state)) > 0 && strncmp(state, "FROZEN", 6) == 0)
          break;
        sleep_ms(5);
      }
    (void)kill_listed(fz);
    (void)put(fz, "freezer.state", "THAWED"); /* the kills are delivered on thawing */
  }
  for (int waited = 0;; waited += 5) {
    left = 0;
    for (int i = 0; i < cg.nh; i++) {
      int n;
      if (hier_dir(&cg.h[i], name, dir, sizeof(dir)) != 0)
        continue;
      n = kill_listed(dir); /* whatever a v1 host without freezer let through */
      if (n > 0)
        left += n;
    }
    if (!left || waited >= timeout_ms)
      break;
    sleep_ms(5);
  }
  if (left) {
    LOG(LOG_WARN, "cgroup %s: %d processes still there after %d ms", name, left, timeout_ms);
    return left;
  }
  for (int i = 0; i < cg.nh; i++)
    if (hier_dir(&cg.h[i], name, dir, sizeof(dir)) == 0 && rmdir(dir) != 0 && errno != ENOENT)
      LOG(LOG_WARN, "cannot remove cgroup %s: %s", dir, strerror(errno));
  return 0;
}

int cg_oom(const char *name, long long *kills, long long *limit) {
  char dir[PATH_MAX];

  if (!cg.version || dir_with(C_MEMORY, name, dir, sizeof(dir)) != 0)
    return -1;
  *kills = get_keyed(dir, cg.version == 2 ? "memory.events" : "memory.oom_control", "oom_kill");
  *limit = get_number(dir, cg.version == 2 ? "memory.max" : "memory.limit_in_bytes");
  if (*limit >= (1LL << 60))
    *limit = 0; /* v1's "no limit" */
  return *kills < 0 ? -1 : 0;
}

int cg_usage_of(const char *name, struct cg_usage *u) {
  char dir[PATH_MAX];
  long long cpu;

  if (!cg.version || dir_with(C_MEMORY, name, dir, sizeof(dir)) != 0)
    return -1;
  if (cg.version == 2) {
    u->memory_bytes = get_number(dir, "memory.current");
    u->memory_peak_bytes = get_number(dir, "memory.peak"); /* from Linux 5.19 */
    cpu = get_keyed(dir, "cpu.stat", "usage_usec");
    u->cpu_seconds = cpu < 0 ? -1 : (double)cpu / 1e6;
  } else {
    u->memory_bytes = get_number(dir, "memory.usage_in_bytes");
    u->memory_peak_bytes = get_number(dir, "memory.max_usage_in_bytes");
    cpu = dir_with(C_CPUACCT, name, dir, sizeof(dir)) == 0 ? get_number(dir, "cpuacct.usage") : -1;
    u->cpu_seconds = cpu < 0 ? -1 : (double)cpu / 1e9;
  }
  return u->memory_bytes < 0 ? -1 : 0;
}

void cg_teardown(void) {
  for (int i = 0; i < cg.nh; i++)
    if (rmdir(cg.h[i].base) != 0 && errno != ENOENT && errno != EBUSY)
      LOG(LOG_WARN, "cannot remove %s: %s", cg.h[i].base, strerror(errno));
}

void cg_each(void (*fn)(const char *name, void *arg), void *arg) {
  struct dirent *e;
  DIR *d;

  if (!cg.version || !(d = opendir(cg.h[0].base)))
    return;
  while ((e = readdir(d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.' && strchr(e->d_name, '.'))
      fn(e->d_name, arg);
  closedir(d);
}

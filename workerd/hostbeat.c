/*
 * hostbeat.c: liveness per host. Told "host_beat" by the controller (its
 * register and heartbeat answers), the workerds of one host beat together:
 * the one that holds the host directory's lock (the agent) carries the
 * others' heartbeats in its own (its body's "vouch"), and each of the
 * others beats on its own only while no answer for it has come lately. They
 * meet in a directory of files (docs/internals/workerd.md, "Liveness per
 * host"):
 *
 *   D/agent.lock  flock()ed by the agent, for as long as it lives
 *   D/ID          a workerd's beacon: its time says it is alive (touched at
 *                 every tick); its text, its exec_refused count
 *   D/ID.ack      the agent's word after each answer that spoke for ID:
 *                 "ok MS B" (its interval, and whether to go on beating
 *                 with the host: 1 or 0) or "refused"
 *
 * D is MUSTER_HOST_DIR (the local backend's: in its state directory), else
 * one per controller and hostname under /run/muster/host (root) or
 * /tmp/muster-host-UID; a directory another account could write is not
 * used. Nothing in it is a secret: a beacon holds no token, and the
 * controller takes a vouch only for workers of the voucher's own user.
 */
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The most siblings one heartbeat speaks for (the controller's VOUCH_MAX). */
#define VOUCH_MAX 1000
/* A beacon untouched this long is a workerd gone (kill -9): removed. */
#define BEACON_GONE_MS (10 * 60 * 1000)

static struct {
  bool joined;        /* the beacon is there */
  char dir[PATH_MAX]; /* D */
  int lock_fd;        /* >= 0: this workerd is the agent */
  uint64_t refused;   /* the exec_refused the beacon says */
  int64_t next_tick_ms;
  int64_t covered_until_ms; /* an "ok" ack came: no beat of its own until then */
  struct timespec ack_seen; /* the ack last read (its mtime) */
  ino_t ack_ino;
} hb = {.lock_fd = -1};

static int64_t tick_ms(void) {
  int64_t t = wd.hb_interval_ms / 4;

  return t < 200 ? 200 : t > 5000 ? 5000 : t;
}

static int64_t real_ms(void) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A directory of ours: made if absent, and taken only if it is a directory
 * (not a link) owned by this account that nobody else may write. */
static int own_dir(const char *path) {
  struct stat st;

  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return -1;
  if (lstat(path, &st) != 0)
    return -1;
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
    LOG(LOG_INFO, "%s is not a directory of this account's alone: this worker beats on its own",
        path);
    return -1;
  }
  return 0;
}

/* Chooses and makes D. */
static int dir_setup(void) {
  const char *given = getenv("MUSTER_HOST_DIR");
  char host[256] = "", base[PATH_MAX];
  uint64_t h = 1469598103934665603ULL; /* FNV-1a of the controller's URL */

  if (given && *given) {
    if (strlen(given) >= sizeof(hb.dir))
      return -1;
    snprintf(hb.dir, sizeof(hb.dir), "%s", given);
    return own_dir(hb.dir);
  }
  for (const char *p = wd.url; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  if (gethostname(host, sizeof(host) - 1) != 0 || strchr(host, '/'))
    return -1;
  if (geteuid() == 0) {
    if (own_dir("/run/muster") != 0 || own_dir("/run/muster/host") != 0)
      return -1;
    snprintf(base, sizeof(base), "/run/muster/host");
  } else {
    snprintf(base, sizeof(base), "/tmp/muster-host-%u", (unsigned)geteuid());
    if (own_dir(base) != 0)
      return -1;
  }
  if (snprintf(hb.dir, sizeof(hb.dir), "%s/%016" PRIx64 "-%s", base, h, host) >=
      (int)sizeof(hb.dir))
    return -1;
  return own_dir(hb.dir);
}

static int path_of(char *buf, size_t size, const char *id, const char *suffix) {
  return snprintf(buf, size, "%s/%s%s", hb.dir, id, suffix) < (int)size ? 0 : -1;
}

/* Writes text to D/NAME whole (a temporary file renamed over it). */
static int write_file(const char *name, const char *text) {
  char tmp[PATH_MAX], path[PATH_MAX];
  size_t len = strlen(text);
  int fd, ok;

  if (path_of(tmp, sizeof(tmp), ".", name) != 0 || path_of(path, sizeof(path), name, "") != 0)
    return -1;
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return -1;
  ok = write(fd, text, len) == (ssize_t)len;
  close(fd);
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* The beacon: written when its count changes, touched otherwise. */
static int beacon_touch(void) {
  char text[32], path[PATH_MAX];
  uint64_t n = ex_refused();

  if (!hb.joined || n != hb.refused) {
    snprintf(text, sizeof(text), "%" PRIu64 "\n", n);
    if (write_file(wd.id, text) != 0)
      return -1;
    hb.refused = n;
    hb.joined = true;
    return 0;
  }
  if (path_of(path, sizeof(path), wd.id, "") != 0)
    return -1;
  return utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW);
}

static void join(void) {
  if (dir_setup() != 0 || beacon_touch() != 0) {
    LOG(LOG_INFO, "could not join this host's heartbeat in %s: this worker beats on its own",
        hb.dir[0] ? hb.dir : "(no directory)");
    hb.joined = false;
    return;
  }
  LOG(LOG_DEBUG, "joined this host's heartbeat in %s", hb.dir);
}

void host_beat_leave(void) {
  char path[PATH_MAX];

  if (!hb.joined)
    return;
  if (path_of(path, sizeof(path), wd.id, "") == 0)
    unlink(path);
  if (path_of(path, sizeof(path), wd.id, ".ack") == 0)
    unlink(path);
  if (hb.lock_fd >= 0)
    close(hb.lock_fd); /* (the lock goes with it: another takes over) */
  hb.lock_fd = -1;
  hb.joined = false;
  hb.covered_until_ms = 0;
  rmdir(hb.dir); /* (the last one out; ENOTEMPTY otherwise) */
}

/* Becomes the agent if nobody is. */
static void agent_try(void) {
  char path[PATH_MAX];
  int fd;

  if (hb.lock_fd >= 0 || path_of(path, sizeof(path), "agent.lock", "") != 0)
    return;
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return;
  }
  hb.lock_fd = fd;
  hb.covered_until_ms = 0;
  LOG(LOG_INFO, "beating for this host's workers (%s)", hb.dir);
}

/* Reads the agent's word for this worker, if new. Returns HB_STOP_QUIET when
 * the controller asked it to stop. */
static enum hb_result ack_read(int64_t now) {
  char path[PATH_MAX], text[64];
  struct stat st;
  ssize_t n;
  long long ms;
  int fd, on;

  if (path_of(path, sizeof(path), wd.id, ".ack") != 0 || stat(path, &st) != 0)
    return HB_NONE;
  if (st.st_ino == hb.ack_ino && st.st_mtim.tv_sec == hb.ack_seen.tv_sec &&
      st.st_mtim.tv_nsec == hb.ack_seen.tv_nsec)
    return HB_NONE;
  hb.ack_ino = st.st_ino;
  hb.ack_seen = st.st_mtim;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return HB_NONE;
  n = read(fd, text, sizeof(text) - 1);
  close(fd);
  text[n > 0 ? n : 0] = '\0';
  if (sscanf(text, "ok %lld %d", &ms, &on) == 2 && ms >= 100 && ms <= 3600 * 1000) {
    /* covered for an interval and a half: the agent's next answer is due
     * within one; past that, this worker beats on its own again */
    if ((int64_t)ms != wd.hb_interval_ms)
      LOG(LOG_DEBUG, "heartbeat interval now %.1f s", (double)ms / 1000);
    wd.hb_interval_ms = ms;
    hb.covered_until_ms = now + ms + ms / 2;
    if (!on) {
      /* (the controller no longer wants host beats: this worker leaves at
       * its next step and beats on its own) */
      wd.host_beat = false;
      hb.covered_until_ms = 0;
    }
    return HB_NONE;
  }
  if (strncmp(text, "stop", 4) == 0) {
    LOG(LOG_INFO, "the controller asked this worker to stop");
    return HB_STOP_QUIET;
  }
  hb.covered_until_ms = 0; /* "refused": its own heartbeat learns why */
  return HB_NONE;
}

enum hb_result host_beat_step(int64_t now) {
  if (wd.host_beat != hb.joined) {
    if (wd.host_beat)
      join();
    else
      host_beat_leave();
    hb.next_tick_ms = now;
  }
  if (!hb.joined || now < hb.next_tick_ms)
    return HB_NONE;
  hb.next_tick_ms = now + tick_ms();
  if (beacon_touch() != 0) {
    LOG(LOG_INFO, "could not touch this worker's beacon in %s: it beats on its own", hb.dir);
    host_beat_leave();
    wd.host_beat = false; /* (until an answer says so again) */
    return HB_NONE;
  }
  /* (while the agent answers for it, nobody need take its part) */
  if (!host_beat_covered(now))
    agent_try();
  return hb.lock_fd >= 0 ? HB_NONE : ack_read(now);
}

bool host_beat_covered(int64_t now) {
  return hb.joined && hb.lock_fd < 0 && now < hb.covered_until_ms;
}

int64_t host_beat_deadline(void) {
  return hb.joined || wd.host_beat != hb.joined ? hb.next_tick_ms : INT64_MAX;
}

/* One sibling's beacon, if fresh: appended to vouch. Stale ones of workerds
 * gone are removed. */
static void vouch_one(json_t *vouch, const char *id, int64_t real_now) {
  char path[PATH_MAX], text[32];
  struct stat st;
  int64_t age;
  ssize_t n;
  int fd;

  if (path_of(path, sizeof(path), id, "") != 0 || lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return;
  age = real_now - ((int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000);
  if (age > BEACON_GONE_MS) {
    unlink(path);
    if (path_of(path, sizeof(path), id, ".ack") == 0)
      unlink(path);
    return;
  }
  /* fresh: touched within two of its ticks and a second (a hung workerd's
   * beacon ages, is left out, and its heartbeat timeout runs) */
  if (age > 2 * tick_ms() + 1000)
    return;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return;
  n = read(fd, text, sizeof(text) - 1);
  close(fd);
  text[n > 0 ? n : 0] = '\0';
  json_array_append_new(vouch, json_pack("{s:s, s:I}", "id", id, "exec_refused",
                                         (json_int_t)strtoull(text, NULL, 10)));
}

static bool beacon_there(const char *id) {
  char path[PATH_MAX];
  struct stat st;

  return path_of(path, sizeof(path), id, "") == 0 && lstat(path, &st) == 0;
}

/* An ack whose beacon is gone (its workerd left as the agent wrote it) is
 * removed once a minute old. */
static void ack_stray(const char *name, int64_t real_now) {
  char id[WD_ID_MAX + 1], path[PATH_MAX];
  size_t n = strlen(name);
  struct stat st;

  if (n < 5 || n - 4 > WD_ID_MAX || strcmp(name + n - 4, ".ack") != 0)
    return;
  memcpy(id, name, n - 4);
  id[n - 4] = '\0';
  if (beacon_there(id) || path_of(path, sizeof(path), name, "") != 0 || lstat(path, &st) != 0)
    return;
  if (real_now - ((int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000) > 60000)
    unlink(path);
}

static bool id_like(const char *s) {
  if (strncmp(s, "w-", 2) != 0 || strlen(s) > WD_ID_MAX)
    return false;
  for (const char *p = s + 2; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
      return false;
  return true;
}

json_t *host_beat_vouch(void) {
  json_t *vouch;
  struct dirent *e;
  int64_t real_now = real_ms();
  DIR *d;

  if (!hb.joined || hb.lock_fd < 0 || !(d = opendir(hb.dir)))
    return NULL;
  vouch = json_array();
  while (vouch && json_array_size(vouch) < VOUCH_MAX && (e = readdir(d))) {
    if (id_like(e->d_name) && strcmp(e->d_name, wd.id) != 0)
      vouch_one(vouch, e->d_name, real_now);
    else if (e->d_name[0] == 'w')
      ack_stray(e->d_name, real_now);
  }
  closedir(d);
  return vouch;
}

void host_beat_answered(const json_t *vouched) {
  const char *id;
  json_t *v;
  char name[WD_ID_MAX + 8], text[48];

  if (!hb.joined || hb.lock_fd < 0 || !json_is_object(vouched))
    return;
  json_object_foreach((json_t *)vouched, id, v) {
    json_t *iv = json_object_get(v, "heartbeat_interval_seconds");
    double s = json_number_value(iv);

    if (!id_like(id) || strcmp(id, wd.id) == 0)
      continue;
    if (json_is_true(json_object_get(v, "stop")))
      snprintf(text, sizeof(text), "stop\n");
    else if (json_is_false(json_object_get(v, "stop")) && json_is_number(iv) && s >= 0.1 &&
             s <= 3600)
      snprintf(text, sizeof(text), "ok %lld %d\n", (long long)(s * 1000),
               !json_is_false(json_object_get(v, "host_beat")));
    else
      snprintf(text, sizeof(text), "refused\n");
    snprintf(name, sizeof(name), "%s.ack", id);
    /* (not for a workerd that left since: its ack would stay behind) */
    if (!beacon_there(id))
      continue;
    if (write_file(name, text) != 0)
      LOG(LOG_DEBUG, "could not write %s/%s", hb.dir, name);
  }
}

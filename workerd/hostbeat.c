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
 *                 every tick); its text, "REFUSED PID TICK": its exec
 *                 refusals, its pid, its tick in ms
 *   D/ID.ack      the agent's word after each answer that spoke for ID:
 *                 "ok MS B PID SENT COVER" (the interval told, whether to
 *                 go on beating with the host: 1 or 0, the pid it was for,
 *                 when the call started, in ms of the wall clock, and for
 *                 how long after that the worker may skip its own beats) or
 *                 "refused PID"
 *
 * D is MUSTER_HOST_DIR (the local backend's: in its state directory), else
 * one per controller and hostname under /run/muster/host (root),
 * $XDG_RUNTIME_DIR or /tmp/muster-host-UID; in it, one directory per user
 * (the register answer's host_beat_group). A directory another account
 * could write is not used. Nothing in it is a secret: a beacon holds no
 * token, and the controller takes a vouch only for a running worker of the
 * voucher's own user and host, registered by the pid the beacon names.
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
/* A file of the agent's left without its beacon (an ack written as its
 * workerd left, a temporary one of a crash) is removed this old. */
#define STRAY_MS 60000
/* A directory that could not be joined is tried again this much later. */
#define JOIN_RETRY_MS 60000

static struct {
  bool joined;        /* the beacon is there */
  bool said;          /* a failure to join was logged (once at INFO) */
  char dir[PATH_MAX]; /* D */
  int lock_fd;        /* D/agent.lock, open while joined */
  bool agent;         /* lock_fd is flock()ed: this workerd is the agent */
  int64_t sent_ms;    /* the wall clock when the agent's vouching call started */
  char beacon[64];    /* the beacon's text, as written */
  uint64_t refused;   /* the exec refusals it says (host_beat_step()'s caller's count) */
  int64_t join_at_ms; /* not before this (a failed join) */
  int64_t next_tick_ms;
  int64_t covered_until_ms; /* an "ok" ack came: no beat of its own until then */
  struct timespec ack_seen; /* the ack last read (its mtime) */
  ino_t ack_ino;
} hb = {.lock_fd = -1};

static int64_t tick_ms(void) {
  int64_t t = wd.hb_interval_ms / 4;

  return t < 200 ? 200 : t > 5000 ? 5000 : t;
}

/* A file's time in ms (a time past any year of use, a file's set so,
 * clamped). */
static int64_t mtime_ms(const struct stat *st) {
  int64_t s = st->st_mtim.tv_sec;

  s = s < 0 ? 0 : s > (1LL << 40) ? (1LL << 40) : s;
  return s * 1000 + st->st_mtim.tv_nsec / 1000000;
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
    errno = EPERM;
    return -1;
  }
  return 0;
}

/* Where the directories of this account's host beats go. */
static int base_dir(char *base, size_t size) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");

  if (geteuid() == 0) {
    snprintf(base, size, "/run/muster/host");
    return own_dir("/run/muster") == 0 && own_dir(base) == 0 ? 0 : -1;
  }
  /* (made by root for this account alone, where there is one: nobody
   * else can make it first, as in /tmp) */
  if (xdg && xdg[0] == '/' && strlen(xdg) + 16 < size) {
    snprintf(base, size, "%s/muster-host", xdg);
    if (own_dir(base) == 0)
      return 0;
  }
  snprintf(base, size, "/tmp/muster-host-%u", (unsigned)geteuid());
  return own_dir(base);
}

/* Chooses and makes D: the host's directory, then the user's in it. */
static int dir_setup(void) {
  const char *given = getenv("MUSTER_HOST_DIR");
  char host[256] = "", base[PATH_MAX], at[PATH_MAX];

  if (given && *given) {
    if (strlen(given) >= sizeof(at))
      return -1;
    snprintf(at, sizeof(at), "%s", given);
  } else {
    if (gethostname(host, sizeof(host) - 1) != 0 || strchr(host, '/') || host[0] == '.')
      return -1;
    if (base_dir(base, sizeof(base)) != 0 ||
        snprintf(at, sizeof(at), "%s/%08x-%s", base, (unsigned)util_fnv1a(wd.url), host) >=
            (int)sizeof(at))
      return -1;
  }
  if (own_dir(at) != 0)
    return -1;
  if (snprintf(hb.dir, sizeof(hb.dir), "%s/g-%s", at, wd.host_group) >= (int)sizeof(hb.dir))
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
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
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

/* Reads D/NAME (a regular file: never a FIFO's wait) into text; its stat in
 * *st. Returns 0 or -1. */
static int read_file(const char *name, char *text, size_t size, struct stat *st) {
  char path[PATH_MAX];
  ssize_t n;
  int fd;

  if (path_of(path, sizeof(path), name, "") != 0)
    return -1;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return -1;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    close(fd);
    return -1;
  }
  n = read(fd, text, size - 1);
  close(fd);
  text[n > 0 ? n : 0] = '\0';
  return n > 0 ? 0 : -1;
}

/* The beacon: written when its text changes, touched otherwise. */
static int beacon_touch(void) {
  char text[sizeof(hb.beacon)], path[PATH_MAX];

  snprintf(text, sizeof(text), "%" PRIu64 " %ld %" PRId64 "\n", hb.refused, (long)getpid(),
           tick_ms());
  if (!hb.joined || strcmp(text, hb.beacon) != 0) {
    if (write_file(wd.id, text) != 0)
      return -1;
    snprintf(hb.beacon, sizeof(hb.beacon), "%s", text);
    hb.joined = true;
    return 0;
  }
  if (path_of(path, sizeof(path), wd.id, "") != 0)
    return -1;
  return utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW);
}

/* Removes D when nothing but the agent's lock and stray temporary files is
 * left in it (the last one out): only the names seen so, so that a
 * workerd joining meanwhile keeps its files (and D, which rmdir() then
 * leaves). */
static void dir_remove_if_empty(void) {
  char names[16][NAME_MAX + 1], path[PATH_MAX];
  struct dirent *e;
  int n = 0;
  DIR *d = opendir(hb.dir);

  if (!d)
    return;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (n == 16 || (strcmp(e->d_name, "agent.lock") != 0 && e->d_name[0] != '.')) {
      closedir(d);
      return;
    }
    snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
  }
  closedir(d);
  for (int i = 0; i < n; i++)
    if (path_of(path, sizeof(path), names[i], "") == 0)
      unlink(path);
  rmdir(hb.dir); /* (fails if another joined meanwhile: it stays theirs) */
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
  hb.agent = false;
  hb.joined = false;
  hb.covered_until_ms = 0;
  dir_remove_if_empty();
}

/* Opens D/agent.lock (made if absent). */
static int lock_open(void) {
  char path[PATH_MAX];

  if (path_of(path, sizeof(path), "agent.lock", "") != 0)
    return -1;
  hb.lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  return hb.lock_fd >= 0 ? 0 : -1;
}

/* Joins the host's heartbeat: D made, the beacon written, the lock open.
 * On failure this worker beats on its own, and tries again a minute later
 * (said once). D removed by the last one out as this one came is made
 * again at once. */
static void join(int64_t now) {
  int e = 0;

  for (int tries = 0; tries < 2; tries++) {
    if (dir_setup() == 0 && beacon_touch() == 0 && lock_open() == 0) {
      LOG(LOG_DEBUG, "joined this host's heartbeat in %s", hb.dir);
      hb.next_tick_ms = now;
      return;
    }
    e = errno;
    if (hb.joined)
      host_beat_leave(); /* (the beacon, if it was written) */
    if (e != ENOENT)
      break;
  }
  LOG(hb.said ? LOG_DEBUG : LOG_INFO,
      "could not join this host's heartbeat in %s (%s): this worker beats on its own",
      hb.dir[0] ? hb.dir : "its directory", strerror(e));
  hb.said = true;
  hb.joined = false;
  hb.join_at_ms = now + JOIN_RETRY_MS;
}

/* Whether the open lock is D/agent.lock still (not a file the last one
 * out, or a cleaner of old files, removed, another made anew). */
static bool lock_is_ds(void) {
  char path[PATH_MAX];
  struct stat held, named;

  return path_of(path, sizeof(path), "agent.lock", "") == 0 && fstat(hb.lock_fd, &held) == 0 &&
         lstat(path, &named) == 0 && held.st_ino == named.st_ino && held.st_dev == named.st_dev &&
         held.st_nlink > 0;
}

/* Becomes the agent if nobody is: one flock() a tick on the open lock,
 * which must be D's (else it is opened again). The agent checks that its
 * lock still is, and keeps its time fresh for cleaners of old files. */
static void agent_try(void) {
  if (hb.lock_fd < 0 && lock_open() != 0)
    return;
  if (hb.agent && lock_is_ds()) {
    futimens(hb.lock_fd, NULL);
    return;
  }
  if (!hb.agent && flock(hb.lock_fd, LOCK_EX | LOCK_NB) != 0)
    return;
  if (!lock_is_ds()) {
    if (hb.agent)
      LOG(LOG_INFO, "this host's lock file was replaced: no longer beating for its workers");
    hb.agent = false;
    close(hb.lock_fd);
    lock_open(); /* (-1 on failure: tried again at the next tick) */
    return;
  }
  hb.agent = true;
  hb.covered_until_ms = 0;
  LOG(LOG_INFO, "beating for this host's workers (%s)", hb.dir);
}

/* Reads the agent's word for this worker, if new and for this workerd. */
static void ack_read(int64_t now) {
  char name[WD_ID_MAX + 8], text[128];
  struct stat st;
  long long ms, pid, sent, cover;
  int64_t was = hb.covered_until_ms;
  int on;

  snprintf(name, sizeof(name), "%s.ack", wd.id);
  if (read_file(name, text, sizeof(text), &st) != 0)
    return;
  if (st.st_ino == hb.ack_ino && st.st_mtim.tv_sec == hb.ack_seen.tv_sec &&
      st.st_mtim.tv_nsec == hb.ack_seen.tv_nsec)
    return;
  hb.ack_ino = st.st_ino;
  hb.ack_seen = st.st_mtim;
  if (sscanf(text, "ok %lld %d %lld %lld %lld", &ms, &on, &pid, &sent, &cover) == 5 &&
      pid == (long long)getpid() && ms >= 100 && ms <= 3600 * 1000 && cover >= 0 &&
      cover <= 7200 * 1000 && sent > util_wall_ms() - 86400000LL &&
      sent < util_wall_ms() + 86400000LL) {
    /* The interval grows by at most twice an ack (a file is not the
     * controller's own word), the cover no longer than two intervals and
     * a second. The cover counts from the agent's call: the controller
     * sized it so that this worker's own beat, due when it ends, comes
     * within its timeout. */
    int64_t left;

    if (ms > 2 * wd.hb_interval_ms)
      ms = 2 * wd.hb_interval_ms;
    if (cover > 2 * ms + 1000)
      cover = 2 * ms + 1000;
    left = sent + cover - util_wall_ms();
    if ((int64_t)ms != wd.hb_interval_ms)
      LOG(LOG_DEBUG, "heartbeat interval now %.1f s", (double)ms / 1000);
    wd.hb_interval_ms = ms;
    hb.covered_until_ms = left > 0 ? now + (left < cover ? left : cover) : 0;
    if (!on) {
      /* (the controller no longer wants host beats: this worker leaves at
       * its next step and beats on its own) */
      wd.host_beat = false;
      hb.covered_until_ms = 0;
    }
    /* Its own beat comes no later than this answer allows: when the new
     * cover ends; at once if it ended one; an interval on, the one it now
     * tells (shorter, it may be, than the one the beat was set by). Not
     * while one of its own is in flight (INT64_MAX): its answer sets it. */
    if (wd.next_hb_ms != INT64_MAX) {
      int64_t due = hb.covered_until_ms > now ? hb.covered_until_ms : was > now ? now : now + ms;

      if (due < wd.next_hb_ms)
        wd.next_hb_ms = due;
    }
  } else if (sscanf(text, "refused %lld", &pid) == 1 && pid == (long long)getpid() &&
             hb.covered_until_ms > now) {
    /* the end of its cover: its own heartbeat learns why, now (not at each
     * refusal: one that lasts would double its beats), unless one is in
     * flight */
    hb.covered_until_ms = 0;
    if (wd.next_hb_ms != INT64_MAX)
      wd.next_hb_ms = now;
  }
}

enum hb_result host_beat_step(int64_t now, uint64_t refused) {
  hb.refused = refused;
  if (!wd.host_beat && hb.joined)
    host_beat_leave();
  if (wd.host_beat && !hb.joined) {
    if (now < hb.join_at_ms)
      return HB_NONE;
    join(now);
  }
  if (!hb.joined || now < hb.next_tick_ms)
    return HB_NONE;
  hb.next_tick_ms = now + tick_ms();
  if (beacon_touch() != 0) {
    LOG(LOG_INFO, "could not touch this worker's beacon in %s (%s): it beats on its own", hb.dir,
        strerror(errno));
    host_beat_leave();
    hb.join_at_ms = now + JOIN_RETRY_MS;
    return HB_NONE;
  }
  agent_try();
  if (!hb.agent)
    ack_read(now);
  return HB_NONE;
}

bool host_beat_covered(int64_t now) {
  return hb.joined && !hb.agent && now < hb.covered_until_ms;
}

int64_t host_beat_covered_until(void) {
  return hb.joined && !hb.agent ? hb.covered_until_ms : 0;
}

int64_t host_beat_deadline(void) {
  if (hb.joined)
    return hb.next_tick_ms;
  return wd.host_beat ? hb.join_at_ms : INT64_MAX;
}

/* One sibling's beacon, if fresh: appended to vouch. Stale ones of workerds
 * gone are removed. */
static void vouch_one(json_t *vouch, const char *id, int64_t real_now) {
  char text[64], path[PATH_MAX];
  unsigned long long refused;
  long long pid, tick;
  struct stat st;
  int64_t age;

  if (read_file(id, text, sizeof(text), &st) != 0 ||
      sscanf(text, "%llu %lld %lld", &refused, &pid, &tick) != 3 || tick < 1 || tick > 60000)
    return;
  age = real_now - mtime_ms(&st);
  if (age > BEACON_GONE_MS) {
    if (path_of(path, sizeof(path), id, "") == 0)
      unlink(path);
    if (path_of(path, sizeof(path), id, ".ack") == 0)
      unlink(path);
    return;
  }
  /* fresh: touched within two of its ticks and a second (a hung workerd's
   * beacon ages, is left out, and its heartbeat timeout runs) */
  if (age > 2 * tick + 1000)
    return;
  json_array_append_new(vouch, json_pack("{s:s, s:I, s:I}", "id", id, "pid", (json_int_t)pid,
                                         "exec_refused", (json_int_t)(refused & INT64_MAX)));
}

static bool beacon_there(const char *id) {
  char path[PATH_MAX];
  struct stat st;

  return path_of(path, sizeof(path), id, "") == 0 && lstat(path, &st) == 0;
}

/* An ack whose beacon is gone (its workerd left as the agent wrote it), or
 * a temporary file of a crash, is removed once a minute old. */
static void stray_remove(const char *name, int64_t real_now) {
  char id[WD_ID_MAX + 1], path[PATH_MAX];
  size_t n = strlen(name);
  struct stat st;

  if (name[0] != '.') {
    if (n < 5 || n - 4 > WD_ID_MAX || strcmp(name + n - 4, ".ack") != 0)
      return;
    memcpy(id, name, n - 4);
    id[n - 4] = '\0';
    if (beacon_there(id))
      return;
  } else if (strncmp(name, ".w-", 3) != 0) {
    return;
  }
  if (path_of(path, sizeof(path), name, "") == 0 && lstat(path, &st) == 0 &&
      real_now - mtime_ms(&st) > STRAY_MS)
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
  int64_t real_now = util_wall_ms();
  DIR *d;

  if (!hb.joined || !hb.agent || !(d = opendir(hb.dir)))
    return NULL;
  hb.sent_ms = real_now; /* (the call starts now) */
  vouch = json_array();
  while (vouch && json_array_size(vouch) < VOUCH_MAX && (e = readdir(d))) {
    if (id_like(e->d_name) && strcmp(e->d_name, wd.id) != 0)
      vouch_one(vouch, e->d_name, real_now);
    else if (e->d_name[0] == 'w' || e->d_name[0] == '.')
      stray_remove(e->d_name, real_now);
  }
  closedir(d);
  return vouch;
}

void host_beat_answered(const json_t *vouched) {
  const char *id;
  json_t *v;
  char name[WD_ID_MAX + 8], text[128];

  if (!hb.joined || !hb.agent || !json_is_object(vouched))
    return;
  json_object_foreach((json_t *)vouched, id, v) {
    json_t *iv = json_object_get(v, "heartbeat_interval_seconds");
    json_t *pid = json_object_get(v, "pid");
    json_t *cover = json_object_get(v, "cover_ms");
    double s = json_number_value(iv);

    if (!id_like(id) || strcmp(id, wd.id) == 0 || !json_is_integer(pid))
      continue;
    if (json_is_false(json_object_get(v, "stop")) && json_is_number(iv) && s >= 0.1 && s <= 3600 &&
        json_is_integer(cover))
      snprintf(text, sizeof(text), "ok %lld %d %lld %lld %lld\n", (long long)(s * 1000),
               !json_is_false(json_object_get(v, "host_beat")), (long long)json_integer_value(pid),
               (long long)hb.sent_ms, (long long)json_integer_value(cover));
    else
      snprintf(text, sizeof(text), "refused %lld\n", (long long)json_integer_value(pid));
    snprintf(name, sizeof(name), "%s.ack", id);
    /* (not for a workerd that left since: its ack would stay behind) */
    if (!beacon_there(id))
      continue;
    if (write_file(name, text) != 0)
      LOG(LOG_DEBUG, "could not write %s/%s", hb.dir, name);
  }
}

int host_beat_lock_fd(void) {
  return hb.lock_fd;
}

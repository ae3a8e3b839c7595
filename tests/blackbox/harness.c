/* harness.c: see harness.h. */
#include "harness.h"
#include "harness_cleanup.h"

#include "netlink.h"
#include "subnet.h"

#include <check.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int started_once;

double h_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double h_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double h_iso_seconds(const char *t) {
  struct tm tm;
  int ms = 0;
  char *rest;

  memset(&tm, 0, sizeof(tm));
  if (!t || !(rest = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm)) || sscanf(rest, ".%3dZ", &ms) != 1)
    return 0;
  return (double)timegm(&tm) + ms / 1000.0;
}

const char *h_proc_stat(long pid, char *buf, size_t len) {
  char path[64];
  FILE *f;
  size_t n;
  char *p;

  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  f = fopen(path, "r");
  if (!f)
    return NULL;
  n = fread(buf, 1, len - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* The name may hold spaces and parentheses: the fields start after its
   * last ')'. */
  p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p + 2 : NULL;
}

int h_gone(long pid, double timeout_s) {
  double until = h_now() + timeout_s;

  for (;;) {
    char buf[512];
    const char *f = h_proc_stat(pid, buf, sizeof(buf));

    if (!f || f[0] == 'Z')
      return 1;
    if (h_now() >= until)
      return 0;
    usleep(50 * 1000);
  }
}

const char *h_str(json_t *obj, const char *key) {
  return json_string_value(json_object_get(obj, key));
}

int h_free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;

  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

void h_write_exec(const char *path, const char *text) {
  FILE *f = fopen(path, "w");

  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  ck_assert_int_eq(chmod(path, 0755), 0);
}

void h_shared_dir(char *dir, size_t len, const char *tag) {
  ck_assert_int_lt(snprintf(dir, len, "/var/tmp/muster-%s-XXXXXX", tag), (int)len);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_eq(chmod(dir, 0777), 0);
}

void h_shared_dir_remove(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[PATH_MAX];

  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

void h_wait_beat_after(struct ctl_proc *c, const char *id, double after, double timeout_s) {
  double beat = 0;

  for (double until = h_now() + timeout_s; beat <= after; usleep(100 * 1000)) {
    json_t *w = h_worker(c, id), *f = json_object_get(w, "failure");

    ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0, "worker %s is %s: %s (logs in %s)",
                  id, h_str(w, "status"), json_is_string(f) ? json_string_value(f) : "", c->dir);
    beat = json_is_string(json_object_get(w, "last_heartbeat"))
               ? h_iso_seconds(h_str(w, "last_heartbeat"))
               : 0;
    json_decref(w);
    ck_assert_msg(beat > after || h_now() < until,
                  "no heartbeat of worker %s stored %.1f s after the time asked in %g s (logs in "
                  "%s)",
                  id, h_wall() - after, timeout_s, c->dir);
  }
}

long h_workerd_pid(struct ctl_proc *c, const char *id) {
  char path[160];
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  long pid = 0;

  snprintf(path, sizeof(path), "%s/muster.db", c->dir);
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db, "SELECT pid FROM workers WHERE id = ?1", -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW)
      pid = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  ck_assert_msg(pid > 1, "worker %s has no registered workerd pid", id);
  return pid;
}

int h_wait_exit(struct ctl_proc *c, double timeout_s) {
  double until = h_now() + timeout_s;

  while (h_now() < until) {
    if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
      c->pid = 0;
      hc_started(c);
      return 1;
    }
    usleep(10 * 1000);
  }
  return 0;
}

double h_metric(struct ctl_proc *c, const char *name) {
  char *raw = NULL, *p;
  double v = -1;
  size_t n = strlen(name);

  ck_assert_int_eq(h_http(c, "GET", "/metrics", NULL, NULL, NULL, &raw), 200);
  for (p = raw; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncmp(p, name, n) == 0 && p[n] == ' ') {
      char *end;
      v = strtod(p + n + 1, &end);
      if (end == p + n + 1 || (*end != '\n' && *end != '\0'))
        v = -1;
      break;
    }
  free(raw);
  ck_assert_msg(v >= 0, "/metrics has no %s", name);
  return v;
}

void h_subnet(int port, char *buf, size_t len) {
  int b = 128 + ((port >> 8) & 127);

  /* (never in 10.213.0.0/16: a controller on the default bridge may be
   * running, scripts/run.sh's) */
  snprintf(buf, len, "10.%d.%d.0/24", b == 213 ? 127 : b, port & 255);
}

static void spawn(struct ctl_proc *c) {
  char listen[64], workerd[512], cert[200], key[200], ca[200];
  const char *argv[40];
  int n = 0;

  snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->port);
  snprintf(workerd, sizeof(workerd), "%s", MUSTER_WORKERD_BIN);
  argv[n++] = c->bin ? c->bin : MUSTER_CONTROLLER_BIN;
  argv[n++] = "--listen";
  argv[n++] = listen;
  argv[n++] = "--state-dir";
  argv[n++] = c->dir;
  argv[n++] = "--http-threads";
  argv[n++] = "4";
  argv[n++] = "--workdir"; /* (an extra one comes after: it wins) */
  argv[n++] = c->work;
  /* A subnet of its own, from its port: suites run at once never meet on
   * one bridge (a test's own --subnet, later, wins). */
  if (!c->subnet[0])
    h_subnet(c->port, c->subnet, sizeof(c->subnet));
  argv[n++] = "--subnet";
  argv[n++] = c->subnet;
  for (int i = 0; c->extra[i] && n < 32; i++)
    argv[n++] = c->extra[i];
  if (c->tls) {
    snprintf(cert, sizeof(cert), "%s/cert.pem", c->tls_dir);
    snprintf(key, sizeof(key), "%s/key.pem", c->tls_dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", c->tls_dir);
    argv[n++] = "--tls-cert";
    argv[n++] = cert;
    argv[n++] = "--tls-key";
    argv[n++] = key;
  }
  argv[n] = NULL;

  c->pid = fork();
  ck_assert_int_ge(c->pid, 0);
  if (c->pid == 0) {
    int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    /* If the test process dies (a Check timeout), the controller goes too. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    /* Check's own files and pipes are not the controller's business. */
    for (int k = 3; k < 1024; k++)
      close(k);
    setenv("MUSTER_ORPHAN_TIMEOUT", c->orphan_timeout ? c->orphan_timeout : "60", 1);
    /* (what its workers verify it with: it hands this on) */
    if (c->tls)
      setenv("MUSTER_CA_FILE", ca, 1);
    /* (a change of uid clears the death signal: set again, and the test
     * checked to be still there) */
    if (c->uid && (setgroups(0, NULL) != 0 || setgid(c->gid) != 0 || setuid(c->uid) != 0 ||
                   prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1))
      _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
}

/* Ready as a user's client sees it: /api/v1/health answers, and the url
 * file that clients on this host read has been written by this start
 * (since: the wall-clock time just before the spawn). The controller
 * writes that file just after it begins to serve. */
static void wait_ready(struct ctl_proc *c, struct timespec since) {
  double until = h_now() + 30;
  char path[160];
  int healthy = 0;

  snprintf(path, sizeof(path), "%s/url", c->dir);
  while (h_now() < until) {
    struct stat st;
    int status;

    ck_assert_msg(waitpid(c->pid, &status, WNOHANG) == 0, "the controller exited at start; see %s",
                  c->log);
    if (!healthy)
      healthy = h_http(c, "GET", "/api/v1/health", NULL, NULL, NULL, NULL) == 200;
    /* File times come from the kernel's coarse clock, a tick behind
     * CLOCK_REALTIME: 20 ms of slack (a previous start's file is older). */
    if (healthy && stat(path, &st) == 0 && st.st_size > 0 &&
        st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9 >= since.tv_sec + since.tv_nsec / 1e9 - 0.02)
      return;
    usleep(20 * 1000);
  }
  ck_abort_msg("the controller %s within 30 s; see %s",
               healthy ? "answered /api/v1/health but wrote no url file"
                       : "did not answer /api/v1/health",
               c->log);
}

static void read_token(struct ctl_proc *c) {
  char path[160];
  FILE *f;

  snprintf(path, sizeof(path), "%s/token", c->dir);
  f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(c->token, sizeof(c->token), f));
  fclose(f);
  c->token[strcspn(c->token, "\n")] = '\0';
}

void h_start(struct ctl_proc *c) {
  struct timespec since;

  if (!started_once) {
    hc_init();
    started_once = 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
  }
  if (!c->dir[0]) {
    snprintf(c->dir, sizeof(c->dir), "/var/tmp/muster-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(c->dir));
    if (c->uid)
      ck_assert_int_eq(chown(c->dir, c->uid, c->gid), 0);
  }
  if (!c->port)
    c->port = h_free_port();
  snprintf(c->url, sizeof(c->url), "%s://127.0.0.1:%d", c->tls ? "https" : "http", c->port);
  if (c->tls && !c->tls_dir[0]) {
    /* valid for the loopback address clients use and the bridge's
     * gateway, where workers reach the controller */
    char cmd[512], gw[24];
    if (!c->subnet[0])
      h_subnet(c->port, c->subnet, sizeof(c->subnet));
    snprintf(gw, sizeof(gw), "%.*s1", (int)(strrchr(c->subnet, '.') - c->subnet + 1), c->subnet);
    snprintf(c->tls_dir, sizeof(c->tls_dir), "%s.tls", c->dir);
    snprintf(cmd, sizeof(cmd), "bash %s/tests/tls/make_ca.sh %s 127.0.0.1 %s", MUSTER_SOURCE_DIR,
             c->tls_dir, gw);
    ck_assert_msg(system(cmd) == 0, "could not make the test CA: %s", cmd);
  }
  snprintf(c->log, sizeof(c->log), "%s.controller.log", c->dir);
  snprintf(c->work, sizeof(c->work), "%s.work", c->dir);
  if (mkdir(c->work, 0777) == 0 || errno == EEXIST)
    ck_assert_int_eq(chmod(c->work, 0777), 0);
  clock_gettime(CLOCK_REALTIME, &since);
  spawn(c);
  hc_started(c);
  wait_ready(c, since);
  read_token(c);
}

void h_restart(struct ctl_proc *c) {
  struct timespec since;

  clock_gettime(CLOCK_REALTIME, &since);
  spawn(c);
  hc_started(c);
  wait_ready(c, since);
}

void h_kill9(struct ctl_proc *c) {
  kill(c->pid, SIGKILL);
  waitpid(c->pid, NULL, 0);
  c->pid = 0;
  hc_started(c);
}

/* Fails the test if a sanitizer reported anything in the controller's or a
 * workerd's log (a sanitized build prints there, not to the test). */
static void assert_no_sanitizer_reports(struct ctl_proc *c) {
  char cmd[512], hit[512] = "";
  FILE *f;

  snprintf(cmd, sizeof(cmd),
           "grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' %s %s/workers/*.log "
           "2>/dev/null | head -3",
           c->log, c->dir);
  f = popen(cmd, "r");
  if (!f)
    return;
  if (!fgets(hit, sizeof(hit), f))
    hit[0] = '\0';
  pclose(f);
  ck_assert_msg(hit[0] == '\0', "a sanitizer reported an error; see %s", hit);
}

void h_finish(struct ctl_proc *c) {
  char cmd[700];

  hc_end(c);
  assert_no_sanitizer_reports(c);
  /* (DIR-slurm: a root slurm controller's job output, beside its state) */
  snprintf(cmd, sizeof(cmd), "rm -rf %s %s-slurm %s-slurm-users %s.tls %s %s", c->dir, c->dir,
           c->dir, c->dir, c->log, c->work);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", c->dir);
}

struct buf {
  char *data;
  size_t len;
};

static size_t collect(char *p, size_t size, size_t n, void *arg) {
  struct buf *b = arg;
  char *grown = realloc(b->data, b->len + size * n + 1);

  if (!grown)
    return 0;
  b->data = grown;
  memcpy(b->data + b->len, p, size * n);
  b->len += size * n;
  b->data[b->len] = '\0';
  return size * n;
}

void h_curl_tls(struct ctl_proc *c, CURL *curl) {
  char ca[160];

  if (!c->tls)
    return;
  snprintf(ca, sizeof(ca), "%s/ca.pem", c->tls_dir);
  curl_easy_setopt(curl, CURLOPT_CAINFO, ca); /* (libcurl copies it) */
}

long h_http(struct ctl_proc *c, const char *method, const char *path, const char *body,
            const char *token, json_t **out, char **raw) {
  CURL *curl = curl_easy_init();
  struct curl_slist *hdrs = NULL;
  struct buf b = {NULL, 0};
  char url[512], auth[160];
  long status = 0;

  snprintf(url, sizeof(url), "%s%s", c->url, path);
  curl_easy_setopt(curl, CURLOPT_URL, url);
  h_curl_tls(c, curl);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &b);
  if (token) {
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token[0] ? token : c->token);
    hdrs = curl_slist_append(hdrs, auth);
  }
  if (body) {
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
  if (curl_easy_perform(curl) == CURLE_OK)
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  if (out)
    *out = b.data ? json_loads(b.data, 0, NULL) : NULL;
  if (raw)
    *raw = b.data;
  else
    free(b.data);
  return status;
}

json_t *h_launch(struct ctl_proc *c, const char *body) {
  json_t *ans = NULL, *workers;
  char *raw = NULL;
  long st = h_http(c, "POST", "/api/v1/workers", body, "", &ans, &raw);

  ck_assert_msg(st == 201, "launch %s answered %ld: %s", body, st, raw ? raw : "");
  free(raw);
  workers = json_incref(json_object_get(ans, "workers"));
  json_decref(ans);
  return workers;
}

json_t *h_await(struct ctl_proc *c, json_t *workers, int wfc, double timeout) {
  json_t *ids = json_array(), *w, *ans = NULL, *body;
  char *text;
  size_t i;
  long st;

  json_array_foreach(workers, i, w) json_array_append(ids, json_object_get(w, "id"));
  body = json_pack("{s:o, s:b, s:f}", "ids", ids, "wait_for_completion", wfc, "timeout_seconds",
                   timeout);
  text = json_dumps(body, 0);
  json_decref(body);
  st = h_http(c, "POST", "/api/v1/workers/await", text, "", &ans, NULL);
  free(text);
  ck_assert_int_eq(st, 200);
  ck_assert_ptr_nonnull(ans);
  return ans;
}

json_t *h_worker(struct ctl_proc *c, const char *id) {
  char path[64];
  json_t *w = NULL;

  snprintf(path, sizeof(path), "/api/v1/workers/%s", id);
  ck_assert_int_eq(h_http(c, "GET", path, NULL, "", &w, NULL), 200);
  return w;
}

json_t *h_wait_status(struct ctl_proc *c, const char *id, const char *status, double timeout_s) {
  double until = h_now() + timeout_s;
  json_t *w = NULL;

  do {
    json_decref(w);
    w = h_worker(c, id);
    if (strcmp(h_str(w, "status"), status) == 0)
      return w;
    usleep(50 * 1000);
  } while (h_now() < until);
  ck_abort_msg("worker %s is %s, not %s, after %g s (failure: %s)", id, h_str(w, "status"), status,
               timeout_s, h_str(w, "failure") ? h_str(w, "failure") : "none");
  return NULL;
}

struct sse {
  struct buf b;
  int events;
  int want;
};

static size_t sse_collect(char *p, size_t size, size_t n, void *arg) {
  struct sse *s = arg;
  size_t got = collect(p, size, n, &s->b);
  const char *q = s->b.data;

  s->events = 0;
  while (q && (q = strstr(q, "\ndata: ")) != NULL) {
    s->events++;
    q++;
  }
  /* Returning less than given ends the transfer: we have enough. */
  return s->events >= s->want ? 0 : got;
}

int h_sse(struct ctl_proc *c, long since, int want, long timeout_ms, char **raw) {
  CURL *curl = curl_easy_init();
  struct curl_slist *hdrs = NULL;
  struct sse s = {{NULL, 0}, 0, want};
  char url[256], auth[160];

  snprintf(url, sizeof(url), "%s/api/v1/events?since=%ld", c->url, since);
  snprintf(auth, sizeof(auth), "Authorization: Bearer %s", c->token);
  hdrs = curl_slist_append(hdrs, auth);
  curl_easy_setopt(curl, CURLOPT_URL, url);
  h_curl_tls(c, curl);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, sse_collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &s);
  curl_easy_perform(curl);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  *raw = s.b.data ? s.b.data : strdup("");
  return s.events;
}

void h_worker_token(struct ctl_proc *c, const char *id, char *auth, size_t len) {
  char db[160];
  sqlite3 *h;
  sqlite3_stmt *st;

  snprintf(db, sizeof(db), "%s/muster.db", c->dir);
  ck_assert_int_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(h, "SELECT token FROM workers WHERE id = ?1", -1, &st, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  snprintf(auth, len, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(h);
}

pid_t h_sh_bg(const char *fmt, ...) {
  char cmd[1400];
  va_list ap;
  pid_t p;

  va_start(ap, fmt);
  ck_assert_int_lt(vsnprintf(cmd, sizeof(cmd), fmt, ap), (int)sizeof(cmd));
  va_end(ap);
  p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  return p;
}

int h_collect(void *arg, const char *data, size_t len) {
  char *buf = arg;
  size_t have = strlen(buf);

  if (have + len < H_COLLECT_MAX) {
    memcpy(buf + have, data, len);
    buf[have + len] = '\0';
  }
  return 0;
}

char *h_output_of(struct ctl_proc *c, const char *body, const char *stream) {
  json_t *workers = h_launch(c, body), *ans;
  char path[160], *out = NULL;
  const char *id = h_str(json_array_get(workers, 0), "id");

  ans = h_await(c, workers, 1, 60);
  ck_assert_msg(json_array_size(json_object_get(ans, "failures")) == 0,
                "the worker failed: %.1500s", json_dumps(ans, 0));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs%s%s", id, stream ? "?stream=" : "",
           stream ? stream : "");
  ck_assert_int_eq(h_http(c, "GET", path, NULL, "", NULL, &out), 200);
  json_decref(ans);
  json_decref(workers);
  return out;
}

char *h_json_text(const char *text) {
  json_t *j = json_string(text);
  char *s = json_dumps(j, JSON_ENCODE_ANY);

  json_decref(j);
  ck_assert_ptr_nonnull(s);
  return s;
}

json_t *h_worker_call(struct ctl_proc *c, const char *id, const char *what, const char *body) {
  char path[160], auth[200];
  json_t *out = NULL;
  long st;

  h_worker_token(c, id, auth, sizeof(auth));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/%s", id, what);
  st = h_http(c, "POST", path, body, auth, &out, NULL);
  ck_assert_msg(st == 200, "%s of %s: HTTP %ld", what, id, st);
  ck_assert_ptr_nonnull(out);
  return out;
}

/*
 * loadgen.c: the load generator of bench/controller. Speaks plain HTTP/1.1
 * (keep-alive, Content-Length answers) over loopback, one thread per
 * connection, so that its own cost is small and the same against the
 * controller as against the reference server.
 *
 *   loadgen get PORT PATH CONNECTIONS SECONDS [TOKEN]
 *       GETs PATH as fast as CONNECTIONS connections can, for SECONDS;
 *       prints one JSON line: requests, errors, req_per_s, p50_ms, p99_ms.
 *   loadgen workers PORT FILE INTERVAL SECONDS THREADS
 *       plays the muster-workerd of every worker in FILE (lines "ID TOKEN
 *       ATTEMPT"): registers each, then heartbeats each every INTERVAL
 *       seconds, or at the interval the controller's last answer told
 *       (heartbeat_interval_seconds), as workerd does, for SECONDS; prints
 *       registered, heartbeats, errors, the heartbeat latency p50/p99 and
 *       the last interval told. A heartbeat that fails (a controller
 *       restarting) is tried again at the worker's next turn. Each
 *       heartbeat comes on a connection of its own, closed after its
 *       answer, while the interval is longer than 10 s, as a workerd's
 *       then does; with "fresh", always; while a SIGUSR1 says so, never. With
 *       "hosts=K", the workers are on hosts of K each, and beat as a host
 *       (workerd/hostbeat.c): one heartbeat call an interval for each
 *       host, its first worker's, carrying the K-1 others' ("vouch");
 *       heartbeats count the workers' beats, calls the calls; while a
 *       SIGUSR2 says so, each worker beats on its own.
 *   loadgen wakes PORT TOKEN FILE
 *       for each worker id in FILE (one a line): parks an await on it
 *       (wait_for_completion) on one connection, waits until /metrics
 *       counts it parked (asked every 2 ms), sends the stop of the worker on another, and
 *       times the await's answer from the moment the stop was sent (its
 *       handling included); prints the wakes' p50/p99/max.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int port;

/* A whole decimal argument, or exit 2 naming it. */
static long num(const char *s, const char *what) {
  char *end;
  long v;

  errno = 0;
  v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < 0) {
    fprintf(stderr, "loadgen: %s must be a number, not \"%s\"\n", what, s);
    exit(2);
  }
  return v;
}

static double seconds(const char *s, const char *what) {
  char *end;
  double v = strtod(s, &end);

  if (end == s || *end || !(v > 0)) {
    fprintf(stderr, "loadgen: %s must be a number of seconds, not \"%s\"\n", what, s);
    exit(2);
  }
  return v;
}

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int dial(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0)
    return -1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* One connection with its receive buffer. */
struct conn {
  int fd;
  char *buf;
  size_t cap, len;
};

/* Sends req and reads one answer; returns its status (0 on a broken
 * connection, which is then re-dialled for the next request). */
static int roundtrip(struct conn *c, const char *req, size_t reqlen) {
  size_t off = 0, body = 0, need = 0;
  int status = 0;

  if (c->fd < 0 && (c->fd = dial()) < 0)
    return 0;
  while (off < reqlen) {
    ssize_t n = send(c->fd, req + off, reqlen - off, MSG_NOSIGNAL);
    if (n <= 0)
      goto broken;
    off += (size_t)n;
  }
  c->len = 0;
  for (;;) {
    ssize_t n;
    char *hdr_end, *hdr_end_num;

    if (c->len == c->cap) {
      size_t cap = c->cap ? 2 * c->cap : 65536;
      char *grown = realloc(c->buf, cap + 1);
      if (!grown)
        goto broken;
      c->buf = grown;
      c->cap = cap;
    }
    n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n <= 0)
      goto broken;
    c->len += (size_t)n;
    c->buf[c->len] = '\0';
    if (!need) {
      char *cl;
      hdr_end = strstr(c->buf, "\r\n\r\n");
      if (!hdr_end)
        continue;
      body = (size_t)(hdr_end + 4 - c->buf);
      status = (int)strtol(c->buf + 9, &hdr_end_num, 10); /* "HTTP/1.1 200 OK" */
      if (hdr_end_num == c->buf + 9 || *hdr_end_num != ' ')
        goto broken;
      cl = strcasestr(c->buf, "\r\nContent-Length:");
      if (!cl || cl > hdr_end)
        goto broken; /* only fixed-length answers are expected */
      need = strtoul(cl + 17, &hdr_end_num, 10);
      if (hdr_end_num == cl + 17 || *hdr_end_num != '\r')
        goto broken;
      need += body;
    }
    if (c->len >= need)
      return status;
  }
broken:
  close(c->fd);
  c->fd = -1;
  return 0;
}

/* How many times needle stands in text. */
static long count_of(const char *text, const char *needle) {
  long n = 0;

  for (const char *p = text ? strstr(text, needle) : NULL; p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* The heartbeat interval an answer in c's buffer tells, or 0. */
static double told_interval(const struct conn *c) {
  const char *k = c->buf ? strstr(c->buf, "\"heartbeat_interval_seconds\":") : NULL;
  char *end;
  double v;

  if (!k)
    return 0;
  v = strtod(k + 29, &end);
  return end != k + 29 && v >= 0.1 && v <= 3600 ? v : 0;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;

  return (x > y) - (x < y);
}

/* ---- get ---- */

struct getter {
  pthread_t t;
  const char *req;
  size_t reqlen;
  double until;
  double *lat;
  size_t n, cap;
  long errors;
};

static void *get_main(void *arg) {
  struct getter *g = arg;
  struct conn c = {.fd = -1};

  while (now_s() < g->until) {
    double t0 = now_s();
    int st = roundtrip(&c, g->req, g->reqlen);

    if (st != 200) {
      g->errors++;
      continue;
    }
    if (g->n == g->cap) {
      size_t cap = g->cap ? 2 * g->cap : 4096;
      double *grown = realloc(g->lat, cap * sizeof(*grown));
      if (!grown)
        break;
      g->lat = grown;
      g->cap = cap;
    }
    g->lat[g->n++] = now_s() - t0;
  }
  if (c.fd >= 0)
    close(c.fd);
  free(c.buf);
  return NULL;
}

static void report(const char *what, double *all, size_t n, long errors, double secs) {
  qsort(all, n, sizeof(*all), dbl_cmp);
  printf("{\"what\": \"%s\", \"requests\": %zu, \"errors\": %ld, \"req_per_s\": %.0f, "
         "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f}\n",
         what, n, errors, n / secs, n ? all[n / 2] * 1000 : 0, n ? all[n * 99 / 100] * 1000 : 0,
         n ? all[n - 1] * 1000 : 0);
}

static int cmd_get(int argc, char **argv) {
  char req[2048];
  int nconn = (int)num(argv[4], "CONNECTIONS");
  double secs = seconds(argv[5], "SECONDS"), t0;
  struct getter *g = calloc((size_t)nconn, sizeof(*g));
  size_t total = 0, k = 0;
  long errors = 0;
  double *all;

  snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s\r\n", argv[3],
           argc > 6 ? "Authorization: Bearer " : "", argc > 6 ? argv[6] : "",
           argc > 6 ? "\r\n" : "");
  t0 = now_s();
  for (int i = 0; i < nconn; i++) {
    g[i].req = req;
    g[i].reqlen = strlen(req);
    g[i].until = t0 + secs;
    pthread_create(&g[i].t, NULL, get_main, &g[i]);
  }
  for (int i = 0; i < nconn; i++) {
    pthread_join(g[i].t, NULL);
    total += g[i].n;
    errors += g[i].errors;
  }
  all = malloc((total + 1) * sizeof(*all));
  for (int i = 0; i < nconn; i++) {
    memcpy(all + k, g[i].lat, g[i].n * sizeof(*all));
    k += g[i].n;
    free(g[i].lat);
  }
  report("get", all, total, errors, now_s() - t0);
  free(all);
  free(g);
  return 0;
}

/* ---- workers ---- */

struct wk {
  char id[16];
  char token[72];
  int attempt;
  int gone; /* told to stop: its workerd has ended (it beats no more) */
};

/* A workerd told an interval longer than this keeps no connection between
 * its heartbeats (CALL_KEEP_INTERVAL_MS, workerd/workerd.h): it opens one
 * for each. */
#define KEEP_INTERVAL_S 10

/* Turned on (and off again) by SIGUSR1: every connection is kept, whatever
 * the interval (the bench's reference: what kept connections cost). */
static volatile sig_atomic_t keep_all;

static void on_usr1(int sig) {
  (void)sig;
  keep_all = !keep_all;
}

/* Turned on (and off again) by SIGUSR2: each worker beats on its own
 * (hosts=K's reference: what per-worker heartbeats cost). */
static volatile sig_atomic_t per_worker;

static void on_usr2(int sig) {
  (void)sig;
  per_worker = !per_worker;
}

struct hb {
  pthread_t t;
  struct wk *w;
  int n;
  double interval, until;
  int fresh;    /* a connection of its own for each heartbeat */
  int per_host; /* workers a heartbeat call speaks for (1: its own) */
  long registered, beats, calls, errors;
  double *lat;
  size_t nlat, cap;
};

static void *hb_main(void *arg) {
  struct hb *h = arg;
  struct conn c = {.fd = -1};
  /* (a host's call names each of its workers: 60 bytes or fewer each) */
  size_t reqcap = 1024 + (size_t)h->per_host * 64;
  char *req = malloc(reqcap), *body = malloc(reqcap);
  double due;

  if (!req || !body) {
    free(req);
    free(body);
    return NULL;
  }

  for (int i = 0; i < h->n; i++) {
    char body[200];
    int len = snprintf(body, sizeof(body), "{\"ip_address\": \"127.0.0.1\", \"attempt\": %d}",
                       h->w[i].attempt);
    int rl = snprintf(req, reqcap,
                      "POST /api/v1/workers/%s/register HTTP/1.1\r\nHost: x\r\n"
                      "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      h->w[i].id, h->w[i].token, len, body);
    if (roundtrip(&c, req, (size_t)rl) == 200) {
      h->registered++;
      if (told_interval(&c) > 0)
        h->interval = told_interval(&c);
    } else {
      h->errors++;
    }
  }
  /* Each worker beats every interval, the thread's workers spread evenly
   * over it, as independent workerds would be; the interval is the last
   * one told (the same for all: it depends on the number of live workers
   * only). */
  due = now_s();
  for (long k = 0; now_s() < h->until; k++) {
    int per = per_worker ? 1 : h->per_host, units = (h->n + per - 1) / per;
    int i = (int)(k % units) * per, sibs = h->n - i < per ? h->n - i : per;
    double t0;
    int rl, bl, a = i, nv = 0;

    due += h->interval / units;

    while (now_s() < due) {
      double d = due - now_s();
      struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
      nanosleep(&ts, NULL);
    }
    if (now_s() >= h->until)
      break;
    /* The host's agent: its first worker whose workerd still runs (one
     * told to stop has ended, and another took its part). */
    while (a < i + sibs && h->w[a].gone)
      a++;
    if (a == i + sibs)
      continue;
    bl = snprintf(body, reqcap, "{\"exec_refused\": 0");
    for (int j = a + 1; j < i + sibs; j++)
      if (!h->w[j].gone)
        bl += snprintf(body + bl, reqcap - (size_t)bl, "%s{\"id\": \"%s\", \"exec_refused\": 0}",
                       nv++ ? ", " : ", \"vouch\": [", h->w[j].id);
    bl += snprintf(body + bl, reqcap - (size_t)bl, nv ? "]}" : "}");
    rl = snprintf(req, reqcap,
                  "POST /api/v1/workers/%s/heartbeat HTTP/1.1\r\nHost: x\r\n"
                  "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s",
                  h->w[a].id, h->w[a].token, bl, body);
    t0 = now_s();
    if (roundtrip(&c, req, (size_t)rl) != 200) {
      h->errors++;
      continue;
    }
    h->calls++;
    /* (the caller, and each worker the answer vouched for) */
    h->beats += count_of(c.buf, "\"stop\":false,\"heartbeat_interval_seconds\"");
    if (strstr(c.buf, "{\"stop\":true"))
      h->w[a].gone = 1;
    for (int j = a + 1; nv && j < i + sibs; j++) {
      char refused[64];

      snprintf(refused, sizeof(refused), "\"%s\":{\"refused\"", h->w[j].id);
      if (!h->w[j].gone && strstr(c.buf, refused))
        h->w[j].gone = 1; /* (beats on its own, learns it must stop, ends) */
    }
    if (told_interval(&c) > 0)
      h->interval = told_interval(&c);
    if (!keep_all && (h->fresh || h->interval > KEEP_INTERVAL_S)) {
      close(c.fd);
      c.fd = -1;
    }
    if (h->nlat == h->cap) {
      size_t cap = h->cap ? 2 * h->cap : 4096;
      double *grown = realloc(h->lat, cap * sizeof(*grown));
      if (!grown)
        continue;
      h->lat = grown;
      h->cap = cap;
    }
    h->lat[h->nlat++] = now_s() - t0;
  }
  if (c.fd >= 0)
    close(c.fd);
  free(c.buf);
  free(req);
  free(body);
  return NULL;
}

static int cmd_workers(int argc, char **argv) {
  FILE *f = fopen(argv[3], "r");
  double interval = seconds(argv[4], "INTERVAL"), secs = seconds(argv[5], "SECONDS"), t0;
  int nthreads = (int)num(argv[6], "THREADS"), n = 0, cap = 0;
  struct wk *w = NULL;
  struct hb *h;
  long reg = 0, beats = 0, calls = 0, errors = 0;
  int per_host = 1;
  size_t total = 0, k = 0;
  double *all;

  if (!f) {
    perror(argv[3]);
    return 2;
  }
  for (;;) {
    struct wk x;
    if (fscanf(f, "%15s %71s %d", x.id, x.token, &x.attempt) != 3)
      break;
    if (n == cap) {
      cap = cap ? 2 * cap : 1024;
      w = realloc(w, (size_t)cap * sizeof(*w));
    }
    w[n++] = x;
  }
  fclose(f);
  if (argc == 8 && strncmp(argv[7], "hosts=", 6) == 0)
    per_host = (int)num(argv[7] + 6, "hosts=K");
  signal(SIGUSR1, on_usr1);
  signal(SIGUSR2, on_usr2);
  h = calloc((size_t)nthreads, sizeof(*h));
  t0 = now_s();
  for (int i = 0; i < nthreads; i++) {
    int lo = n * i / nthreads, hi = n * (i + 1) / nthreads;
    h[i].w = w + lo;
    h[i].n = hi - lo;
    h[i].interval = interval;
    h[i].until = t0 + secs;
    h[i].fresh = argc == 8 && strcmp(argv[7], "fresh") == 0;
    h[i].per_host = per_host;
    pthread_create(&h[i].t, NULL, hb_main, &h[i]);
  }
  for (int i = 0; i < nthreads; i++) {
    pthread_join(h[i].t, NULL);
    reg += h[i].registered;
    beats += h[i].beats;
    calls += h[i].calls;
    errors += h[i].errors;
    total += h[i].nlat;
  }
  all = malloc((total + 1) * sizeof(*all));
  for (int i = 0; i < nthreads; i++) {
    memcpy(all + k, h[i].lat, h[i].nlat * sizeof(*all));
    k += h[i].nlat;
    free(h[i].lat);
  }
  qsort(all, total, sizeof(*all), dbl_cmp);
  printf("{\"what\": \"workers\", \"workers\": %d, \"registered\": %ld, \"heartbeats\": %ld, "
         "\"calls\": %ld, \"errors\": %ld, \"hb_p50_ms\": %.3f, \"hb_p99_ms\": %.3f, "
         "\"interval_s\": %.1f}\n",
         n, reg, beats, calls, errors, total ? all[total / 2] * 1000 : 0,
         total ? all[total * 99 / 100] * 1000 : 0, nthreads ? h[0].interval : 0);
  free(all);
  free(h);
  free(w);
  return 0;
}

/* ---- wakes ---- */

/* The value of metric name (a line "name VALUE") in c's last answer, or -1. */
static double metric_of(const struct conn *c, const char *name) {
  char key[128], *end;
  const char *p;
  double v;

  snprintf(key, sizeof(key), "\n%s ", name);
  p = c->buf ? strstr(c->buf, key) : NULL;
  if (!p)
    return -1;
  p += strlen(key);
  v = strtod(p, &end);
  return end != p ? v : -1;
}

/* A wake that went wrong: both connections are closed, so that no answer
 * still due on them (a parked await, a stop's) is read as the next one's. */
static void wake_error(struct conn *a, struct conn *b, long *errors) {
  (*errors)++;
  if (a->fd >= 0)
    close(a->fd);
  if (b->fd >= 0)
    close(b->fd);
  a->fd = b->fd = -1;
}

static int cmd_wakes(char **argv) {
  const char *token = argv[3];
  FILE *f = fopen(argv[4], "r");
  struct conn a = {.fd = -1}, b = {.fd = -1};
  char id[32], req[1024], body[200], metrics[256];
  double *wake = NULL;
  size_t n = 0, cap = 0;
  long errors = 0;

  if (!f) {
    perror(argv[4]);
    return 2;
  }
  snprintf(metrics, sizeof(metrics), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  while (fscanf(f, "%31s", id) == 1) {
    int bl = snprintf(body, sizeof(body),
                      "{\"ids\": [\"%s\"], \"wait_for_completion\": true, "
                      "\"timeout_seconds\": 30}",
                      id);
    int rl = snprintf(req, sizeof(req),
                      "POST /api/v1/workers/await HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      "%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                      token, bl, body);
    double until = now_s() + 30, t0, t1;
    int parked = 0;

    if ((a.fd < 0 && (a.fd = dial()) < 0) || send(a.fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
      wake_error(&a, &b, &errors);
      continue;
    }
    /* A scrape of /metrics costs the controller milliseconds of CPU among
     * 100,000 workers: it is asked 2 ms after the await was sent (by when
     * the await has parked, as a rule) and every 2 ms after, so that the
     * bench does not load the controller it measures. */
    while (!parked && now_s() < until) {
      struct timespec ms = {0, 2000000};

      nanosleep(&ms, NULL);
      parked = roundtrip(&b, metrics, strlen(metrics)) == 200 &&
               metric_of(&b, "muster_await_waiting") >= 1;
    }
    bl = snprintf(body, sizeof(body), "{\"ids\": [\"%s\"]}", id);
    rl = snprintf(req, sizeof(req),
                  "POST /api/v1/workers/stop HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  "%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                  token, bl, body);
    /* The stop is sent, then the await's answer read: the wake is timed
     * whether it comes before the stop's own answer or after. */
    t0 = now_s();
    if (!parked || send(b.fd, req, (size_t)rl, MSG_NOSIGNAL) != rl || roundtrip(&a, "", 0) != 200) {
      wake_error(&a, &b, &errors);
      continue;
    }
    t1 = now_s();
    if (roundtrip(&b, "", 0) != 200) {
      wake_error(&a, &b, &errors);
      continue;
    }
    if (n == cap) {
      double *grown = realloc(wake, (cap ? 2 * cap : 256) * sizeof(*wake));

      if (!grown)
        break;
      wake = grown;
      cap = cap ? 2 * cap : 256;
    }
    wake[n++] = t1 - t0;
  }
  fclose(f);
  report("wakes", wake, n, errors, 1);
  free(wake);
  free(a.buf);
  free(b.buf);
  if (a.fd >= 0)
    close(a.fd);
  if (b.fd >= 0)
    close(b.fd);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 6 && strcmp(argv[1], "get") == 0) {
    port = (int)num(argv[2], "PORT");
    return cmd_get(argc, argv);
  }
  if ((argc == 7 ||
       (argc == 8 && (strcmp(argv[7], "fresh") == 0 || strncmp(argv[7], "hosts=", 6) == 0))) &&
      strcmp(argv[1], "workers") == 0) {
    port = (int)num(argv[2], "PORT");
    return cmd_workers(argc, argv);
  }
  if (argc == 5 && strcmp(argv[1], "wakes") == 0) {
    port = (int)num(argv[2], "PORT");
    return cmd_wakes(argv);
  }
  fprintf(stderr, "usage: loadgen get PORT PATH CONNECTIONS SECONDS [TOKEN]\n"
                  "       loadgen workers PORT FILE INTERVAL SECONDS THREADS [fresh|hosts=K]\n"
                  "       loadgen wakes PORT TOKEN FILE\n");
  return 2;
}

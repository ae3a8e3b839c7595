/*
 * workerd.c: muster-workerd, the daemon that runs inside every worker.
 *
 * It registers the worker's address with the controller, runs the worker's
 * command, ships the command's stdout and stderr to the controller, sends
 * heartbeats, and reports how the command ended. It also serves the exec
 * channel (docs/exec-protocol.md): the launching session runs commands in
 * the worker through it, as it would through SSH.
 *
 * It is single-threaded: one poll() loop over the command's two output pipes,
 * the exec channel's sockets and pipes, and a self-pipe that turns SIGCHLD,
 * SIGTERM and SIGINT into readable bytes.
 * HTTP calls are blocking (libcurl easy interface, one handle reused for
 * keep-alive); each is bounded by a 10 s timeout, and while one runs the
 * command simply fills its pipes and waits, which is the back-pressure we want.
 *
 * The controller may restart at any moment. workerd survives that: register
 * and the exit report retry with backoff for 10 minutes, logs stay buffered
 * (up to 8 MiB per stream) until the next flush gets through, and heartbeats
 * are simply tried again at the next interval, so a worker re-attaches by
 * being heard again.
 *
 * Environment: MUSTER_CONTROLLER_URL, MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN
 * (a secret: never logged), MUSTER_BIND_IP (optional), MUSTER_LOG_LEVEL
 * (optional: error, warn, info or debug). stderr is the daemon's log file.
 */
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MUSTER_VERSION
#define MUSTER_VERSION "dev"
#endif

#define WD_URL_MAX 2048                    /* MUSTER_CONTROLLER_URL */
#define WD_ID_MAX 64                       /* MUSTER_WORKER_ID */
#define WD_TOKEN_MAX 512                   /* MUSTER_WORKER_TOKEN */
#define WD_IP_MAX 64                       /* an IPv6 address with a zone fits */
#define WD_ANSWER_MAX (1u << 20)           /* largest answer body we accept */
#define WD_ARGV_MAX 4096                   /* most arguments in "command" */
#define WD_ENV_MAX 4096                    /* most variables in "env" */
#define WD_REASON_MAX 512                  /* the exit report's "reason" */
#define WD_STREAM_CAP (8u << 20)           /* unshipped bytes kept per stream */
#define WD_FLUSH_BYTES (64u << 10)         /* flush a stream once it holds this */
#define WD_FLUSH_DELAY_MS 200              /* ... or this long after its first byte */
#define WD_POST_MAX (512u << 10)           /* largest body of one logs POST */
#define WD_READS_PER_WAKE 16               /* reads per stream per poll round */
#define WD_RETRY_FIRST_MS 100              /* backoff: first delay ... */
#define WD_RETRY_MAX_MS 5000               /* ... doubling up to this ... */
#define WD_RETRY_TOTAL_MS (10 * 60 * 1000) /* ... for at most this long */
#define WD_KILL_GRACE_MS 5000              /* SIGTERM to SIGKILL */
#define WD_DRAIN_MS 2000                   /* reading pipes after the child exited */
#define WD_CONNECT_TIMEOUT_MS 2000L
#define WD_CALL_TIMEOUT_MS 10000L
#define WD_HEARTBEAT_DEFAULT_MS 2000

/* One output stream of the command: a ring buffer of the bytes that the
 * controller has not accepted yet. The ring is allocated once, at its full
 * capacity; untouched pages cost no memory, and the read position returns to
 * the start whenever the ring empties, so a worker whose logs flow normally
 * only ever touches its first pages. */
struct stream {
  const char *name; /* "stdout" or "stderr", as in the logs URL */
  int fd;           /* read end of the pipe; -1 once at EOF, or never opened */
  char *ring;       /* WD_STREAM_CAP bytes; NULL for an idle worker */
  size_t start;     /* offset of the oldest byte */
  size_t len;       /* bytes held */
  uint64_t dropped; /* bytes overwritten since the last successful flush */
  int64_t first_ms; /* when the oldest held byte arrived; valid if len > 0 */
};

/* How the worker ends, decided by the first reason to stop. */
enum finish_mode {
  FINISH_REPORT, /* flush logs and report the exit, retrying for 10 minutes */
  FINISH_QUIET,  /* the controller asked us to stop: one last flush, no report */
  FINISH_SILENT  /* the controller no longer knows us: say nothing more */
};

/* Where the child failed before the command started, sent to the parent
 * through a close-on-exec pipe (end of file there means exec succeeded). */
enum exec_stage { STAGE_SETUP = 1, STAGE_CHDIR = 2, STAGE_EXEC = 3 };
struct exec_status {
  int stage;
  int err;
};

/* Delays between attempts of a call that must eventually get through. */
struct backoff {
  int64_t give_up_ms;
  int64_t delay_ms;
};

/* The write end of the self-pipe, read by the signal handler. It is set once
 * before any handler is installed and never changes afterwards. */
static int sig_write_fd = -1;

/* The daemon's one state, in the manner of Redis's `server`. */
static struct {
  /* Configuration, from the environment. */
  char url[WD_URL_MAX + 1];
  char id[WD_ID_MAX + 1];
  char token[WD_TOKEN_MAX + 1];
  char ip[WD_IP_MAX];
  long attempt; /* the start attempt the backend started this workerd for */
  int exec_port;
  int listen_fd;
  int sig_read_fd;

  /* HTTP. The answer buffer holds the body of the last call. */
  CURL *curl;
  struct curl_slist *hdr_json;
  struct curl_slist *hdr_bytes;
  char curl_err[CURL_ERROR_SIZE];
  char *answer;
  size_t answer_len;
  bool answer_too_big;
  bool controller_up;
  int64_t last_contact_ms; /* when the controller last answered anything */
  int64_t orphan_ms;       /* give up after this long without an answer */

  /* What register assigned. argv and envp are NULL-terminated, owned here. */
  int64_t hb_interval_ms;
  char **argv;
  size_t argc;
  char **envp;
  char *cwd;
  char *exec_token; /* a secret: never logged; NULL = exec refused */

  /* The command and how it ended. */
  pid_t child;
  bool child_done;
  int wait_status;
  int64_t drain_until_ms;
  char reason[WD_REASON_MAX]; /* empty unless the command could not start */
  struct stream out;
  struct stream err;

  /* Stopping. */
  bool stopping; /* a stop was decided; mode says how to end */
  bool finish;   /* leave the main loop now (idle worker, failed start) */
  bool ending;   /* the main loop is winding down the exec channel to leave */
  enum finish_mode mode;
  int stop_signal;    /* SIGTERM or SIGINT if that is why we stop, else 0 */
  int64_t kill_at_ms; /* when to send SIGKILL; INT64_MAX once sent */

  /* Deadlines of the main loop. */
  int64_t next_hb_ms;
  int64_t logs_retry_at_ms;
  int64_t logs_backoff_ms;
} wd;

/* ------------------------------------------------------------------------ */
/* Start-up                                                                 */

/* Makes sure that file descriptors 0, 1 and 2 are open (on /dev/null if the
 * backend closed them), so that no pipe we create later lands on one of them
 * and gets clobbered by the child's dup2() calls. */
static void std_fds_ensure(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    /* open() takes the lowest free descriptor, which is this one. */
    int n = open("/dev/null", O_RDWR);
    if (n > fd)
      close(n);
  }
}

/* Sets the log level from MUSTER_LOG_LEVEL, if it is set to a known name. */
static void log_level_from_env(void) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  const char *v = getenv("MUSTER_LOG_LEVEL");

  if (!v)
    return;
  for (int i = 0; i < 4; i++)
    if (strcmp(v, names[i]) == 0)
      log_verbosity = i;
}

/* Copies the environment variable name into out (size bytes) after checking
 * that it is set, non-empty and short enough. Returns 0 or MUSTER_E_INVALID
 * (logged, naming the variable but never its value). */
__attribute__((warn_unused_result)) static int env_copy(const char *name, char *out, size_t size) {
  const char *v = getenv(name);
  size_t n;

  if (!v || !*v) {
    LOG(LOG_ERROR, "%s is not set", name);
    return MUSTER_E_INVALID;
  }
  n = strlen(v);
  if (n >= size) {
    LOG(LOG_ERROR, "%s is longer than %zu characters", name, size - 1);
    return MUSTER_E_INVALID;
  }
  memcpy(out, v, n + 1);
  return 0;
}

/* Reads and checks the configuration from the environment into wd.
 * Returns 0 or MUSTER_E_INVALID (logged). */
__attribute__((warn_unused_result)) static int config_load(void) {
  const char *bind_ip = getenv("MUSTER_BIND_IP");
  size_t n;
  int rc;

  rc = env_copy("MUSTER_CONTROLLER_URL", wd.url, sizeof(wd.url));
  if (rc)
    goto out;
  rc = env_copy("MUSTER_WORKER_ID", wd.id, sizeof(wd.id));
  if (rc)
    goto out;
  rc = env_copy("MUSTER_WORKER_TOKEN", wd.token, sizeof(wd.token));
  if (rc)
    goto out;

  rc = MUSTER_E_INVALID;
  if (strncmp(wd.url, "http://", 7) != 0 && strncmp(wd.url, "https://", 8) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL must start with http:// or https://");
    goto out;
  }
  /* The contract says no trailing slash; tolerate one rather than build
   * "//api/v1" paths. */
  n = strlen(wd.url);
  while (n > 8 && wd.url[n - 1] == '/')
    wd.url[--n] = '\0';
  /* The id goes into URL paths, so it must need no escaping. */
  for (const char *p = wd.id; *p; p++) {
    if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') && !(*p >= '0' && *p <= '9') &&
        *p != '-' && *p != '_') {
      LOG(LOG_ERROR, "MUSTER_WORKER_ID may hold only letters, digits, '-' and '_'");
      goto out;
    }
  }
  /* The token goes into a header line: a control character or a space in it
   * would let it forge other headers. */
  for (const char *p = wd.token; *p; p++) {
    if (*p <= ' ' || *p == 0x7f) {
      LOG(LOG_ERROR, "MUSTER_WORKER_TOKEN holds a space or a control character");
      goto out;
    }
  }
  /* A worker whose controller never comes back must not live forever:
   * after MUSTER_ORPHAN_TIMEOUT seconds (default 600) without any answer it
   * ends itself, as a container would be reaped with its cluster. */
  wd.orphan_ms = 600 * 1000;
  if (getenv("MUSTER_ORPHAN_TIMEOUT")) {
    long secs;
    if (util_parse_long(getenv("MUSTER_ORPHAN_TIMEOUT"), 1, 7 * 86400, &secs) != 0) {
      LOG(LOG_ERROR, "MUSTER_ORPHAN_TIMEOUT must be a number of seconds (1 to 604800)");
      goto out;
    }
    wd.orphan_ms = secs * 1000;
  }
  /* The controller accepts the registration of one start attempt only: a
   * workerd of an earlier one (started before a controller crash) is refused
   * and ends without running anything. */
  if (getenv("MUSTER_WORKER_ATTEMPT") &&
      util_parse_long(getenv("MUSTER_WORKER_ATTEMPT"), 1, 1L << 30, &wd.attempt) != 0) {
    LOG(LOG_ERROR, "MUSTER_WORKER_ATTEMPT must be a start attempt number (1 or more)");
    goto out;
  }
  wd.last_contact_ms = util_mono_ms();
  if (bind_ip && *bind_ip) {
    n = strlen(bind_ip);
    if (n >= sizeof(wd.ip)) {
      LOG(LOG_ERROR, "MUSTER_BIND_IP is too long");
      goto out;
    }
    memcpy(wd.ip, bind_ip, n + 1);
  }
  rc = 0;
out:
  return rc;
}

/* Finds the local address that packets toward the controller leave from, by
 * connecting a UDP socket to it (which sends nothing) and asking the kernel
 * which source address it picked. Writes it into ip (size bytes).
 * Returns 0, MUSTER_E_INVALID if the URL cannot be parsed, or
 * MUSTER_E_UNREACHABLE if the controller's host has no address or route now
 * (the caller retries), MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int ip_toward_controller(char *ip, size_t size) {
  CURLU *u = curl_url();
  char *host = NULL;
  char *port = NULL;
  char *h;
  long port_num;
  struct addrinfo hints;
  struct addrinfo *res = NULL;
  socklen_t ip_size = (socklen_t)size;
  int fd = -1;
  int gai;
  int rc;

  if (!u) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  if (curl_url_set(u, CURLUPART_URL, wd.url, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
      util_parse_long(port, 1, 65535, &port_num) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL is not a valid URL with a host and port");
    rc = MUSTER_E_INVALID;
    goto out;
  }
  /* libcurl returns IPv6 literals in brackets; getaddrinfo wants them bare. */
  h = host;
  if (h[0] == '[') {
    size_t n = strlen(h);
    h++;
    if (n >= 2 && h[n - 2] == ']')
      h[n - 2] = '\0';
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  gai = getaddrinfo(h, port, &hints, &res);
  if (gai != 0) {
    LOG(LOG_WARN, "cannot resolve the controller's host %s: %s", h, gai_strerror(gai));
    rc = MUSTER_E_UNREACHABLE;
    goto out;
  }
  rc = MUSTER_E_UNREACHABLE;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);

    fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, ip, ip_size, NULL, 0, NI_NUMERICHOST) == 0) {
      rc = 0;
      break;
    }
    close(fd);
    fd = -1;
  }
  if (rc)
    LOG(LOG_WARN, "no route toward the controller's host %s", h);
out:
  if (fd >= 0)
    close(fd);
  if (res)
    freeaddrinfo(res);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return rc;
}

/* Opens the exec channel's listening socket on wd.ip, port 0, and records the
 * port the kernel chose in wd.exec_port. The socket (wd.listen_fd, closed by
 * cleanup()) stays open for the daemon's life; the main loop accepts on it
 * (see "The exec channel").
 * Returns 0, MUSTER_E_INVALID if wd.ip is not a numeric address, or
 * MUSTER_E_IO (logged). */
__attribute__((warn_unused_result)) static int exec_listen(void) {
  struct addrinfo hints;
  struct addrinfo *res = NULL;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  int gai;
  int rc = MUSTER_E_IO;

  memset(&hints, 0, sizeof(hints));
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  gai = getaddrinfo(wd.ip, "0", &hints, &res);
  if (gai != 0) {
    LOG(LOG_ERROR, "\"%s\" is not an IP address: %s", wd.ip, gai_strerror(gai));
    rc = MUSTER_E_INVALID;
    goto out;
  }
  /* Non-blocking: the main loop accepts until EAGAIN. */
  wd.listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (wd.listen_fd < 0) {
    LOG(LOG_ERROR, "cannot create the exec socket: %s", strerror(errno));
    goto out;
  }
  if (bind(wd.listen_fd, res->ai_addr, res->ai_addrlen) != 0 ||
      listen(wd.listen_fd, SOMAXCONN) != 0 ||
      getsockname(wd.listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
    LOG(LOG_ERROR, "cannot listen on %s: %s", wd.ip, strerror(errno));
    goto out;
  }
  if (ss.ss_family == AF_INET6)
    wd.exec_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  else
    wd.exec_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  rc = 0;
out:
  if (res)
    freeaddrinfo(res);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Signals                                                                  */

/* Turns a signal into one byte on the self-pipe; the main loop does the work.
 * A full pipe loses the byte, which is harmless: one pending byte per kind
 * of signal is all the loop needs. */
static void on_signal(int signo) {
  int saved = errno;
  unsigned char b = (unsigned char)signo;
  ssize_t n = write(sig_write_fd, &b, 1);

  (void)n;
  errno = saved;
}

/* Creates the self-pipe and installs the handlers for SIGCHLD, SIGTERM and
 * SIGINT; ignores SIGPIPE, which the child gets back at its default.
 * Returns 0 or MUSTER_E_IO (logged). */
__attribute__((warn_unused_result)) static int signals_install(void) {
  struct sigaction sa;
  int p[2];

  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    LOG(LOG_ERROR, "cannot create the signal pipe: %s", strerror(errno));
    return MUSTER_E_IO;
  }
  wd.sig_read_fd = p[0];
  sig_write_fd = p[1];
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  /* Only an exit of the child matters, not its being stopped or continued. */
  sa.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
      sigaction(SIGINT, &sa, NULL) != 0)
    return MUSTER_E_IO;
  sa.sa_handler = SIG_IGN;
  sa.sa_flags = 0;
  if (sigaction(SIGPIPE, &sa, NULL) != 0)
    return MUSTER_E_IO;
  return 0;
}

/* Empties the self-pipe. Sets *child if SIGCHLD arrived and *term to SIGTERM
 * or SIGINT if one of them did (left alone otherwise). */
static void signals_take(bool *child, int *term) {
  unsigned char buf[64];
  ssize_t n;

  while ((n = read(wd.sig_read_fd, buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == SIGCHLD)
        *child = true;
      else if (buf[i] == SIGTERM || buf[i] == SIGINT)
        *term = buf[i];
    }
  }
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */

/* libcurl's write callback: appends the answer body to wd.answer, keeping it
 * NUL-terminated. Past WD_ANSWER_MAX it refuses the data, which aborts the
 * transfer with CURLE_WRITE_ERROR. */
static size_t http_on_data(char *data, size_t size, size_t nmemb, void *unused) {
  size_t n = size * nmemb;

  (void)unused;
  if (n > WD_ANSWER_MAX - wd.answer_len) {
    wd.answer_too_big = true;
    return 0;
  }
  memcpy(wd.answer + wd.answer_len, data, n);
  wd.answer_len += n;
  wd.answer[wd.answer_len] = '\0';
  return n;
}

/* Creates the one curl handle, its two header lists (both carrying the
 * bearer token) and the answer buffer; http_cleanup() frees them.
 * curl_global_init() must have been called. Returns 0 or MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int http_init(void) {
  char auth[WD_TOKEN_MAX + 32];
  struct curl_slist *l;
  int rc = MUSTER_E_NOMEM;

  snprintf(auth, sizeof(auth), "Authorization: Bearer %s", wd.token);
  wd.answer = malloc(WD_ANSWER_MAX + 1);
  wd.curl = curl_easy_init();
  if (!wd.answer || !wd.curl)
    goto out;
  wd.answer[0] = '\0';
  /* curl_slist_append returns NULL on failure and leaves the list as it was,
   * so each step keeps the list in wd where http_cleanup can free it. */
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  wd.hdr_json = l;
  /* "Expect:" stops libcurl from waiting for a 100-continue before large
   * bodies, which only adds a round trip against our controller. */
  if (!(l = curl_slist_append(wd.hdr_json, "Content-Type: application/json")))
    goto out;
  if (!(l = curl_slist_append(wd.hdr_json, "Expect:")))
    goto out;
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  wd.hdr_bytes = l;
  if (!(l = curl_slist_append(wd.hdr_bytes, "Content-Type: application/octet-stream")))
    goto out;
  if (!(l = curl_slist_append(wd.hdr_bytes, "Expect:")))
    goto out;

  curl_easy_setopt(wd.curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(wd.curl, CURLOPT_CONNECTTIMEOUT_MS, WD_CONNECT_TIMEOUT_MS);
  curl_easy_setopt(wd.curl, CURLOPT_TIMEOUT_MS, WD_CALL_TIMEOUT_MS);
  curl_easy_setopt(wd.curl, CURLOPT_WRITEFUNCTION, http_on_data);
  curl_easy_setopt(wd.curl, CURLOPT_ERRORBUFFER, wd.curl_err);
  curl_easy_setopt(wd.curl, CURLOPT_USERAGENT, "muster-workerd/" MUSTER_VERSION);
  /* Workers talk to the controller directly, as they talk to each other; a
   * site-wide http_proxy meant for the internet would only get in the way. */
  curl_easy_setopt(wd.curl, CURLOPT_PROXY, "");
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(wd.curl, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  rc = 0;
out:
  /* The token must not linger on the stack. */
  explicit_bzero(auth, sizeof(auth));
  return rc;
}

/* Frees what http_init() created; harmless if it failed part way. */
static void http_cleanup(void) {
  curl_slist_free_all(wd.hdr_json);
  curl_slist_free_all(wd.hdr_bytes);
  if (wd.curl)
    curl_easy_cleanup(wd.curl);
  free(wd.answer);
  wd.hdr_json = wd.hdr_bytes = NULL;
  wd.curl = NULL;
  wd.answer = NULL;
}

/* POSTs body (len bytes; JSON if json, raw bytes otherwise) to
 * {url}/api/v1/workers/{id}/{suffix}. Returns 0 when the controller answered,
 * with the status in *status and the body in wd.answer (NUL-terminated, valid
 * until the next call); MUSTER_E_UNREACHABLE when no answer came (refused,
 * timed out, reset); MUSTER_E_TOO_LARGE when the answer passed 1 MiB;
 * MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int
http_post(const char *suffix, bool json, const void *body, size_t len, long *status) {
  char url[WD_URL_MAX + WD_ID_MAX + 64];
  sigset_t block, old;
  CURLcode cc;
  int rc = 0;
  int n;

  n = snprintf(url, sizeof(url), "%s/api/v1/workers/%s/%s", wd.url, wd.id, suffix);
  if (n < 0 || (size_t)n >= sizeof(url))
    return MUSTER_E_INTERNAL;
  wd.answer_len = 0;
  wd.answer[0] = '\0';
  wd.answer_too_big = false;
  wd.curl_err[0] = '\0';
  *status = 0;
  curl_easy_setopt(wd.curl, CURLOPT_URL, url);
  curl_easy_setopt(wd.curl, CURLOPT_HTTPHEADER, json ? wd.hdr_json : wd.hdr_bytes);
  curl_easy_setopt(wd.curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(wd.curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);

  /* Our handlers only write to the self-pipe, so holding the signals back
   * during the call loses nothing, and keeps EINTR out of libcurl's poll()
   * and the resolver; they are delivered as soon as the mask is restored. */
  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old);
  cc = curl_easy_perform(wd.curl);
  sigprocmask(SIG_SETMASK, &old, NULL);

  if (cc == CURLE_WRITE_ERROR && wd.answer_too_big) {
    LOG(LOG_WARN, "the controller's answer to %s was larger than 1 MiB", suffix);
    rc = MUSTER_E_TOO_LARGE;
  } else if (cc == CURLE_OUT_OF_MEMORY) {
    rc = MUSTER_E_NOMEM;
  } else if (cc != CURLE_OK) {
    if (wd.controller_up)
      LOG(LOG_WARN, "cannot reach the controller at %s (%s); will keep trying", wd.url,
          wd.curl_err[0] ? wd.curl_err : curl_easy_strerror(cc));
    LOG(LOG_DEBUG, "POST %s: %s", suffix, wd.curl_err[0] ? wd.curl_err : curl_easy_strerror(cc));
    wd.controller_up = false;
    rc = MUSTER_E_UNREACHABLE;
  } else {
    curl_easy_getinfo(wd.curl, CURLINFO_RESPONSE_CODE, status);
    wd.last_contact_ms = util_mono_ms();
    if (!wd.controller_up)
      LOG(LOG_INFO, "the controller answers again");
    wd.controller_up = true;
  }
  return rc;
}

/* Starts a backoff that gives up 10 minutes from now. */
static void backoff_init(struct backoff *b) {
  b->give_up_ms = util_mono_ms() + WD_RETRY_TOTAL_MS;
  b->delay_ms = WD_RETRY_FIRST_MS;
}

/* Sleeps for the next delay of b (100 ms, doubling up to 5 s), never past
 * its end. Returns 0 when it is time to try again, MUSTER_E_TIMEOUT when the
 * 10 minutes are over, or, if interruptible, MUSTER_E_SHUTTING_DOWN as soon as
 * SIGTERM or SIGINT arrives (used before any child exists). */
__attribute__((warn_unused_result)) static int backoff_wait(struct backoff *b, bool interruptible) {
  int64_t now = util_mono_ms();
  int64_t until;

  if (now >= b->give_up_ms)
    return MUSTER_E_TIMEOUT;
  until = now + b->delay_ms;
  if (until > b->give_up_ms)
    until = b->give_up_ms;
  b->delay_ms = b->delay_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : b->delay_ms * 2;
  while ((now = util_mono_ms()) < until) {
    struct pollfd p = {.fd = wd.sig_read_fd, .events = POLLIN};
    bool child = false;
    int term = 0;

    if (poll(&p, 1, (int)(until - now)) > 0) {
      signals_take(&child, &term);
      if (term && interruptible)
        return MUSTER_E_SHUTTING_DOWN;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                             */

/* Frees a NULL-terminated array of strings and the strings; NULL is fine. */
static void strv_free(char **v) {
  if (!v)
    return;
  for (char **p = v; *p; p++)
    free(*p);
  free(v);
}

/* Reads the assignment in the register answer (ans: borrowed reference) into
 * wd.hb_interval_ms, wd.argv, wd.envp, wd.cwd and wd.exec_token, which
 * cleanup() frees. Types are checked strictly, since a command run from a
 * mangled answer could do anything. Returns 0, MUSTER_E_PROTOCOL (logged) or
 * MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int assignment_parse(json_t *ans) {
  json_t *hb = json_object_get(ans, "heartbeat_interval_seconds");
  json_t *cmd = json_object_get(ans, "command");
  json_t *env = json_object_get(ans, "env");
  json_t *cwd = json_object_get(ans, "cwd");
  json_t *xtok = json_object_get(ans, "exec_token");
  const char *key;
  json_t *val;
  size_t i;
  int rc = MUSTER_E_PROTOCOL;

  if (!json_is_object(ans)) {
    LOG(LOG_ERROR, "the register answer is not a JSON object");
    goto out;
  }
  wd.hb_interval_ms = WD_HEARTBEAT_DEFAULT_MS;
  if (hb && !json_is_null(hb)) {
    double s = json_number_value(hb);
    if (!json_is_number(hb) || !(s >= 0.1 && s <= 3600)) {
      LOG(LOG_ERROR, "heartbeat_interval_seconds is not a number of seconds in [0.1, 3600]");
      goto out;
    }
    wd.hb_interval_ms = (int64_t)(s * 1000);
  }

  if (cmd && !json_is_null(cmd)) {
    if (!json_is_array(cmd) || json_array_size(cmd) > WD_ARGV_MAX) {
      LOG(LOG_ERROR, "command is not an array of at most %d strings", WD_ARGV_MAX);
      goto out;
    }
    json_array_foreach(cmd, i, val) {
      if (!json_is_string(val) || (i == 0 && json_string_length(val) == 0)) {
        LOG(LOG_ERROR, "command[%zu] is not a %sstring", i, i == 0 ? "non-empty " : "");
        goto out;
      }
    }
    wd.argc = json_array_size(cmd);
    if (wd.argc > 0) {
      wd.argv = calloc(wd.argc + 1, sizeof(char *));
      if (!wd.argv) {
        rc = MUSTER_E_NOMEM;
        goto out;
      }
      json_array_foreach(cmd, i, val) {
        if (!(wd.argv[i] = strdup(json_string_value(val)))) {
          rc = MUSTER_E_NOMEM;
          goto out;
        }
      }
    }
  }

  if (env && !json_is_null(env) && (!json_is_object(env) || json_object_size(env) > WD_ENV_MAX)) {
    LOG(LOG_ERROR, "env is not an object of at most %d strings", WD_ENV_MAX);
    goto out;
  }
  /* The script sees workerd's own environment (the container's, or the
   * Slurm job's) with the controller's variables on top, less what is for
   * workerd alone: its token above all. */
  {
    extern char **environ;
    size_t own = 0;

    for (char **e = environ; *e; e++)
      own++;
    wd.envp = calloc(own + (env ? json_object_size(env) : 0) + 1, sizeof(char *));
    if (!wd.envp) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    i = 0;
    for (char **e = environ; *e; e++) {
      size_t kl = strcspn(*e, "=");
      char name[256];

      if (kl >= sizeof(name) || strncmp(*e, "MUSTER_WORKER_TOKEN=", 20) == 0 ||
          strncmp(*e, "MUSTER_BIND_IP=", 15) == 0 ||
          strncmp(*e, "MUSTER_ORPHAN_TIMEOUT=", 22) == 0 ||
          strncmp(*e, "MUSTER_LOG_LEVEL=", 17) == 0)
        continue;
      memcpy(name, *e, kl);
      name[kl] = '\0';
      if (env && json_object_get(env, name))
        continue; /* the controller's value wins */
      if (!(wd.envp[i++] = strdup(*e))) {
        rc = MUSTER_E_NOMEM;
        goto out;
      }
    }
  }
  json_object_foreach(env, key, val) {
    size_t kl = strlen(key);
    size_t vl;
    char *kv;

    /* Values are never logged: they may hold the user's secret_env. */
    if (kl == 0 || strchr(key, '=') || !json_is_string(val)) {
      LOG(LOG_ERROR, "env entry \"%.64s\" is not NAME: string", key);
      goto out;
    }
    vl = json_string_length(val);
    if (!(kv = malloc(kl + vl + 2))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    memcpy(kv, key, kl);
    kv[kl] = '=';
    memcpy(kv + kl + 1, json_string_value(val), vl + 1);
    wd.envp[i++] = kv;
  }

  if (cwd && !json_is_null(cwd)) {
    if (!json_is_string(cwd) || json_string_length(cwd) == 0) {
      LOG(LOG_ERROR, "cwd is not a non-empty string");
      goto out;
    }
    if (!(wd.cwd = strdup(json_string_value(cwd)))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
  }

  /* Absent or null until the controller hands one out: exec is then refused.
   * Its value is never logged, not even when it is malformed. */
  if (xtok && !json_is_null(xtok)) {
    if (!json_is_string(xtok) || json_string_length(xtok) == 0 ||
        json_string_length(xtok) > WD_TOKEN_MAX ||
        strlen(json_string_value(xtok)) != json_string_length(xtok)) {
      LOG(LOG_ERROR, "exec_token is not a non-empty string of at most %d characters", WD_TOKEN_MAX);
      goto out;
    }
    if (!(wd.exec_token = strdup(json_string_value(xtok)))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
  }
  rc = 0;
out:
  return rc;
}

/* This process's start time, or 0 if unknown: with the pid, how a local
 * controller knows this process from whatever gets its pid later. */
static unsigned long long self_start_time(void) {
  unsigned long long st;
  int zombie;

  return util_proc_stat(0, &st, &zombie) == 0 ? st : 0;
}

/* Registers this worker (address, hostname, exec port, pid) and reads the
 * assignment from the answer. Connection failures and 5xx answers are retried
 * with backoff for 10 minutes, since the controller may be restarting.
 * Returns 0; MUSTER_E_SHUTTING_DOWN if SIGTERM or SIGINT arrived meanwhile;
 * the matching MUSTER_E_* for a 4xx answer (the worker was stopped or is
 * unknown: its body is logged); MUSTER_E_TIMEOUT, MUSTER_E_PROTOCOL,
 * MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int register_worker(void) {
  char host[256];
  json_t *req = NULL;
  json_t *ans = NULL;
  json_error_t jerr;
  char *body = NULL;
  struct backoff b;
  long status;
  int rc;

  if (gethostname(host, sizeof(host)) != 0)
    host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  req = json_pack("{s:s, s:s, s:i, s:I, s:I, s:I}", "ip_address", wd.ip, "hostname", host,
                  "exec_port", wd.exec_port, "pid", (json_int_t)getpid(), "attempt",
                  (json_int_t)wd.attempt, "start_time", (json_int_t)self_start_time());
  if (!req || !(body = json_dumps(req, JSON_COMPACT))) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  backoff_init(&b);
  /* A controller that never answers is no better while registering than
   * later: the orphan timeout bounds this wait too. */
  if (b.give_up_ms > util_mono_ms() + wd.orphan_ms)
    b.give_up_ms = util_mono_ms() + wd.orphan_ms;
  for (;;) {
    rc = http_post("register", true, body, strlen(body), &status);
    if (rc == 0 && status == 200)
      break;
    if (rc == 0 && status >= 400 && status < 500) {
      LOG(LOG_ERROR, "the controller refused the registration (HTTP %ld): %.1000s", status,
          wd.answer);
      rc = status == 401   ? MUSTER_E_UNAUTHORIZED
           : status == 403 ? MUSTER_E_FORBIDDEN
           : status == 404 ? MUSTER_E_NOT_FOUND
           : status == 409 ? MUSTER_E_CONFLICT
                           : MUSTER_E_MALFORMED;
      goto out;
    }
    if (rc == 0 && status < 500) {
      LOG(LOG_ERROR, "unexpected HTTP %ld from the controller to the registration", status);
      rc = MUSTER_E_PROTOCOL;
      goto out;
    }
    if (rc == 0)
      LOG(LOG_DEBUG, "registration: HTTP %ld; retrying", status);
    else if (rc != MUSTER_E_UNREACHABLE)
      goto out;
    rc = backoff_wait(&b, true);
    if (rc == MUSTER_E_TIMEOUT)
      LOG(LOG_ERROR, "could not register within 10 minutes; giving up");
    if (rc)
      goto out;
  }
  ans = json_loadb(wd.answer, wd.answer_len, 0, &jerr);
  if (!ans) {
    LOG(LOG_ERROR, "the register answer is not JSON: %s", jerr.text);
    rc = MUSTER_E_PROTOCOL;
    goto out;
  }
  rc = assignment_parse(ans);
out:
  json_decref(ans);
  json_decref(req);
  free(body);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Output streams                                                           */

/* Gives where the next bytes of s may be written and how many fit there
 * contiguously. When the ring is full it first drops the oldest 64 KiB
 * (counted for the notice), so a flood while the controller is away costs
 * one step per 64 KiB rather than one per read. */
static void stream_space(struct stream *s, char **where, size_t *room) {
  size_t tail;

  if (s->len == WD_STREAM_CAP) {
    s->start = (s->start + WD_FLUSH_BYTES) % WD_STREAM_CAP;
    s->len -= WD_FLUSH_BYTES;
    s->dropped += WD_FLUSH_BYTES;
  }
  if (s->len == 0)
    s->start = 0;
  tail = (s->start + s->len) % WD_STREAM_CAP;
  *where = s->ring + tail;
  *room = tail >= s->start ? WD_STREAM_CAP - tail : s->start - tail;
}

/* Counts n bytes just written at the place stream_space() gave. */
static void stream_commit(struct stream *s, size_t n, int64_t now) {
  if (s->len == 0)
    s->first_ms = now;
  s->len += n;
}

/* Drops the n oldest bytes of s, which the controller has taken. */
static void stream_consume(struct stream *s, size_t n) {
  s->start = (s->start + n) % WD_STREAM_CAP;
  s->len -= n;
  if (s->len == 0)
    s->start = 0;
}

/* Appends n bytes of our own (not the command's) to s. */
static void stream_append(struct stream *s, const char *data, size_t n, int64_t now) {
  while (n > 0) {
    char *where;
    size_t room;

    stream_space(s, &where, &room);
    if (room > n)
      room = n;
    memcpy(where, data, room);
    stream_commit(s, room, now);
    data += room;
    n -= room;
  }
}

/* Reads what the pipe of s holds now (bounded per call, so that one chatty
 * stream cannot starve the loop), and closes it at end of file. */
static void stream_read(struct stream *s, int64_t now) {
  for (int i = 0; i < WD_READS_PER_WAKE && s->fd >= 0; i++) {
    char *where;
    size_t room;
    ssize_t n;

    stream_space(s, &where, &room);
    if (room > WD_FLUSH_BYTES)
      room = WD_FLUSH_BYTES;
    n = read(s->fd, where, room);
    if (n > 0) {
      stream_commit(s, (size_t)n, now);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n < 0)
      LOG(LOG_WARN, "reading the command's %s: %s", s->name, strerror(errno));
    close(s->fd);
    s->fd = -1;
  }
}

/* Sends n bytes to the controller's log of the stream named suffix. Returns 0
 * when the controller took them, or refused them for good (a 4xx: logged; the
 * caller drops them, since sending them again can never succeed), and
 * MUSTER_E_UNREACHABLE when they must be kept for the next flush. */
__attribute__((warn_unused_result)) static int log_post(const char *suffix, const char *bytes,
                                                        size_t n) {
  long status;
  int rc = http_post(suffix, false, bytes, n, &status);

  if (rc || status >= 500)
    return MUSTER_E_UNREACHABLE;
  if (status < 200 || status >= 300)
    LOG(LOG_WARN, "the controller refused %zu bytes of %s (HTTP %ld); dropping them", n, suffix,
        status);
  return 0;
}

/* Sends everything s holds, in POSTs of at most 512 KiB, preceded by a notice
 * if bytes were dropped. Returns 0 once s is empty, or MUSTER_E_UNREACHABLE
 * with the unsent bytes still in s. */
__attribute__((warn_unused_result)) static int stream_flush(struct stream *s) {
  char suffix[32];
  char notice[128];
  int rc = 0;

  snprintf(suffix, sizeof(suffix), "logs?stream=%s", s->name);
  while (s->len > 0) {
    size_t n = s->len;

    if (s->dropped) {
      int k = snprintf(notice, sizeof(notice),
                       "[muster-workerd: %" PRIu64
                       " bytes of output dropped while the controller was unreachable]\n",
                       s->dropped);
      rc = log_post(suffix, notice, (size_t)k);
      if (rc)
        goto out;
      s->dropped = 0;
    }
    if (n > WD_STREAM_CAP - s->start)
      n = WD_STREAM_CAP - s->start;
    if (n > WD_POST_MAX)
      n = WD_POST_MAX;
    rc = log_post(suffix, s->ring + s->start, n);
    if (rc)
      goto out;
    stream_consume(s, n);
  }
out:
  return rc;
}

/* When s must next be flushed: INT64_MAX if it is empty; otherwise at 64 KiB
 * or 200 ms after its oldest byte, but not before the retry time that a
 * failed flush set. */
static int64_t stream_deadline(const struct stream *s) {
  int64_t due;

  if (s->len == 0)
    return INT64_MAX;
  due = s->len >= WD_FLUSH_BYTES ? 0 : s->first_ms + WD_FLUSH_DELAY_MS;
  return due > wd.logs_retry_at_ms ? due : wd.logs_retry_at_ms;
}

/* Flushes the streams whose deadline has come. A failure postpones every
 * stream's flush by the next backoff delay, so that a missing controller
 * costs one attempt per delay, not one per loop round. */
static void streams_flush_due(int64_t now) {
  struct stream *all[2] = {&wd.out, &wd.err};

  for (int i = 0; i < 2; i++) {
    if (now < stream_deadline(all[i]))
      continue;
    if (stream_flush(all[i]) == 0) {
      wd.logs_backoff_ms = WD_RETRY_FIRST_MS;
      continue;
    }
    wd.logs_retry_at_ms = util_mono_ms() + wd.logs_backoff_ms;
    wd.logs_backoff_ms =
        wd.logs_backoff_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : wd.logs_backoff_ms * 2;
    break;
  }
}

/* Flushes both streams now. Returns 0 or MUSTER_E_UNREACHABLE. */
__attribute__((warn_unused_result)) static int streams_flush_all(void) {
  int rc = wd.out.ring ? stream_flush(&wd.out) : 0;

  if (rc == 0 && wd.err.ring)
    rc = stream_flush(&wd.err);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The command                                                              */

/* What a child runs, prepared entirely before fork(): argv and envp are
 * NULL-terminated; cwd may be NULL (stay where workerd is). */
struct child_spec {
  int in_fd, out_fd, err_fd; /* become the command's fds 0, 1 and 2 */
  int status_fd;             /* close-on-exec pipe for a struct exec_status */
  char *const *argv;
  char **envp;
  const char *cwd;
  bool own_group; /* exec commands: own process group, killed with workerd */
  pid_t parent;   /* with own_group: workerd's pid, taken before fork() */
};

/* Runs in the child after fork(): wires the standard streams, resets the
 * signals, enters cwd, sets the environment to the prepared one and executes
 * the command. On failure it sends the stage and errno through status_fd and
 * exits 127; the parent writes the sentence. It calls no malloc (the
 * environment is swapped by pointer, not rebuilt with setenv), because
 * libcurl may have left a resolver thread behind that held a lock. */
__attribute__((noreturn)) static void child_run(const struct child_spec *cs) {
  struct exec_status st = {STAGE_SETUP, 0};
  struct sigaction dfl;
  sigset_t none;
  ssize_t n;

  /* Both sides call setpgid, so that the group exists before either the
   * parent signals it or the command starts children. */
  if (cs->own_group && setpgid(0, 0) != 0) {
    st.err = errno;
    goto fail;
  }
  /* An exec command must not outlive a workerd that was killed outright
   * (SIGKILL, a crash): no one would relay or reap it. */
  if (cs->own_group && prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    st.err = errno;
    goto fail;
  }
  if (dup2(cs->in_fd, 0) < 0 || dup2(cs->out_fd, 1) < 0 || dup2(cs->err_fd, 2) < 0) {
    st.err = errno;
    goto fail;
  }
  /* Nothing of ours (libcurl's socket, the exec sockets, the pipes' other
   * ends) may leak into the command; the status pipe is close-on-exec
   * already. */
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536)
      max = 65536;
    for (int fd = 3; fd < max; fd++)
      fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  /* Handlers first, then the mask (the parent blocked everything around
   * fork), so a pending signal never runs our handler in the child. */
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; sig++)
    sigaction(sig, &dfl, NULL); /* fails harmlessly for SIGKILL, SIGSTOP */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* workerd died between fork() and prctl(): the death signal missed us. */
  if (cs->own_group && getppid() != cs->parent)
    _exit(127);

  if (cs->cwd && chdir(cs->cwd) != 0) {
    st.stage = STAGE_CHDIR;
    st.err = errno;
    goto fail;
  }
  /* execvp searches the PATH of the environment it runs in, which is now the
   * assigned one, as with clearenv() and setenv(). */
  environ = cs->envp;
  execvp(cs->argv[0], cs->argv);
  st.stage = STAGE_EXEC;
  st.err = errno;
fail:
  n = write(cs->status_fd, &st, sizeof(st));
  (void)n;
  _exit(127);
}

/* Closes *fd if it is open and marks it closed. */
static void fd_close(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Starts the assigned command with its output on two pipes, and waits until
 * it has been executed or has failed to be (the status pipe tells which).
 * A failure to execute is not an error here: it shows as a reason in
 * wd.reason, a sentence on the command's stderr, and exit 127 through
 * SIGCHLD. Returns 0, or MUSTER_E_IO/MUSTER_E_NOMEM if no child could be
 * started at all, with wd.reason set for the exit report. */
__attribute__((warn_unused_result)) static int command_start(void) {
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, statp[2] = {-1, -1};
  int devnull = -1;
  struct exec_status st;
  sigset_t all, old;
  ssize_t n;
  pid_t pid;
  int rc = MUSTER_E_IO;
  int saved;

  wd.out.ring = malloc(WD_STREAM_CAP);
  wd.err.ring = malloc(WD_STREAM_CAP);
  if (!wd.out.ring || !wd.err.ring) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": out of memory", wd.argv[0]);
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  if (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 || pipe2(statp, O_CLOEXEC) != 0 ||
      (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 ||
      fcntl(outp[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) != 0) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": %s", wd.argv[0], strerror(errno));
    goto out;
  }

  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid = fork();
  if (pid == 0) {
    struct child_spec cs = {.in_fd = devnull,
                            .out_fd = outp[1],
                            .err_fd = errp[1],
                            .status_fd = statp[1],
                            .argv = wd.argv,
                            .envp = wd.envp,
                            .cwd = wd.cwd};
    child_run(&cs);
  }
  saved = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": %s", wd.argv[0], strerror(saved));
    goto out;
  }
  wd.child = pid;
  wd.out.fd = outp[0];
  wd.err.fd = errp[0];
  outp[0] = errp[0] = -1;
  fd_close(&statp[1]);

  /* Blocks only until exec, which closes the pipe; signals are unblocked
   * again, so a SIGCHLD may interrupt the read. */
  do
    n = read(statp[0], &st, sizeof(st));
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof(st)) {
    const char *what = st.stage == STAGE_CHDIR  ? "cannot change to directory"
                       : st.stage == STAGE_EXEC ? "cannot run"
                                                : "cannot set up the standard streams of";
    const char *arg = st.stage == STAGE_CHDIR ? wd.cwd : wd.argv[0];
    char line[WD_REASON_MAX + 32];
    int k;

    snprintf(wd.reason, sizeof(wd.reason), "%s \"%s\": %s", what, arg, strerror(st.err));
    LOG(LOG_WARN, "%s", wd.reason);
    /* The user reads the command's stderr first, so say it there too. */
    k = snprintf(line, sizeof(line), "muster-workerd: %s\n", wd.reason);
    stream_append(&wd.err, line, (size_t)k < sizeof(line) ? (size_t)k : sizeof(line) - 1,
                  util_mono_ms());
  } else {
    LOG(LOG_INFO, "started \"%s\" as process %ld", wd.argv[0], (long)pid);
  }
  rc = 0;
out:
  fd_close(&outp[0]);
  fd_close(&outp[1]);
  fd_close(&errp[0]);
  fd_close(&errp[1]);
  fd_close(&statp[0]);
  fd_close(&statp[1]);
  fd_close(&devnull);
  return rc;
}

/* Collects the child's exit status if it has exited, and starts the 2 s
 * window in which its pipes are still read. */
static void child_reap(int64_t now) {
  int st;
  pid_t r;

  if (wd.child <= 0 || wd.child_done)
    return;
  do
    r = waitpid(wd.child, &st, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0)
    return;
  if (r < 0) {
    /* Cannot happen unless someone else reaped it; end rather than hang. */
    LOG(LOG_ERROR, "lost track of the command: %s", strerror(errno));
    snprintf(wd.reason, sizeof(wd.reason), "muster-workerd lost track of the command");
    wd.wait_status = -1;
  } else {
    wd.wait_status = st;
    if (WIFEXITED(st))
      LOG(LOG_INFO, "the command exited with code %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
      LOG(LOG_INFO, "the command was killed by signal %d", WTERMSIG(st));
  }
  wd.child_done = true;
  wd.drain_until_ms = now + WD_DRAIN_MS;
}

/* Decides to stop, in the given mode, unless a stop is already under way or
 * the command has already ended (then its own end is what gets reported).
 * signo is SIGTERM or SIGINT when a signal asked, else 0. A running command
 * gets SIGTERM now and SIGKILL 5 s later; an idle worker ends at once. */
static void stop_begin(enum finish_mode mode, int signo, int64_t now) {
  if (wd.stopping || wd.child_done)
    return;
  wd.stopping = true;
  wd.mode = mode;
  wd.stop_signal = signo;
  if (wd.child > 0) {
    kill(wd.child, SIGTERM);
    wd.kill_at_ms = now + WD_KILL_GRACE_MS;
  } else {
    wd.finish = true;
  }
}

/* ------------------------------------------------------------------------ */
/* The exec channel                                                         */

/*
 * docs/exec-protocol.md is the contract. One TCP connection runs one command:
 * the client sends a hello (token, argv, env, cwd), then stdin (I) and
 * signals (K); we send the command's stdout (O) and stderr (E) as they come,
 * then its exit (X), and close.
 *
 * Every connection lives in the main poll loop, with its socket, the
 * command's three pipes and its deadlines. Flow control both ways, with fixed
 * bounds: the command's output pipes are not read while the connection holds
 * EX_OUT_HIGH unsent bytes, and the socket is not read while the last stdin
 * frame (at most 1 MiB) has not gone into the command's stdin pipe. So a
 * client that stops reading stalls its command, as a full terminal would,
 * and costs at most about 2 MiB.
 *
 * A connection's life: EX_HELLO (waiting for the hello, 10 s at most) ->
 * EX_RUNNING (the command runs; it ends when the command has exited and its
 * output pipes reached end of file, or 2 s after its exit) -> EX_CLOSING (X
 * queued; send what is left, shut our side, read until the client closes,
 * so that unread input never turns the close into a reset that could destroy
 * the X on its way) -> freed. A client gone before the X turns the connection
 * into EX_ORPHAN: its command's process group gets SIGTERM, SIGKILL 2 s
 * later, and the record lives until the command is reaped.
 */

#define EX_CONN_MAX 64            /* concurrent connections (commands) */
#define EX_SPARE 16               /* more records, for refusals on their way */
#define EX_FRAME_MAX (1u << 20)   /* largest frame payload, both ways */
#define EX_HDR 5                  /* type byte + 4-byte big-endian length */
#define EX_HELLO_MS 10000         /* from accept to a complete hello */
#define EX_OUT_HIGH (1u << 20)    /* stop reading the command's output here */
#define EX_READ_CHUNK (64u << 10) /* one read from a pipe: one O/E frame */
#define EX_KILL_GRACE_MS 2000     /* SIGTERM to SIGKILL for exec commands */
#define EX_DRAIN_MS 2000          /* reading output pipes after the exit */
#define EX_LINGER_MS 2000         /* waiting for the client to close after X */
#define EX_STALL_MS 60000         /* a client that reads nothing of its X */
#define EX_STOP_MS 5000           /* workerd's stop: longest wait for exec */
#define EX_READS_PER_WAKE 16      /* reads per descriptor per poll round */
#define EX_NAME_MAX 200           /* bytes of argv[0] in logs and errors */
#define EX_POLL_MAX ((EX_CONN_MAX + EX_SPARE) * 4 + 1)
/* The hard bound of an output buffer: EX_OUT_HIGH plus what one round of
 * reads may add past it. */
#define EX_OUT_CAP (EX_OUT_HIGH + 4 * EX_READ_CHUNK)

enum ex_state {
  EX_HELLO,   /* waiting for the hello */
  EX_RUNNING, /* the command was started: relaying */
  EX_CLOSING, /* X queued: flushing, then waiting for the client to close */
  EX_ORPHAN   /* the client is gone: killing and reaping the command */
};

/* One exec connection and its command. */
struct ex_conn {
  enum ex_state state;
  int sock; /* -1 once released */
  char peer[INET6_ADDRSTRLEN + 8];
  char name[EX_NAME_MAX + 1]; /* argv[0], cut at a character, for the logs */
  int64_t deadline_ms;        /* HELLO: the hello is due; CLOSING: give up */

  /* The frame being read: its header, then its payload (in_len + 1 bytes,
   * so that a hello can be NUL-terminated). */
  unsigned char hdr[EX_HDR];
  size_t hdr_got;
  unsigned char *in;
  size_t in_len, in_got;

  /* Frames to send, back to back, from out[out_start] on. */
  unsigned char *out;
  size_t out_start, out_len, out_cap;
  bool shut;     /* CLOSING: everything was sent and our side shut down */
  bool peer_eof; /* CLOSING: the client closed its side */

  /* The command; pid is also its process group. */
  pid_t pid;              /* 0 before it started */
  bool exited;            /* reaped; wait_status is valid */
  int wait_status;        /* -1 if it was lost */
  int64_t drain_until_ms; /* valid once exited */
  int64_t kill_at_ms;     /* SIGKILL to the group; INT64_MAX if none due */
  const char *stop_error; /* the X's error if workerd's stop killed it */
  int stdin_fd, out_fd, err_fd;
  unsigned char *pend; /* an I payload not yet all in the stdin pipe */
  size_t pend_len, pend_off;

  /* Where this round's pollfds are; -1 where none. */
  int at_sock, at_in, at_out, at_err;
};

static struct {
  struct ex_conn *conns[EX_CONN_MAX + EX_SPARE];
  size_t n;
  bool stopping; /* workerd is ending: refuse, kill, wind down */
  int64_t stop_deadline_ms;
  int64_t accept_after_ms; /* accept() ran out of descriptors: pause */
  int at_listen;
} ex;

/* Length of the longest prefix of s, at most max bytes, that does not cut a
 * UTF-8 sequence (the hello's strings are valid UTF-8, checked by Jansson). */
static size_t utf8_prefix(const char *s, size_t max) {
  size_t n = strlen(s);

  if (n <= max)
    return n;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
    n--;
  return n;
}

/* Makes room for need more bytes at the end of c's output buffer, growing it
 * (up to EX_OUT_CAP) or moving its contents to the front. Returns where they
 * go, or NULL if out of memory or past the cap (which flow control makes
 * impossible: see EX_OUT_HIGH). */
static unsigned char *ex_out_room(struct ex_conn *c, size_t need) {
  size_t cap;
  unsigned char *p;

  if (c->out_len + need > EX_OUT_CAP)
    return NULL;
  if (c->out_start + c->out_len + need <= c->out_cap)
    return c->out + c->out_start + c->out_len;
  if (c->out_len + need <= c->out_cap && c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
    return c->out + c->out_len;
  }
  if (c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
  }
  cap = c->out_cap ? c->out_cap : 4096;
  while (cap < c->out_len + need)
    cap *= 2;
  if (cap > EX_OUT_CAP)
    cap = EX_OUT_CAP;
  p = realloc(c->out, cap);
  if (!p)
    return NULL;
  c->out = p;
  c->out_cap = cap;
  return c->out + c->out_len;
}

/* Writes a frame header for type and len at h. */
static void ex_hdr_put(unsigned char *h, char type, size_t len) {
  h[0] = (unsigned char)type;
  h[1] = (unsigned char)(len >> 24);
  h[2] = (unsigned char)(len >> 16);
  h[3] = (unsigned char)(len >> 8);
  h[4] = (unsigned char)len;
}

/* Queues one frame (len <= EX_FRAME_MAX) on c. Returns 0 or MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int ex_queue(struct ex_conn *c, char type,
                                                        const void *data, size_t len) {
  unsigned char *w = ex_out_room(c, EX_HDR + len);

  if (!w)
    return MUSTER_E_NOMEM;
  ex_hdr_put(w, type, len);
  if (len)
    memcpy(w + EX_HDR, data, len);
  c->out_len += EX_HDR + len;
  return 0;
}

/* Builds the payload of an X frame: code and signo are -1 for null, error is
 * NULL for null. Returns a new string (free()), or NULL if out of memory. */
static char *ex_exit_json(int code, int signo, const char *error) {
  json_t *o =
      json_pack("{s:o, s:o, s:o}", "exit_code", code >= 0 ? json_integer(code) : json_null(),
                "signal", signo >= 0 ? json_integer(signo) : json_null(), "error",
                error ? json_string(error) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

  json_decref(o);
  return s;
}

/* Closes the command's pipes and drops unwritten stdin. */
static void ex_pipes_close(struct ex_conn *c) {
  fd_close(&c->stdin_fd);
  fd_close(&c->out_fd);
  fd_close(&c->err_fd);
  free(c->pend);
  c->pend = NULL;
  c->pend_len = c->pend_off = 0;
}

/* Closes c's socket and frees its buffers; the record itself stays while its
 * command needs reaping. */
static void ex_sock_release(struct ex_conn *c) {
  fd_close(&c->sock);
  free(c->in);
  free(c->out);
  c->in = c->out = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  c->out_start = c->out_len = c->out_cap = 0;
}

/* Ends c's exchange with X: queues it, closes the pipes and moves to
 * EX_CLOSING. code and signo are -1 for null; error (NULL for null) is a
 * sentence for the client. If even the X cannot be queued, the socket is
 * released, which the client sees as a lost connection. */
static void ex_finish(struct ex_conn *c, int code, int signo, const char *error, int64_t now) {
  char *x = ex_exit_json(code, signo, error);

  ex_pipes_close(c);
  free(c->in);
  c->in = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  c->state = EX_CLOSING;
  c->deadline_ms = now + EX_STALL_MS;
  if (!x || ex_queue(c, 'X', x, strlen(x)) != 0) {
    LOG(LOG_ERROR, "exec from %s: out of memory for the exit frame", c->peer);
    ex_sock_release(c);
  }
  free(x);
}

/* Refuses c's request (nothing runs): X with exit code code and error. */
static void ex_refuse(struct ex_conn *c, int code, const char *error, int64_t now) {
  LOG(LOG_WARN, "exec from %s refused: %s", c->peer, error);
  ex_finish(c, code, -1, error, now);
}

/* Sends c's queued frames until the socket is full. Returns 0, or
 * MUSTER_E_IO when the client is gone (connection reset or closed). */
__attribute__((warn_unused_result)) static int ex_flush(struct ex_conn *c, int64_t now) {
  while (c->out_len > 0) {
    ssize_t n = send(c->sock, c->out + c->out_start, c->out_len, MSG_NOSIGNAL);

    if (n > 0) {
      c->out_start += (size_t)n;
      c->out_len -= (size_t)n;
      if (c->state == EX_CLOSING)
        c->deadline_ms = now + EX_STALL_MS;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return MUSTER_E_IO;
  }
  c->out_start = 0;
  return 0;
}

/* Sends sig to c's command's process group if the command is still there. */
static void ex_signal(struct ex_conn *c, int sig) {
  if (c->pid > 0 && !c->exited)
    kill(-c->pid, sig);
}

/* The client is gone (or broke the protocol) before its X: the command's
 * group gets SIGTERM now and SIGKILL 2 s later, and the record stays as an
 * orphan until the command is reaped. why is for the log. */
static void ex_disconnect(struct ex_conn *c, const char *why, int64_t now) {
  ex_sock_release(c);
  ex_pipes_close(c);
  if (c->state == EX_RUNNING && c->pid > 0 && !c->exited) {
    LOG(LOG_INFO, "exec from %s: %s; terminating %s", c->peer, why, c->name);
    ex_signal(c, SIGTERM);
    if (c->kill_at_ms == INT64_MAX)
      c->kill_at_ms = now + EX_KILL_GRACE_MS;
  } else if (c->state == EX_RUNNING && c->pid > 0) {
    /* The command exited but something it started still holds its output
     * pipes: that group is about to be reaped, not kept. */
    LOG(LOG_DEBUG, "exec from %s: %s after the command exited", c->peer, why);
    kill(-c->pid, SIGKILL);
  } else if (c->state != EX_CLOSING) {
    LOG(LOG_DEBUG, "exec from %s: %s", c->peer, why);
  }
  c->state = EX_ORPHAN;
}

/* Builds the command's environment: the worker's script environment with
 * env (a JSON object of strings, borrowed; may be NULL) on top. Returns a new
 * NULL-terminated array (strv_free()), or NULL if out of memory. */
static char **ex_envp_build(json_t *env) {
  size_t own = 0, i = 0;
  const char *key;
  json_t *val;
  char **v;

  for (char **e = wd.envp; e && *e; e++)
    own++;
  v = calloc(own + json_object_size(env) + 1, sizeof(char *));
  if (!v)
    return NULL;
  for (char **e = wd.envp; e && *e; e++) {
    size_t kl = strcspn(*e, "=");

    if (env && json_object_getn(env, *e, kl))
      continue; /* the hello's value wins */
    if (!(v[i++] = strdup(*e)))
      goto fail;
  }
  json_object_foreach(env, key, val) {
    size_t kl = strlen(key), vl = json_string_length(val);

    if (!(v[i] = malloc(kl + vl + 2)))
      goto fail;
    memcpy(v[i], key, kl);
    v[i][kl] = '=';
    memcpy(v[i] + kl + 1, json_string_value(val), vl + 1);
    i++;
  }
  return v;
fail:
  strv_free(v);
  return NULL;
}

/* True if j is a JSON string without NUL bytes (which C strings cannot
 * carry); non-empty too if nonempty. */
static bool ex_is_cstring(json_t *j, bool nonempty) {
  return json_is_string(j) && strlen(json_string_value(j)) == json_string_length(j) &&
         (!nonempty || json_string_length(j) > 0);
}

/* Checks the hello (text, len bytes) and starts its command, moving c to
 * EX_RUNNING; or refuses it with an X. */
static void ex_start(struct ex_conn *c, const char *text, size_t len, int64_t now) {
  int inp[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, statp[2] = {-1, -1};
  json_t *hello = json_loadb(text, len, 0, NULL);
  json_t *token = json_object_get(hello, "token");
  json_t *jargv = json_object_get(hello, "argv");
  json_t *env = json_object_get(hello, "env");
  json_t *jcwd = json_object_get(hello, "cwd");
  char **argv = NULL, **envp = NULL;
  const char *cwd = wd.cwd;
  char err[EX_NAME_MAX + 256];
  struct exec_status st;
  sigset_t all, old;
  json_t *val;
  const char *key;
  size_t i;
  ssize_t n;
  pid_t pid;
  int saved;

  if (!json_is_object(hello)) {
    ex_refuse(c, 126, "the hello is not a JSON object", now);
    goto out;
  }
  /* The token first: a client without it learns nothing more. */
  if (!wd.exec_token) {
    ex_refuse(c, 126, "this worker has no exec token", now);
    goto out;
  }
  if (!ex_is_cstring(token, false) || !util_secret_equal(json_string_value(token), wd.exec_token)) {
    ex_refuse(c, 126, "wrong exec token", now);
    goto out;
  }
  if (!json_is_array(jargv) || json_array_size(jargv) == 0 ||
      json_array_size(jargv) > WD_ARGV_MAX) {
    ex_refuse(c, 126, "argv is not a non-empty array of at most 4096 strings", now);
    goto out;
  }
  json_array_foreach(jargv, i, val) {
    if (!ex_is_cstring(val, i == 0)) {
      snprintf(err, sizeof(err), "argv[%zu] is not a %sstring", i, i == 0 ? "non-empty " : "");
      ex_refuse(c, 126, err, now);
      goto out;
    }
  }
  if (json_is_null(env))
    env = NULL;
  if (env && (!json_is_object(env) || json_object_size(env) > WD_ENV_MAX)) {
    ex_refuse(c, 126, "env is not an object of at most 4096 strings", now);
    goto out;
  }
  json_object_foreach(env, key, val) {
    /* Values are never logged or echoed: they may be secrets. */
    if (key[0] == '\0' || strchr(key, '=') || !ex_is_cstring(val, false)) {
      snprintf(err, sizeof(err), "env entry \"%.*s\" is not NAME: string",
               (int)utf8_prefix(key, 64), key);
      ex_refuse(c, 126, err, now);
      goto out;
    }
  }
  if (jcwd && !json_is_null(jcwd)) {
    if (!ex_is_cstring(jcwd, true)) {
      ex_refuse(c, 126, "cwd is not a non-empty string or null", now);
      goto out;
    }
    cwd = json_string_value(jcwd);
  }

  snprintf(c->name, sizeof(c->name), "%.*s",
           (int)utf8_prefix(json_string_value(json_array_get(jargv, 0)), EX_NAME_MAX),
           json_string_value(json_array_get(jargv, 0)));
  LOG(LOG_INFO, "exec from %s: %s (%zu args)", c->peer, c->name, json_array_size(jargv) - 1);

  argv = calloc(json_array_size(jargv) + 1, sizeof(char *));
  if (!argv)
    goto nomem;
  json_array_foreach(jargv, i, val) {
    if (!(argv[i] = strdup(json_string_value(val))))
      goto nomem;
  }
  if (!(envp = ex_envp_build(env)))
    goto nomem;

  if (pipe2(inp, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 ||
      pipe2(statp, O_CLOEXEC) != 0 || fcntl(inp[1], F_SETFL, O_NONBLOCK) != 0 ||
      fcntl(outp[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) != 0) {
    snprintf(err, sizeof(err), "cannot start \"%s\": %s", c->name, strerror(errno));
    ex_refuse(c, 126, err, now);
    goto out;
  }

  {
    struct child_spec cs = {.in_fd = inp[0],
                            .out_fd = outp[1],
                            .err_fd = errp[1],
                            .status_fd = statp[1],
                            .argv = argv,
                            .envp = envp,
                            .cwd = cwd,
                            .own_group = true,
                            .parent = getpid()};

    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid = fork();
    if (pid == 0)
      child_run(&cs);
    saved = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
  }
  if (pid < 0) {
    snprintf(err, sizeof(err), "cannot start \"%s\": %s", c->name, strerror(saved));
    ex_refuse(c, 126, err, now);
    goto out;
  }
  /* The child does the same; whichever runs first makes the group, so it
   * exists before we could signal it. (EACCES once it has exec'd: fine.) */
  setpgid(pid, pid);
  fd_close(&statp[1]);
  /* Blocks only until exec, which closes the pipe. */
  do
    n = read(statp[0], &st, sizeof(st));
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof(st)) {
    int code = st.stage == STAGE_EXEC && st.err == ENOENT ? 127 : 126;

    /* It has written its status and is exiting: reap it here, so that it
     * is never mistaken for a running command. */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    if (st.stage == STAGE_CHDIR)
      snprintf(err, sizeof(err), "cannot change to directory \"%.*s\": %s",
               (int)utf8_prefix(cwd, EX_NAME_MAX), cwd, strerror(st.err));
    else if (st.stage == STAGE_EXEC)
      snprintf(err, sizeof(err), "cannot run \"%s\": %s", c->name, strerror(st.err));
    else
      snprintf(err, sizeof(err), "cannot set up \"%s\": %s", c->name, strerror(st.err));
    ex_refuse(c, code, err, now);
    goto out;
  }
  c->pid = pid;
  c->stdin_fd = inp[1];
  c->out_fd = outp[0];
  c->err_fd = errp[0];
  inp[1] = outp[0] = errp[0] = -1;
  c->state = EX_RUNNING;
  goto out;

nomem:
  ex_refuse(c, 126, "muster-workerd is out of memory", now);
out:
  fd_close(&inp[0]);
  fd_close(&inp[1]);
  fd_close(&outp[0]);
  fd_close(&outp[1]);
  fd_close(&errp[0]);
  fd_close(&errp[1]);
  fd_close(&statp[0]);
  fd_close(&statp[1]);
  strv_free(argv);
  strv_free(envp);
  json_decref(hello);
}

/* Writes pending stdin into the command's stdin pipe. A command that closed
 * its stdin (EPIPE) loses the rest, as it would from a terminal. */
static void ex_stdin_write(struct ex_conn *c) {
  while (c->pend && c->stdin_fd >= 0) {
    ssize_t n = write(c->stdin_fd, c->pend + c->pend_off, c->pend_len - c->pend_off);

    if (n > 0) {
      c->pend_off += (size_t)n;
      if (c->pend_off == c->pend_len) {
        free(c->pend);
        c->pend = NULL;
        c->pend_len = c->pend_off = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(&c->stdin_fd);
  }
  if (c->stdin_fd < 0 && c->pend) {
    free(c->pend);
    c->pend = NULL;
    c->pend_len = c->pend_off = 0;
  }
}

/* Acts on one complete frame from the client; the payload (c->in, c->in_len
 * bytes) is taken over or freed. */
static void ex_dispatch(struct ex_conn *c, char type, int64_t now) {
  unsigned char *payload = c->in;
  size_t len = c->in_len;

  c->in = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  if (c->state == EX_HELLO) {
    if (type != 'H') {
      ex_refuse(c, 126, "the first frame must be a hello (H)", now);
    } else {
      ex_start(c, (const char *)payload, len, now);
    }
  } else if (c->state != EX_RUNNING) {
    /* CLOSING: whatever still comes in is read only to be dropped. */
  } else if (type == 'I' && len == 0) {
    fd_close(&c->stdin_fd);
  } else if (type == 'I') {
    if (c->stdin_fd >= 0) {
      c->pend = payload;
      c->pend_len = len;
      c->pend_off = 0;
      payload = NULL;
      ex_stdin_write(c);
    }
  } else if (type == 'K') {
    char num[16];
    long sig;

    if (len < sizeof(num)) {
      memcpy(num, payload, len);
      num[len] = '\0';
    } else {
      num[0] = '\0';
    }
    if (util_parse_long(num, 1, NSIG - 1, &sig) == 0) {
      LOG(LOG_DEBUG, "exec from %s: signal %ld to %s", c->peer, sig, c->name);
      ex_signal(c, (int)sig);
    } else {
      LOG(LOG_WARN, "exec from %s: ignoring a K frame that is not a signal number", c->peer);
    }
  } else {
    /* A second hello, or a type from a later protocol: ignored. */
    LOG(LOG_DEBUG, "exec from %s: ignoring a frame of type 0x%02x", c->peer,
        (unsigned)(unsigned char)type);
  }
  free(payload);
}

/* Reads frames from c's socket, as long as c may take them: not while stdin
 * is pending (that is the flow control toward the command). In EX_CLOSING
 * everything is read and dropped, until the client closes. */
static void ex_sock_read(struct ex_conn *c, int64_t now) {
  for (int i = 0; i < EX_READS_PER_WAKE && c->sock >= 0; i++) {
    unsigned char drop[4096];
    unsigned char *where;
    size_t want;
    ssize_t n;

    if (c->state == EX_ORPHAN || (c->state == EX_RUNNING && c->pend))
      return;
    if (c->state == EX_CLOSING) {
      where = drop;
      want = sizeof(drop);
    } else if (c->hdr_got < EX_HDR) {
      where = c->hdr + c->hdr_got;
      want = EX_HDR - c->hdr_got;
    } else {
      where = c->in + c->in_got;
      want = c->in_len - c->in_got;
    }
    n = recv(c->sock, where, want, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) {
      if (c->state == EX_CLOSING) {
        c->peer_eof = true;
        return;
      }
      ex_disconnect(c, n == 0 ? "the client closed the connection" : "the connection broke", now);
      return;
    }
    if (c->state == EX_CLOSING)
      continue;
    if (c->hdr_got < EX_HDR) {
      c->hdr_got += (size_t)n;
      if (c->hdr_got < EX_HDR)
        continue;
      c->in_len = (size_t)c->hdr[1] << 24 | (size_t)c->hdr[2] << 16 | (size_t)c->hdr[3] << 8 |
                  (size_t)c->hdr[4];
      c->in_got = 0;
      if (c->in_len > EX_FRAME_MAX) {
        if (c->state == EX_HELLO)
          ex_refuse(c, 126, "a frame is larger than 1 MiB", now);
        else
          ex_disconnect(c, "the client sent a frame larger than 1 MiB", now);
        return;
      }
      if (!(c->in = malloc(c->in_len + 1))) {
        if (c->state == EX_HELLO)
          ex_refuse(c, 126, "muster-workerd is out of memory", now);
        else
          ex_disconnect(c, "out of memory for a frame", now);
        return;
      }
      c->in[c->in_len] = '\0';
    } else {
      c->in_got += (size_t)n;
    }
    if (c->in_got == c->in_len)
      ex_dispatch(c, (char)c->hdr[0], now);
  }
}

/* Reads the command's output pipe *fd into type frames while c's buffer is
 * under EX_OUT_HIGH; closes *fd at end of file. */
static void ex_pipe_read(struct ex_conn *c, int *fd, char type) {
  for (int i = 0; i < EX_READS_PER_WAKE && *fd >= 0 && c->out_len < EX_OUT_HIGH; i++) {
    unsigned char *w = ex_out_room(c, EX_HDR + EX_READ_CHUNK);
    ssize_t n;

    if (!w)
      return; /* out of memory: the pipe stays full until it passes */
    n = read(*fd, w + EX_HDR, EX_READ_CHUNK);
    if (n > 0) {
      ex_hdr_put(w, type, (size_t)n);
      c->out_len += EX_HDR + (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(fd);
  }
}

/* Collects the exit of every exec command that has exited. Each is waited
 * for by its own pid, so the script's child is left to child_reap(). */
static void ex_reap(int64_t now) {
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];
    pid_t r;
    int st;

    if (c->pid <= 0 || c->exited)
      continue;
    do
      r = waitpid(c->pid, &st, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0)
      continue;
    c->exited = true;
    c->wait_status = r < 0 ? -1 : st;
    c->drain_until_ms = now + EX_DRAIN_MS;
    if (c->state == EX_ORPHAN) {
      /* What the command left in its group goes with it. */
      kill(-c->pid, SIGKILL);
      c->kill_at_ms = INT64_MAX;
    }
  }
}

/* Moves c on by the clock and by what it has seen: SIGKILL when due, the
 * hello's timeout, the X once the command has exited and its output is
 * drained. */
static void ex_step(struct ex_conn *c, int64_t now) {
  if (c->kill_at_ms <= now) {
    if (c->pid > 0 && !c->exited) {
      LOG(LOG_WARN, "exec from %s: %s still runs %d s after SIGTERM; sending SIGKILL", c->peer,
          c->name, EX_KILL_GRACE_MS / 1000);
      kill(-c->pid, SIGKILL);
    }
    c->kill_at_ms = INT64_MAX;
  }
  switch (c->state) {
  case EX_HELLO:
    if (now >= c->deadline_ms)
      ex_refuse(c, 126, "no hello within 10 s", now);
    break;
  case EX_RUNNING:
    if (c->exited && ((c->out_fd < 0 && c->err_fd < 0) || now >= c->drain_until_ms)) {
      int ws = c->wait_status;
      int code = ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
      int sig = ws >= 0 && WIFSIGNALED(ws) ? WTERMSIG(ws) : -1;
      const char *error = ws < 0 ? "muster-workerd lost track of the command" : c->stop_error;

      if (code >= 0)
        LOG(LOG_INFO, "exec from %s: %s exited with code %d", c->peer, c->name, code);
      else if (sig >= 0)
        LOG(LOG_INFO, "exec from %s: %s was killed by signal %d", c->peer, c->name, sig);
      ex_finish(c, code, sig, error, now);
    }
    break;
  case EX_CLOSING:
  case EX_ORPHAN:
    break;
  }
}

/* Sends what c has queued; in EX_CLOSING, once all is sent, shuts our side
 * down and releases the socket when the client has closed its side too, or
 * when it has not for too long. */
static void ex_send(struct ex_conn *c, int64_t now) {
  if (c->sock < 0)
    return;
  if (c->out_len > 0 && ex_flush(c, now) != 0) {
    if (c->state == EX_CLOSING)
      ex_sock_release(c);
    else
      ex_disconnect(c, "the connection broke", now);
    return;
  }
  if (c->state != EX_CLOSING)
    return;
  if (c->out_len == 0 && !c->shut) {
    /* Our FIN follows the X; the client answers with its close. */
    shutdown(c->sock, SHUT_WR);
    c->shut = true;
    c->deadline_ms = now + EX_LINGER_MS;
  }
  if ((c->shut && c->peer_eof) || now >= c->deadline_ms)
    ex_sock_release(c);
}

/* True when c is over and may be freed: its socket is released and its
 * command, if it had one, reaped (and, for an orphan, its group killed). */
static bool ex_over(const struct ex_conn *c) {
  if (c->sock >= 0)
    return false;
  if (c->state == EX_ORPHAN)
    return c->pid <= 0 || (c->exited && c->kill_at_ms == INT64_MAX);
  return c->pid <= 0 || c->exited;
}

/* Frees c, which must be over (ex_over()) or be given up on. */
static void ex_conn_free(struct ex_conn *c) {
  if (!c)
    return;
  ex_sock_release(c);
  ex_pipes_close(c);
  free(c);
}

/* Refuses a connection that gets no record (even the spare ones are taken,
 * or out of memory), best effort and without blocking: X, our FIN, and what
 * the client sent is read, so that the close is less likely to turn into a
 * reset. */
static void ex_refuse_now(int fd, const char *error) {
  char *x = ex_exit_json(126, -1, error);
  unsigned char buf[4096];

  if (x) {
    size_t len = strlen(x);
    unsigned char frame[EX_HDR + 256];

    if (len <= sizeof(frame) - EX_HDR) {
      ex_hdr_put(frame, 'X', len);
      memcpy(frame + EX_HDR, x, len);
      (void)!send(fd, frame, EX_HDR + len, MSG_NOSIGNAL);
    }
    free(x);
  }
  shutdown(fd, SHUT_WR);
  while (recv(fd, buf, sizeof(buf), 0) > 0)
    ;
  close(fd);
}

/* Accepts the connections waiting on the exec socket. */
static void ex_accept(int64_t now) {
  for (int i = 0; i < EX_READS_PER_WAKE; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN], port[8];
    struct ex_conn *c;
    int one = 1;
    int fd = accept4(wd.listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        LOG(LOG_WARN, "cannot accept an exec connection: %s", strerror(errno));
        ex.accept_after_ms = now + 100; /* else the waiting one spins the loop */
      }
      return;
    }
    if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      snprintf(host, sizeof(host), "?");
      snprintf(port, sizeof(port), "?");
    }
    if (ex.n == EX_CONN_MAX + EX_SPARE) {
      LOG(LOG_WARN, "exec from %s:%s refused: too many connections", host, port);
      ex_refuse_now(fd, ex.stopping ? "this worker is stopping"
                                    : "this worker serves too many exec connections");
      continue;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
      ex_refuse_now(fd, "muster-workerd is out of memory");
      continue;
    }
    /* Frames are small and interactive (orted's control traffic); and a
     * client whose machine vanished is noticed within about two minutes. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    {
      int idle = 60, intvl = 10, cnt = 6;
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    }
    c->sock = fd;
    c->stdin_fd = c->out_fd = c->err_fd = -1;
    c->at_sock = c->at_in = c->at_out = c->at_err = -1;
    c->state = EX_HELLO;
    c->deadline_ms = now + EX_HELLO_MS;
    c->kill_at_ms = INT64_MAX;
    c->wait_status = -1;
    snprintf(c->peer, sizeof(c->peer), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
    snprintf(c->name, sizeof(c->name), "(no command yet)");
    ex.conns[ex.n++] = c;
    LOG(LOG_DEBUG, "exec connection from %s", c->peer);
    if (ex.stopping) {
      ex_refuse(c, 126, "this worker is stopping", now);
    } else {
      size_t busy = 0;

      /* Refusals on their way out do not count: they hold no command. */
      for (size_t k = 0; k < ex.n; k++)
        busy += ex.conns[k]->state != EX_CLOSING || ex.conns[k]->pid > 0;
      if (busy > EX_CONN_MAX)
        ex_refuse(c, 126, "this worker serves too many exec connections (64)", now);
    }
  }
}

/* workerd is ending: every exec command's group gets SIGTERM (SIGKILL 2 s
 * later), its client gets the X with error sentence, waiting hellos are
 * refused, and new connections will be. */
static void ex_stop_all(int64_t now) {
  ex.stopping = true;
  ex.stop_deadline_ms = now + EX_STOP_MS;
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    if (c->state == EX_HELLO) {
      ex_refuse(c, 126, "this worker is stopping", now);
    } else if (c->state == EX_RUNNING && !c->exited) {
      LOG(LOG_INFO, "exec from %s: the worker is stopping; terminating %s", c->peer, c->name);
      c->stop_error = "the worker stopped while the command ran";
      ex_signal(c, SIGTERM);
      c->kill_at_ms = now + EX_KILL_GRACE_MS;
    }
  }
}

/* The earliest deadline among the exec connections, or INT64_MAX. */
static int64_t ex_next_deadline(void) {
  int64_t next = ex.accept_after_ms > 0 ? ex.accept_after_ms : INT64_MAX;

  if (ex.stopping && ex.n > 0 && ex.stop_deadline_ms < next)
    next = ex.stop_deadline_ms;
  for (size_t i = 0; i < ex.n; i++) {
    const struct ex_conn *c = ex.conns[i];

    if (c->kill_at_ms < next)
      next = c->kill_at_ms;
    if ((c->state == EX_HELLO || (c->state == EX_CLOSING && c->sock >= 0)) && c->deadline_ms < next)
      next = c->deadline_ms;
    if (c->state == EX_RUNNING && c->exited && c->drain_until_ms < next)
      next = c->drain_until_ms;
  }
  return next;
}

/* Adds the exec socket and every connection's descriptors to p (n entries
 * so far; room for EX_POLL_MAX more), noting where each went. */
static void ex_poll_add(struct pollfd *p, int *n, int64_t now) {
  ex.at_listen = -1;
  if (now >= ex.accept_after_ms)
    ex.accept_after_ms = 0;
  if (wd.listen_fd >= 0 && ex.accept_after_ms == 0) {
    ex.at_listen = *n;
    p[(*n)++] = (struct pollfd){.fd = wd.listen_fd, .events = POLLIN};
  }
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    c->at_sock = c->at_in = c->at_out = c->at_err = -1;
    if (c->sock >= 0) {
      short ev = POLLRDHUP;

      if (c->state == EX_HELLO || c->state == EX_CLOSING || (c->state == EX_RUNNING && !c->pend))
        ev |= POLLIN;
      if (c->out_len > 0)
        ev |= POLLOUT;
      c->at_sock = *n;
      p[(*n)++] = (struct pollfd){.fd = c->sock, .events = ev};
    }
    if (c->state != EX_RUNNING)
      continue;
    if (c->stdin_fd >= 0 && c->pend) {
      c->at_in = *n;
      p[(*n)++] = (struct pollfd){.fd = c->stdin_fd, .events = POLLOUT};
    }
    if (c->out_len < EX_OUT_HIGH) {
      if (c->out_fd >= 0) {
        c->at_out = *n;
        p[(*n)++] = (struct pollfd){.fd = c->out_fd, .events = POLLIN};
      }
      if (c->err_fd >= 0) {
        c->at_err = *n;
        p[(*n)++] = (struct pollfd){.fd = c->err_fd, .events = POLLIN};
      }
    }
  }
}

/* Handles what poll() reported for the exec channel (reaping is separate:
 * ex_reap() on SIGCHLD), then moves every connection on and frees those that
 * are over. */
static void ex_poll_handle(const struct pollfd *p, int64_t now) {
  size_t kept = 0;

  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    /* The command's output before the client's input, so that an X decided
     * below comes after all that was read. */
    if (c->at_out >= 0 && p[c->at_out].revents && c->state == EX_RUNNING)
      ex_pipe_read(c, &c->out_fd, 'O');
    if (c->at_err >= 0 && p[c->at_err].revents && c->state == EX_RUNNING)
      ex_pipe_read(c, &c->err_fd, 'E');
    if (c->at_in >= 0 && p[c->at_in].revents && c->state == EX_RUNNING)
      ex_stdin_write(c);
    if (c->at_sock >= 0 && c->sock >= 0) {
      short rev = p[c->at_sock].revents;

      if (c->state == EX_RUNNING && c->pend && (rev & (POLLRDHUP | POLLHUP | POLLERR)))
        ex_disconnect(c, "the client closed the connection", now);
      else if (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))
        ex_sock_read(c, now);
    }
  }
  if (ex.at_listen >= 0 && p[ex.at_listen].revents)
    ex_accept(now);
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    /* Frames queued above or by ex_step go out now, not a round later. */
    ex_step(c, now);
    ex_send(c, now);
    if (ex_over(c)) {
      LOG(LOG_DEBUG, "exec from %s: connection over", c->peer);
      ex_conn_free(c);
      continue;
    }
    ex.conns[kept++] = c;
  }
  ex.n = kept;
}

/* True when workerd may end as far as the exec channel is concerned: no
 * connection left, or the stop has waited long enough. */
static bool ex_done(int64_t now) {
  return ex.n == 0 || now >= ex.stop_deadline_ms;
}

/* Ends the exec channel for good: what still runs is killed with its group
 * and reaped, every connection closed. Safe to call more than once. */
static void ex_cleanup(void) {
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    if (c->pid > 0 && !c->exited) {
      kill(-c->pid, SIGKILL);
      while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    }
    ex_conn_free(c);
  }
  ex.n = 0;
}

/* ------------------------------------------------------------------------ */
/* Heartbeats and the main loop                                             */

/* Sends one heartbeat and acts on the answer: a stop, or an answer saying
 * that the controller no longer knows this worker, starts stopping. A
 * controller that cannot be reached is not an error: the next interval tries
 * again, and succeeding is all it takes to re-attach. */
static void heartbeat(void) {
  json_t *ans = NULL;
  json_t *stop;
  long status;
  int rc = http_post("heartbeat", true, "{}", 2, &status);

  if (rc == MUSTER_E_UNREACHABLE || (rc == 0 && status >= 500)) {
    int64_t now = util_mono_ms();
    if (rc == MUSTER_E_UNREACHABLE && now - wd.last_contact_ms > wd.orphan_ms) {
      LOG(LOG_ERROR,
          "no answer from the controller for %" PRId64 " s (MUSTER_ORPHAN_TIMEOUT); "
          "ending this worker",
          (now - wd.last_contact_ms) / 1000);
      stop_begin(FINISH_SILENT, 0, now);
      goto out;
    }
    LOG(LOG_DEBUG, "heartbeat not delivered (%s); next one in %" PRId64 " ms",
        rc ? "unreachable" : "server error", wd.hb_interval_ms);
    goto out;
  }
  if (rc) {
    LOG(LOG_WARN, "heartbeat failed: %s", muster_strerror(rc));
    goto out;
  }
  if (status == 401 || status == 403 || status == 404 || status == 409) {
    LOG(LOG_INFO, "the controller no longer runs this worker (HTTP %ld); stopping", status);
    stop_begin(FINISH_SILENT, 0, util_mono_ms());
    goto out;
  }
  if (status != 200) {
    LOG(LOG_WARN, "unexpected HTTP %ld to a heartbeat", status);
    goto out;
  }
  ans = json_loadb(wd.answer, wd.answer_len, 0, NULL);
  stop = json_object_get(ans, "stop");
  if (!json_is_boolean(stop)) {
    LOG(LOG_WARN, "the heartbeat answer has no boolean \"stop\"");
    goto out;
  }
  LOG(LOG_DEBUG, "heartbeat delivered");
  if (json_is_true(stop)) {
    LOG(LOG_INFO, "the controller asked this worker to stop");
    stop_begin(FINISH_QUIET, 0, util_mono_ms());
  }
out:
  json_decref(ans);
}

/* The earlier of two deadlines. */
static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* Runs until the worker must end: the command has exited and its pipes are
 * drained (or 2 s have passed), or an idle worker was told to stop; then the
 * exec channel is wound down (its commands killed, for at most 5 s). Reads
 * the pipes, ships logs, heartbeats, serves exec, and turns signals into
 * stop decisions.
 * Returns 0, or MUSTER_E_IO if poll() itself failed. */
__attribute__((warn_unused_result)) static int main_loop(void) {
  int rc = 0;

  for (;;) {
    struct pollfd p[3 + EX_POLL_MAX];
    int nfds = 0, at_out = -1, at_err = -1;
    int64_t now = util_mono_ms();
    int64_t next = INT64_MAX;
    int timeout;
    bool child = false;
    int term = 0;

    /* The worker's own end (an idle worker told to stop, a script that
     * exited and was drained) waits for the exec channel to wind down:
     * its commands are killed, their clients told, for at most 5 s. */
    if (!wd.ending && (wd.finish || (wd.child_done && ((wd.out.fd < 0 && wd.err.fd < 0) ||
                                                       now >= wd.drain_until_ms)))) {
      wd.ending = true;
      fd_close(&wd.out.fd);
      fd_close(&wd.err.fd);
    }
    if ((wd.ending || wd.stopping) && !ex.stopping)
      ex_stop_all(now);
    if (wd.ending && ex_done(now))
      break;
    if (wd.stopping && !wd.child_done && now >= wd.kill_at_ms) {
      LOG(LOG_WARN, "the command is still running %d s after SIGTERM; sending SIGKILL",
          WD_KILL_GRACE_MS / 1000);
      kill(wd.child, SIGKILL);
      wd.kill_at_ms = INT64_MAX;
    }
    if (!wd.stopping && !wd.child_done && !wd.ending && now >= wd.next_hb_ms) {
      heartbeat();
      wd.next_hb_ms = util_mono_ms() + wd.hb_interval_ms;
      continue; /* the call took time, and may have decided a stop */
    }
    streams_flush_due(now);

    if (!wd.stopping && !wd.child_done && !wd.ending)
      next = min64(next, wd.next_hb_ms);
    if (wd.stopping && !wd.child_done)
      next = min64(next, wd.kill_at_ms);
    if (wd.child_done && !wd.ending)
      next = min64(next, wd.drain_until_ms);
    next = min64(next, ex_next_deadline());
    if (wd.out.ring)
      next = min64(next, stream_deadline(&wd.out));
    if (wd.err.ring)
      next = min64(next, stream_deadline(&wd.err));
    now = util_mono_ms();
    timeout = next == INT64_MAX ? -1 : next <= now ? 0 : (int)min64(next - now, INT_MAX);

    p[nfds++] = (struct pollfd){.fd = wd.sig_read_fd, .events = POLLIN};
    if (wd.out.fd >= 0) {
      at_out = nfds;
      p[nfds++] = (struct pollfd){.fd = wd.out.fd, .events = POLLIN};
    }
    if (wd.err.fd >= 0) {
      at_err = nfds;
      p[nfds++] = (struct pollfd){.fd = wd.err.fd, .events = POLLIN};
    }
    ex_poll_add(p, &nfds, now);
    if (poll(p, (nfds_t)nfds, timeout) < 0) {
      if (errno == EINTR)
        continue;
      LOG(LOG_ERROR, "poll: %s", strerror(errno));
      rc = MUSTER_E_IO;
      break;
    }
    now = util_mono_ms();
    /* Pipes before SIGCHLD, so the drain window starts after what is here. */
    if (at_out >= 0 && p[at_out].revents)
      stream_read(&wd.out, now);
    if (at_err >= 0 && p[at_err].revents)
      stream_read(&wd.err, now);
    if (p[0].revents) {
      signals_take(&child, &term);
      if (child) {
        child_reap(now);
        ex_reap(now);
      }
      if (term) {
        LOG(LOG_INFO, "received %s; stopping", term == SIGTERM ? "SIGTERM" : "SIGINT");
        stop_begin(FINISH_REPORT, term, now);
      }
    }
    ex_poll_handle(p, now);
  }
  fd_close(&wd.out.fd);
  fd_close(&wd.err.fd);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The end                                                                  */

/* Builds the exit report: exit code, or signal, and the reason the command
 * could not start if that is what happened. Returns a new string (free()),
 * or NULL if out of memory. */
static char *exit_body(void) {
  json_t *o = json_object();
  json_t *code = NULL, *sig = NULL, *reason = NULL;
  char *s = NULL;

  if (!o)
    goto out;
  if (wd.child_done && wd.wait_status >= 0 && WIFEXITED(wd.wait_status))
    code = json_integer(WEXITSTATUS(wd.wait_status));
  else if (wd.child_done && wd.wait_status >= 0 && WIFSIGNALED(wd.wait_status))
    sig = json_integer(WTERMSIG(wd.wait_status));
  else if (!wd.child_done && wd.stop_signal)
    sig = json_integer(wd.stop_signal); /* an idle worker killed by a signal */
  reason = wd.reason[0] ? json_string(wd.reason) : json_null();
  if (json_object_set_new(o, "exit_code", code ? code : json_null()) != 0 ||
      json_object_set_new(o, "signal", sig ? sig : json_null()) != 0 ||
      json_object_set_new(o, "reason", reason) != 0)
    goto out;
  s = json_dumps(o, JSON_COMPACT);
out:
  json_decref(o);
  return s;
}

/* Ends the worker as wd.mode says. For FINISH_REPORT it ships the remaining
 * logs and then reports the exit, retrying both with backoff for 10 minutes
 * (a 4xx to the report means the controller already considers the worker
 * finished). Returns 0, MUSTER_E_TIMEOUT (logged) or MUSTER_E_NOMEM. */
__attribute__((warn_unused_result)) static int finish(void) {
  struct backoff b;
  char *body = NULL;
  long status;
  int rc = 0;

  if (wd.mode == FINISH_SILENT)
    goto out;
  if (wd.mode == FINISH_QUIET) {
    /* One try: the controller stopped this worker and may refuse logs now. */
    if (streams_flush_all() != 0)
      LOG(LOG_INFO, "the last output of the command could not be shipped");
    goto out;
  }
  body = exit_body();
  if (!body) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  backoff_init(&b);
  /* A worker ended by SIGTERM is most often being stopped by the controller,
   * which knows the outcome already: a short try is enough. The long one is
   * for a command that ended by itself, whose result must not be lost. */
  if (wd.stop_signal)
    b.give_up_ms = util_mono_ms() + 10 * 1000;
  for (;;) {
    if (streams_flush_all() == 0) {
      rc = http_post("exit", true, body, strlen(body), &status);
      if (rc == 0 && status >= 200 && status < 300) {
        LOG(LOG_INFO, "reported the exit: %s", body);
        break;
      }
      if (rc == 0 && status < 500) {
        LOG(LOG_INFO, "the controller already considers this worker finished (HTTP %ld)", status);
        break;
      }
    }
    rc = backoff_wait(&b, false);
    if (rc) {
      LOG(LOG_ERROR, "could not report the exit in time; giving up");
      goto out;
    }
  }
  rc = 0;
out:
  free(body);
  return rc;
}

/* Ends what the command left behind in our process group (say, a daemonised
 * grandchild that still holds its pipes): the worker ends with workerd, as a
 * container ends with its first process. Only when workerd leads the group,
 * as the backend's setsid() makes it; otherwise the group belongs to whoever
 * started us (a shell, a test) and is not ours to signal. */
static void group_terminate(void) {
  struct sigaction ign;

  if (wd.child <= 0 || getpgrp() != getpid())
    return;
  memset(&ign, 0, sizeof(ign));
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGTERM, &ign, NULL);
  kill(0, SIGTERM);
}

/* Frees everything in wd and closes its descriptors, so that sanitizer runs
 * see no leaks. */
static void cleanup(void) {
  ex_cleanup();
  http_cleanup();
  strv_free(wd.argv);
  strv_free(wd.envp);
  free(wd.cwd);
  if (wd.exec_token) {
    explicit_bzero(wd.exec_token, strlen(wd.exec_token));
    free(wd.exec_token);
    wd.exec_token = NULL;
  }
  free(wd.out.ring);
  free(wd.err.ring);
  fd_close(&wd.out.fd);
  fd_close(&wd.err.fd);
  fd_close(&wd.listen_fd);
  explicit_bzero(wd.token, sizeof(wd.token));
}

/* Runs one worker: reads its configuration from the environment, registers,
 * runs its command and reports how it ended. curl_global_init() must have
 * been called. Returns the process's exit code. */
static int worker_main(void) {
  int code = 1;
  int rc;

  std_fds_ensure();
  log_level_from_env();
  wd.listen_fd = wd.sig_read_fd = -1;
  wd.out = (struct stream){.name = "stdout", .fd = -1};
  wd.err = (struct stream){.name = "stderr", .fd = -1};
  wd.controller_up = true;
  wd.mode = FINISH_REPORT;
  wd.kill_at_ms = INT64_MAX;
  wd.logs_backoff_ms = WD_RETRY_FIRST_MS;

  rc = config_load();
  if (rc == 0)
    rc = signals_install();
  if (rc == 0)
    rc = http_init();
  if (rc)
    goto out;
  if (!wd.ip[0]) {
    struct backoff b;

    /* The host's name or route may not be there yet on a node that is still
     * coming up; that is worth the same patience as the controller itself. */
    backoff_init(&b);
    while ((rc = ip_toward_controller(wd.ip, sizeof(wd.ip))) == MUSTER_E_UNREACHABLE) {
      rc = backoff_wait(&b, true);
      if (rc)
        break;
    }
    if (rc == MUSTER_E_SHUTTING_DOWN)
      code = 0;
    if (rc)
      goto out;
  }
  rc = exec_listen();
  if (rc)
    goto out;
  LOG(LOG_INFO, "worker %s on %s, exec port %d, controller %s", wd.id, wd.ip, wd.exec_port, wd.url);

  rc = register_worker();
  if (rc == MUSTER_E_SHUTTING_DOWN) {
    LOG(LOG_INFO, "stopped before registering");
    code = 0;
  }
  if (rc)
    goto out;
  if (wd.argv)
    LOG(LOG_INFO, "registered; running \"%s\" with %zu more arguments", wd.argv[0], wd.argc - 1);
  else
    LOG(LOG_INFO, "registered as an idle worker");
  wd.next_hb_ms = util_mono_ms() + wd.hb_interval_ms;

  if (wd.argv && command_start() != 0)
    wd.finish = true; /* reported below, with wd.reason */
  rc = main_loop();
  if (rc) {
    /* Never leave the command running without anyone to watch it. */
    if (wd.child > 0 && !wd.child_done)
      kill(wd.child, SIGKILL);
    goto out;
  }
  rc = finish();
  if (rc == 0)
    code = 0;
out:
  group_terminate();
  cleanup();
  return code;
}

/* ------------------------------------------------------------------------ */
/* Fork server                                                              */

/* Starts one worker from a request of the controller's local backend: req
 * holds n bytes of NUL-terminated "NAME=value" strings, the worker's
 * settings, and MUSTER_LOG_FILE, where its output goes. The worker is
 * forked twice so that it is not our child: its parent exits at once and
 * the controller, a child subreaper, adopts it and reaps it, exactly as if
 * it had started it itself. Returns the worker's pid or -errno. */
static pid_t zygote_fork(int sock, char *req, size_t n) {
  int pfd[2];
  pid_t mid, pid = -EAGAIN;
  ssize_t got;

  if (pipe2(pfd, O_CLOEXEC) != 0)
    return -errno;
  mid = fork();
  if (mid < 0) {
    int e = errno;
    close(pfd[0]);
    close(pfd[1]);
    return -e;
  }
  if (mid == 0) {
    pid_t w;

    /* Reaped by the kernel is right for this middle process, not for its
     * child: a worker that died before this process exits must stay a
     * zombie for the controller to reap and see. */
    signal(SIGCHLD, SIG_DFL);
    close(sock);
    close(pfd[0]);
    w = fork();
    if (w == 0) {
      const char *logfile = NULL;
      int fd;

      /* The fork server ignores SIGCHLD (its children are reaped by the
       * kernel); a worker must not: it waits for its script. */
      signal(SIGCHLD, SIG_DFL);

      close(pfd[1]);
      setsid();
      for (size_t off = 0; off < n;) {
        char *kv = req + off;
        size_t len = strnlen(kv, n - off);
        char *eq = memchr(kv, '=', len);

        /* req[n] is NUL, so the last string is terminated too. */
        off += len + 1;
        if (!eq)
          continue;
        *eq = '\0';
        if (strcmp(kv, "MUSTER_LOG_FILE") == 0)
          logfile = eq + 1;
        else
          setenv(kv, eq + 1, 1);
      }
      fd = open("/dev/null", O_RDONLY);
      if (fd >= 0 && fd != 0) {
        dup2(fd, 0);
        close(fd);
      }
      fd = logfile ? open(logfile, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2)
          close(fd);
      }
      _exit(worker_main());
    }
    if (w < 0)
      w = -errno;
    if (write(pfd[1], &w, sizeof(w)) != (ssize_t)sizeof(w))
      _exit(1);
    _exit(0);
  }
  close(pfd[1]);
  /* The answer comes as soon as the middle process has forked; it exits
   * right after and the kernel reaps it (SIGCHLD is ignored here), so the
   * next request need not wait for that. */
  while ((got = read(pfd[0], &pid, sizeof(pid))) < 0 && errno == EINTR)
    ;
  close(pfd[0]);
  return got == (ssize_t)sizeof(pid) ? pid : -EIO;
}

/* muster-workerd --zygote: a fork server for the controller's local
 * backend. Loading libcurl and its dozens of libraries costs several
 * milliseconds of CPU per exec; forked from this warm process, a worker
 * starts in a fraction of that. Requests come as datagrams on fd 3 (a
 * SOCK_SEQPACKET socket); each gets the pid (or -errno) back. It ends when
 * the controller closes the socket; the workers it started live on. */
static int zygote_main(void) {
  char req[16384];
  int sock = 3;

  pid_t hello = 0;

  signal(SIGPIPE, SIG_IGN);
  /* The middle processes of zygote_fork() are reaped by the kernel. */
  signal(SIGCHLD, SIG_IGN);
  /* Says it is ready (and is a fork server at all). */
  if (send(sock, &hello, sizeof(hello), MSG_NOSIGNAL) < 0)
    return 1;
  for (;;) {
    ssize_t n = recv(sock, req, sizeof(req) - 1, 0);
    pid_t pid;

    if (n == 0)
      return 0;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno == ECONNRESET ? 0 : 1;
    }
    req[n] = '\0';
    pid = zygote_fork(sock, req, (size_t)n);
    if (send(sock, &pid, sizeof(pid), MSG_NOSIGNAL) < 0)
      return 0;
  }
}

int main(int argc, char **argv) {
  int code;

  log_set_program("muster-workerd");
  if (argc == 2 && strcmp(argv[1], "--version") == 0) {
    printf("muster-workerd %s\n", MUSTER_VERSION);
    return 0;
  }
  if (argc > 2 || (argc == 2 && strcmp(argv[1], "--zygote") != 0)) {
    fprintf(stderr,
            "usage: muster-workerd [--zygote]\n"
            "Started by the muster controller's backend, configured by MUSTER_CONTROLLER_URL,\n"
            "MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN and optionally MUSTER_BIND_IP.\n"
            "--zygote serves the local backend as a fork server on fd 3.\n");
    return 2;
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    LOG(LOG_ERROR, "cannot initialise libcurl");
    return 1;
  }
  code = argc == 2 ? zygote_main() : worker_main();
  curl_global_cleanup();
  return code;
}

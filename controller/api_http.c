/* api_http.c: the REST API's plumbing on libmicrohttpd: the request life
 * cycle, the authentication of client calls, and the router, which walks
 * the route tables that the handler files register (api_routes.c) and
 * calls no handler by name. See api.h and api_internal.h. */
#include "api_internal.h"

#include "api_guard.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "network.h"
#include "state.h"
#include "users.h"
#include "util.h"
#include "validate.h"
#include "wcache.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* The API's daemons: [0] on --listen's address; [1], in bridge mode, on
 * the bridge's gateway address, where workers in their own network
 * namespaces reach the controller (unless --listen's address is every
 * address, which holds it already). The same handlers serve both. */
static struct MHD_Daemon *daemons[2];
static int listen_fds[2] = {-1, -1}; /* bound by api_bind(), served by api_start() */

/* ---- authentication ---- */

/* Whether t is a client token, and whose (users.h): the state directory's
 * (the bootstrap administrator), or a user's, found by its prefix and
 * checked by its hash in constant time. */
static int token_user(const char *t, struct user_id *who) {
  char prefix[USER_PREFIX_LEN + 1], sha[65];
  struct db_user u;
  struct reader *rd;
  int rc, ok;

  memset(who, 0, sizeof(*who));
  if (!t)
    return 0;
  if (util_secret_equal(t, g.api_token)) {
    who->admin = 1;
    return 1;
  }
  if (!user_token_parts(t, prefix, sha))
    return 0;
  rd = api_reader_get();
  rc = db_user_by_prefix(rd->db, prefix, &u);
  api_reader_put(rd);
  ok = rc == 0 && util_secret_equal(sha, u.token_sha256);
  if (ok) {
    snprintf(who->name, sizeof(who->name), "%s", u.name);
    who->admin = u.admin;
  }
  explicit_bzero(&u, sizeof(u));
  return ok;
}

/* 1 if the request carries a client token (who: whose). GET /api/v1/events
 * also takes it as the query parameter access_token=<token>: a browser's
 * EventSource cannot set an Authorization header. */
static int client_ok(struct MHD_Connection *c, const char *url, const char *method,
                     struct user_id *who) {
  if (token_user(api_bearer(c), who))
    return 1;
  if (strcmp(url, "/api/v1/events") != 0 || strcmp(method, "GET") != 0)
    return 0;
  return token_user(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token"), who);
}

/* ---- routing ---- */

/* Matches url against pattern. Returns 1 if it matches, with the {id} or
 * {name} segment copied to arg (arg_ok 0 if an {id} segment is not a
 * worker id); 0 if not. */
static int path_match(const char *pattern, const char *url, char *arg, size_t arglen, int *arg_ok) {
  *arg_ok = 1;
  arg[0] = '\0';
  while (*pattern && *url) {
    if (*pattern == '{') {
      const char *close = strchr(pattern, '}');
      size_t n = strcspn(url, "/");
      int is_id = strncmp(pattern, "{id}", 4) == 0;

      /* A session's stored name may be a user's, "USER/name": two
       * segments, where the rest of the pattern matches after them. */
      if (close && n && strncmp(pattern, "{session}", 9) == 0 && url[n] == '/') {
        size_t m = strcspn(url + n + 1, "/");
        char rest_arg[80];
        int rest_ok;
        if (m && !path_match(close + 1, url + n, rest_arg, sizeof(rest_arg), &rest_ok) &&
            path_match(close + 1, url + n + 1 + m, rest_arg, sizeof(rest_arg), &rest_ok))
          n += 1 + m;
      }
      if (!close || n == 0)
        return 0;
      snprintf(arg, arglen, "%.*s", (int)(n < arglen ? n : arglen - 1), url);
      if (n >= arglen || (is_id && !validate_worker_id(arg)))
        *arg_ok = 0;
      pattern = close + 1;
      url += n;
      continue;
    }
    if (*pattern != *url)
      return 0;
    pattern++;
    url++;
  }
  return *pattern == '\0' && *url == '\0';
}

/* The methods a route may have, in the order a 405's "use ..." names them
 * (whatever the order of the tables). */
static const char *const methods[] = {"POST", "PUT", "GET", "DELETE"};
#define NMETHODS ((int)(sizeof(methods) / sizeof(methods[0])))

/* Adds method to the set *allowed of methods that the path takes. */
static void allow(unsigned *allowed, const char *method) {
  for (int k = 0; k < NMETHODS; k++)
    if (strcmp(methods[k], method) == 0)
      *allowed |= 1u << k;
}

/* Writes the set allowed as "POST or GET or DELETE". */
static void allowed_text(unsigned allowed, char *buf, size_t size) {
  buf[0] = '\0';
  for (int k = 0; k < NMETHODS; k++)
    if (allowed & (1u << k))
      snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", buf[0] ? " or " : "", methods[k]);
}

/* Answers the request at once, from its head, with the error rc; *ret
 * gets libmicrohttpd's result. Returns 0 (nothing picked). */
static int answer(struct MHD_Connection *c, enum MHD_Result *ret, int rc, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int answer(struct MHD_Connection *c, enum MHD_Result *ret, int rc, const char *field,
                  const char *fmt, ...) {
  char msg[400];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  *ret = api_respond_error(c, rc, field, "%s", msg);
  return 0;
}

static const char need_token[] =
    "this call needs \"Authorization: Bearer <token>\" (the token is in the controller's state "
    "directory)";

/* Picks what answers the request from its head alone, before any byte of
 * its body is read: its route (rq->route, rq->arg) or the web UI's files
 * (rq->web), and the body it may send (rq->max_body). A token that does
 * not hold, a path or method that none takes, is answered at once (*ret):
 * nobody without a token makes the controller read, let alone keep, a
 * body. Returns 1 when picked, else 0. */
static int pick(struct MHD_Connection *c, struct req *rq, const char *url, const char *method,
                enum MHD_Result *ret) {
  char arg[SESSION_STORED_MAX], allowed[64];
  unsigned allowed_set = 0;
  int authed = -1;

  for (int pass = 0; pass < 2; pass++) {
    for (const struct api_route *const *t = api_route_tables; *t; t++) {
      for (const struct api_route *r = *t; r->method; r++) {
        int arg_ok, worker = r->auth == AUTH_WORKER || r->auth == AUTH_SECRET;

        /* Worker calls first, and only for a well-formed id: anything else
         * is a client's business. */
        if ((pass == 0) != worker)
          continue;
        if (!path_match(r->path, url, arg, sizeof(arg), &arg_ok))
          continue;
        if (worker && !arg_ok)
          continue;
        if (strcmp(r->method, method) != 0) {
          allow(&allowed_set, r->method);
          continue;
        }
        rq->max_body = API_MAX_BODY;
        /* A run's own token, else a client's that sees the run. */
        if (r->auth == AUTH_RUN && api_bearer(c) && r->check(c, arg) == 0) {
          api_guard_request(c, 1);
          rq->run_token = 1;
        } else if (r->auth == AUTH_CLIENT || r->auth == AUTH_RUN) {
          if (authed < 0)
            authed = client_ok(c, url, method, &rq->who);
          api_guard_request(c, authed);
          if (!authed)
            return answer(c, ret, MUSTER_E_UNAUTHORIZED, NULL, "%s",
                          api_bearer(c) ? "the bearer token is not valid" : need_token);
          /* (what a user who is no administrator sees is each handler's
           * business: api_scope.h) */
          if (!arg_ok)
            return answer(c, ret, MUSTER_E_NOT_FOUND, "id", "\"%.40s\" is not a worker id", arg);
        } else if (r->auth == AUTH_WORKER) {
          int rc = api_bearer(c) ? r->check(c, arg) : MUSTER_E_UNAUTHORIZED;

          api_guard_request(c, rc == 0);
          if (rc)
            return answer(c, ret, rc, NULL, "worker calls need that worker's own token");
        } else {
          /* A job's secret holds only with the body it comes with: the
           * connection stays one to close first, and the body is small. */
          api_guard_request(c, 0);
          if (r->auth == AUTH_SECRET && !api_bearer(c))
            return answer(c, ret, MUSTER_E_UNAUTHORIZED, NULL, "a claim needs its job's secret");
          rq->max_body = r->auth == AUTH_SECRET ? API_SECRET_BODY : 0;
        }
        rq->route = r;
        snprintf(rq->arg, sizeof(rq->arg), "%s", arg);
        return 1;
      }
    }
  }
  if (authed < 0)
    authed = client_ok(c, url, method, &rq->who);
  api_guard_request(c, authed);
  if (allowed_set) {
    allowed_text(allowed_set, allowed, sizeof(allowed));
    if (!authed)
      return answer(c, ret, MUSTER_E_UNAUTHORIZED, NULL, "the bearer token is not valid");
    return answer(c, ret, MUSTER_E_METHOD, NULL, "use %s", allowed);
  }
  /* Everything outside /api/ is the web UI's. */
  if (strncmp(url, "/api/", 5) != 0) {
    if (strcmp(method, "GET") != 0)
      return answer(c, ret, MUSTER_E_METHOD, NULL, "use GET");
    rq->web = 1;
    rq->max_body = 0;
    return 1;
  }
  if (!authed)
    return answer(c, ret, MUSTER_E_UNAUTHORIZED, NULL, "%s",
                  api_bearer(c) ? "the bearer token is not valid" : need_token);
  return answer(c, ret, MUSTER_E_NOT_FOUND, NULL, "no such endpoint: %s %.200s", method, url);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  struct req *rq = *con_cls;
  enum MHD_Result ret = MHD_NO;

  (void)cls;
  (void)version;
  if (!rq) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    long n;

    rq = calloc(1, sizeof(*rq));
    if (!rq)
      return MHD_NO;
    *con_cls = rq;
    if (!pick(c, rq, url, method, &ret))
      return ret;
    /* Too large, said by its length: refused before a byte of it is read. */
    if (cl && util_parse_long(cl, 0, 0x7fffffffffffffffL, &n) == 0 && (size_t)n > rq->max_body) {
      rq->too_large = 1;
      if (rq->max_body == 0)
        return api_respond_error(c, MUSTER_E_TOO_LARGE, NULL, "%s %.200s takes no request body",
                                 method, url);
      return api_respond_error(c, MUSTER_E_TOO_LARGE, NULL,
                               "the request body is larger than %zu KiB, the most this call takes",
                               rq->max_body / 1024);
    }
    return MHD_YES;
  }
  if (*upload_size) {
    /* A body without a length (chunked) that outgrows its cap: nothing
     * more of it is read, and the connection ends. */
    if (rq->too_large || rq->len + *upload_size > rq->max_body)
      return MHD_NO;
    char *grown = realloc(rq->body, rq->len + *upload_size + 1);
    if (!grown)
      return MHD_NO;
    rq->body = grown;
    memcpy(rq->body + rq->len, upload, *upload_size);
    rq->len += *upload_size;
    rq->body[rq->len] = '\0';
    *upload_size = 0;
    return MHD_YES;
  }
  if (rq->resume)
    return rq->resume(c, rq);
  __atomic_add_fetch(&g.http_requests, 1, __ATOMIC_RELAXED);
  if (g.shutting_down && strcmp(url, "/api/v1/health") != 0)
    return api_respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
  if (rq->web)
    return api_web_fallback(c, rq, url);
  return rq->route->fn(c, rq, rq->arg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  struct req *rq = *con_cls;

  (void)cls;
  (void)c;
  (void)toe;
  if (!rq)
    return;
  if (rq->release)
    rq->release(rq);
  free(rq->body);
  free(rq);
  *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];

  (void)cls;
  vsnprintf(msg, sizeof(msg), fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  LOG(LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* Binds host:*port (port 0: a free one, written back) into *out. Returns 0
 * or an error with a sentence in err. */
static int bind_one(const char *host, const char *shown, const char *dev, int *port, int *out,
                    char *err, size_t errlen) {
  struct sockaddr_in addr;
  socklen_t len = sizeof(addr);
  int one = 1, fd;

  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)*port);
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    snprintf(err, errlen, "--listen: \"%s\" is not an IPv4 address", shown);
    return MUSTER_E_INVALID;
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "could not make a socket: %s", strerror(errno));
    return MUSTER_E_IO;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  /* The gateway's socket takes what comes in on the bridge only: Linux
   * accepts a packet for a local address on any link, and a host of the
   * LAN that routes the subnet through this one would reach it. */
  if (dev && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, (socklen_t)strlen(dev)) != 0) {
    snprintf(err, errlen, "could not tie the gateway's socket to %s: %s", dev, strerror(errno));
    close(fd);
    return MUSTER_E_IO;
  }
  /* Bound, not listening: until api_start(), a client is refused at once
   * rather than left waiting in the backlog. */
  if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
      getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
    snprintf(err, errlen, "could not listen on %s:%d: %s%s", host, *port, strerror(errno),
             errno == EADDRINUSE ? " (another muster-controller, or another program, has it)" : "");
    close(fd);
    return MUSTER_E_IO;
  }
  *port = ntohs(addr.sin_port);
  *out = fd;
  return 0;
}

/* --tls-cert's and --tls-key's PEM text, read at the start (NULL: plain
 * HTTP); libmicrohttpd reads them for as long as it serves. */
static char *tls_cert_pem, *tls_key_pem;

/* Reads the PEM file path (what: its option) into *out. Returns 0, or
 * MUSTER_E_INVALID with a sentence in err. */
static int read_pem(const char *path, const char *what, char **out, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  char *buf = NULL;
  size_t n = 0, cap = 0;

  if (!f) {
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
    return MUSTER_E_INVALID;
  }
  for (;;) {
    if (n + 4096 + 1 > cap) {
      char *grown = cap < (1u << 20) ? realloc(buf, cap ? 2 * cap : 8192) : NULL;
      if (!grown) {
        free(buf);
        fclose(f);
        snprintf(err, errlen, "%s %s: larger than 1 MiB, or out of memory", what, path);
        return MUSTER_E_INVALID;
      }
      buf = grown;
      cap = cap ? 2 * cap : 8192;
    }
    size_t k = fread(buf + n, 1, 4096, f);
    n += k;
    if (k == 0)
      break;
  }
  fclose(f);
  buf[n] = '\0';
  if (!strstr(buf, "-----BEGIN ")) {
    free(buf);
    snprintf(err, errlen, "%s %s: not a PEM file (no -----BEGIN line)", what, path);
    return MUSTER_E_INVALID;
  }
  *out = buf;
  return 0;
}

int api_bind(struct ctl_config *cfg, char *err, size_t errlen) {
  const char *host = cfg->listen_host;
  int rc;

  if (strcmp(host, "*") == 0 || host[0] == '\0')
    host = "0.0.0.0";
  if (strcmp(host, "localhost") == 0)
    host = "127.0.0.1";
  /* (read before anything else starts: a file that is not there stops the
   * controller before its restart's reconciliation) */
  if (cfg->tls_cert[0] && !tls_cert_pem &&
      ((rc = read_pem(cfg->tls_cert, "--tls-cert", &tls_cert_pem, err, errlen)) ||
       (rc = read_pem(cfg->tls_key, "--tls-key", &tls_key_pem, err, errlen))))
    return rc;
  rc = bind_one(host, cfg->listen_host, NULL, &cfg->port, &listen_fds[0], err, errlen);
  /* Workers in their own namespaces reach the controller at the gateway,
   * on the same port. */
  if (!rc && net_bridge() && strcmp(host, "0.0.0.0") != 0 && strcmp(host, net_gateway()) != 0)
    rc = bind_one(net_gateway(), net_gateway(), net_bridge_name(), &cfg->port, &listen_fds[1], err,
                  errlen);
  return rc;
}

/* Serves fd with a daemon of its own into *out; the fd is the daemon's
 * from here (libmicrohttpd closes it, even when it fails to start). */
static int serve_one(int fd, long max_connections, struct MHD_Daemon **out, char *err,
                     size_t errlen) {
  /* libmicrohttpd splits its limit among its threads, which take the
   * connections unevenly: each gets the whole, and the guard (api_guard.c)
   * keeps the total. */
  unsigned mhd_limit =
      (unsigned)((max_connections + 64) * (g.cfg.http_threads > 0 ? g.cfg.http_threads : 1));

  if (listen(fd, 4096) != 0) {
    snprintf(err, errlen, "could not listen on %s:%d: %s", g.cfg.listen_host, g.cfg.port,
             strerror(errno));
    close(fd);
    return MUSTER_E_IO;
  }
  /* (with TLS, the certificate and key come last: there, MHD_OPTION_END
   * ends the list when there are none) */
  *out = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
          (tls_cert_pem ? MHD_USE_TLS : 0),
      0, NULL, NULL, handle, NULL, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE,
      (unsigned)g.cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
      MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)GUARD_IDLE_S,
      MHD_OPTION_NOTIFY_CONNECTION, api_guard_notify, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
      NULL, tls_cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, tls_cert_pem,
      MHD_OPTION_HTTPS_MEM_KEY, tls_key_pem, MHD_OPTION_END);
  if (!*out) {
    snprintf(err, errlen, "could not serve on %s:%d%s", g.cfg.listen_host, g.cfg.port,
             tls_cert_pem ? " (does --tls-key hold the key of --tls-cert's certificate? "
                            "libmicrohttpd's words are above)"
                          : "");
    return MUSTER_E_IO;
  }
  return 0;
}

int api_start(char *err, size_t errlen) {
  long max_connections = GUARD_TOTAL_MAX;
  struct rlimit rl;
  int rc;

  if (listen_fds[0] < 0) {
    snprintf(err, errlen, "internal error: the API's socket is not bound (api_bind)");
    return MUSTER_E_INTERNAL;
  }
  rc = api_readers_open(err, errlen);
  if (rc)
    return rc;
  /* As many connections as the descriptors allow, less the database's,
   * the logs', the workers' pipes and the fork server's. */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    max_connections = rl.rlim_cur > 1024 ? (long)rl.rlim_cur - 512 : (long)rl.rlim_cur / 2;
  api_guard_init(max_connections);
  for (int i = 0; i < 2 && !rc; i++) {
    int fd = listen_fds[i];

    /* never closed twice: the daemon's from here */
    listen_fds[i] = -1;
    if (fd >= 0)
      rc = serve_one(fd, max_connections, &daemons[i], err, errlen);
  }
  return rc;
}

void api_stop(void) {
  for (int i = 0; i < 2; i++) {
    if (daemons[i])
      MHD_stop_daemon(daemons[i]); /* closes the socket it was given */
    else if (listen_fds[i] >= 0)
      close(listen_fds[i]);
    daemons[i] = NULL;
    listen_fds[i] = -1;
  }
  api_readers_close();
}

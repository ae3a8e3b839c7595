/*
 * http_target.c: where muster-workerd's HTTP client (http_client.c) finds
 * the controller and whom it trusts there: the controller's URL taken
 * apart, its addresses (an address as it is; a name looked up with glibc's
 * getaddrinfo_a() without blocking, kept a minute, older ones serving
 * while it is looked up again), and the TLS authorities (MUSTER_CA_FILE's,
 * or the system's), read once per process and again when the file
 * changes, which a worker forked from the fork server inherits.
 */
#include "http_client.h"

#include "log.h"
#include "muster_errors.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define HC_RESOLVE_KEEP_MS 60000 /* how long a name's addresses are kept */
#define HC_RESOLVE_RETRY_MS 1000 /* how long a failed lookup stands */
#define HC_CRED_OLD                                                                                \
  16 /* replaced credentials still in use (a worker has at                                         \
        most 10 sessions: 8 calls, 2 kept) */

/* The controller's addresses: one host per worker, resolved once (an
 * address) or every minute (a name). */
static struct {
  char host[HC_HOST_MAX];
  char port[8];
  struct addrinfo *ai;
  int64_t at_ms; /* when resolved; INT64_MAX: an address, kept for good */
  bool pending;
  int64_t started_ms; /* when the last lookup began */
  int64_t failed_ms;  /* when a failed lookup began (INT64_MIN: none)... */
  int failed_e;       /* ...and how */
  struct addrinfo hints;
  struct gaicb req;
} rs = {.failed_ms = INT64_MIN};

/* The TLS credentials (the authorities trusted), for the CA file they were
 * made from ("": the system's). Made once; a worker forked from the fork
 * server inherits them when its MUSTER_CA_FILE is the server's. */
static struct {
  gnutls_certificate_credentials_t cred;
  char ca[PATH_MAX];
  /* the file as it was read */
  ino_t ino;
  dev_t dev;
  off_t size;
  struct timespec mtime;
  int users;   /* sessions set up with cred (hc_tls_hold()) */
  bool warned; /* that the file could not be read, once */
  /* credentials replaced since, with the sessions that still use them */
  struct {
    gnutls_certificate_credentials_t cred;
    int users;
  } old[HC_CRED_OLD];
  int n_old;
} tc;

/* ------------------------------------------------------------------------ */
/* The URL, the addresses, the credentials                                  */

/* Takes url (http[s]://host[:port][/prefix]) apart into t. Returns 0 or
 * MUSTER_E_INVALID. */
int hc_target_parse(const char *url, struct hc_target *t) {
  const char *p, *host_end, *port = NULL, *path;
  size_t hn;

  memset(t, 0, sizeof(*t));
  if (strncmp(url, "http://", 7) == 0) {
    p = url + 7;
  } else if (strncmp(url, "https://", 8) == 0) {
    p = url + 8;
    t->tls = true;
  } else {
    return MUSTER_E_INVALID;
  }
  path = p + strcspn(p, "/?#");
  if (*path == '?' || *path == '#' || memchr(p, '@', (size_t)(path - p)))
    return MUSTER_E_INVALID; /* no query, fragment or user here */
  if (*p == '[') {
    host_end = memchr(p, ']', (size_t)(path - p));
    if (!host_end)
      return MUSTER_E_INVALID;
    hn = (size_t)(host_end - p - 1);
    memcpy(t->host, p + 1, hn < sizeof(t->host) ? hn : 0);
    host_end++;
  } else {
    host_end = memchr(p, ':', (size_t)(path - p));
    if (!host_end)
      host_end = path;
    hn = (size_t)(host_end - p);
    memcpy(t->host, p, hn < sizeof(t->host) ? hn : 0);
  }
  if (!hn || hn >= sizeof(t->host))
    return MUSTER_E_INVALID;
  for (const char *c = t->host; *c; c++)
    if (*c <= ' ' || *c == 0x7f || *c == '[' || *c == ']')
      return MUSTER_E_INVALID; /* (it goes into the Host: line) */
  if (*host_end == ':')
    port = host_end + 1;
  else if (host_end != path)
    return MUSTER_E_INVALID;
  if (port) {
    size_t pn = (size_t)(path - port);
    long v = 0;

    if (!pn || pn > 5)
      return MUSTER_E_INVALID;
    for (size_t i = 0; i < pn; i++) {
      if (port[i] < '0' || port[i] > '9')
        return MUSTER_E_INVALID;
      v = v * 10 + (port[i] - '0');
    }
    if (v < 1 || v > 65535)
      return MUSTER_E_INVALID;
    snprintf(t->port, sizeof(t->port), "%ld", v);
  } else {
    snprintf(t->port, sizeof(t->port), "%s", t->tls ? "443" : "80");
  }
  snprintf(t->host_header, sizeof(t->host_header), "%.*s", (int)(path - p), p);
  if (strlen(path) >= sizeof(t->prefix))
    return MUSTER_E_INVALID;
  snprintf(t->prefix, sizeof(t->prefix), "%s", path);
  for (size_t n = strlen(t->prefix); n && t->prefix[n - 1] == '/'; n--)
    t->prefix[n - 1] = '\0';
  for (const char *c = t->prefix; *c; c++)
    if (*c <= ' ' || *c == 0x7f)
      return MUSTER_E_INVALID;
  return 0;
}

/* Whether host is an IPv4 or IPv6 address rather than a name. */
bool hc_is_address(const char *host) {
  unsigned char buf[sizeof(struct in6_addr)];

  return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Looks at the lookup in flight: when it ended, its addresses replace
 * rs.ai (a failed one leaves the last addresses another minute). Returns
 * its gai_error() (EAI_INPROGRESS while it runs). */
static int lookup_done(int64_t now) {
  int e = gai_error(&rs.req);

  if (e == EAI_INPROGRESS)
    return e;
  rs.pending = false;
  if (e == 0 && rs.req.ar_result) {
    if (rs.ai)
      freeaddrinfo(rs.ai);
    rs.ai = rs.req.ar_result;
  } else if (rs.req.ar_result) {
    freeaddrinfo(rs.req.ar_result);
  }
  rs.req.ar_result = NULL;
  if (rs.ai)
    rs.at_ms = now;
  return e ? e : rs.ai ? 0 : EAI_NONAME;
}

/* Makes sure the addresses of to are known (hc_addresses()). Returns 1
 * when they are (addresses older than a minute serve while newer ones are
 * looked up), 0 while the first are being looked up, or
 * MUSTER_E_UNREACHABLE (err says why; a failed lookup is not tried again
 * for a second). */
int hc_resolve(const struct hc_target *to, int64_t now, char *err, size_t errlen) {
  struct gaicb *list[1] = {&rs.req};
  int e = 0;

  if (rs.pending)
    e = lookup_done(now);
  if (strcmp(rs.host, to->host) != 0 || strcmp(rs.port, to->port) != 0) {
    if (rs.pending)
      return 0; /* (one host per worker: only a changed URL lands here) */
    if (rs.ai)
      freeaddrinfo(rs.ai);
    rs.ai = NULL;
    rs.failed_ms = INT64_MIN;
    e = 0;
    snprintf(rs.host, sizeof(rs.host), "%s", to->host);
    snprintf(rs.port, sizeof(rs.port), "%s", to->port);
  }
  if (rs.ai && (rs.at_ms == INT64_MAX || now - rs.at_ms < HC_RESOLVE_KEEP_MS || rs.pending))
    return 1;
  if (rs.pending)
    return 0;
  if (e && e != EAI_INPROGRESS) { /* the lookup just ended, and failed */
    rs.failed_ms = rs.started_ms; /* (it stands a second from its start) */
    rs.failed_e = e;
    if (!rs.ai) {
      snprintf(err, errlen, "cannot look up %.200s: %s", rs.host, gai_strerror(e));
      return MUSTER_E_UNREACHABLE;
    }
  }
  if (!rs.ai && rs.failed_ms != INT64_MIN && now - rs.failed_ms < HC_RESOLVE_RETRY_MS) {
    snprintf(err, errlen, "cannot look up %.200s: %s", rs.host, gai_strerror(rs.failed_e));
    return MUSTER_E_UNREACHABLE;
  }
  memset(&rs.hints, 0, sizeof(rs.hints));
  rs.hints.ai_socktype = SOCK_STREAM;
  rs.hints.ai_flags = AI_NUMERICSERV;
  if (hc_is_address(rs.host)) {
    struct addrinfo *ai = NULL;

    rs.hints.ai_flags |= AI_NUMERICHOST;
    if ((e = getaddrinfo(rs.host, rs.port, &rs.hints, &ai)) != 0) {
      snprintf(err, errlen, "cannot use the address %.200s: %s", rs.host, gai_strerror(e));
      return MUSTER_E_UNREACHABLE;
    }
    rs.ai = ai;
    rs.at_ms = INT64_MAX;
    return 1;
  }
  memset(&rs.req, 0, sizeof(rs.req));
  rs.req.ar_name = rs.host;
  rs.req.ar_service = rs.port;
  rs.req.ar_request = &rs.hints;
  if ((e = getaddrinfo_a(GAI_NOWAIT, list, 1, NULL)) != 0) {
    if (rs.ai)
      return 1; /* (the last addresses serve) */
    snprintf(err, errlen, "cannot look up %.200s: %s", rs.host, gai_strerror(e));
    return MUSTER_E_UNREACHABLE;
  }
  rs.pending = true;
  rs.started_ms = now;
  return rs.ai ? 1 : 0; /* (the last addresses serve meanwhile) */
}

/* Whether the file st describes is the one tc's credentials were read
 * from, unchanged. */
static bool same_file(const struct stat *st) {
  return st->st_ino == tc.ino && st->st_dev == tc.dev && st->st_size == tc.size &&
         st->st_mtim.tv_sec == tc.mtime.tv_sec && st->st_mtim.tv_nsec == tc.mtime.tv_nsec;
}

/* Makes the credentials (hc_tls_hold()) for the CA file ca ("": the
 * system's authorities); a CA file changed since is read again, and one
 * that cannot be read then leaves the last ones in use (said once).
 * Credentials a session still uses are freed only when the last such
 * session goes (hc_tls_release()). Returns 0, or
 * MUSTER_E_UNREACHABLE (err says why). */
int hc_tls_cred(const char *ca, char *err, size_t errlen) {
  gnutls_certificate_credentials_t fresh = NULL;
  struct stat st = {0};
  bool same_path = tc.cred && strcmp(ca, tc.ca) == 0;
  int r;

  if (*ca && stat(ca, &st) != 0) {
    snprintf(err, errlen, "cannot read MUSTER_CA_FILE %.200s: %s", ca, strerror(errno));
    if (!same_path)
      return MUSTER_E_UNREACHABLE;
    if (!tc.warned)
      LOG(LOG_WARN, "%s; the authorities read before serve", err);
    tc.warned = true;
    return 0;
  }
  tc.warned = false; /* (said again if it goes again) */
  if (same_path && same_file(&st))
    return 0;
  if (strlen(ca) >= sizeof(tc.ca) || gnutls_certificate_allocate_credentials(&fresh) < 0) {
    snprintf(err, errlen, "cannot set up TLS");
    return same_path ? 0 : MUSTER_E_UNREACHABLE;
  }
  r = *ca ? gnutls_certificate_set_x509_trust_file(fresh, ca, GNUTLS_X509_FMT_PEM)
          : gnutls_certificate_set_x509_system_trust(fresh);
  if (r < 0 || (*ca && r == 0)) {
    snprintf(err, errlen, "cannot read the certificate authorities of %.200s: %s%s",
             *ca ? ca : "the system", r < 0 ? gnutls_strerror(r) : "it holds none",
             *ca ? "" : "; set MUSTER_CA_FILE to the file of the CA that signed the controller's");
    gnutls_certificate_free_credentials(fresh);
    if (!same_path)
      return MUSTER_E_UNREACHABLE;
    LOG(LOG_WARN, "%s; the authorities read before serve", err);
    tc.ino = st.st_ino; /* (not read again until it changes again) */
    tc.dev = st.st_dev;
    tc.size = st.st_size;
    tc.mtime = st.st_mtim;
    return 0;
  }
  /* The replaced ones go once no session uses them (the fork server has
   * none: at once). */
  if (tc.cred && tc.users && tc.n_old < HC_CRED_OLD) {
    tc.old[tc.n_old].cred = tc.cred;
    tc.old[tc.n_old++].users = tc.users;
  } else if (tc.cred && !tc.users) {
    gnutls_certificate_free_credentials(tc.cred);
  } /* (more in use than sessions can be: kept for good rather than freed under one) */
  tc.cred = fresh;
  tc.users = 0;
  snprintf(tc.ca, sizeof(tc.ca), "%s", ca);
  tc.ino = st.st_ino;
  tc.dev = st.st_dev;
  tc.size = st.st_size;
  tc.mtime = st.st_mtim;
  return 0;
}

/* Reads the authorities a worker will trust (ca: its MUSTER_CA_FILE, or ""
 * for the system's) ahead, in the fork server, for every worker to
 * inherit; the fork server calls it when a worker's controller URL is
 * https://. */
void hc_tls_prewarm(const char *ca) {
  char err[HC_ERR_MAX];

  (void)hc_tls_cred(ca ? ca : "", err, sizeof(err));
}

/* The controller's addresses, as hc_resolve() last found them. */
const struct addrinfo *hc_addresses(void) {
  return rs.ai;
}

/* The credentials hc_tls_cred() made, for one more session; the session
 * gives them back with hc_tls_release() once deinited. */
gnutls_certificate_credentials_t hc_tls_hold(void) {
  tc.users++;
  return tc.cred;
}

/* How many replaced credentials sessions still use (what a test sees). */
int hc_tls_kept(void) {
  return tc.n_old;
}

/* A session set up with c (from hc_tls_hold()) is gone; replaced
 * credentials that no session uses any more are freed. */
void hc_tls_release(gnutls_certificate_credentials_t c) {
  if (!c)
    return;
  if (c == tc.cred) {
    tc.users--;
    return;
  }
  for (int i = 0; i < tc.n_old; i++) {
    if (tc.old[i].cred != c)
      continue;
    if (--tc.old[i].users == 0) {
      gnutls_certificate_free_credentials(c);
      tc.old[i] = tc.old[--tc.n_old];
    }
    return;
  }
}

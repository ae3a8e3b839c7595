/* api_guard.c: see api_guard.h. */
#include "api_guard.h"

#include "state.h"
#include "util.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* One connection. Unauthenticated ones are on the list, oldest first. */
struct conn {
  int fd;
  uint64_t addr;    /* the client's address, folded (IPv4: the address) */
  int64_t since_ms; /* accepted */
  int listed;       /* on the unauthenticated list */
  int greeted;      /* a whole request head came: past the grace */
  struct conn *prev, *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct conn *head, *tail;
static long n_open, n_unauth, total_max = GUARD_TOTAL_MAX;
static uint64_t n_closed, n_refused;

void api_guard_init(long max_connections) {
  pthread_mutex_lock(&mu);
  total_max =
      max_connections > 0 && max_connections < GUARD_TOTAL_MAX ? max_connections : GUARD_TOTAL_MAX;
  pthread_mutex_unlock(&mu);
}

static void unlink_locked(struct conn *e) {
  if (!e->listed)
    return;
  if (e->prev)
    e->prev->next = e->next;
  else
    head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    tail = e->prev;
  e->prev = e->next = NULL;
  e->listed = 0;
  n_unauth--;
}

/* Ends e's connection: its daemon thread sees the hang-up and closes it. */
static void close_locked(struct conn *e) {
  unlink_locked(e);
  shutdown(e->fd, SHUT_RDWR);
  n_closed++;
}

static uint64_t fold_addr(const struct sockaddr *sa) {
  uint64_t h = 1469598103934665603u;
  const unsigned char *p;
  size_t n;

  if (!sa)
    return 0;
  if (sa->sa_family == AF_INET) {
    return ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr;
  }
  if (sa->sa_family != AF_INET6)
    return 0;
  /* An IPv6 client's /64: one host has as many addresses as it likes. */
  p = ((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr.s6_addr;
  n = 8;
  while (n--)
    h = (h ^ *p++) * 1099511628211u;
  return h | (1ull << 63);
}

static long unauth_max_locked(void);

/* Makes room for e (just listed): past the grace, past the address's
 * share, past the total share, the oldest go. */
static void make_room_locked(struct conn *e, int64_t now) {
  struct conn *p, *next, *oldest_same = NULL;
  long same = 0;

  for (p = head; p && p != e; p = next) {
    next = p->next;
    if (!p->greeted && now - p->since_ms >= GUARD_GRACE_MS) {
      close_locked(p);
      continue;
    }
    if (p->addr == e->addr && ++same == 1)
      oldest_same = p;
  }
  if (same + 1 > GUARD_UNAUTH_PER_IP && oldest_same)
    close_locked(oldest_same);
  if (n_unauth > unauth_max_locked() && head && head != e)
    close_locked(head);
}

/* At most GUARD_UNAUTH_MAX unauthenticated connections, and never more
 * than half of all: the rest is kept for clients with a token. */
static long unauth_max_locked(void) {
  return total_max / 2 < GUARD_UNAUTH_MAX ? (total_max / 2 > 0 ? total_max / 2 : 1)
                                          : GUARD_UNAUTH_MAX;
}

static void started(struct MHD_Connection *c, void **ctx) {
  const union MHD_ConnectionInfo *fd =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  const union MHD_ConnectionInfo *addr =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  struct conn *e;
  int64_t now = util_mono_ms();

  if (!fd || !(e = calloc(1, sizeof(*e))))
    return; /* unguarded: it lives as any connection did before */
  e->fd = fd->connect_fd;
  e->addr = fold_addr(addr ? addr->client_addr : NULL);
  e->since_ms = now;
  pthread_mutex_lock(&mu);
  n_open++;
  /* At the limit, an unauthenticated connection makes room, the oldest. */
  if (n_open > total_max && head)
    close_locked(head);
  if (n_open > total_max && !head) {
    /* Only authenticated connections are left (those closed above are on
     * their way out): refused, and the controller could not serve this
     * client. */
    shutdown(e->fd, SHUT_RDWR);
    n_refused++;
    __atomic_store_n(&g.unserved_at_ms, now, __ATOMIC_RELAXED);
  } else {
    e->prev = tail;
    if (tail)
      tail->next = e;
    else
      head = e;
    tail = e;
    e->listed = 1;
    n_unauth++;
    make_room_locked(e, now);
  }
  pthread_mutex_unlock(&mu);
  *ctx = e;
}

void api_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code) {
  struct conn *e = *socket_context;

  (void)cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    started(c, socket_context);
    return;
  }
  if (!e)
    return;
  pthread_mutex_lock(&mu);
  unlink_locked(e);
  n_open--;
  pthread_mutex_unlock(&mu);
  free(e);
  *socket_context = NULL;
}

void api_guard_request(struct MHD_Connection *c, int authed) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  struct conn *e = info ? info->socket_context : NULL;
  int raise = 0;

  if (!e) {
    /* unguarded (no memory for its record): the timeout still follows */
    if (authed)
      MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)GUARD_AUTHED_IDLE_S);
    return;
  }
  pthread_mutex_lock(&mu);
  e->greeted = 1;
  if (authed && e->listed) {
    unlink_locked(e);
    raise = 1;
  }
  pthread_mutex_unlock(&mu);
  if (raise)
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)GUARD_AUTHED_IDLE_S);
}

void api_guard_stats(struct api_guard_stats *out) {
  pthread_mutex_lock(&mu);
  out->open = n_open;
  out->unauthenticated = n_unauth;
  out->closed_unauthenticated = n_closed;
  out->refused = n_refused;
  pthread_mutex_unlock(&mu);
}

/*
 * api_guard.h: what a client without a token may cost the API's daemons
 * (docs/design.md, "Hostile clients").
 *
 * Every connection starts unauthenticated; the first request on it whose
 * token holds (api_guard_request()) makes it an authenticated one for the
 * rest of its life. Unauthenticated connections are few and short-lived:
 *   - at most GUARD_UNAUTH_MAX at once, and GUARD_UNAUTH_PER_IP from one
 *     client address (a Slurm node's workers share one; 256 lets a node's
 *     burst of registers through): past either, the oldest of them (of that address)
 *     is closed to make room, as OpenSSH's MaxStartups drops unauthenticated
 *     connections first;
 *   - each has GUARD_GRACE_MS from its accept to its first authenticated
 *     request (OpenSSH's LoginGraceTime), however slowly it sends;
 *   - libmicrohttpd's idle timeout is short (GUARD_IDLE_S) until then, and
 *     GUARD_AUTHED_IDLE_S after.
 * Authenticated connections are closed by nobody but their idle timeout;
 * past GUARD_TOTAL_MAX connections in all, a new one is refused, and the
 * moment is recorded as one the controller could not serve
 * (g.unserved_at_ms, which the monitor turns into time given back to
 * leases and heartbeats).
 *
 * The table is its own, under its own lock (a leaf: never held around
 * anything else). A connection is closed by shutdown(2) of its socket,
 * which its daemon thread then sees and ends as any client's hang-up; the
 * socket stays open until libmicrohttpd's close notice, which takes the
 * connection out of the table under the same lock.
 */
#ifndef MUSTER_API_GUARD_H
#define MUSTER_API_GUARD_H

#include <microhttpd.h>
#include <stdint.h>

#define GUARD_UNAUTH_MAX 1024
#define GUARD_UNAUTH_PER_IP 256
#define GUARD_GRACE_MS 10000
#define GUARD_IDLE_S 10
#define GUARD_AUTHED_IDLE_S 300
#define GUARD_TOTAL_MAX 60000

/* At most max_connections in all (0 or more than GUARD_TOTAL_MAX: that).
 * Before the daemons start. */
void api_guard_init(long max_connections);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback. */
void api_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* A request's head came on c (past the grace); authed: its token held, so
 * c is no longer one to close first. */
void api_guard_request(struct MHD_Connection *c, int authed);

struct api_guard_stats {
  long open, unauthenticated;
  uint64_t closed_unauthenticated; /* closed to make room, or past their grace */
  uint64_t refused;                /* past GUARD_TOTAL_MAX */
};
void api_guard_stats(struct api_guard_stats *out);

#endif

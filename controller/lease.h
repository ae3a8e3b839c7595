/*
 * lease.h: sessions' leases (docs/design.md, "Sessions and leases").
 *
 * A client that holds a session's lease renews it every ttl/3; when a lease
 * runs out the controller stops every live worker of the session ("stopped:
 * the session's lease expired") and fails its running runs. Leases live in
 * memory; SQLite keeps only which sessions hold one, and their ttl, so a
 * renewal writes nothing and a restarted controller gives every lease one
 * full ttl from its start. Every function here needs the state lock.
 *
 * Calls go one way: the monitor thread (monitor.c) runs
 * leases_expire_locked(), lifecycle.c restores and frees the leases, the API
 * takes and gives them back; this file acts on workers only through the
 * state machine's public functions (sm_stop_many_with_locked()), and
 * state.c never calls back here.
 */
#ifndef MUSTER_LEASE_H
#define MUSTER_LEASE_H

#include "util.h"

#include <jansson.h>
#include <stdint.h>

/* At most this many sessions hold a lease at once. */
#define LEASE_MAX 10000
/* A ttl is 3 s to 1 day (renewed every third: a renewal has 2 s at least
 * to arrive). */
#define LEASE_TTL_MIN 3.0
#define LEASE_TTL_MAX 86400.0

#define LEASE_EXPIRED "stopped: the session's lease expired"

/* Takes or renews session's lease for ttl seconds from now (or the longer
 * ttl another holder asked for); *expires_ms gets its end (util_mono_ms()
 * time), *created 1 if the session held no lease. Returns 0,
 * MUSTER_E_CONFLICT when LEASE_MAX sessions hold one already, or a
 * database error. */
MUST_CHECK int lease_put_locked(const char *session, double ttl, int64_t *expires_ms, int *created);
/* Gives session's lease back (its workers stay). MUSTER_E_NOT_FOUND if it
 * held none. */
MUST_CHECK int lease_drop_locked(const char *session);
/* Stops the workers of the sessions whose lease ran out by now. */
void leases_expire_locked(int64_t now);
/* The leases SQLite lists, each with ttl from now (a restart's grace). */
void leases_restore_locked(void);
/* Session's lease as {"ttl_seconds", "expires_at", "seconds_left"}, or
 * json null: a new reference. */
json_t *lease_json_locked(const char *session);
/* Calls fn for every lease (its session, ttl and seconds left). */
void leases_each_locked(void (*fn)(void *arg, const char *session, double ttl, double left),
                        void *arg);
void leases_free_locked(void);

#endif

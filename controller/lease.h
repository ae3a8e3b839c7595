/*
 * lease.h: sessions' leases (docs/design.md, "Sessions and leases").
 *
 * A session's lease is the union of its holders' parts. Each client that
 * holds one names itself (its holder id), asks for its own ttl and renews
 * its part every ttl/3. A part runs out on its own: the runs bound to that
 * holder fail ("the client that ran it is gone"). When the last part that
 * keeps the session's workers (stop_workers) runs out, the controller stops
 * every live worker of the session ("stopped: the session's lease
 * expired") and fails its running runs. A part given back (DELETE) ends
 * only that holder's part. Parts live in memory; SQLite keeps which holders
 * hold one, their ttl, and which ran out, so a renewal writes nothing and a
 * restarted controller gives every part one full ttl from its start. Every
 * function here needs the state lock.
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

/* At most this many sessions hold a lease at once, with at most
 * LEASE_HOLDERS_MAX holders each. */
#define LEASE_MAX 10000
#define LEASE_HOLDERS_MAX 1024
/* A ttl is 3 s to 1 day (renewed every third: a renewal has 2 s at least
 * to arrive). */
#define LEASE_TTL_MIN 3.0
#define LEASE_TTL_MAX 86400.0
/* The holder of a client that names none. */
#define LEASE_HOLDER_DEFAULT "default"

#define LEASE_EXPIRED "stopped: the session's lease expired"
#define LEASE_GIVEN_BACK "stopped: its client ended the session's lease"

/* What lease_put_locked() found and did. */
struct lease_put {
  int created;         /* the holder held no part before */
  int expired;         /* ...because its earlier part had run out */
  int workers_stopped; /* ...and the session's workers were stopped then */
  int session_full;    /* refused: the session has LEASE_HOLDERS_MAX holders */
};

/* Takes or renews holder's part of session's lease for ttl seconds from
 * now. stop_workers: whether the part keeps the session's workers (else it
 * only binds the holder's runs). Returns 0, MUSTER_E_CONFLICT when
 * LEASE_MAX sessions hold one already or the session has
 * LEASE_HOLDERS_MAX holders, or a database error. */
MUST_CHECK int lease_put_locked(const char *session, const char *holder, double ttl,
                                int stop_workers, struct lease_put *out);
/* Gives holder's part back and fails the runs bound to it that are still
 * running. With stop_workers, the session's live workers are stopped too
 * when no other holder's part keeps them; *stopped gets their number
 * (-1: others keep them). MUSTER_E_NOT_FOUND if the holder held none. */
MUST_CHECK int lease_drop_locked(const char *session, const char *holder, int stop_workers,
                                 int *stopped);
/* Whether holder holds a live part of session's lease. */
int lease_held_locked(const char *session, const char *holder);
/* Ends the parts that ran out by now (see above). */
void leases_expire_locked(int64_t now);
/* Gives every part ms more: the controller could not serve its renewals
 * for that long (monitor.c; docs/design.md, "Time the controller could not
 * serve"). */
void leases_credit_locked(int64_t ms);
/* The parts SQLite lists, each with its ttl from now (a restart's grace). */
void leases_restore_locked(void);
/* Session's lease as {"ttl_seconds", "expires_at", "seconds_left",
 * "stops_workers", "holders": [{"holder", "ttl_seconds", "expires_at",
 * "seconds_left", "stop_workers"}]} (the first four of the part that lasts
 * longest among those that keep the workers, or among all if none does),
 * or json null: a new reference. */
json_t *lease_json_locked(const char *session);
/* Calls fn for every session's lease (as lease_json_locked() sums it up;
 * stops_workers: whether it keeps the session's workers). */
void leases_each_locked(void (*fn)(void *arg, const char *session, double ttl, double left,
                                   int stops_workers),
                        void *arg);
void leases_free_locked(void);

#endif

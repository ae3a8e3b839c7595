/*
 * wcache.h: the API's worker objects, serialized, kept in memory so that a
 * GET or a page of a list is a copy instead of a query and a JSON build.
 *
 * The database stays the only truth: the writer invalidates an entry after
 * every commit that changed that worker (db.c does it), and a reader only
 * stores what it read if no invalidation of its stripe came in between
 * (the generation taken before the read), so a stale object can never be
 * stored. Bounded: a fixed number of slots, a newer entry replaces an older
 * one in its slot. Thread-safe (striped locks); nothing else is taken while
 * a stripe lock is held.
 */
#ifndef MUSTER_WCACHE_H
#define MUSTER_WCACHE_H

#include "util.h"

#include <stddef.h>
#include <stdint.h>

/* Looks id up. On a hit returns 1 and a malloc'ed copy of its text in
 * *text (length *len; the caller frees it). On a miss returns 0 and the
 * stripe's generation in *gen, to hand to wcache_put() after reading. */
MUST_CHECK int wcache_get(const char *id, char **text, size_t *len, uint64_t *gen);

/* Stores text (copied) for id, unless id was invalidated since gen. */
void wcache_put(const char *id, const char *text, size_t len, uint64_t gen);

/* Bracket a commit of the writer and the invalidations that follow it:
 * meanwhile readers bypass the cache, so that none is served an object older
 * than the commit it may already have seen elsewhere (an event seq). A
 * reader whose generation was taken outside the bracket stores nothing. */
void wcache_write_begin(void);
void wcache_write_end(void);

/* Forgets id: its row changed (call after the change is committed). */
void wcache_invalidate(const char *id);

/* Forgets everything (tests; a restart starts empty anyway). */
void wcache_clear(void);

#endif

/*
 * state_internal.h: what the files of the controller's state share; the rest
 * of the controller uses state.h only. From the bottom up (a file calls only
 * the files above it in this list, never one below):
 *
 *   ctl.c            the one global state (g), the state lock, the URL
 *   status.c         the worker statuses: names, terminal ones, legal moves
 *   live.c           the live-worker table (g.head, g.hash), its dirty list
 *                    and start queue
 *   waiters.c        suspended awaits and streams: listing, waking, reaping
 *   state.c          the state machine: sm_begin/sm_transition/sm_commit
 *   backend_report.c the backends' reports, turned into transitions
 *   heartbeat.c      heartbeats in memory, their flush, timeouts
 *   sched.c          admission: place, commit the attempt, submit
 *   retention.c      --retain: pruning old terminal workers
 *   statedir.c       the state directory: modes, lock, API token
 *   restore.c        a restarted controller's live table, reconciled
 *   monitor.c        the monitor thread, which runs the periodic work
 *   lifecycle.c      state_init(), state_begin_shutdown(), state_cleanup()
 *
 * lease.c (lease.h) sits between state.c and monitor.c: the monitor and
 * lifecycle.c call it, and it stops a session's workers through the state
 * machine's public functions.
 *
 * Every function here needs the state lock unless it says otherwise.
 */
#ifndef MUSTER_STATE_INTERNAL_H
#define MUSTER_STATE_INTERNAL_H

#include "state.h"

#include <stddef.h>
#include <stdint.h>

/* The hash of a worker id (FNV-1a), for g.hash and g.watch. Needs no lock. */
static inline unsigned state_hash_id(const char *id) {
  unsigned h = 2166136261u;

  for (; *id; id++)
    h = (h ^ (unsigned char)*id) * 16777619u;
  return h;
}

/* live.c */

/* Adds a new scheduling worker to the live table. Returns it (the table
 * owns it: lw_remove_locked() frees it), or NULL when out of memory. */
struct lw *lw_new_locked(const char *id, const char *token, const char *session, const char *launch,
                         const char *owner, const struct backend_req *req);
/* Takes w out of the live table and frees it. */
void lw_remove_locked(struct lw *w);
/* Sets w's status, counting the workers that heartbeat (g.beating) and
 * the live workers by status (g.live_by_status). */
void lw_set_status_locked(struct lw *w, enum wstatus to);
/* Takes w out of g.dirty, if it is listed (its heartbeat is written). */
void lw_clean_locked(struct lw *w);
/* Takes w out of the start queue (g.queue), if it is listed. */
void lw_unqueue_locked(struct lw *w);

/* user_live.c */

/* owner's sums ("": the bootstrap administrator's), made at zero if it has
 * none yet; NULL when out of memory. */
struct user_live *user_live_of_locked(const char *owner);
/* Counts req in ul's sums. */
void user_live_add_locked(struct user_live *ul, const struct backend_req *req);
/* Takes req out of ul's sums. */
void user_live_sub_locked(struct user_live *ul, const struct backend_req *req);
/* Frees every user's sums (at shutdown). */
void user_live_free_locked(void);

/* waiters.c */

/* Resumes a suspended await (once; it is marked ready and leaves the watch
 * index, since no change can matter to it any more). */
void waiter_wake_locked(struct waiter *wt);
/* Counts worker id's move to status to in the awaits that wait on id (found
 * through the watch index: the cost is theirs alone, not that of every
 * await), and wakes the ones that are complete. */
void waiters_notify_locked(const char *id, enum wstatus to);
/* Wakes the streams of kind: the event streams (id is ignored), or the log
 * streams of worker id (through the watch index), or every log stream when
 * id is NULL. */
void streams_wake_locked(enum stream_kind kind, const char *id);
/* Resumes the awaits whose deadline passed by now. */
void expire_waiters_locked(int64_t now);
/* Wakes the streams whose wake_at_ms passed by now (and clears it). */
void streams_wake_due_locked(int64_t now);
/* Resumes the awaits and streams whose client hung up (once a second). */
void reap_gone_clients_locked(int64_t now);

/* heartbeat.c */

/* The heartbeat interval for that many starting and running workers: the
 * configured one, or longer so that they send at most --heartbeat-rate
 * heartbeats a second (docs/internals/controller.md, "Heartbeats"). */
int64_t hb_interval_ms(int beating);

/* Writes heartbeats and usage samples not yet written, in one transaction,
 * at most every 100 ms (every FLUSH_BUSY_MS while FLUSH_MAX_ROWS or more
 * wait) and FLUSH_MAX_ROWS of them (all of them with all set). Transactions
 * small enough that the state lock is held under a millisecond at a time
 * (about 10 us a row and 170 us the commit, measured at 10,000 workers), so
 * that an await's wake or a stop waits no longer behind one; large enough
 * that rows sharing a page share its write. Up to 7,500 rows a second. */
int flush_heartbeats_locked(int64_t now, int all); /* 1 if it wrote (or tried) */
#define FLUSH_BUSY_MS 8
#define FLUSH_MAX_ROWS 60
/* (a timeout slice put off by a flush runs at the next look, 2 ms on, which
 * must come before the next flush: monitor.c) */
_Static_assert(FLUSH_BUSY_MS > 2, "a put-off timeout slice needs a look between two flushes");
/* Fails workers that never registered or that stopped heartbeating: all of
 * them at each of the monitor's looks while there are SCAN_SLICE or fewer,
 * else SCAN_SLICE at a time, going on where the last look stopped, every
 * scan_every_ms() (each worker judged every 100 ms up to 10,000 live, every
 * live/100,000 s beyond: once a second at 100,000), so that the state lock
 * is held 0.1 to 0.4 ms a look (70 to 350 ns a worker, measured at 10,000
 * and 100,000). */
void check_timeouts_locked(int64_t now);
#define SCAN_SLICE 1000
/* How long the timeout scan waits between slices once there are more than
 * SCAN_SLICE live workers: 10 to 100 ms. */
int64_t scan_every_ms(void);
/* Gives every running worker's heartbeat timeout, and every starting
 * one's start timeout, ms more (monitor.c: the controller could not serve
 * for that long). */
void heartbeats_credit_locked(int64_t ms);

/* sched.c */

/* Starts every waiting worker the backend has room for. */
void schedule_locked(void);

/* retention.c */

/* Prunes the terminal workers past --retain, when due. It releases the state
 * lock while it removes their files, and takes it again before it returns. */
void prune_locked(int64_t now);

/* statedir.c: these run before the monitor or the API, without the lock. */

/* Creates the state directory and its folders, makes them private, locks the
 * directory for this process, and reads or creates the API token
 * (g.api_token). Returns 0 or an error with a sentence in err. */
MUST_CHECK int statedir_prepare(char *err, size_t errlen);
/* Makes the state directory 0700 and its secret files 0600. Returns 0 or
 * MUSTER_E_IO with a sentence in err. */
int secure_state_dir(char *err, size_t errlen);

/* restore.c */

/* Re-creates the live table from SQLite and reconciles it with what the
 * backend still runs. Returns 0, or MUSTER_E_DB / MUSTER_E_NOMEM with a
 * sentence in err when a live worker could not be restored (the start
 * stops there, before the backend reconciles anything). */
MUST_CHECK int restore_live_locked(char *err, size_t errlen);

#endif

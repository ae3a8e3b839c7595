/* live.c: the live-worker table: every worker that is not yet terminal, in
 * creation order and hashed by id (g.head, g.hash). See state.h and
 * state_internal.h. */
#include "state_internal.h"

#include "fault.h"
#include "muster_errors.h"
#include "util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned hash_id(const char *id) {
  return state_hash_id(id) % (sizeof(g.hash) / sizeof(g.hash[0]));
}

/* Adds d to the count of live workers of status s (none for an ended one,
 * which the database counts). */
static void count_live(enum wstatus s, int d) {
  if (s < WS_LIVE_N)
    __atomic_add_fetch(&g.live_by_status[s], d, __ATOMIC_RELAXED);
}

struct lw *lw_find_locked(const char *id) {
  ASSERT_LOCKED();
  for (struct lw *w = g.hash[hash_id(id)]; w; w = w->hnext)
    if (strcmp(w->id, id) == 0)
      return w;
  return NULL;
}

struct lw *lw_reserve_locked(const char *owner) {
  struct lw *w;

  ASSERT_LOCKED();
  if (FAULT_FAILS("lw_reserve_nomem") || !(w = calloc(1, sizeof(*w))))
    return NULL;
  w->owner = user_live_of_locked(owner);
  if (!w->owner) {
    free(w);
    return NULL;
  }
  return w;
}

void lw_unreserve(struct lw *w) {
  free(w);
}

void lw_link_locked(struct lw *w, const char *id, const char *token, const char *session,
                    const char *launch, const struct backend_req *req) {
  unsigned h;

  ASSERT_LOCKED();
  user_live_add_locked(w->owner, req);
  snprintf(w->id, sizeof(w->id), "%s", id);
  snprintf(w->token, sizeof(w->token), "%s", token);
  snprintf(w->session, sizeof(w->session), "%s", session);
  snprintf(w->launch, sizeof(w->launch), "%s", launch ? launch : "");
  w->req = *req;
  w->status = WS_SCHEDULING; /* (not beating: g.beating stays) */
  count_live(WS_SCHEDULING, 1);
  w->since_ms = util_mono_ms();
  w->last_hb_ms = w->since_ms;
  h = hash_id(id);
  w->hnext = g.hash[h];
  g.hash[h] = w;
  w->prev = g.tail;
  if (g.tail)
    g.tail->next = w;
  else
    g.head = w;
  g.tail = w;
  __atomic_add_fetch(&g.live_count, 1, __ATOMIC_RELAXED);
  lw_queue_locked(w);
}

struct lw *lw_new_locked(const char *id, const char *token, const char *session, const char *launch,
                         const char *owner, const struct backend_req *req) {
  struct lw *w = lw_reserve_locked(owner);

  if (w)
    lw_link_locked(w, id, token, session, launch, req);
  return w;
}

static int beats(enum wstatus s) {
  return s == WS_STARTING || s == WS_RUNNING;
}

void lw_remove_locked(struct lw *w) {
  struct lw **pp = &g.hash[hash_id(w->id)];

  while (*pp && *pp != w)
    pp = &(*pp)->hnext;
  if (*pp)
    *pp = w->hnext;
  if (w->prev)
    w->prev->next = w->next;
  else
    g.head = w->next;
  if (w->next)
    w->next->prev = w->prev;
  else
    g.tail = w->prev;
  __atomic_sub_fetch(&g.live_count, 1, __ATOMIC_RELAXED);
  if (beats(w->status)) /* (no longer counted as beating) */
    __atomic_sub_fetch(&g.beating, 1, __ATOMIC_RELAXED);
  count_live(w->status, -1);
  user_live_sub_locked(w->owner, &w->req);
  if (g.scan_next == w)
    g.scan_next = w->next;
  lw_clean_locked(w);
  lw_unqueue_locked(w);
  memset(w->token, 0, sizeof(w->token));
  free(w->outside_why);
  free(w);
}

_Static_assert(WS_SCHEDULING == 0 && WS_STARTING == 1 && WS_RUNNING == 2 && WS_SUCCEEDED == 3 &&
                   WS_FAILED == 4 && WS_STOPPED == 5 && WS_COUNT_ == 6,
               "the live statuses come first (g.live_by_status), and the ended ones are the three "
               "that db_ended_counts() counts (ST_COUNTS)");

void lw_set_status_locked(struct lw *w, enum wstatus to) {
  int d = beats(to) - beats(w->status);

  if (d)
    __atomic_add_fetch(&g.beating, d, __ATOMIC_RELAXED);
  /* (a worker that ended stays in the table, terminal, until its commit
   * drops it: it is counted by the database from then on) */
  count_live(w->status, -1);
  count_live(to, 1);
  w->status = to;
}

void state_live_counts(long out[WS_LIVE_N]) {
  for (int s = 0; s < WS_LIVE_N; s++)
    out[s] = __atomic_load_n(&g.live_by_status[s], __ATOMIC_RELAXED);
}

/* w's link at offset off (offsetof(struct lw, ...)). */
static struct lw_link *link_of(struct lw *w, size_t off) {
  return w ? (struct lw_link *)((char *)w + off) : NULL;
}

/* Appends w to l through its link at off, unless it is listed already. */
static void lw_list_append(struct lw_list *l, size_t off, struct lw *w) {
  struct lw_link *k = link_of(w, off);

  if (k->in)
    return;
  k->in = 1;
  k->next = NULL;
  k->prev = l->tail;
  if (l->tail)
    link_of(l->tail, off)->next = w;
  else
    l->head = w;
  l->tail = w;
  l->n++;
}

/* Takes w out of l, if it is listed. */
static void lw_list_remove(struct lw_list *l, size_t off, struct lw *w) {
  struct lw_link *k = link_of(w, off);

  if (!k->in)
    return;
  if (k->prev)
    link_of(k->prev, off)->next = k->next;
  else
    l->head = k->next;
  if (k->next)
    link_of(k->next, off)->prev = k->prev;
  else
    l->tail = k->prev;
  k->in = 0;
  k->next = k->prev = NULL;
  l->n--;
}

void lw_dirty_locked(struct lw *w) {
  ASSERT_LOCKED();
  /* (at the end: the flush writes the oldest first) */
  lw_list_append(&g.dirty, offsetof(struct lw, dirty_link), w);
}

void lw_clean_locked(struct lw *w) {
  lw_list_remove(&g.dirty, offsetof(struct lw, dirty_link), w);
}

void lw_queue_locked(struct lw *w) {
  lw_list_append(&g.queue, offsetof(struct lw, queue_link), w);
}

void lw_unqueue_locked(struct lw *w) {
  lw_list_remove(&g.queue, offsetof(struct lw, queue_link), w);
}

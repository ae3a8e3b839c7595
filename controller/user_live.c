/* user_live.c: what each user's live workers hold (g.users_live), kept as
 * the live table (live.c) adds and removes workers, under the state lock.
 * A launch's quota check and /metrics read these sums, not the workers'
 * rows: among 100,000 live workers of one user, the rows took 12 ms to
 * sum, under the state lock for a launch. Cores and memory are summed in
 * millionths (the launch ranges' 0.01 is 10,000 of them), as integers,
 * so that no rounding accumulates. Calls ctl.c (g, the lock's assertion). */
#include "state_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* x (cores or GiB, within the launch ranges) in millionths. */
static long long micro(double x) {
  return llround(x * 1e6);
}

static struct user_usage usage_of(const struct user_live *ul) {
  return (struct user_usage){(double)ul->cpu_micro / 1e6, (double)ul->memory_micro / 1e6, ul->gpus,
                             ul->workers};
}

static struct user_live *find(const char *name) {
  for (struct user_live *ul = g.users_live; ul; ul = ul->next)
    if (strcmp(ul->name, name) == 0)
      return ul;
  return NULL;
}

struct user_live *user_live_of_locked(const char *owner) {
  struct user_live *ul, **pp;

  ASSERT_LOCKED();
  if (!owner)
    owner = "";
  ul = find(owner);
  if (!ul) {
    ul = calloc(1, sizeof(*ul));
    if (!ul)
      return NULL;
    snprintf(ul->name, sizeof(ul->name), "%s", owner);
    /* (kept by name: the bootstrap administrator, "", first) */
    for (pp = &g.users_live; *pp && strcmp((*pp)->name, owner) < 0; pp = &(*pp)->next)
      ;
    ul->next = *pp;
    *pp = ul;
  }
  return ul;
}

void user_live_add_locked(struct user_live *ul, const struct backend_req *req) {
  ASSERT_LOCKED();
  ul->cpu_micro += micro(req->cpu);
  ul->memory_micro += micro(req->memory);
  ul->gpus += req->ngpu;
  ul->workers++;
}

void user_live_sub_locked(struct user_live *ul, const struct backend_req *req) {
  ASSERT_LOCKED();
  ul->workers--;
  ul->gpus -= req->ngpu;
  ul->cpu_micro -= micro(req->cpu);
  ul->memory_micro -= micro(req->memory);
}

void user_live_get_locked(const char *name, struct user_usage *out) {
  struct user_live *ul;

  ASSERT_LOCKED();
  ul = find(name ? name : "");
  *out = ul ? usage_of(ul) : (struct user_usage){0, 0, 0, 0};
}

void user_live_each_locked(void (*fn)(void *arg, const char *user, const struct user_usage *u),
                           void *arg) {
  ASSERT_LOCKED();
  for (struct user_live *ul = g.users_live; ul; ul = ul->next)
    if (ul->workers > 0) {
      struct user_usage u = usage_of(ul);

      fn(arg, ul->name[0] ? ul->name : USER_BOOTSTRAP, &u);
    }
}

void user_live_free_locked(void) {
  while (g.users_live) {
    struct user_live *next = g.users_live->next;

    free(g.users_live);
    g.users_live = next;
  }
}

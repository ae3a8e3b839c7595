/* ctl.c: the one global state (g) and the state lock that guards it; see
 * state.h. The lowest layer of the state module: it calls nothing of the
 * others. */
#include "state.h"

#include "log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ctl g = {.lock = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP};

void state_lock(void) {
  int rc = pthread_mutex_lock(&g.lock);

  if (rc) {
    /* EDEADLK: this thread holds it already. Say so and stop, rather than
     * hang every thread of the controller. */
    LOG(LOG_ERROR, "internal error: the state lock could not be taken: %s", strerror(rc));
    abort();
  }
  g.lock_owner = pthread_self();
  g.lock_held = 1;
}

void state_unlock(void) {
  int rc;

  g.lock_held = 0;
  rc = pthread_mutex_unlock(&g.lock);
  if (rc) {
    LOG(LOG_ERROR,
        "internal error: the state lock was released by a thread that did not "
        "hold it: %s",
        strerror(rc));
    abort();
  }
}

void state_assert_locked(const char *func) {
  if (!g.lock_held || !pthread_equal(g.lock_owner, pthread_self())) {
    LOG(LOG_ERROR, "internal error: %s needs the state lock and was called without it", func);
    abort();
  }
}

void state_kick_locked(void) {
  ASSERT_LOCKED();
  g.schedule_needed = 1;
  pthread_cond_signal(&g.kick);
}

/* Set by state_init() before the backend starts; never changes after. */
const char *state_controller_url(void) {
  return g.controller_url;
}

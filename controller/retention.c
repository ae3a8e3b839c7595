/* retention.c: --retain: terminal workers past it are pruned with their
 * events, logs and files. See state_internal.h. */
#include "state_internal.h"

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Retention: terminal workers past --retain go, with their events, logs and
 * files, in batches, through db_prune(), the one path that deletes. */
void prune_locked(int64_t now) {
  char(*ids)[16];
  char cutoff[32];
  time_t t;
  struct tm tm;
  int n = 0;
  /* Once a minute, or more often for a short --retain (tests). */
  int64_t every = (int64_t)(g.cfg.retain_s * 500);

  if (every > 60000)
    every = 60000;
  if (every < 500)
    every = 500;
  if (g.cfg.retain_s <= 0 || now - g.last_prune_ms < every)
    return;
  g.last_prune_ms = now;
  t = time(NULL) - (time_t)g.cfg.retain_s;
  gmtime_r(&t, &tm);
  strftime(cutoff, sizeof(cutoff), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
  ids = calloc(500, sizeof(*ids));
  if (!ids)
    return;
  if (db_prune(g.db, cutoff, 500, ids, &n) != 0)
    LOG(LOG_WARN, "could not prune old workers: %s", db_errmsg(g.db));
  if (n == 500)
    g.last_prune_ms = now - every + 100; /* more to do: again soon */
  /* The files go without the lock: nobody looks for a pruned worker's. */
  state_unlock();
  for (int i = 0; i < n; i++) {
    static const char *const kinds[] = {"logs/%s.stdout", "logs/%s.stderr", "logs/%s.end",
                                        "workers/%s.log"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      char rel[64], path[700];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
      snprintf(rel, sizeof(rel), kinds[k], ids[i]);
#pragma GCC diagnostic pop
      snprintf(path, sizeof(path), "%s/%s", g.cfg.state_dir, rel);
      if (unlink(path) != 0 && errno != ENOENT)
        LOG(LOG_WARN, "could not remove %s: %s", path, strerror(errno));
    }
  }
  if (n)
    LOG(LOG_INFO, "retention: pruned %d workers that ended before %s", n, cutoff);
  free(ids);
  state_lock();
}

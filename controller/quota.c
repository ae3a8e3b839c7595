/* quota.c: a launch against its user's limits (users.h). */
#include "state.h"
#include "users.h"

#include "muster_errors.h"

#include <stdio.h>

/* One limit: past it, the sentence. */
static int over(const char *user, double limit, double held, double asked, const char *unit,
                const char *field, const char **fieldp, char *why, size_t size) {
  if (limit < 0 || held + asked <= limit + 1e-9)
    return 0;
  snprintf(why, size, "%s holds %g of their %g %s; this launch asks for %g more", user, held, limit,
           unit, asked);
  *fieldp = field;
  return 1;
}

int quota_check_locked(struct db *db, const char *name, double cpu, double memory, long gpus,
                       long workers, const char **field, char *why, size_t size) {
  struct db_user u;
  struct user_usage used;
  int rc = db_user_get(db, name, &u);

  if (rc == 0 && u.removed)
    rc = MUSTER_E_NOT_FOUND;
  if (rc == MUSTER_E_NOT_FOUND) {
    snprintf(why, size, "there is no user %s any more", name);
    return MUSTER_E_UNAUTHORIZED; /* removed since its call began */
  }
  if (rc)
    return rc;
  user_live_get_locked(name, &used);
  if (over(name, u.max_cpu, used.cpu, cpu, "cores", "cpu", field, why, size) ||
      over(name, u.max_memory, used.memory, memory, "GiB of memory", "memory", field, why, size) ||
      over(name, (double)u.max_gpus, (double)used.gpus, (double)gpus, "GPUs", "nvidia_gpu", field,
           why, size) ||
      over(name, (double)u.max_workers, (double)used.workers, (double)workers, "live workers", "n",
           field, why, size))
    return MUSTER_E_INVALID;
  return 0;
}

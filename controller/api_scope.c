/* api_scope.c: see api_scope.h. */
#include "api_scope.h"

#include "muster_errors.h"
#include "session_name.h"
#include "users.h"
#include "validate.h"

#include <stdio.h>
#include <string.h>

int api_session_scope(const struct req *rq, const char *name, char *out, size_t size) {
  const char *slash = name ? strchr(name, '/') : NULL;
  size_t own = strlen(rq->who.name);

  if (!name)
    return MUSTER_E_INVALID;
  if (slash) {
    /* a stored name: anyone's to an administrator, else one's own */
    if (!session_name_ok(name))
      return MUSTER_E_INVALID;
    int mine = own && (size_t)(slash - name) == own && strncmp(name, rq->who.name, own) == 0;

    if (!rq->who.admin && !mine)
      return MUSTER_E_NOT_FOUND;
    /* An administrator's "USER/x": USER must be a user (a session made for
     * a name nobody has yet would be the next user of that name's). */
    if (!mine) {
      char user[USER_NAME_MAX + 1];
      struct db_user u;
      struct reader *rd = api_reader_get();
      int rc;

      snprintf(user, sizeof(user), "%.*s", (int)(slash - name), name);
      rc = db_user_get(rd->db, user, &u);
      api_reader_put(rd);
      if (rc || u.removed)
        return MUSTER_E_NOT_FOUND;
    }
    snprintf(out, size, "%s", name);
    return 0;
  }
  if (!validate_name(name))
    return MUSTER_E_INVALID;
  if (own)
    snprintf(out, size, "%s/%s", rq->who.name, name);
  else
    snprintf(out, size, "%s", name);
  return 0;
}

const char *api_own_prefix(const struct req *rq, char *buf, size_t size) {
  if (rq->who.admin)
    return NULL;
  snprintf(buf, size, "%s/", rq->who.name);
  return buf;
}

int api_sees_session(const struct req *rq, const char *s) {
  char prefix[USER_NAME_MAX + 2];
  const char *own = api_own_prefix(rq, prefix, sizeof(prefix));

  return !own || (s && strncmp(s, own, strlen(own)) == 0);
}

int api_sees_worker(const struct req *rq, struct reader *rd, const char *id) {
  char session[SESSION_STORED_MAX];

  if (rq->who.admin)
    return 1;
  return db_worker_session(rd->db, id, session, sizeof(session)) == 0 &&
         api_sees_session(rq, session);
}

int api_sees_run(const struct req *rq, const char *id) {
  char st[16], session[SESSION_STORED_MAX];
  struct reader *rd = api_reader_get();
  int rc = db_run_state(rd->db, id, st, sizeof(st), session, sizeof(session));

  api_reader_put(rd);
  return rc == 0 && (rq->who.admin || api_sees_session(rq, session));
}

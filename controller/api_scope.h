/*
 * api_scope.h: what a caller sees (docs/design.md, "Users").
 *
 * Sessions are a user's own: a user's session "x" is stored as "USER/x";
 * the bootstrap administrator's sessions keep their bare names. A user
 * names their own bare; an administrator may name anyone's in full
 * ("alice/x"), and sees every worker, session and run; a user who is no
 * administrator sees only what is in their own sessions: anything else
 * answers 404, as if it did not exist. Answers show stored names.
 */
#ifndef MUSTER_API_SCOPE_H
#define MUSTER_API_SCOPE_H

#include "api_internal.h"

#include <stddef.h>

/* The stored name of session name as rq's caller means it, into out
 * (SESSION_STORED_MAX bytes). 0; MUSTER_E_INVALID when name is no
 * session's name; MUSTER_E_NOT_FOUND for another user's, to a caller who
 * is no administrator. */
int api_session_scope(const struct req *rq, const char *name, char *out, size_t size);
/* Whether rq's caller sees the session stored as s. */
int api_sees_session(const struct req *rq, const char *s);
/* Whether rq's caller sees worker id (read through rd); 0 also when there
 * is no such worker. */
int api_sees_worker(const struct req *rq, struct reader *rd, const char *id);
/* Whether rq's caller sees run id (its session is theirs to see); 0 also
 * when there is no such run. */
int api_sees_run(const struct req *rq, const char *id);
/* "USER/" for a caller who sees only their own sessions (into buf), else
 * NULL. */
const char *api_own_prefix(const struct req *rq, char *buf, size_t size);

#endif

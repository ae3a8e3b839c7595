/*
 * session_name.h: how long a session's name is. A client names a session
 * with up to SESSION_NAME_MAX of [A-Za-z0-9_.-]; a user's session is
 * stored as "USER/name" (docs/design.md, "Users"), up to 32 + 1 + 64
 * characters: every buffer that holds a stored name has SESSION_STORED_MAX
 * bytes, and session_name_ok() says whether a name is one. Header only.
 */
#ifndef MUSTER_SESSION_NAME_H
#define MUSTER_SESSION_NAME_H

#define SESSION_NAME_MAX 64
#define SESSION_STORED_MAX 112
#define SESSION_USER_MAX 32

#include <string.h>

/* Whether s (n bytes) is a name as a client gives it: a session's, a
 * role's, a run's mode, a lease's holder. */
static inline int session_bare_ok(const char *s, size_t n) {
  if (n == 0 || n > SESSION_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.'))
      return 0;
  }
  return 1;
}

/* Whether s (n bytes) has the form of a user's name: 1 to SESSION_USER_MAX of
 * [a-z0-9_-], starting with a letter. */
static inline int session_user_ok(const char *s, size_t n) {
  if (n == 0 || n > SESSION_USER_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
          s[i] == '-'))
      return 0;
  return 1;
}

/* Whether session is a session's name: bare, or a user's as stored,
 * "USER/name". */
static inline int session_name_ok(const char *session) {
  const char *slash = strchr(session, '/');

  if (!slash)
    return session_bare_ok(session, strlen(session));
  return session_user_ok(session, (size_t)(slash - session)) &&
         session_bare_ok(slash + 1, strlen(slash + 1));
}

#endif

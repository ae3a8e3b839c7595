/*
 * session_name.h: how long a session's name is. A client names a session
 * with up to SESSION_NAME_MAX of [A-Za-z0-9_.-]; a user's session is
 * stored as "USER/name" (docs/design.md, "Users"), up to 32 + 1 + 64
 * characters: every buffer that holds a stored name has SESSION_STORED_MAX
 * bytes. Header only.
 */
#ifndef MUSTER_SESSION_NAME_H
#define MUSTER_SESSION_NAME_H

#define SESSION_NAME_MAX 64
#define SESSION_STORED_MAX 112

#endif

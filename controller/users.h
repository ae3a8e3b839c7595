/*
 * users.h: the people who share a controller, and their tokens
 * (docs/design.md, "Users").
 *
 * A user's token is "mu_" and 64 hex digits (256 random bits). The
 * database keeps its first USER_PREFIX_LEN hex digits in clear, to find
 * the row, and the SHA-256 of the whole token; a call's token is checked by
 * hashing it and comparing in constant time (as JupyterHub does for the
 * tokens it generates: a salted, slow hash buys nothing for 256 random
 * bits). The state directory's `token` is the bootstrap administrator's.
 */
#ifndef MUSTER_USERS_H
#define MUSTER_USERS_H

#include "db.h"
#include "session_name.h"

#include <stddef.h>

#define USER_TOKEN_PREFIX "mu_"
#define USER_TOKEN_LEN (3 + 64)
#define USER_PREFIX_LEN 12
#define USER_NAME_MAX SESSION_USER_MAX
/* The name the bootstrap administrator (the state directory's token) goes
 * by; no user may take it. */
#define USER_BOOTSTRAP "admin"

/* Who a call comes from. */
struct user_id {
  char name[USER_NAME_MAX + 1]; /* "" for the bootstrap administrator */
  int admin;
};

/* A user's row, as db_users.c reads it (limits < 0: none). */
struct db_user {
  char name[USER_NAME_MAX + 1];
  int admin;
  char unix_user[64];
  double max_cpu, max_memory;
  long max_gpus, max_workers;
  char token_prefix[USER_PREFIX_LEN + 1];
  char token_sha256[65];
  char created_at[32];
  int removed; /* removed: its name taken for good, its token dead */
};

/* A new token into token (USER_TOKEN_LEN + 1 bytes), its lookup prefix and
 * its SHA-256 (hex). Returns 0, or MUSTER_E_IO without randomness. */
int user_token_new(char *token, char *prefix, char *sha256) __attribute__((warn_unused_result));
/* Whether token has a user token's shape; its prefix and hash if so. */
int user_token_parts(const char *token, char *prefix, char *sha256);
/* Whether name is a user name: 1 to USER_NAME_MAX of [a-z0-9_-], starting
 * with a letter, and not USER_BOOTSTRAP. */
int user_name_ok(const char *name);
/* Whether account may be a user's --unix-user: an account's name, and not
 * root's or in root's group where it exists here. One that does not exist
 * (yet) is taken: the worker that would run as it fails, saying so (the
 * local and Slurm backends look it up on the controller's host). Returns
 * 0, or -1 with why. */
int user_unix_ok(const char *account, char *why, size_t whylen);

/* ---- db_users.c: the users' rows ---- */
/* What db_user_add() and db_user_set_token() say when another user's token
 * has the same prefix (one in 2^48): mint another. */
#define USER_PREFIX_TAKEN 1
/* MUSTER_E_CONFLICT when the name is taken (by a removed user too). */
int db_user_add(struct db *db, const struct db_user *u) __attribute__((warn_unused_result));
/* MUSTER_E_NOT_FOUND when no user has it. */
int db_user_by_prefix(struct db *db, const char *prefix, struct db_user *out)
    __attribute__((warn_unused_result));
int db_user_get(struct db *db, const char *name, struct db_user *out)
    __attribute__((warn_unused_result));
int db_user_set_token(struct db *db, const char *name, const char *prefix, const char *sha256)
    __attribute__((warn_unused_result));
/* Removes name (the row stays, so that the name is never another's: a new
 * user would find the first one's sessions, runs and logs). MUSTER_E_CONFLICT
 * while name owns live workers; MUSTER_E_NOT_FOUND. */
int db_user_remove(struct db *db, const char *name) __attribute__((warn_unused_result));
/* Calls fn for every user, by name. */
int db_user_each(struct db *db, void (*fn)(void *arg, const struct db_user *u), void *arg)
    __attribute__((warn_unused_result));
/* What a user's live workers hold (the state module keeps each user's:
 * user_live_get_locked()). */
struct user_usage {
  double cpu, memory; /* cores, GiB */
  long gpus, workers;
};
/* Checks a launch of name's that asks for cpu cores, memory GiB, gpus and
 * workers against name's limits and what their live workers hold (quota.c;
 * under the state lock, with the admission). 0, MUSTER_E_INVALID with the
 * sentence in why and the field in *field, or a database error. */
int quota_check_locked(struct db *db, const char *name, double cpu, double memory, long gpus,
                       long workers, const char **field, char *why, size_t size)
    __attribute__((warn_unused_result));
/* Worker id's session (its stored name) into out; MUSTER_E_NOT_FOUND. */
int db_worker_session(struct db *db, const char *id, char *out, size_t size)
    __attribute__((warn_unused_result));
/* How many live workers name owns. */
/* The ids of name's live workers (the ones db_user_live_workers() counts)
 * into *ids (free()), *n of them. */
int db_user_live_ids(struct db *db, const char *name, char (**ids)[16], int *n)
    __attribute__((warn_unused_result));
int db_user_live_workers(struct db *db, const char *name, long *n)
    __attribute__((warn_unused_result));

#endif

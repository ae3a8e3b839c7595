/*
 * user_cmd.c: `muster-controller user ...`, the users of a state directory
 * (users.h), managed on its database directly: it works whether or not
 * the controller runs (a running one reads a call's user from the database,
 * so a new token or a removal holds at once).
 *
 *   user add NAME [--admin] [--unix-user U] [--max-cpu N] [--max-memory GIB]
 *                 [--max-gpus K] [--max-workers W]     prints the new token once
 *   user list                                           one line a user
 *   user token NAME                                     a new token; the old one is dead
 *   user remove NAME                                    refused while NAME has live workers
 *
 * Each takes --state-dir DIR (default $HOME/.muster, as the controller).
 */
#include "user_cmd.h"

#include "db.h"
#include "muster_errors.h"
#include "users.h"
#include "util.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: muster-controller user add NAME [--admin] [--unix-user U] [--max-cpu N]\n"
    "                                       [--max-memory GIB] [--max-gpus K] [--max-workers W]\n"
    "       muster-controller user list\n"
    "       muster-controller user token NAME\n"
    "       muster-controller user remove NAME\n"
    "\n"
    "The users who share this controller, each with a token of their own: add\n"
    "prints a new user's token once (the controller keeps only its hash); token\n"
    "gives a user a new one, the old one dead at once; remove is refused while\n"
    "the user has live workers. Limits are checked at launch. Each takes\n"
    "--state-dir DIR (default $HOME/.muster).\n";

static int fail(const char *fmt, const char *a) {
  fprintf(stderr, "muster-controller user: ");
  fprintf(stderr, fmt, a);
  fputc('\n', stderr);
  return 2;
}

/* Parses a limit (>= 0) from v into *out. */
static int limit(const char *opt, const char *v, double *out) {
  char *end;
  double d;

  if (!v)
    return fail("%s needs a number", opt);
  d = strtod(v, &end);
  if (end == v || *end || !(d >= 0) || d > 1e9)
    return fail("not a number >= 0: %s", v);
  *out = d;
  return 0;
}

static void print_user(void *arg, const struct db_user *u) {
  char cpu[24] = "-", mem[24] = "-", gpus[24] = "-", workers[24] = "-";

  (void)arg;
  if (u->max_cpu >= 0)
    snprintf(cpu, sizeof(cpu), "%g", u->max_cpu);
  if (u->max_memory >= 0)
    snprintf(mem, sizeof(mem), "%g", u->max_memory);
  if (u->max_gpus >= 0)
    snprintf(gpus, sizeof(gpus), "%ld", u->max_gpus);
  if (u->max_workers >= 0)
    snprintf(workers, sizeof(workers), "%ld", u->max_workers);
  printf("%-16s %-5s %-14s %7s %7s %5s %7s  %s\n", u->name, u->admin ? "yes" : "no",
         u->unix_user[0] ? u->unix_user : "-", cpu, mem, gpus, workers, u->created_at);
}

int user_cmd(int argc, char **argv) {
  const char *home = getenv("HOME"), *verb = argc > 1 ? argv[1] : NULL, *name = NULL;
  char dir[512], path[600], err[512], token[USER_TOKEN_LEN + 1];
  struct db_user u;
  struct db *db = NULL;
  struct stat st;
  int rc = 0;

  memset(&u, 0, sizeof(u));
  u.max_cpu = u.max_memory = -1;
  u.max_gpus = u.max_workers = -1;
  snprintf(dir, sizeof(dir), "%s/.muster", home ? home : ".");
  if (!verb || strcmp(verb, "--help") == 0 || strcmp(verb, "-h") == 0) {
    fputs(usage, verb ? stdout : stderr);
    return verb ? 0 : 2;
  }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    double d;

    if (strcmp(a, "--state-dir") == 0 && v) {
      snprintf(dir, sizeof(dir), "%s", v);
      i++;
    } else if (strcmp(a, "--admin") == 0) {
      u.admin = 1;
    } else if (strcmp(a, "--unix-user") == 0 && v) {
      char why[200];
      if (user_unix_ok(v, why, sizeof(why)) != 0)
        return fail("--unix-user: %s", why);
      snprintf(u.unix_user, sizeof(u.unix_user), "%s", v);
      i++;
    } else if (strcmp(a, "--max-cpu") == 0 || strcmp(a, "--max-memory") == 0 ||
               strcmp(a, "--max-gpus") == 0 || strcmp(a, "--max-workers") == 0) {
      if ((rc = limit(a, v, &d)))
        return rc;
      if (strcmp(a, "--max-cpu") == 0)
        u.max_cpu = d;
      else if (strcmp(a, "--max-memory") == 0)
        u.max_memory = d;
      else if (d != (double)(long)d)
        return fail("not a whole number: %s", v);
      else if (strcmp(a, "--max-gpus") == 0)
        u.max_gpus = (long)d;
      else
        u.max_workers = (long)d;
      i++;
    } else if (a[0] == '-') {
      fprintf(stderr, "muster-controller user: unknown option %s\n\n%s", a, usage);
      return 2;
    } else if (!name) {
      name = a;
    } else {
      return fail("one user at a time, not also %s", a);
    }
  }
  if (strcmp(verb, "list") != 0 && !name)
    return fail("name the user (%s)", "user add|token|remove NAME");
  if (name && !user_name_ok(name))
    return fail("\"%s\" is not a user name: 1 to 32 of a-z, 0-9, _ and -, starting with a "
                "letter (\"" USER_BOOTSTRAP "\" is the state directory's token's)",
                name);
  snprintf(path, sizeof(path), "%s/muster.db", dir);
  if (stat(path, &st) != 0)
    return fail("no controller's database at %s (start the controller once, or give --state-dir)",
                path);
  /* The database of this very version: a newer muster-controller would
   * migrate it under a running older one. */
  {
    sqlite3 *raw = NULL;
    sqlite3_stmt *q = NULL;
    int version = -1;

    if (sqlite3_open_v2(path, &raw, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
      version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(raw);
    if (version < 0)
      return fail("cannot read the database %s", path);
    if (version != db_migration_count) {
      fprintf(stderr,
              "muster-controller user: %s is at schema %d, this muster-controller's is %d: %s\n",
              path, version, db_migration_count,
              version < db_migration_count
                  ? "start this muster-controller on it once (it migrates it)"
                  : "use the muster-controller that made it");
      return 2;
    }
  }
  if (db_open(path, &db, err, sizeof(err)) != 0)
    return fail("%s", err);
  if (strcmp(verb, "add") == 0 || strcmp(verb, "token") == 0) {
    snprintf(u.name, sizeof(u.name), "%s", name);
    rc = USER_PREFIX_TAKEN;
    /* (another user's token with the same prefix: one in 2^48; mint anew) */
    for (int tries = 0; rc == USER_PREFIX_TAKEN && tries < 4; tries++) {
      if (user_token_new(token, u.token_prefix, u.token_sha256) != 0)
        rc = MUSTER_E_IO;
      else if (strcmp(verb, "add") == 0)
        rc = db_user_add(db, &u);
      else
        rc = db_user_set_token(db, name, u.token_prefix, u.token_sha256);
    }
    if (rc == MUSTER_E_IO)
      rc = fail("%s", "no randomness for a token");
    else if (rc == MUSTER_E_CONFLICT)
      rc = fail("the name %s is taken, by a user or by one removed (a name is never given to "
                "another; user token NAME gives a user a new token)",
                name);
    else if (rc == MUSTER_E_NOT_FOUND)
      rc = fail("there is no user %s", name);
    else if (rc)
      rc = fail("could not store the token: %s", db_errmsg(db));
    /* The token, once: the database keeps only its hash. */
    if (!rc)
      printf("%s\n", token);
    explicit_bzero(token, sizeof(token));
  } else if (strcmp(verb, "list") == 0) {
    printf("%-16s %-5s %-14s %7s %7s %5s %7s  %s\n", "NAME", "ADMIN", "UNIX_USER", "MAX_CPU",
           "MAX_MEM", "GPUS", "WORKERS", "CREATED");
    if (db_user_each(db, print_user, NULL) != 0)
      rc = fail("could not list the users: %s", db_errmsg(db));
  } else if (strcmp(verb, "remove") == 0) {
    long live = 0;

    rc = db_user_remove(db, name);
    if (rc == MUSTER_E_CONFLICT) {
      if (db_user_live_workers(db, name, &live) != 0)
        live = -1;
      fprintf(stderr,
              "muster-controller user: %s has %ld live worker%s: stop them first (muster stop), "
              "or remove the user through the running controller, which stops them with it: "
              "muster users remove %s --stop\n",
              name, live, live == 1 ? "" : "s", name);
      rc = 1;
    } else if (rc == MUSTER_E_NOT_FOUND) {
      rc = fail("there is no user %s", name);
    } else if (rc) {
      rc = fail("could not remove the user: %s", db_errmsg(db));
    }
  } else {
    fprintf(stderr, "muster-controller user: no command \"%s\" (add, list, token, remove)\n\n%s",
            verb, usage);
    rc = 2;
  }
  db_close(db);
  return rc;
}

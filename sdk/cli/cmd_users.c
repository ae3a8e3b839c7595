/* cmd_users.c: `muster whoami` and `muster users` (administrators: list,
 * add, token, remove; docs/design.md, "Users"), over the REST calls. */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_users[] =
    "usage: muster users [list] [--json]\n"
    "       muster users add NAME [--admin] [--unix-user U] [--max-cpu N]\n"
    "                    [--max-memory GIB] [--max-gpus K] [--max-workers W]\n"
    "       muster users token NAME\n"
    "       muster users remove NAME [--stop]\n"
    "\n"
    "The users of the controller, for administrators. add and token print the\n"
    "new token once (token revokes the old one at once); remove is refused\n"
    "while the user owns live workers, unless --stop stops them with it.\n"
    "muster whoami says whose token this is.\n";

static const char usage_whoami[] =
    "usage: muster whoami [--json]\n"
    "\n"
    "Whose token this client carries, whether they are an administrator, and\n"
    "the account their workers run as.\n";

/* A limit as a table cell: "-" where there is none. */
static void cell(json_t *v, char *buf, size_t size) {
  if (json_is_number(v))
    snprintf(buf, size, "%g", json_number_value(v));
  else
    snprintf(buf, size, "-");
}

static int print_list(const char *text, int as_json) {
  json_t *ans = json_loads(text, 0, NULL), *u;
  size_t i;

  if (as_json || !ans) {
    puts(text);
    json_decref(ans);
    return EXIT_OK;
  }
  printf("%-20s %-5s %-16s %-8s %-10s %-8s %-11s %s\n", "NAME", "ADMIN", "UNIX USER", "MAX CPU",
         "MAX MEMORY", "MAX GPUS", "MAX WORKERS", "LIVE");
  json_array_foreach(json_object_get(ans, "users"), i, u) {
    char cpu[32], mem[32], gpus[32], workers[32];
    const char *unix_user = json_string_value(json_object_get(u, "unix_user"));
    char *name = term_safe_dup(json_string_value(json_object_get(u, "name")), 0);
    char *acct = term_safe_dup(unix_user ? unix_user : "-", 0);

    cell(json_object_get(u, "max_cpu"), cpu, sizeof(cpu));
    cell(json_object_get(u, "max_memory"), mem, sizeof(mem));
    cell(json_object_get(u, "max_gpus"), gpus, sizeof(gpus));
    cell(json_object_get(u, "max_workers"), workers, sizeof(workers));
    printf("%-20s %-5s %-16s %-8s %-10s %-8s %-11s %lld\n", name ? name : "?",
           json_is_true(json_object_get(u, "admin")) ? "yes" : "no", acct ? acct : "?", cpu, mem,
           gpus, workers, (long long)json_integer_value(json_object_get(u, "live_workers")));
    free(name);
    free(acct);
  }
  json_decref(ans);
  return EXIT_OK;
}

/* Prints the "token" of the answer text, alone on its line. */
static int print_token(const char *text) {
  json_t *ans = json_loads(text, 0, NULL);
  const char *t = json_string_value(json_object_get(ans, "token"));

  if (t)
    puts(t);
  json_decref(ans);
  return t ? EXIT_OK : EXIT_INTERNAL;
}

/* The options of muster users add NAME [options] (argv[2] is NAME) into
 * o. Returns EXIT_OK, or EXIT_USAGE (said). */
static int add_options(int argc, char **argv, muster_user_opts *o) {
  muster_user_opts_init(o);
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    double d;
    long l;

    if (strcmp(a, "--admin") == 0) {
      o->admin = 1;
    } else if (strcmp(a, "--unix-user") == 0 && v) {
      o->unix_user = argv[++i];
    } else if ((strcmp(a, "--max-cpu") == 0 || strcmp(a, "--max-memory") == 0) && v) {
      if (parse_double(argv[++i], 0, &d) != 0)
        return usage_error(usage_users, "%s must be a number >= 0, not \"%s\"", a, v);
      *(a[6] == 'c' ? &o->max_cpu : &o->max_memory) = d;
    } else if ((strcmp(a, "--max-gpus") == 0 || strcmp(a, "--max-workers") == 0) && v) {
      if (parse_int(argv[++i], 0, 1L << 30, &l) != 0)
        return usage_error(usage_users, "%s must be a whole number >= 0, not \"%s\"", a, v);
      *(a[6] == 'g' ? &o->max_gpus : &o->max_workers) = (int)l;
    } else {
      return unknown_option(usage_users, a);
    }
  }
  return EXIT_OK;
}

int cmd_users(int argc, char **argv) {
  const char *sub = NULL, *name = NULL;
  muster_client *c = NULL;
  muster_user_opts o;
  char *out = NULL;
  int rc, code, as_json = 0, stop = 0;

  /* The command and NAME wherever they are among --json, --stop and -h;
   * add's own options after NAME. */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];

    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_users, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0 && (!sub || strcmp(sub, "list") == 0)) {
      as_json = 1;
    } else if (strcmp(a, "--stop") == 0 && sub && strcmp(sub, "remove") == 0) {
      stop = 1;
    } else if (!sub && a[0] != '-') {
      sub = a;
      if (strcmp(sub, "list") != 0 && strcmp(sub, "add") != 0 && strcmp(sub, "token") != 0 &&
          strcmp(sub, "remove") != 0)
        return usage_error(usage_users, "unknown users command \"%s\"", sub);
    } else if (sub && strcmp(sub, "list") != 0 && !name && a[0] != '-') {
      name = a;
      if (strcmp(sub, "add") == 0) {
        if ((code = add_options(argc - i + 2, argv + i - 2, &o)) != EXIT_OK)
          return code;
        break;
      }
    } else {
      return unknown_option(usage_users, a);
    }
  }
  if (!sub)
    sub = "list";
  if (strcmp(sub, "list") != 0 && !name)
    return usage_error(usage_users, "muster users %s needs a user's NAME", sub);
  if ((code = connect_client(&c)))
    return code;
  if (strcmp(sub, "list") == 0)
    rc = muster_users_list(c, &out);
  else if (strcmp(sub, "add") == 0)
    rc = muster_user_add(c, name, &o, &out);
  else if (strcmp(sub, "token") == 0)
    rc = muster_user_token(c, name, &out);
  else
    rc = muster_user_remove(c, name, stop, &out);
  if (rc) {
    code = call_failed(c, rc);
    if (rc == MUSTER_E_CONFLICT && strcmp(sub, "remove") == 0 && !stop)
      fprintf(stderr, "(muster users remove %s --stop stops them with it)\n", name);
  } else if (strcmp(sub, "list") == 0) {
    code = print_list(out, as_json);
  } else if (strcmp(sub, "remove") == 0) {
    printf("removed user %s\n", name);
  } else {
    code = print_token(out);
  }
  free(out);
  muster_client_free(c);
  return code;
}

int cmd_whoami(int argc, char **argv) {
  muster_client *c = NULL;
  char *out = NULL;
  int rc, code, as_json = 0;
  json_t *ans;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_whoami, stdout);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--json") == 0) {
      as_json = 1;
    } else {
      return unknown_option(usage_whoami, argv[i]);
    }
  }
  if ((code = connect_client(&c)))
    return code;
  rc = muster_whoami(c, &out);
  if (rc) {
    code = call_failed(c, rc);
  } else if (as_json) {
    puts(out);
  } else if ((ans = json_loads(out, 0, NULL))) {
    const char *run_as = json_string_value(json_object_get(ans, "run_as"));
    char *user = term_safe_dup(json_string_value(json_object_get(ans, "user")), 0);
    char *acct = term_safe_dup(run_as ? run_as : "the controller's own account", 0);

    printf("%s%s; workers run as %s\n", user ? user : "?",
           json_is_true(json_object_get(ans, "admin")) ? " (administrator)" : "",
           acct ? acct : "?");
    free(user);
    free(acct);
    json_decref(ans);
  }
  free(out);
  muster_client_free(c);
  return code;
}

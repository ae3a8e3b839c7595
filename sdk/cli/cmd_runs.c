/* cmd_runs.c: muster runs (the list), muster runs show (one run, its
 * workers and latest values) and muster metrics (a run's points, once or
 * followed). */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_runs[] =
    "usage: muster runs [--session S] [--status S] [-n N] [--json]\n"
    "       muster runs show [--json] RUN\n"
    "\n"
    "Lists runs, newest first (at most N, default 50; --status running, succeeded,\n"
    "failed or stopped). runs show: one run, its workers and its metrics' latest\n"
    "values.\n";

static const char usage_metrics[] =
    "usage: muster metrics [--names N,...] [--max-points N] [--follow] [--json] RUN\n"
    "\n"
    "Prints a run's metrics: a line per step and rank with its values, oldest\n"
    "first. --names: only those; --max-points: at most N points per name and rank\n"
    "(each the last of its bucket; --json adds the bucket's min and max); --follow:\n"
    "new points as they come, until the run ends; --json: the points as JSON lines.\n";

static int cmd_runs_show(int argc, char **argv);

int cmd_runs(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "show") == 0)
    return cmd_runs_show(argc - 1, argv + 1);
  const char *session = NULL, *status = NULL;
  int as_json = 0, rc, code = EXIT_OK;
  long limit = 50, got = 0;
  char next[32] = "";
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_runs, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--session") == 0 && v) {
      session = argv[++i];
    } else if (strcmp(a, "--status") == 0 && v) {
      status = argv[++i];
      if (strcmp(status, "running") != 0 && strcmp(status, "succeeded") != 0 &&
          strcmp(status, "failed") != 0 && strcmp(status, "stopped") != 0)
        return usage_error(usage_runs,
                           "--status must be running, succeeded, failed or stopped, not \"%s\"",
                           status);
    } else if (strcmp(a, "-n") == 0 && v) {
      if (parse_int(argv[++i], 1, 1000000, &limit) != 0)
        return usage_error(usage_runs, "-n must be a whole number >= 1, not \"%s\"", v);
    } else {
      return unknown_option(usage_runs, a);
    }
  }
  if ((code = connect_client(&c)))
    return code;
  if (as_json)
    fputs("[", stdout);
  else
    printf("%-13s %-9s %-9s %-8s %-7s %-12s %-8s %s\n", "RUN", "MODE", "STATUS", "RESTARTS",
           "WORKERS", "SESSION", "AGE", "FAILURE");
  /* Page after page, as the controller hands them out, until -n are shown. */
  do {
    muster_run_info_list l;
    long want = limit - got > 5000 ? 5000 : limit - got;
    rc = muster_runs(c, session, status, (int)want, next[0] ? next : NULL, &l, next);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    for (size_t k = 0; k < l.count; k++, got++) {
      const muster_run_info *r = &l.items[k];
      char age[32], restarts[24], failure[4096];
      if (as_json) {
        printf("%s%s", got ? "," : "", r->json ? r->json : "null");
        continue;
      }
      fmt_age(age_of(r->created_at), age, sizeof(age));
      snprintf(restarts, sizeof(restarts), "%d/%d", r->restarts, r->max_restarts);
      fmt_failure_line(r->failure ? r->failure : "", failure, sizeof(failure));
      {
        char *safe_failure = term_safe_dup(failure, 0);
        char *safe_session = term_safe_dup(r->session ? r->session : "-", 0);
        printf("%-13s %-9s %-9s %-8s %-7zu %-12.12s %-8s %s\n", r->id, r->mode ? r->mode : "-",
               r->status ? r->status : "-", restarts, r->nworkers,
               safe_session ? safe_session : "?", age, safe_failure ? safe_failure : "?");
        free(safe_failure);
        free(safe_session);
      }
    }
    muster_run_info_list_free(&l);
  } while (next[0] && got < limit);
  if (as_json)
    puts("]");
  muster_client_free(c);
  return code;
}

/* A value as the tables print it. */
static void fmt_value(double v, char *buf, size_t size) {
  if (v != 0 && (v >= 1e6 || v <= -1e6 || (v < 1e-3 && v > -1e-3)))
    snprintf(buf, size, "%.4g", v);
  else if (v >= 1000 || v <= -1000)
    snprintf(buf, size, "%.0f", v);
  else
    snprintf(buf, size, "%.4f", v);
}

static void print_latest(json_t *latest) {
  const char *name;
  json_t *v;
  char val[32];

  if (!json_object_size(latest)) {
    puts("latest:   (no metrics)");
    return;
  }
  fputs("latest:  ", stdout);
  json_object_foreach(latest, name, v) {
    char *safe = term_safe_dup(name, 0);
    fmt_value(json_number_value(json_object_get(v, "value")), val, sizeof(val));
    printf(" %s %s (step %lld)", safe ? safe : "?", val,
           (long long)json_integer_value(json_object_get(v, "step")));
    free(safe);
  }
  putchar('\n');
}

static int cmd_runs_show(int argc, char **argv) {
  const char *id = NULL;
  int as_json = 0, code, rc;
  muster_client *c = NULL;
  char *text = NULL, *safe;
  json_t *run, *w;
  size_t i;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_runs, stdout);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--json") == 0) {
      as_json = 1;
    } else if (argv[i][0] == '-') {
      return unknown_option(usage_runs, argv[i]);
    } else if (id) {
      return usage_error(usage_runs, "runs show takes one run, not \"%s\" too", argv[i]);
    } else {
      id = argv[i];
    }
  }
  if (!id)
    return usage_error(usage_runs, "runs show needs a run's id");
  if ((code = connect_client(&c)))
    return code;
  rc = muster_run_get(c, id, &text);
  if (rc) {
    code = call_failed(c, rc);
    muster_client_free(c);
    return code;
  }
  if (as_json) {
    puts(text);
    free(text);
    muster_client_free(c);
    return EXIT_OK;
  }
  run = json_loads(text, 0, NULL);
  free(text);
  if (!run) {
    muster_client_free(c);
    return out_of_memory();
  }
  {
    char *cmd = json_dumps(json_object_get(run, "command"), JSON_COMPACT);
    const char *st = json_string_value(json_object_get(run, "status"));
    const char *failure = json_string_value(json_object_get(run, "failure"));
    char *safe_cmd = term_safe_dup(cmd ? cmd : "?", 0);
    const char *mode = json_string_value(json_object_get(run, "mode"));
    const char *created = json_string_value(json_object_get(run, "created_at"));
    printf("run:      %s (%s), %s\n", id, mode ? mode : "?", st ? st : "?");
    safe = term_safe_dup(json_string_value(json_object_get(run, "session")), 0);
    printf("session:  %s\n", safe ? safe : "-");
    free(safe);
    printf("command:  %s\n", safe_cmd ? safe_cmd : "?");
    printf("restarts: %lld of %lld\n",
           (long long)json_integer_value(json_object_get(run, "restarts")),
           (long long)json_integer_value(json_object_get(run, "max_restarts")));
    printf("created:  %s\n", created ? created : "?");
    if (json_is_string(json_object_get(run, "finished_at")))
      printf("finished: %s\n", json_string_value(json_object_get(run, "finished_at")));
    if (failure) {
      char *safe_failure = term_safe_dup(failure, 1);
      fputs("failure:  ", stdout);
      print_failure(stdout, safe_failure ? safe_failure : "?", "          ");
      free(safe_failure);
    }
    free(cmd);
    free(safe_cmd);
  }
  print_latest(json_object_get(run, "latest"));
  {
    json_t *stalls = json_object_get(run, "stalls");
    json_t *last = json_array_get(stalls, json_array_size(stalls) - 1);
    const char *rep = json_string_value(json_object_get(last, "report"));
    char *safe_rep = rep ? term_safe_dup(rep, 1) : NULL;
    if (last && safe_rep) {
      const char *at = json_string_value(json_object_get(last, "at"));
      printf("stalls:   %zu, the last at %s:\n", json_array_size(stalls), at ? at : "?");
      fputs("          ", stdout);
      print_failure(stdout, safe_rep, "          ");
    }
    free(safe_rep);
  }
  printf("workers:  %zu\n", json_array_size(json_object_get(run, "workers")));
  json_array_foreach(json_object_get(run, "workers"), i, w) {
    muster_worker wk;
    if (i >= 64) {
      printf("  ... and %zu more (muster ps --run %s)\n",
             json_array_size(json_object_get(run, "workers")) - i, id);
      break;
    }
    if (muster_get(c, json_string_value(w), &wk) != 0) {
      printf("  %s\n", json_string_value(w));
      continue;
    }
    term_safe_worker(&wk);
    printf("  %-13s %-10s %-15s %s\n", wk.id, muster_status_name(wk.status),
           wk.ip_address ? wk.ip_address : "-", wk.failure ? wk.failure : "");
    muster_worker_cleanup(&wk);
  }
  json_decref(run);
  muster_client_free(c);
  return EXIT_OK;
}

/* ---- muster metrics ---- */

static int key_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Prints the points of one answer: JSON lines, or a line per step and rank
 * (the answer comes grouped by series: its rows are gathered first). */
static void print_points(json_t *points, int as_json) {
  json_t *rows = json_object(), *pt;
  const char **keys;
  const char *key;
  size_t i, n = 0;

  json_array_foreach(points, i, pt) {
    char k[64];
    json_t *row, *vals;
    if (as_json) {
      char *line = json_dumps(pt, JSON_COMPACT);
      if (line)
        puts(line);
      free(line);
      continue;
    }
    snprintf(k, sizeof(k), "%020lld/%08lld",
             (long long)json_integer_value(json_object_get(pt, "step")),
             (long long)json_integer_value(json_object_get(pt, "rank")));
    row = json_object_get(rows, k);
    if (!row) {
      row = json_pack("{s:O, s:O, s:O, s:{}}", "step", json_object_get(pt, "step"), "rank",
                      json_object_get(pt, "rank"), "epoch", json_object_get(pt, "epoch"), "values");
      if (!row)
        continue;
      json_object_set_new(rows, k, row);
    }
    vals = json_object_get(row, "values");
    json_object_update(vals, json_object_get(pt, "values"));
  }
  keys = calloc(json_object_size(rows) + 1, sizeof(*keys));
  json_object_foreach(rows, key, pt) if (keys) keys[n++] = key;
  qsort(keys, n, sizeof(*keys), key_cmp);
  for (i = 0; i < n; i++) {
    json_t *row = json_object_get(rows, keys[i]), *v;
    json_t *ep = json_object_get(row, "epoch");
    const char *name;
    char epoch[24] = "-", val[32];
    if (json_is_number(ep))
      snprintf(epoch, sizeof(epoch), "%.2f", json_number_value(ep));
    printf("%-8lld %-5lld %-7s", (long long)json_integer_value(json_object_get(row, "step")),
           (long long)json_integer_value(json_object_get(row, "rank")), epoch);
    json_object_foreach(json_object_get(row, "values"), name, v) {
      char *safe = term_safe_dup(name, 0);
      fmt_value(json_number_value(v), val, sizeof(val));
      printf(" %s=%s", safe ? safe : "?", val);
      free(safe);
    }
    putchar('\n');
  }
  free(keys);
  json_decref(rows);
  fflush(stdout);
}

/* The run's status, or NULL when it cannot be read (into buf). */
static const char *run_status(muster_client *c, const char *id, char *buf, size_t size) {
  char *text = NULL;
  json_t *run;
  const char *st;

  if (muster_run_get(c, id, &text) != 0)
    return NULL;
  run = json_loads(text, 0, NULL);
  free(text);
  st = json_string_value(json_object_get(run, "status"));
  snprintf(buf, size, "%s", st ? st : "");
  json_decref(run);
  return st ? buf : NULL;
}

int cmd_metrics(int argc, char **argv) {
  const char *id = NULL, *names = NULL;
  int as_json = 0, follow = 0, code = EXIT_OK, rc;
  long max_points = 0;
  int64_t since = 0;
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_metrics, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--follow") == 0 || strcmp(a, "-f") == 0) {
      follow = 1;
    } else if (strcmp(a, "--names") == 0 && v) {
      names = argv[++i];
    } else if (strcmp(a, "--max-points") == 0 && v) {
      if (parse_int(argv[++i], 1, 100000, &max_points) != 0)
        return usage_error(usage_metrics, "--max-points must be 1 to 100000, not \"%s\"", v);
    } else if (a[0] == '-') {
      return unknown_option(usage_metrics, a);
    } else if (id) {
      return usage_error(usage_metrics, "metrics takes one run, not \"%s\" too", a);
    } else {
      id = a;
    }
  }
  if (!id)
    return usage_error(usage_metrics, "metrics needs a run's id");
  if ((code = connect_client(&c)))
    return code;
  if (!as_json)
    printf("%-8s %-5s %-7s %s\n", "STEP", "RANK", "EPOCH", "VALUES");
  for (;;) {
    char *text = NULL, st[16];
    json_t *ans;
    /* Read the status first: the points read after it include every point
     * its run took before it ended. */
    const char *status = follow ? run_status(c, id, st, sizeof(st)) : "";
    rc = muster_run_metrics(c, id, names, since, (int)max_points, &text);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    ans = json_loads(text, 0, NULL);
    free(text);
    print_points(json_object_get(ans, "points"), as_json);
    since = (int64_t)json_integer_value(json_object_get(ans, "next_since"));
    json_decref(ans);
    if (!follow || (status && strcmp(status, "running") != 0))
      break;
    sleep(1);
  }
  muster_client_free(c);
  return code;
}

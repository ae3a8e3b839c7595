/* check_logs.c: a worker's logs as a user reads them, at their edges: the
 * 64 MiB cap of a stream (what is kept, and the one note that says the rest
 * was dropped, across a controller restart too). Real controller, real
 * workerd processes. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The controller's cap on one stream of one worker (controller/api_worker.c). */
#define LOG_CAP (64L * 1024 * 1024)
#define NOTE "\n[muster: log truncated at 64 MiB]\n"

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* The worker's own token, as its workerd holds it (read from the
 * controller's database). */
static void worker_token(const char *id, char *auth, size_t len) {
  char db[160];
  sqlite3 *h;
  sqlite3_stmt *st;

  snprintf(db, sizeof(db), "%s/muster.db", ctl.dir);
  ck_assert_int_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(h, "SELECT token FROM workers WHERE id = ?1", -1, &st, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  snprintf(auth, len, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(h);
}

/* Ships n bytes of c (then NUL-free text) to worker id's stdout as its
 * workerd would, and asserts that the controller took them (204). */
static void ship(const char *id, const char *auth, char c, size_t n, const char *text) {
  char path[160];
  size_t tl = text ? strlen(text) : 0;
  char *body = malloc(n + tl + 1);

  ck_assert_ptr_nonnull(body);
  memset(body, c, n);
  memcpy(body + n, text ? text : "", tl);
  body[n + tl] = '\0';
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, body, auth, NULL, NULL), 204);
  free(body);
}

/* What GET .../logs answers from offset on. */
static char *log_from(const char *id, long offset) {
  char path[160], *out = NULL;

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?offset=%ld", id, offset);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  return out ? out : strdup("");
}

/* A stream that reaches the cap keeps its output up to the cap exactly (the
 * chunk that crosses it is cut there, not dropped), then says once that the
 * rest was dropped: later chunks, small or large, and a controller restart
 * add neither output nor a second note. */
START_TEST(a_log_past_64_mib_keeps_output_up_to_the_cap_and_says_truncated_once) {
  json_t *workers, *ans;
  char auth[200], id[16], *tail;
  const size_t mib = 1024 * 1024;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"true\"}");
  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(workers, 0), "id"));
  worker_token(id, auth, sizeof(auth));
  /* Up to 1000 bytes short of the cap, in POSTs of 1 MiB (the most one
   * request may carry). */
  for (long i = 0; i < LOG_CAP / (long)mib - 1; i++)
    ship(id, auth, 'a', mib, NULL);
  ship(id, auth, 'b', mib - 1000, NULL);
  /* This one crosses the cap: its first 1000 bytes fit. */
  ship(id, auth, 'c', 990, "0123456789past-the-cap\n");
  /* Small enough to fit where the note ends, and large: both dropped. */
  ship(id, auth, 'd', 0, "late line\n");
  ship(id, auth, 'e', 5000, NULL);
  h_kill9(&ctl);
  h_restart(&ctl);
  ship(id, auth, 'f', 0, "after the restart\n");
  ship(id, auth, 'g', 5000, NULL);

  tail = log_from(id, LOG_CAP - 20);
  ck_assert_msg(strcmp(tail, "cccccccccc0123456789" NOTE) == 0,
                "the log's last bytes from 20 before the cap are \"%.200s\"", tail);
  free(tail);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("logs");
  TCase *tc = tcase_create("logs");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_log_past_64_mib_keeps_output_up_to_the_cap_and_says_truncated_once);
  suite_add_tcase(s, tc);
  return check_run(s);
}

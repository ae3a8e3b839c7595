/* check_db.c: the SQLite store: migrations, transitions with their events,
 * and the database's own guards. Each test uses a fresh file. */
#include "db.h"
#include "muster_errors.h"
#include "state.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path[128];

static void setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/muster-check-db-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/muster.db", dir);
}

static void teardown(void) {
  char cmd[160];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static struct db *open_ok(void) {
  struct db *db = NULL;
  char err[256] = "";

  ck_assert_msg(db_open(path, &db, err, sizeof(err)) == 0, "db_open: %s", err);
  return db;
}

static void insert(struct db *db, const char *id) {
  struct db_worker_new w = {.id = id, .session = "s", .role = "worker", .cpu = 1, .memory = 2,
                            .kernel = "python3", .args_json = "[]", .env_json = "{}",
                            .secret_env_json = "{\"SECRET\":\"v\"}", .token = "tok",
                            .backend = "local"};
  ck_assert_int_eq(db_begin(db), 0);
  ck_assert_int_eq(db_session_touch(db, "s", "127.0.0.1"), 0);
  ck_assert_int_eq(db_worker_insert(db, &w), 0);
  ck_assert_int_eq(db_commit(db), 0);
}

static int sql_int(const char *sql) {
  sqlite3 *c;
  sqlite3_stmt *s;
  int v = -1;

  ck_assert_int_eq(sqlite3_open(path, &c), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(c, sql, -1, &s, NULL), SQLITE_OK);
  if (sqlite3_step(s) == SQLITE_ROW)
    v = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(c);
  return v;
}

static int sql_exec(const char *sql) {
  sqlite3 *c;
  int rc;

  ck_assert_int_eq(sqlite3_open(path, &c), SQLITE_OK);
  rc = sqlite3_exec(c, sql, NULL, NULL, NULL);
  sqlite3_close(c);
  return rc;
}

START_TEST(migrations_set_user_version_and_wal) {
  struct db *db = open_ok();
  db_close(db);
  ck_assert_int_eq(sql_int("PRAGMA user_version"), db_migration_count);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM sqlite_master WHERE name IN "
                           "('workers', 'events', 'sessions')"),
                   3);
  /* Opening again applies nothing and keeps the data. */
  db = open_ok();
  insert(db, "w-aaaaaaaaaa");
  db_close(db);
  db = open_ok();
  json_t *w = db_worker_json(db, "w-aaaaaaaaaa");
  ck_assert_ptr_nonnull(w);
  json_decref(w);
  db_close(db);
}
END_TEST

START_TEST(newer_database_is_refused_untouched) {
  struct db *db = open_ok();
  char err[256] = "", q[64];

  insert(db, "w-aaaaaaaaaa");
  db_close(db);
  snprintf(q, sizeof(q), "PRAGMA user_version = %d", db_migration_count + 1);
  ck_assert_int_eq(sql_exec(q), SQLITE_OK);
  db = NULL;
  ck_assert_int_eq(db_open(path, &db, err, sizeof(err)), MUSTER_E_SCHEMA_TOO_NEW);
  ck_assert_ptr_null(db);
  ck_assert_ptr_nonnull(strstr(err, "newer"));
  ck_assert_int_eq(sql_int("SELECT count(*) FROM workers"), 1);
  ck_assert_int_eq(sql_int("PRAGMA user_version"), db_migration_count + 1);
}
END_TEST

START_TEST(transition_writes_row_and_event_together) {
  struct db *db = open_ok();
  struct db_fields f = DB_FIELDS_INIT;
  json_t *w;

  insert(db, "w-aaaaaaaaaa");
  ck_assert_int_eq(db_begin(db), 0);
  f.backend_ref = "123";
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "scheduling", "starting", &f, "go"),
                   0);
  ck_assert_int_eq(db_commit(db), 0);
  w = db_worker_json(db, "w-aaaaaaaaaa");
  ck_assert_str_eq(json_string_value(json_object_get(w, "status")), "starting");
  ck_assert_str_eq(json_string_value(json_object_get(w, "backend_ref")), "123");
  /* secret_env values never leave: only the keys. */
  ck_assert_str_eq(json_string_value(json_array_get(json_object_get(w, "secret_env"), 0)),
                   "SECRET");
  json_decref(w);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM events WHERE worker_id = 'w-aaaaaaaaaa'"), 2);

  /* A rolled back transition leaves neither the row nor an event. */
  ck_assert_int_eq(db_begin(db), 0);
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "starting", "running", &f, "x"), 0);
  db_rollback(db);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM events"), 2);
  w = db_worker_json(db, "w-aaaaaaaaaa");
  ck_assert_str_eq(json_string_value(json_object_get(w, "status")), "starting");
  json_decref(w);
  db_close(db);
}
END_TEST

START_TEST(stale_from_status_is_a_conflict) {
  struct db *db = open_ok();
  struct db_fields f = DB_FIELDS_INIT;

  insert(db, "w-aaaaaaaaaa");
  ck_assert_int_eq(db_begin(db), 0);
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "running", "failed", &f, "x"),
                   MUSTER_E_CONFLICT);
  db_rollback(db);
  db_close(db);
}
END_TEST

START_TEST(database_guards_terminal_states_and_events) {
  struct db *db = open_ok();
  struct db_fields f = DB_FIELDS_INIT;

  insert(db, "w-aaaaaaaaaa");
  insert(db, "w-bbbbbbbbbb");
  ck_assert_int_eq(db_begin(db), 0);
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "scheduling", "stopped", &f, "x"), 0);
  ck_assert_int_eq(db_commit(db), 0);
  db_close(db);
  ck_assert_int_ne(sql_exec("UPDATE workers SET status = 'running'"), SQLITE_OK);
  ck_assert_int_ne(sql_exec("DELETE FROM events"), SQLITE_OK);
  ck_assert_int_ne(sql_exec("UPDATE events SET detail = 'x'"), SQLITE_OK);
  ck_assert_int_ne(sql_exec("UPDATE workers SET status = 'bogus' WHERE id = 'w-bbbbbbbbbb'"),
                   SQLITE_OK);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM workers WHERE status = 'stopped'"), 1);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM events"), 3);
}
END_TEST

START_TEST(events_since_formats_sse) {
  struct db *db = open_ok();
  char *buf = NULL;
  size_t len = 0;
  int64_t last = 0;

  insert(db, "w-aaaaaaaaaa");
  insert(db, "w-bbbbbbbbbb");
  ck_assert_int_eq(db_events_since(db, 0, 10, &buf, &len, &last), 2);
  ck_assert_ptr_nonnull(strstr(buf, "id: 1\ndata: {"));
  ck_assert_ptr_nonnull(strstr(buf, "\"to\":\"scheduling\""));
  ck_assert_int_eq(last, 2);
  free(buf);
  ck_assert_int_eq(db_events_since(db, 2, 10, &buf, &len, &last), 0);
  ck_assert_ptr_null(buf);
  ck_assert_int_eq(db_last_event_seq(db), 2);
  db_close(db);
}
END_TEST

START_TEST(upgrade_from_version_1_keeps_data_and_adds_exec_tokens) {
  struct db *db;
  json_t *sess;
  char q[64];

  /* A database as the first release left it. */
  ck_assert_int_eq(sql_exec(db_migrations[0].sql), SQLITE_OK);
  ck_assert_int_eq(sql_exec("INSERT INTO sessions(name, master_ip, created_at) "
                            "VALUES ('old', '10.0.0.1', 'then'); PRAGMA user_version = 1;"),
                   SQLITE_OK);
  db = open_ok();
  snprintf(q, sizeof(q), "PRAGMA user_version");
  ck_assert_int_eq(sql_int(q), db_migration_count);
  sess = db_session_json(db, "old");
  ck_assert_ptr_nonnull(sess);
  ck_assert_str_eq(json_string_value(json_object_get(sess, "master_ip")), "10.0.0.1");
  ck_assert_int_eq(strlen(json_string_value(json_object_get(sess, "exec_token"))), 48);
  json_decref(sess);
  /* New sessions get their own token. */
  insert(db, "w-aaaaaaaaaa");
  sess = db_session_json(db, "s");
  ck_assert_int_eq(strlen(json_string_value(json_object_get(sess, "exec_token"))), 48);
  json_decref(sess);
  ck_assert_ptr_null(db_session_json(db, "nope"));
  db_close(db);
}
END_TEST

START_TEST(state_machine_table) {
  /* The design's transitions, and nothing else; starting -> starting is a
   * new start attempt after a restart found the recorded one not running. */
  for (int a = 0; a < WS_COUNT_; a++)
    for (int b = 0; b < WS_COUNT_; b++) {
      int want = (a == WS_SCHEDULING && (b == WS_STARTING || b == WS_FAILED || b == WS_STOPPED)) ||
                 (a == WS_STARTING && (b == WS_STARTING || b == WS_RUNNING || b == WS_FAILED ||
                                         b == WS_STOPPED)) ||
                 (a == WS_RUNNING && (b == WS_SUCCEEDED || b == WS_FAILED || b == WS_STOPPED));
      ck_assert_int_eq(sm_legal(a, b), want);
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("db");
  TCase *tc = tcase_create("store");
  SRunner *sr;
  int failed;

  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, migrations_set_user_version_and_wal);
  tcase_add_test(tc, newer_database_is_refused_untouched);
  tcase_add_test(tc, transition_writes_row_and_event_together);
  tcase_add_test(tc, stale_from_status_is_a_conflict);
  tcase_add_test(tc, database_guards_terminal_states_and_events);
  tcase_add_test(tc, events_since_formats_sse);
  tcase_add_test(tc, state_machine_table);
  tcase_add_test(tc, upgrade_from_version_1_keeps_data_and_adds_exec_tokens);
  suite_add_tcase(s, tc);
  sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}

/* check_db.c: the SQLite store: migrations, transitions with their events,
 * and the database's own guards. Each test uses a fresh file. */
#include "db.h"
#include "muster_errors.h"
#include "state.h"

#include "../check_run.h"

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
  struct db_worker_new w = {.id = id,
                            .session = "s",
                            .role = "worker",
                            .cpu = 1,
                            .memory = 2,
                            .kernel = "python3",
                            .args_json = "[]",
                            .env_json = "{}",
                            .secret_env_json = "{\"SECRET\":\"v\"}",
                            .token = "tok",
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
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "scheduling", "starting", &f, "go"), 0);
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

/* A worker requeued over and over has more events than one answer holds:
 * its detail shows the newest (the latest transition and why), oldest
 * first, and says that earlier ones were left out. */
START_TEST(a_requeued_workers_detail_shows_its_newest_events) {
  struct db *db = open_ok();
  json_t *ev = NULL;
  int truncated = -1;

  insert(db, "w-aaaaaaaaaa");
  insert(db, "w-bbbbbbbbbb");
  ck_assert_int_eq(
      sql_exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1200) "
               "INSERT INTO events(worker_id, at, \"from\", \"to\", detail) "
               "SELECT 'w-aaaaaaaaaa', 't', 'scheduling', 'scheduling', 'round ' || i FROM n"),
      SQLITE_OK);
  ck_assert_int_eq(db_worker_events(db, "w-aaaaaaaaaa", 1000, &ev, &truncated), 0);
  ck_assert_int_eq(json_array_size(ev), 1000);
  ck_assert_int_eq(truncated, 1);
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 999), "detail")),
                   "round 1200");
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 0), "detail")),
                   "round 201");
  json_decref(ev);
  /* A worker with few: all of them, oldest (its creation) first. */
  ck_assert_int_eq(db_worker_events(db, "w-bbbbbbbbbb", 1000, &ev, &truncated), 0);
  ck_assert_int_eq(json_array_size(ev), 1);
  ck_assert_int_eq(truncated, 0);
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 0), "to")), "scheduling");
  json_decref(ev);
  ck_assert_int_eq(db_worker_events(db, "w-0000000000", 1000, &ev, &truncated), MUSTER_E_NOT_FOUND);
  ck_assert_ptr_null(ev);
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

START_TEST(upgrade_from_version_2_gives_live_workers_an_attempt) {
  struct db *db;
  struct db_worker_info info;

  /* A database as the second release left it, with a running worker whose
   * backend_ref is a bare pid. */
  ck_assert_int_eq(sql_exec(db_migrations[0].sql), SQLITE_OK);
  ck_assert_int_eq(sql_exec(db_migrations[1].sql), SQLITE_OK);
  ck_assert_int_eq(
      sql_exec("PRAGMA user_version = 2; "
               "INSERT INTO sessions(name, master_ip, created_at) VALUES ('s', 'x', 't'); "
               "INSERT INTO workers(id, session, role, status, cpu, memory, nvidia_gpu, kernel, "
               "args, env, secret_env, token, backend, created_at, backend_ref, pid) VALUES "
               "('w-aaaaaaaaaa', 's', 'worker', 'running', 1, 1, 0, 'python3', '[]', '{}', "
               "'{}', 'tok', 'local', 't', '4242', 4242), "
               "('w-bbbbbbbbbb', 's', 'worker', 'scheduling', 1, 1, 0, 'python3', '[]', '{}', "
               "'{}', 'tok', 'local', 't', NULL, NULL);"),
      SQLITE_OK);
  db = open_ok();
  ck_assert_int_eq(sql_int("PRAGMA user_version"), db_migration_count);
  ck_assert_int_eq(db_worker_info(db, "w-aaaaaaaaaa", &info), 0);
  ck_assert_int_eq(info.attempt, 1);
  ck_assert_str_eq(info.backend_ref, "4242");
  db_worker_info_cleanup(&info);
  ck_assert_int_eq(db_worker_info(db, "w-bbbbbbbbbb", &info), 0);
  ck_assert_int_eq(info.attempt, 0);
  db_worker_info_cleanup(&info);
  db_close(db);
}
END_TEST

/* A database as release 6 left it: its workers keep working, with no
 * cwd or path (null: the controller's --workdir and the worker's own PATH,
 * as before); a new one stores both. */
START_TEST(upgrade_from_version_6_leaves_old_workers_in_the_controllers_workdir) {
  struct db *db;
  struct db_worker_info info;
  json_t *w;

  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(sql_exec(db_migrations[i].sql), SQLITE_OK);
  ck_assert_int_eq(
      sql_exec("PRAGMA user_version = 6; "
               "INSERT INTO sessions(name, master_ip, created_at) VALUES ('s', 'x', 't'); "
               "INSERT INTO workers(id, session, role, status, cpu, memory, nvidia_gpu, kernel, "
               "args, env, secret_env, token, backend, created_at) VALUES "
               "('w-aaaaaaaaaa', 's', 'worker', 'scheduling', 1, 1, 0, 'python3', '[]', '{}', "
               "'{}', 'tok', 'local', 't');"),
      SQLITE_OK);
  db = open_ok();
  ck_assert_int_eq(sql_int("PRAGMA user_version"), db_migration_count);
  ck_assert_int_eq(db_worker_info(db, "w-aaaaaaaaaa", &info), 0);
  ck_assert_ptr_null(info.cwd);
  ck_assert_ptr_null(info.path);
  db_worker_info_cleanup(&info);
  w = db_worker_json(db, "w-aaaaaaaaaa");
  ck_assert(json_is_null(json_object_get(w, "cwd")) && json_is_null(json_object_get(w, "path")));
  json_decref(w);
  {
    struct db_worker_new n = {.id = "w-bbbbbbbbbb",
                              .session = "s",
                              .role = "worker",
                              .cpu = 1,
                              .memory = 1,
                              .kernel = "python3",
                              .args_json = "[]",
                              .env_json = "{}",
                              .secret_env_json = "{}",
                              .token = "tok",
                              .backend = "local",
                              .cwd = "/home/u/project",
                              .path = "/a:/b"};
    ck_assert_int_eq(db_begin(db), 0);
    ck_assert_int_eq(db_worker_insert(db, &n), 0);
    ck_assert_int_eq(db_commit(db), 0);
  }
  ck_assert_int_eq(db_worker_info(db, "w-bbbbbbbbbb", &info), 0);
  ck_assert_str_eq(info.cwd, "/home/u/project");
  ck_assert_str_eq(info.path, "/a:/b");
  db_worker_info_cleanup(&info);
  w = db_worker_json(db, "w-bbbbbbbbbb");
  ck_assert_str_eq(json_string_value(json_object_get(w, "cwd")), "/home/u/project");
  ck_assert_str_eq(json_string_value(json_object_get(w, "path")), "/a:/b");
  json_decref(w);
  db_close(db);
}
END_TEST

/* A database as release 5 left it: a session-wide lease becomes holder
 * 'default''s part, and a running run is bound to a holder whose part ends
 * it (a part that keeps no workers where its session had no lease). */
START_TEST(upgrade_from_version_5_binds_leases_and_running_runs_to_holders) {
  struct db *db;
  char q[300];

  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(sql_exec(db_migrations[i].sql), SQLITE_OK);
  ck_assert_int_eq(
      sql_exec("PRAGMA user_version = 5; "
               "INSERT INTO sessions(name, created_at, lease_ttl_seconds) VALUES "
               "('leased', 't', 45), ('plain', 't', NULL); "
               "INSERT INTO runs(id, session, mode, command, status, max_restarts, created_at) "
               "VALUES ('r-aaaaaaaaaa', 'leased', 'exec', '[]', 'running', 0, 't'), "
               "('r-bbbbbbbbbb', 'plain', 'exec', '[]', 'running', 0, 't'), "
               "('r-cccccccccc', 'plain', 'exec', '[]', 'failed', 0, 't');"),
      SQLITE_OK);
  db = open_ok();
  ck_assert_int_eq(sql_int("PRAGMA user_version"), db_migration_count);
  snprintf(q, sizeof(q),
           "SELECT count(*) FROM lease_holders WHERE session = 'leased' AND holder = 'default' "
           "AND ttl_seconds = 45 AND stop_workers = 1 AND expired_at IS NULL");
  ck_assert_int_eq(sql_int(q), 1);
  snprintf(q, sizeof(q),
           "SELECT count(*) FROM lease_holders WHERE session = 'plain' AND holder = 'default' "
           "AND stop_workers = 0");
  ck_assert_int_eq(sql_int(q), 1);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM runs WHERE holder = 'default'"), 2);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM sessions WHERE lease_ttl_seconds IS NOT NULL"), 0);
  db_close(db);
}
END_TEST

START_TEST(pages_follow_the_cursor_newest_first) {
  struct db *db = open_ok();
  char ids[7][16], got[3][16];
  int64_t next = 0, before = 0;
  int n, seen = 0;

  for (int i = 0; i < 7; i++) {
    snprintf(ids[i], sizeof(ids[i]), "w-aaaaaaaaa%d", i);
    insert(db, ids[i]);
  }
  do {
    ck_assert_int_eq(db_worker_page(db, NULL, NULL, NULL, NULL, NULL, before, 3, got, &n, &next),
                     0);
    for (int i = 0; i < n; i++, seen++)
      ck_assert_str_eq(got[i], ids[6 - seen]);
    before = next;
  } while (next);
  ck_assert_int_eq(seen, 7);
  /* Filters apply before the limit. */
  ck_assert_int_eq(
      db_worker_page(db, "[\"running\"]", NULL, NULL, NULL, NULL, 0, 3, got, &n, &next), 0);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(next, 0);
  db_close(db);
}
END_TEST

START_TEST(only_the_pruner_deletes_and_only_ended_workers) {
  struct db *db = open_ok();
  struct db_fields f = DB_FIELDS_INIT;
  char pruned[4][16];
  int n;

  insert(db, "w-aaaaaaaaaa");
  insert(db, "w-bbbbbbbbbb");
  f.set_finished_at = 1;
  ck_assert_int_eq(db_begin(db), 0);
  ck_assert_int_eq(db_worker_transition(db, "w-aaaaaaaaaa", "scheduling", "stopped", &f, "x"), 0);
  ck_assert_int_eq(db_commit(db), 0);
  /* Every other writer meets the triggers. */
  ck_assert_int_ne(sql_exec("DELETE FROM events WHERE worker_id = 'w-aaaaaaaaaa'"), SQLITE_OK);
  ck_assert_int_ne(sql_exec("DELETE FROM workers WHERE id = 'w-aaaaaaaaaa'"), SQLITE_OK);
  /* Not yet past the cutoff: nothing goes. */
  ck_assert_int_eq(db_prune(db, "2000-01-01T00:00:00.000Z", 4, pruned, &n), 0);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(db_prune(db, "2999-01-01T00:00:00.000Z", 4, pruned, &n), 0);
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(pruned[0], "w-aaaaaaaaaa");
  ck_assert_int_eq(sql_int("SELECT count(*) FROM events WHERE worker_id = 'w-aaaaaaaaaa'"), 0);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM workers"), 1);
  ck_assert_int_eq(sql_int("SELECT count(*) FROM prune_gate"), 0);
  /* The live one stays, whatever the cutoff, and the gate is shut again. */
  ck_assert_int_ne(sql_exec("DELETE FROM workers WHERE id = 'w-bbbbbbbbbb'"), SQLITE_OK);
  db_close(db);
}
END_TEST

START_TEST(state_machine_table) {
  /* The design's transitions, and nothing else; starting -> starting is a
   * new start attempt after a restart found the recorded one not running;
   * scheduling -> scheduling an attempt submitted to a queueing backend. */
  for (int a = 0; a < WS_COUNT_; a++)
    for (int b = 0; b < WS_COUNT_; b++) {
      int want = (a == WS_SCHEDULING &&
                  (b == WS_SCHEDULING || b == WS_STARTING || b == WS_FAILED || b == WS_STOPPED)) ||
                 (a == WS_STARTING &&
                  (b == WS_STARTING || b == WS_RUNNING || b == WS_FAILED || b == WS_STOPPED)) ||
                 (a == WS_RUNNING && (b == WS_SUCCEEDED || b == WS_FAILED || b == WS_STOPPED));
      ck_assert_int_eq(sm_legal(a, b), want);
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("db");
  TCase *tc = tcase_create("store");

  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, migrations_set_user_version_and_wal);
  tcase_add_test(tc, newer_database_is_refused_untouched);
  tcase_add_test(tc, transition_writes_row_and_event_together);
  tcase_add_test(tc, stale_from_status_is_a_conflict);
  tcase_add_test(tc, database_guards_terminal_states_and_events);
  tcase_add_test(tc, events_since_formats_sse);
  tcase_add_test(tc, a_requeued_workers_detail_shows_its_newest_events);
  tcase_add_test(tc, state_machine_table);
  tcase_add_test(tc, upgrade_from_version_1_keeps_data_and_adds_exec_tokens);
  tcase_add_test(tc, upgrade_from_version_2_gives_live_workers_an_attempt);
  tcase_add_test(tc, upgrade_from_version_5_binds_leases_and_running_runs_to_holders);
  tcase_add_test(tc, upgrade_from_version_6_leaves_old_workers_in_the_controllers_workdir);
  tcase_add_test(tc, pages_follow_the_cursor_newest_first);
  tcase_add_test(tc, only_the_pruner_deletes_and_only_ended_workers);
  suite_add_tcase(s, tc);
  return check_run(s);
}

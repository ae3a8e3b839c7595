/* check_api.c: black-box tests of the controller, its workers and the
 * local backend: the real muster-controller on a free port, real
 * muster-workerd processes, real SQLite; driven through the REST API. */
#include "harness.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

START_TEST(eight_idle_workers_get_eight_distinct_ips) {
  json_t *workers, *ans, *w;
  size_t i, j;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "8";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 8, \"cpu\": 1, \"memory\": 0.5}");
  ck_assert_int_eq(json_array_size(workers), 8);
  json_array_foreach(workers, i, w) {
    ck_assert_str_eq(h_str(w, "session"), "default");
    ck_assert_ptr_null(json_string_value(json_object_get(w, "ip_address")));
  }
  ans = h_await(&ctl, workers, 0, 60);
  ck_assert(json_is_false(json_object_get(ans, "timed_out")));
  ck_assert_int_eq(json_array_size(json_object_get(ans, "failures")), 0);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 8);
  json_array_foreach(json_object_get(ans, "workers"), i, w) {
    const char *ip = h_str(w, "ip_address");
    ck_assert_str_eq(h_str(w, "status"), "running");
    ck_assert_ptr_nonnull(ip);
    {
      struct in_addr a;
      ck_assert_msg(inet_pton(AF_INET, ip, &a) == 1, "ip %s is not an IPv4 address", ip);
    }
    ck_assert_int_gt(json_integer_value(json_object_get(w, "exec_port")), 0);
    ck_assert_ptr_nonnull(h_str(w, "running_at"));
    for (j = 0; j < i; j++)
      ck_assert_str_ne(ip, h_str(json_array_get(json_object_get(ans, "workers"), j), "ip_address"));
  }
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(script_exit_3_is_a_failure_with_its_code) {
  json_t *workers, *ans, *f;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", "
                           "\"code\": \"echo about to fail; exit 3\"}");
  ans = h_await(&ctl, workers, 1, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "failures")), 1);
  f = json_array_get(json_object_get(ans, "failures"), 0);
  ck_assert_str_eq(h_str(f, "status"), "failed");
  ck_assert_int_eq(json_integer_value(json_object_get(f, "exit_code")), 3);
  ck_assert_ptr_nonnull(strstr(h_str(f, "failure"), "code 3"));
  ck_assert_ptr_nonnull(h_str(f, "finished_at"));
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* --advertise-url is the one URL of the controller: what the url file says
 * to clients on this host and what every worker's script gets, and where
 * its workerd registers (it is reachable: the worker succeeds). */
START_TEST(the_advertised_url_is_what_clients_and_workers_get) {
  json_t *workers, *ans;
  char adv[64], path[160], *out = NULL;
  FILE *f;

  fresh();
  ctl.port = h_free_port();
  snprintf(adv, sizeof(adv), "http://localhost:%d", ctl.port);
  ctl.extra[0] = "--advertise-url";
  ctl.extra[1] = adv;
  /* (on the host's network: a worker in a namespace of its own has a
   * localhost of its own) */
  ctl.extra[2] = "--network";
  ctl.extra[3] = "host";
  h_start(&ctl);
  snprintf(path, sizeof(path), "%s/url", ctl.dir);
  f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(path, sizeof(path), f));
  fclose(f);
  path[strcspn(path, "\n")] = '\0';
  ck_assert_msg(strcmp(path, adv) == 0, "the url file says %s, not %s", path, adv);
  workers =
      h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"code\": \"!echo url=$MUSTER_CONTROLLER_URL\"}");
  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 1,
                "the worker did not succeed through %s", adv);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", h_str(json_array_get(workers, 0), "id"));
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  snprintf(path, sizeof(path), "url=%s\n", adv);
  ck_assert_msg(out && strstr(out, path), "the script saw %s, not %s", out, path);
  free(out);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(script_output_and_environment_reach_the_logs) {
  json_t *workers, *ans, *w;
  char path[128], *out = NULL, *err = NULL;
  const char *id;

  fresh();
  /* (a controller started with an LD_BIND_NOW of its own hands it on) */
  unsetenv("LD_BIND_NOW");
  h_start(&ctl);
  workers = h_launch(
      &ctl, "{\"n\": 1, \"cpu\": 0.25, \"memory\": 0.5, \"name\": \"env-check\", \"kernel\": "
            "\"python3\", \"code\": \"import os,sys; "
            "print('ip', os.environ['CDSW_IP_ADDRESS'], os.environ['MUSTER_IP_ADDRESS']); "
            "print('mc', os.environ['CDSW_CPU_MILLICORES'], os.environ['CDSW_MEMORY_MB']); "
            "print('id', os.environ['CDSW_ENGINE_ID'] == os.environ['MUSTER_WORKER_ID']); "
            "print('user', os.environ['GREETING'], os.environ['API_KEY']); "
            "print('args', sys.argv[1:]); "
            "print('bindnow', 'LD_BIND_NOW' in os.environ, 'MUSTER_ZYGOTE_BIND_NOW' in "
            "os.environ); "
            "print('to stderr', file=sys.stderr)\", \"args\": [\"a\", \"b c\"], "
            "\"env\": {\"GREETING\": \"hello\"}, \"secret_env\": {\"API_KEY\": \"s3cret\"}}");
  ans = h_await(&ctl, workers, 1, 20);
  w = json_array_get(json_object_get(ans, "workers"), 0);
  ck_assert_msg(w != NULL, "the script did not succeed");
  id = h_str(w, "id");
  ck_assert_str_eq(h_str(w, "name"), "env-check");
  /* secret_env: keys only, never the value. */
  ck_assert_str_eq(json_string_value(json_array_get(json_object_get(w, "secret_env"), 0)),
                   "API_KEY");
  {
    char *text = json_dumps(w, 0);
    ck_assert_ptr_null(strstr(text, "s3cret"));
    free(text);
  }
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stderr", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &err), 200);
  ck_assert_ptr_nonnull(out);
  {
    char want[80];
    snprintf(want, sizeof(want), "ip %s %s\n", h_str(w, "ip_address"), h_str(w, "ip_address"));
    ck_assert_msg(strstr(out, want) != NULL, "stdout: %s", out);
  }
  ck_assert_ptr_nonnull(strstr(out, "mc 250 512"));
  ck_assert_ptr_nonnull(strstr(out, "id True"));
  ck_assert_ptr_nonnull(strstr(out, "user hello s3cret"));
  ck_assert_ptr_nonnull(strstr(out, "args ['a', 'b c']"));
  /* The fork server's own setting (zygote_proto.h) is not the command's. */
  ck_assert_msg(strstr(out, "bindnow False False") != NULL, "stdout: %s", out);
  ck_assert_ptr_null(strstr(out, "to stderr"));
  ck_assert_str_eq(err, "to stderr\n");
  free(out);
  free(err);
  /* offset skips what a client already has. */
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stderr&offset=3", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &err), 200);
  ck_assert_str_eq(err, "stderr\n");
  free(err);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(followed_log_streams_until_the_worker_ends) {
  json_t *workers;
  char path[128], *out = NULL;
  double t0;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"bash\", \"code\": "
                           "\"for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done\"}");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?follow=1",
           h_str(json_array_get(workers, 0), "id"));
  t0 = h_now();
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  /* The answer ended by itself once the worker finished, with every line. */
  ck_assert_msg(h_now() - t0 < 20, "follow did not end with the worker");
  ck_assert_ptr_nonnull(out);
  ck_assert_msg(strstr(out, "line 1\n") && strstr(out, "line 5\n"), "followed: %s", out);
  free(out);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_worker_that_never_registers_fails_with_the_start_timeout) {
  json_t *workers, *w;
  char fake[160];

  fresh();
  snprintf(ctl.dir, sizeof(ctl.dir), "/tmp/muster-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(ctl.dir));
  /* A worker whose container comes up but whose daemon hangs before it
   * registers. */
  snprintf(fake, sizeof(fake), "%s/hung-workerd", ctl.dir);
  h_write_exec(fake, "#!/bin/sh\nexec sleep 60\n");
  ctl.extra[0] = "--workerd";
  ctl.extra[1] = fake;
  ctl.extra[2] = "--start-timeout";
  ctl.extra[3] = "1";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  w = h_wait_status(&ctl, h_str(json_array_get(workers, 0), "id"), "failed", 10);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "did not register within the start timeout"));
  json_decref(w);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(await_times_out_on_a_worker_blocked_in_scheduling) {
  json_t *big, *blocked, *ans, *f;
  double t0, took;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  big = h_launch(&ctl, "{\"n\": 1, \"cpu\": 2}");
  json_decref(h_await(&ctl, big, 0, 20));
  blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1}");
  t0 = h_now();
  ans = h_await(&ctl, blocked, 0, 1);
  took = h_now() - t0;
  /* It answers at its timeout, not early and not at the worker's start
   * (which never comes here); the upper bound only leaves a loaded machine
   * its delays. */
  ck_assert_msg(took <= 8.0, "await with timeout 1 took %.3f s", took);
  ck_assert_msg(took >= 0.9, "await with timeout 1 returned after only %.3f s", took);
  ck_assert(json_is_true(json_object_get(ans, "timed_out")));
  f = json_array_get(json_object_get(ans, "failures"), 0);
  ck_assert_str_eq(h_str(f, "status"), "scheduling");
  json_decref(ans);
  /* It was not stopped: once room frees up, it runs. */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers/stop", "{\"ids\": [\"x\"]}", "", NULL, NULL), 422);
  {
    char body[96];
    snprintf(body, sizeof(body), "{\"ids\": [\"%s\"]}", h_str(json_array_get(big, 0), "id"));
    ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", body, "", NULL, NULL), 200);
  }
  ans = h_await(&ctl, blocked, 0, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  json_decref(ans);
  json_decref(big);
  json_decref(blocked);
  h_finish(&ctl);
}
END_TEST

START_TEST(stop_ends_the_worker_and_its_processes) {
  json_t *workers, *ans, *w, *again;
  char path[64];
  long pid;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 2, \"cpu\": 0.1, \"session\": \"nb1\"}");
  json_decref(h_await(&ctl, workers, 0, 20));
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  pid = h_workerd_pid(&ctl, h_str(w, "id"));
  ck_assert_int_eq(kill((pid_t)pid, 0), 0);
  json_decref(w);
  snprintf(path, sizeof(path), "/api/v1/workers/%s", h_str(json_array_get(workers, 0), "id"));
  ck_assert_int_eq(h_http(&ctl, "DELETE", path, NULL, "", &w, NULL), 200);
  ck_assert_str_eq(h_str(w, "status"), "stopped");
  json_decref(w);
  /* Its workerd is gone within the grace period. */
  for (int i = 0; i < 100 && kill((pid_t)pid, 0) == 0; i++)
    usleep(100 * 1000);
  ck_assert_msg(kill((pid_t)pid, 0) != 0, "workerd %ld still runs after stop", pid);
  /* Stopping a stopped worker changes nothing. */
  ck_assert_int_eq(h_http(&ctl, "DELETE", path, NULL, "", &again, NULL), 200);
  ck_assert_str_eq(h_str(again, "status"), "stopped");
  json_decref(again);
  /* Stop with no ids: every live worker of the session. */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers/stop", "{\"session\": \"nb1\"}", "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  ck_assert_str_eq(h_str(json_array_get(json_object_get(ans, "workers"), 0), "status"), "stopped");
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(sessions_hand_out_the_exec_token_to_clients_only) {
  json_t *workers, *s1 = NULL, *s2 = NULL, *w;
  char *text;

  fresh();
  h_start(&ctl);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/sessions/nb", NULL, "", NULL, NULL), 404);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"session\": \"nb\"}");
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/sessions/nb", NULL, NULL, NULL, NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/sessions/nb", NULL, "", &s1, NULL), 200);
  ck_assert_str_eq(h_str(s1, "name"), "nb");
  ck_assert_int_eq(strlen(h_str(s1, "exec_token")), 48);
  /* A second launch in the session keeps its token. */
  json_decref(h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"session\": \"nb\"}"));
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/sessions/nb", NULL, "", &s2, NULL), 200);
  ck_assert_str_eq(h_str(s1, "exec_token"), h_str(s2, "exec_token"));
  /* Worker objects never carry it. */
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  text = json_dumps(w, 0);
  ck_assert_ptr_null(strstr(text, h_str(s1, "exec_token")));
  free(text);
  json_decref(w);
  json_decref(s1);
  json_decref(s2);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(tokens_are_required) {
  json_t *ans = NULL, *workers, *w;
  char path[96], auth_body[256];

  fresh();
  h_start(&ctl);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, NULL, &ans, NULL), 401);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "unauthorized");
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, "wrong", NULL, NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1}", NULL, NULL, NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/events", NULL, NULL, NULL, NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, NULL, NULL), 200);
  ck_assert_int_eq(h_http(&ctl, "GET", "/metrics", NULL, NULL, NULL, NULL), 200);
  /* The client token cannot act as a worker. */
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  w = json_array_get(workers, 0);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/heartbeat", h_str(w, "id"));
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{}", "", NULL, NULL), 403);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/register", h_str(w, "id"));
  snprintf(auth_body, sizeof(auth_body), "{\"ip_address\": \"127.0.0.9\"}");
  ck_assert_int_eq(h_http(&ctl, "POST", path, auth_body, NULL, NULL, NULL), 401);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(bad_requests_name_what_was_wrong) {
  json_t *ans = NULL;
  char *big;
  size_t size = 1024 * 1024 + 10;

  fresh();
  h_start(&ctl);
  big = malloc(size + 1);
  memset(big, ' ', size);
  big[size] = '\0';
  big[0] = '{';
  big[size - 1] = '}';
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", big, "", &ans, NULL), 413);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "body_too_large");
  json_decref(ans);
  free(big);

  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 0}", "", &ans, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "n");
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "invalid_value");
  json_decref(ans);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"memory\": -2}", "", &ans, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "memory");
  json_decref(ans);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 4096}", "", &ans, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "cpu");
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "exceeds_capacity");
  json_decref(ans);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"env\": [1]}", "", &ans, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "env");
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": ", "", &ans, NULL), 400);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "malformed_request");
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "[1]", "", NULL, NULL), 400);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers/w-0000000000", NULL, "", &ans, NULL), 404);
  ck_assert_ptr_nonnull(strstr(h_str(json_object_get(ans, "error"), "message"), "w-0000000000"));
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/await",
                          "{\"ids\": [\"w-0000000000\"], \"timeout_seconds\": 1}", "", &ans, NULL),
                   404);
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?status=sleeping", NULL, "", &ans, NULL),
                   422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "status");
  json_decref(ans);
  /* A run that names a worker twice: the first repeat is named. */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/runs",
             "{\"mode\": \"exec\", \"command\": [\"true\"], \"holder\": \"h\", \"workers\": "
             "[\"w-aaaaaaaaaa\", \"w-bbbbbbbbbb\", \"w-bbbbbbbbbb\", \"w-aaaaaaaaaa\"]}",
             "", &ans, NULL),
      422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "workers");
  ck_assert_ptr_nonnull(strstr(h_str(json_object_get(ans, "error"), "message"),
                               "workers[2] names w-bbbbbbbbbb again"));
  json_decref(ans);
  /* None of that stored anything. */
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  h_finish(&ctl);
}
END_TEST

START_TEST(lost_heartbeats_fail_the_worker) {
  json_t *workers, *w;
  long pid;

  fresh();
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "0.2";
  ctl.extra[2] = "--heartbeat-timeout";
  ctl.extra[3] = "4"; /* (a loaded machine may keep a workerd silent for a second) */
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  json_decref(h_await(&ctl, workers, 0, 20));
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  pid = h_workerd_pid(&ctl, h_str(w, "id"));
  json_decref(w);
  /* A frozen worker: its process exists but says nothing. */
  ck_assert_int_eq(kill((pid_t)pid, SIGSTOP), 0);
  w = h_wait_status(&ctl, h_str(json_array_get(workers, 0), "id"), "failed", 30);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "no heartbeat"));
  kill((pid_t)pid, SIGCONT);
  json_decref(w);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_killed_workerd_is_reported_at_once) {
  json_t *workers, *w;
  long pid;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  json_decref(h_await(&ctl, workers, 0, 20));
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  pid = h_workerd_pid(&ctl, h_str(w, "id"));
  json_decref(w);
  ck_assert_int_eq(kill((pid_t)pid, SIGKILL), 0);
  /* Reported from the daemon's end, saying how it ended, not by a
   * heartbeat timeout (15 s) later: the bound is halfway to that. */
  w = h_wait_status(&ctl, h_str(json_array_get(workers, 0), "id"), "failed", 7.5);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "signal 9"));
  json_decref(w);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(restart_after_kill9_keeps_state_and_reattaches_workers) {
  json_t *workers, *ans, *w0, *w1, *before = NULL, *after = NULL;
  long dead;
  char *events = NULL;
  double up, beat = 0;

  fresh();
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "0.3";
  ctl.extra[2] = "--heartbeat-timeout";
  ctl.extra[3] = "4";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 3, \"cpu\": 0.1}");
  json_decref(h_await(&ctl, workers, 0, 20));
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, "", &before, NULL), 200);

  h_kill9(&ctl);
  /* While the controller is down one worker dies. */
  w0 = json_array_get(json_object_get(before, "workers"), 0);
  dead = h_workerd_pid(&ctl, h_str(w0, "id"));
  ck_assert_int_eq(kill(-(pid_t)dead, SIGKILL), 0);
  ck_assert_msg(h_gone(dead, 10), "workerd %ld still runs 10 s after kill -9", dead);
  h_restart(&ctl);
  up = h_wall(); /* the restarted controller counts heartbeats from before this */

  /* Nothing committed was lost: every worker is still there. */
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, "", &after, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(after, "workers")), 3);
  w0 = h_worker(&ctl, h_str(w0, "id"));
  ck_assert_str_eq(h_str(w0, "status"), "failed");
  ck_assert_ptr_nonnull(strstr(h_str(w0, "failure"), "gone"));
  json_decref(w0);
  /* The others re-attach through their heartbeats and stay running: one
   * of theirs is recorded 5 s after the restart, longer than the heartbeat
   * timeout (4 s), and it is still running then. (The controller records
   * the heartbeats it takes, once a second: a worker it failed has no later
   * one.) */
  w1 = json_array_get(json_object_get(before, "workers"), 1);
  for (double until = h_now() + 15; h_now() < until && beat <= up + 5; usleep(100 * 1000)) {
    json_t *now = h_worker(&ctl, h_str(w1, "id"));
    beat = h_iso_seconds(h_str(now, "last_heartbeat"));
    json_decref(now);
  }
  w1 = h_worker(&ctl, h_str(w1, "id"));
  ck_assert_msg(beat > up + 5,
                "no heartbeat of %s recorded 5 s after the restart (15 s waited; last %s): %s (%s)",
                h_str(w1, "id"), h_str(w1, "last_heartbeat") ? h_str(w1, "last_heartbeat") : "none",
                h_str(w1, "status"), h_str(w1, "failure") ? h_str(w1, "failure") : "");
  ck_assert_msg(strcmp(h_str(w1, "status"), "running") == 0, "after restart: %s (%s)",
                h_str(w1, "status"), h_str(w1, "failure") ? h_str(w1, "failure") : "");
  json_decref(w1);
  /* ...and can still be awaited and stopped. */
  ans = h_await(&ctl, workers, 0, 5);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 2);
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{}", "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 2);
  json_decref(ans);
  /* The event log kept every transition: 3 launches, 3 starts, 3 runs, 1
   * loss, 2 stops; and the dead worker's history reads in order. */
  ck_assert_int_eq(h_sse(&ctl, 0, 12, 5000, &events), 12);
  {
    char want[200];
    const char *p = events;
    snprintf(want, sizeof(want), "\"worker_id\":\"%s\",\"from\":\"running\",\"to\":\"failed\"",
             h_str(json_array_get(json_object_get(before, "workers"), 0), "id"));
    ck_assert_msg(strstr(p, want) != NULL, "events: %s", events);
  }
  free(events);
  json_decref(before);
  json_decref(after);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_script_killed_by_a_signal_is_a_failure_naming_it) {
  json_t *workers, *ans, *f;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"code\": \"!kill -9 $$\"}");
  ans = h_await(&ctl, workers, 1, 20);
  f = json_array_get(json_object_get(ans, "failures"), 0);
  ck_assert_ptr_nonnull(f);
  ck_assert_str_eq(h_str(f, "status"), "failed");
  ck_assert_int_eq(json_integer_value(json_object_get(f, "signal")), 9);
  /* Killed: there is no exit code, and the API says null, not 0. */
  ck_assert_msg(json_is_null(json_object_get(f, "exit_code")), "exit_code is not null");
  ck_assert_msg(strstr(h_str(f, "failure"), "killed by signal 9") != NULL, "failure: %s",
                h_str(f, "failure"));
  json_decref(ans);
  json_decref(workers);
  /* And one that exits has no signal. */
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"code\": \"!exit 3\"}");
  ans = h_await(&ctl, workers, 1, 20);
  f = json_array_get(json_object_get(ans, "failures"), 0);
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(json_integer_value(json_object_get(f, "exit_code")), 3);
  ck_assert_msg(json_is_null(json_object_get(f, "signal")), "signal is not null");
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_launch_of_groups_is_one_launch_of_several_shapes) {
  json_t *workers, *ans = NULL;
  const char *field;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"groups\": [{\"n\": 1, \"cpu\": 0.1, \"role\": \"ps\", \"session\": "
                           "\"g\"}, {\"n\": 2, \"cpu\": 0.2, \"session\": \"g\"}]}");
  ck_assert_int_eq(json_array_size(workers), 3);
  /* Group after group, each with its own shape, one launch. */
  ck_assert_str_eq(h_str(json_array_get(workers, 0), "role"), "ps");
  ck_assert_str_eq(h_str(json_array_get(workers, 1), "role"), "worker");
  ck_assert(json_real_value(json_object_get(json_array_get(workers, 0), "cpu")) == 0.1);
  ck_assert(json_real_value(json_object_get(json_array_get(workers, 2), "cpu")) == 0.2);
  ans = h_await(&ctl, workers, 0, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "failures")), 0);
  json_decref(ans);
  json_decref(workers);

  /* What cannot be one launch is refused, naming groups, and stores
   * nothing. */
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers",
                          "{\"groups\": [{\"n\": 1, \"session\": \"a\"}, {\"n\": 1, "
                          "\"session\": \"b\"}]}",
                          "", &ans, NULL),
                   422);
  field = json_string_value(json_object_get(json_object_get(ans, "error"), "field"));
  ck_assert_str_eq(field ? field : "", "groups");
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "{\"groups\": [{\"n\": 1}], \"n\": 2}",
                          "", NULL, NULL),
                   422);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", "{\"groups\": [{\"n\": 1}, {\"n\": 0}]}",
                          "", &ans, NULL),
                   422);
  ck_assert_ptr_nonnull(strstr(h_str(json_object_get(ans, "error"), "message"), "groups[1]"));
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?session=a", NULL, "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  h_finish(&ctl);
}
END_TEST

START_TEST(gpus_are_handed_out_as_distinct_indices) {
  json_t *workers, *ans, *blocked, *w;
  char path[96], *out0 = NULL, *out1 = NULL;

  fresh();
  ctl.extra[0] = "--gpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 2, \"cpu\": 0.1, \"nvidia_gpu\": 1, \"code\": "
                           "\"!echo gpu=$CUDA_VISIBLE_DEVICES n=$MUSTER_NVIDIA_GPU; sleep 2\"}");
  /* Both GPUs are taken: a third worker wanting one waits. */
  blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"nvidia_gpu\": 1}");
  ans = h_await(&ctl, blocked, 0, 0.5);
  ck_assert(json_is_true(json_object_get(ans, "timed_out")));
  json_decref(ans);
  ans = h_await(&ctl, workers, 1, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 2);
  json_decref(ans);
  w = json_array_get(workers, 0);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", h_str(w, "id"));
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out0), 200);
  w = json_array_get(workers, 1);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", h_str(w, "id"));
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out1), 200);
  ck_assert_msg((strcmp(out0, "gpu=0 n=1\n") == 0 && strcmp(out1, "gpu=1 n=1\n") == 0) ||
                    (strcmp(out0, "gpu=1 n=1\n") == 0 && strcmp(out1, "gpu=0 n=1\n") == 0),
                "GPU assignments: %s / %s", out0, out1);
  free(out0);
  free(out1);
  /* Once they finished, the waiting one gets a GPU. */
  ans = h_await(&ctl, blocked, 0, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  json_decref(ans);
  /* Three GPUs can never fit two. */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"nvidia_gpu\": 3}", "", &ans, NULL),
      422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "nvidia_gpu");
  json_decref(ans);
  json_decref(blocked);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("controller");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, eight_idle_workers_get_eight_distinct_ips);
  tcase_add_test(tc, script_exit_3_is_a_failure_with_its_code);
  tcase_add_test(tc, the_advertised_url_is_what_clients_and_workers_get);
  tcase_add_test(tc, script_output_and_environment_reach_the_logs);
  tcase_add_test(tc, followed_log_streams_until_the_worker_ends);
  tcase_add_test(tc, a_worker_that_never_registers_fails_with_the_start_timeout);
  tcase_add_test(tc, await_times_out_on_a_worker_blocked_in_scheduling);
  tcase_add_test(tc, stop_ends_the_worker_and_its_processes);
  tcase_add_test(tc, tokens_are_required);
  tcase_add_test(tc, sessions_hand_out_the_exec_token_to_clients_only);
  tcase_add_test(tc, bad_requests_name_what_was_wrong);
  tcase_add_test(tc, lost_heartbeats_fail_the_worker);
  tcase_add_test(tc, a_killed_workerd_is_reported_at_once);
  tcase_add_test(tc, restart_after_kill9_keeps_state_and_reattaches_workers);
  tcase_add_test(tc, a_script_killed_by_a_signal_is_a_failure_naming_it);
  tcase_add_test(tc, a_launch_of_groups_is_one_launch_of_several_shapes);
  tcase_add_test(tc, gpus_are_handed_out_as_distinct_indices);
  suite_add_tcase(s, tc);
  return check_run(s);
}

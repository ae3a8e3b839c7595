/* workers.c: worker objects: the status names, a worker and a list of
 * them made from the controller's JSON and freed, a worker id's form. */
#include "client_internal.h"
#include "muster.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
        "unknown"};

const char *muster_status_name(muster_status s) {
  return (unsigned)s <= MUSTER_STATUS_UNKNOWN ? status_names[s] : "unknown";
}

int muster_worker_usage(const muster_worker *w, muster_usage *u) {
  json_t *o = w && w->json ? json_loads(w->json, 0, NULL) : NULL;
  json_t *us = o ? json_object_get(o, "usage") : NULL;
  int ok = json_is_object(us);

  if (ok) {
    u->cpu_seconds = json_number_value(json_object_get(us, "cpu_seconds"));
    u->memory_bytes = (long long)json_integer_value(json_object_get(us, "memory_bytes"));
    u->memory_peak_bytes = (long long)json_integer_value(json_object_get(us, "memory_peak_bytes"));
  }
  json_decref(o);
  return ok;
}

int muster_worker_waiting_for(const muster_worker *w, char *buf, size_t size) {
  json_t *o = w && w->json && w->status == MUSTER_SCHEDULING ? json_loads(w->json, 0, NULL) : NULL;
  const char *why = o ? json_string_value(json_object_get(o, "waiting_for")) : NULL;
  int ok = why && *why;

  if (size)
    snprintf(buf, size, "%s", ok ? why : "");
  json_decref(o);
  return ok;
}

int muster_status_terminal(muster_status s) {
  switch (s) {
#define MUSTER_X_STATUS(sym, name, terminal)                                                       \
  case MUSTER_##sym:                                                                               \
    return terminal;
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
  case MUSTER_STATUS_UNKNOWN:
    return 0;
  }
  return 0;
}

muster_status muster_status_parse_(const char *name) {
  for (int i = 0; name && i < MUSTER_STATUS_UNKNOWN; i++)
    if (strcmp(name, status_names[i]) == 0)
      return (muster_status)i;
  return MUSTER_STATUS_UNKNOWN;
}
static char *jdup(json_t *o, const char *key) {
  const char *v = json_string_value(json_object_get(o, key));
  return v ? strdup(v) : NULL;
}

void muster_worker_from_json_(json_t *o, muster_worker *w) {
  json_t *v;

  memset(w, 0, sizeof(*w));
  w->json = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  snprintf(w->id, sizeof(w->id), "%s",
           json_string_value(json_object_get(o, "id")) ? json_string_value(json_object_get(o, "id"))
                                                       : "");
  w->status = muster_status_parse_(json_string_value(json_object_get(o, "status")));
  w->session = jdup(o, "session");
  w->name = jdup(o, "name");
  w->role = jdup(o, "role");
  w->cpu = json_number_value(json_object_get(o, "cpu"));
  w->memory = json_number_value(json_object_get(o, "memory"));
  w->nvidia_gpu = (int)json_integer_value(json_object_get(o, "nvidia_gpu"));
  w->script = jdup(o, "script");
  w->code = jdup(o, "code");
  w->kernel = jdup(o, "kernel");
  w->ip_address = jdup(o, "ip_address");
  w->hostname = jdup(o, "hostname");
  w->exec_port = (int)json_integer_value(json_object_get(o, "exec_port"));
  w->backend = jdup(o, "backend");
  w->backend_ref = jdup(o, "backend_ref");
  v = json_object_get(o, "exit_code");
  w->has_exit_code = json_is_integer(v);
  w->exit_code = (int)json_integer_value(v);
  w->signal = (int)json_integer_value(json_object_get(o, "signal"));
  w->failure = jdup(o, "failure");
  w->created_at = jdup(o, "created_at");
  w->running_at = jdup(o, "running_at");
  w->finished_at = jdup(o, "finished_at");
  w->last_heartbeat = jdup(o, "last_heartbeat");
}

void muster_worker_cleanup(muster_worker *w) {
  if (!w)
    return;
  free(w->session);
  free(w->name);
  free(w->role);
  free(w->script);
  free(w->code);
  free(w->kernel);
  free(w->ip_address);
  free(w->hostname);
  free(w->backend);
  free(w->backend_ref);
  free(w->failure);
  free(w->created_at);
  free(w->running_at);
  free(w->finished_at);
  free(w->last_heartbeat);
  free(w->json);
  memset(w, 0, sizeof(*w));
}

void muster_worker_list_free(muster_worker_list *l) {
  if (!l)
    return;
  for (size_t i = 0; i < l->count; i++)
    muster_worker_cleanup(&l->items[i]);
  free(l->items);
  l->items = NULL;
  l->count = 0;
}

int muster_list_from_json_(muster_client *c, json_t *arr, muster_worker_list *out) {
  size_t i;
  json_t *o;

  out->count = 0;
  out->items = NULL;
  if (!json_is_array(arr))
    return muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL,
                              "the controller's answer has no worker list");
  out->items = calloc(json_array_size(arr) + 1, sizeof(*out->items));
  if (!out->items)
    return muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  json_array_foreach(arr, i, o) muster_worker_from_json_(o, &out->items[out->count++]);
  return 0;
}

int muster_worker_id_ok_(muster_client *c, const char *id) {
  if (!id || strlen(id) != 12 || strncmp(id, "w-", 2) != 0 ||
      strspn(id + 2, "abcdefghijklmnopqrstuvwxyz0123456789") != 10)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "id",
                              "\"%.40s\" is not a worker id (like w-3kf9x2m1qa)",
                              id ? id : "(null)");
  return 0;
}

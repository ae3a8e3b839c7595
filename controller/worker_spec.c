/* worker_spec.c: see worker_spec.h. */
#include "worker_spec.h"

#include "job_secret.h"
#include "validate.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The argv a worker runs, from its launch request. New reference. */
json_t *spec_command(const struct db_worker_info *info) {
  json_t *argv = json_array(),
         *args = info->args_json ? json_loads(info->args_json, 0, NULL) : NULL;

  if (info->command_json) {
    json_decref(argv);
    argv = json_loads(info->command_json, 0, NULL);
    if (!argv)
      argv = json_array();
  } else if (info->script) {
    json_array_append_new(argv, json_string(info->kernel));
    json_array_append_new(argv, json_string(info->script));
  } else if (info->code && info->code[0] == '!') {
    /* CML: code starting with "!" is a shell command. */
    json_array_append_new(argv, json_string("/bin/sh"));
    json_array_append_new(argv, json_string("-c"));
    json_array_append_new(argv, json_string(info->code + 1));
    json_array_append_new(argv, json_string("sh"));
  } else if (info->code) {
    json_array_append_new(argv, json_string(info->kernel));
    json_array_append_new(argv, json_string(validate_kernel_code_flag(info->kernel)));
    json_array_append_new(argv, json_string(info->code));
  }
  if (json_array_size(argv) && json_is_array(args))
    json_array_extend(argv, args);
  json_decref(args);
  return argv;
}

static void setf(json_t *env, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void setf(json_t *env, const char *key, const char *fmt, ...) {
  char buf[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  json_object_set_new(env, key, json_string(buf));
}

/* The environment of docs/design.md for a worker's script. New reference. */
json_t *spec_env(const struct db_worker_info *info, const char *ip, const char *controller_url,
                 const char *run_key) {
  json_t *env = json_object(), *user;
  char token[RUN_TOKEN_LEN + 1];

  setf(env, "MUSTER_CONTROLLER_URL", "%s", controller_url);
  setf(env, "MUSTER_WORKER_ID", "%s", info->id);
  setf(env, "MUSTER_SESSION", "%s", info->session);
  setf(env, "MUSTER_ROLE", "%s", info->role ? info->role : "worker");
  setf(env, "MUSTER_IP_ADDRESS", "%s", ip);
  setf(env, "MUSTER_MASTER_IP", "%s", info->master_ip);
  setf(env, "MUSTER_CPU", "%g", info->cpu);
  setf(env, "MUSTER_MEMORY", "%g", info->memory);
  setf(env, "MUSTER_NVIDIA_GPU", "%d", info->nvidia_gpu);
  setf(env, "CDSW_ENGINE_ID", "%s", info->id);
  setf(env, "CDSW_MASTER_ID", "%s", info->session);
  setf(env, "CDSW_MASTER_IP", "%s", info->master_ip);
  setf(env, "CDSW_IP_ADDRESS", "%s", ip);
  setf(env, "CDSW_CPU_MILLICORES", "%.0f", info->cpu * 1000);
  setf(env, "CDSW_MEMORY_MB", "%.0f", info->memory * 1024);
  /* As in a container: only the GPUs given to this worker are visible. */
  setf(env, "CUDA_VISIBLE_DEVICES", "%s", info->gpu_indices);
  /* The client's PATH (longer than setf's buffer, at times): its commands
   * are found as its own shell would find them. An env PATH still wins. */
  if (info->path)
    json_object_set_new(env, "PATH", json_string(info->path));
  user = info->env_json ? json_loads(info->env_json, 0, NULL) : NULL;
  if (json_is_object(user))
    json_object_update(env, user);
  json_decref(user);
  user = info->secret_env_json ? json_loads(info->secret_env_json, 0, NULL) : NULL;
  if (json_is_object(user))
    json_object_update(env, user);
  json_decref(user);
  /* A run's processes post its metrics with the run's own token. */
  if (info->run[0] && run_token(run_key, info->run, token) == 0) {
    setf(env, "MUSTER_RUN_ID", "%s", info->run);
    setf(env, "MUSTER_RUN_TOKEN", "%s", token);
    explicit_bzero(token, sizeof(token));
  }
  /* The session names the worker's /tmp (docs/sandbox.md): a launch's env
   * cannot put it in another session's. */
  setf(env, "MUSTER_SESSION", "%s", info->session);
  return env;
}

const char *spec_cwd(const struct db_worker_info *info, const char *workdir) {
  return info->cwd ? info->cwd : workdir;
}

json_t *spec_script(const struct db_worker_info *info, const char *workdir) {
  const char *cwd = spec_cwd(info, workdir);
  size_t n = strlen(cwd);

  if (!info->script || info->command_json || info->code)
    return json_null();
  if (info->script[0] == '/')
    return json_string(info->script);
  return json_sprintf("%.*s/%s", (int)(n > 1 && cwd[n - 1] == '/' ? n - 1 : n), cwd, info->script);
}

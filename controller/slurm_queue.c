/*
 * slurm_queue.c: Slurm's queue, read: squeue --json parsed into one struct
 * sq_job per job (from Slurm 22.05's format to 23.02's and later), and the
 * search for a job by its comment. Calls slurm_run.c and slurm_words.c
 * (slurm_internal.h).
 */
#include "slurm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A job's state: a string up to Slurm 22.05, an array of a base state and
 * flags ("RUNNING", "COMPLETING") from 23.02: the first that is a final
 * or a base state, else the first. */
static const char *job_state_of(json_t *v) {
  if (json_is_string(v))
    return json_string_value(v);
  if (json_is_array(v) && json_array_size(v) > 0)
    return json_string_value(json_array_get(v, 0));
  return NULL;
}

/* An integer: a number up to 22.05, {"set", "infinite", "number"} from
 * 23.02. */
static long number_of(json_t *v) {
  if (json_is_object(v))
    return json_is_true(json_object_get(v, "set"))
               ? (long)json_integer_value(json_object_get(v, "number"))
               : 0;
  return (long)json_integer_value(v);
}

/* Parses squeue --json's jobs into *out (pointers into root). */
static int squeue_parse(json_t *root, struct sq_job **out, size_t *n) {
  json_t *jobs = json_object_get(root, "jobs"), *j;
  size_t i;

  *out = NULL;
  *n = 0;
  if (!json_is_array(jobs))
    return -1;
  *out = calloc(json_array_size(jobs) + 1, sizeof(**out));
  if (!*out)
    return -1;
  json_array_foreach(jobs, i, j) {
    struct sq_job *q = &(*out)[*n];
    q->id = number_of(json_object_get(j, "job_id"));
    q->het_id = number_of(json_object_get(j, "het_job_id"));
    q->state = job_state_of(json_object_get(j, "job_state"));
    q->reason = json_string_value(json_object_get(j, "state_reason"));
    q->nodes = json_string_value(json_object_get(j, "nodes"));
    q->comment = json_string_value(json_object_get(j, "comment"));
    if (q->id > 0 && q->state)
      (*n)++;
  }
  return 0;
}

/* Runs squeue --json. Returns its parsed output (to json_decref) or NULL
 * with words filled. */
static json_t *squeue_json(char *words, size_t len) {
  char *argv[] = {"squeue", "--json", NULL};
  struct sb_out o;
  json_t *root = NULL;

  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) != 0) {
    snprintf(words, len, "%s", o.err ? o.err : "cannot run squeue");
  } else if (o.status != 0 || o.timed_out) {
    slurm_words(&o, "squeue", SB_CMD_TIMEOUT_MS, words, len);
  } else {
    json_error_t je;
    root = json_loads(o.out, 0, &je);
    if (!root)
      snprintf(words, len, "squeue --json printed something that is not JSON (%s)", je.text);
  }
  sb_out_free(&o);
  return root;
}

/* Reads the queue: *root (to json_decref) and its jobs *q (to free, pointing
 * into *root). Returns 0, or -1 with nothing to free and words filled. */
int sb_queue_read(json_t **root, struct sq_job **q, size_t *nq, char *words, size_t len) {
  *q = NULL;
  *nq = 0;
  *root = squeue_json(words, len);
  if (!*root)
    return -1;
  if (squeue_parse(*root, q, nq) != 0) {
    snprintf(words, len, "squeue --json printed no jobs array");
    free(*q);
    *q = NULL;
    json_decref(*root);
    *root = NULL;
    return -1;
  }
  return 0;
}

/* The job queued with comment: its id (a heterogeneous job's leader), 0 when
 * there is none, -1 when the queue cannot be read (words say why). */
long sb_queued_with_comment(const char *comment, char *words, size_t len) {
  json_t *root;
  struct sq_job *q;
  size_t nq;
  long id = -1;

  if (sb_queue_read(&root, &q, &nq, words, len) == 0) {
    id = 0;
    for (size_t i = 0; i < nq && !id; i++)
      if (q[i].comment && strcmp(q[i].comment, comment) == 0)
        id = q[i].het_id ? q[i].het_id : q[i].id;
  }
  free(q);
  json_decref(root);
  return id;
}

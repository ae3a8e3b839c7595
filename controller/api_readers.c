/* api_readers.c: the REST API's read-only database connections, and the
 * worker objects read through them (or found in wcache.h's cache). See
 * api_internal.h. */
#include "api_internal.h"

#include "state.h"
#include "wcache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read-only SQLite connections for lists and gets, which so never wait for
 * the state lock nor hold it. Each is used by one thread at a time. */
#define MAX_READERS 66
static struct reader readers[MAX_READERS];
static int nreaders;

/* See api_internal.h. */
int api_readers_open(char *err, size_t errlen) {
  char path[600];

  snprintf(path, sizeof(path), "%s/muster.db", g.cfg.state_dir);
  nreaders = g.cfg.http_threads + 2;
  if (nreaders > MAX_READERS)
    nreaders = MAX_READERS;
  for (int i = 0; i < nreaders; i++) {
    int rc = db_open_reader(path, &readers[i].db, err, errlen);
    if (rc)
      return rc;
    pthread_mutex_init(&readers[i].mu, NULL);
  }
  return 0;
}

void api_readers_close(void) {
  for (int i = 0; i < nreaders; i++) {
    db_close(readers[i].db);
    readers[i].db = NULL;
    pthread_mutex_destroy(&readers[i].mu);
  }
  nreaders = 0;
}

/* Takes a reader connection; give it back with api_reader_put(). */
struct reader *api_reader_get(void) {
  static __thread unsigned hint;

  for (int i = 0; i < nreaders; i++) {
    struct reader *r = &readers[(hint + (unsigned)i) % (unsigned)nreaders];
    if (pthread_mutex_trylock(&r->mu) == 0)
      return r;
  }
  hint++;
  pthread_mutex_lock(&readers[hint % (unsigned)nreaders].mu);
  return &readers[hint % (unsigned)nreaders];
}

void api_reader_put(struct reader *r) {
  pthread_mutex_unlock(&r->mu);
}

/* The worker object of id as JSON text, from the cache or read through
 * rd (without the state lock). Returns a malloc'ed string (length *len), or
 * NULL if there is no such worker. */
char *api_worker_text(struct reader *rd, const char *id, size_t *len) {
  uint64_t gen;
  char *text;
  json_t *w;

  if (wcache_get(id, &text, len, &gen))
    return text;
  w = db_worker_json(rd->db, id);
  if (!w)
    return NULL;
  text = json_dumps(w, JSON_COMPACT);
  json_decref(w);
  if (!text)
    return NULL;
  *len = strlen(text);
  wcache_put(id, text, *len, gen);
  return text;
}

/* The worker object of id, read without the state lock. New reference, or
 * NULL if there is none. */
json_t *api_worker_read(const char *id) {
  struct reader *r = api_reader_get();
  json_t *w = db_worker_json(r->db, id);

  api_reader_put(r);
  return w;
}

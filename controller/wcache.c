/* wcache.c: see wcache.h. */
#include "wcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 32768 /* about 20 MiB at most, for objects of ~600 bytes */
#define STRIPES 64

struct slot {
  char id[16];
  char *text;
  size_t len;
};

static struct slot slots[SLOTS];
static struct stripe {
  pthread_mutex_t mu;
  uint64_t gen;
} stripes[STRIPES];
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Odd while the writer is between a commit and the invalidations that
 * follow it (a seqlock): the cache may then be behind the database, so it is
 * neither read nor filled. */
static uint64_t epoch;

static void init(void) {
  for (int i = 0; i < STRIPES; i++)
    pthread_mutex_init(&stripes[i].mu, NULL);
}

static unsigned hash(const char *id) {
  unsigned h = 2166136261u;

  for (; *id; id++)
    h = (h ^ (unsigned char)*id) * 16777619u;
  return h;
}

int wcache_get(const char *id, char **text, size_t *len, uint64_t *gen) {
  unsigned h = hash(id);
  struct slot *s = &slots[h % SLOTS];
  struct stripe *st = &stripes[h % STRIPES];
  int hit = 0;

  uint64_t e0 = __atomic_load_n(&epoch, __ATOMIC_ACQUIRE);

  pthread_once(&once, init);
  pthread_mutex_lock(&st->mu);
  if (!(e0 & 1) && s->text && strcmp(s->id, id) == 0 && (*text = malloc(s->len + 1)) != NULL) {
    memcpy(*text, s->text, s->len + 1);
    *len = s->len;
    hit = 1;
  }
  *gen = (e0 & 1) ? UINT64_MAX : st->gen;
  pthread_mutex_unlock(&st->mu);
  /* A commit began while the entry was copied: it may be older than what a
   * reader of the database now sees. Read the database instead. */
  if (hit && __atomic_load_n(&epoch, __ATOMIC_ACQUIRE) != e0) {
    free(*text);
    *text = NULL;
    hit = 0;
    *gen = UINT64_MAX;
  }
  return hit;
}

void wcache_put(const char *id, const char *text, size_t len, uint64_t gen) {
  unsigned h = hash(id);
  struct slot *s = &slots[h % SLOTS];
  struct stripe *st = &stripes[h % STRIPES];
  char *copy;

  if (strlen(id) >= sizeof(s->id) || !(copy = malloc(len + 1)))
    return;
  memcpy(copy, text, len);
  copy[len] = '\0';
  pthread_once(&once, init);
  pthread_mutex_lock(&st->mu);
  if (st->gen == gen) {
    free(s->text);
    memcpy(s->id, id, strlen(id) + 1);
    s->text = copy;
    s->len = len;
    copy = NULL;
  }
  pthread_mutex_unlock(&st->mu);
  free(copy);
}

void wcache_write_begin(void) {
  __atomic_add_fetch(&epoch, 1, __ATOMIC_ACQ_REL);
}

void wcache_write_end(void) {
  __atomic_add_fetch(&epoch, 1, __ATOMIC_ACQ_REL);
}

void wcache_invalidate(const char *id) {
  unsigned h = hash(id);
  struct slot *s = &slots[h % SLOTS];
  struct stripe *st = &stripes[h % STRIPES];

  pthread_once(&once, init);
  pthread_mutex_lock(&st->mu);
  st->gen++;
  if (s->text && strcmp(s->id, id) == 0) {
    free(s->text);
    s->text = NULL;
  }
  pthread_mutex_unlock(&st->mu);
}

void wcache_clear(void) {
  pthread_once(&once, init);
  for (int i = 0; i < SLOTS; i++) {
    struct stripe *st = &stripes[i % STRIPES];
    pthread_mutex_lock(&st->mu);
    st->gen++;
    free(slots[i].text);
    slots[i].text = NULL;
    pthread_mutex_unlock(&st->mu);
  }
}

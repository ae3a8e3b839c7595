/* checkpoint.c: the checkpointer: copies the write-ahead log into the
 * database on a thread and a connection of its own, so that the writer
 * never does it while it holds the state lock. A passive checkpoint waits
 * for no one: it copies what no reader still needs, and the next one goes
 * on from there. See docs/internals/controller.md, "Heartbeats". */
#include "checkpoint.h"

#include "log.h"
#include "util.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

/* How often the log is copied: at 5,000 heartbeats a second it grows by
 * about 5,000 pages (20 MiB) a second. */
#define CHECKPOINT_EVERY_MS 500

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  pthread_t thread;
  int running, stopping;
  sqlite3 *conn;
  long long log_frames, checkpointed_frames; /* (atomic: read by /metrics) */
} ck = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *checkpoint_main(void *arg) {
  int64_t next = util_mono_ms() + CHECKPOINT_EVERY_MS;
  int warned = 0;

  (void)arg;
  pthread_mutex_lock(&ck.lock);
  while (!ck.stopping) {
    int rc, log_pages = 0, copied = 0;

    util_cond_wait_until(&ck.wake, &ck.lock, next);
    if (ck.stopping)
      break;
    if (util_mono_ms() < next)
      continue;
    next = util_mono_ms() + CHECKPOINT_EVERY_MS;
    pthread_mutex_unlock(&ck.lock);
    rc = sqlite3_wal_checkpoint_v2(ck.conn, NULL, SQLITE_CHECKPOINT_PASSIVE, &log_pages, &copied);
    pthread_mutex_lock(&ck.lock);
    if (rc == SQLITE_OK && log_pages >= 0) {
      /* (copied: all the log's frames in the database now, whoever copied
       * them, not just this call's) */
      __atomic_store_n(&ck.log_frames, (long long)log_pages, __ATOMIC_RELAXED);
      __atomic_store_n(&ck.checkpointed_frames, (long long)copied, __ATOMIC_RELAXED);
    }
    if (rc != SQLITE_OK && rc != SQLITE_BUSY && !warned) {
      LOG(LOG_WARN, "could not checkpoint the database's log: %s (the writer does it then)",
          sqlite3_errmsg(ck.conn));
      warned = 1;
    } else if (rc == SQLITE_OK && log_pages < 0 && !warned) {
      /* (its connection does not see the log: every checkpoint would be
       * left to the writer, under the state lock) */
      LOG(LOG_WARN, "the checkpointer finds no write-ahead log (the writer checkpoints then)");
      warned = 1;
    }
  }
  pthread_mutex_unlock(&ck.lock);
  return NULL;
}

/* Reads the database on conn once, so that conn knows it is in WAL mode;
 * 1 if it is. */
static int reads_the_log(sqlite3 *conn) {
  sqlite3_stmt *s = NULL;
  int wal = 0;

  if (sqlite3_prepare_v2(conn, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    const unsigned char *mode = sqlite3_column_text(s, 0);
    wal = mode && strcmp((const char *)mode, "wal") == 0;
  }
  sqlite3_finalize(s);
  return wal;
}

int checkpointer_start(const char *path) {
  if (sqlite3_open_v2(path, &ck.conn, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK) {
    LOG(LOG_WARN, "could not open %s for the checkpointer: %s", path,
        ck.conn ? sqlite3_errmsg(ck.conn) : "out of memory");
    sqlite3_close(ck.conn);
    ck.conn = NULL;
    return -1;
  }
  sqlite3_busy_timeout(ck.conn, 1000);
  /* A connection learns that the database is in WAL mode when it first
   * reads it: until then a checkpoint on it finds no log (-1 pages) and
   * does nothing, and every checkpoint falls to the writer's own (at 20,000
   * pages, 50 to 100 ms under the state lock). */
  if (!reads_the_log(ck.conn)) {
    LOG(LOG_WARN, "could not open %s's log for the checkpointer: %s", path,
        sqlite3_errmsg(ck.conn));
    sqlite3_close(ck.conn);
    ck.conn = NULL;
    return -1;
  }
  util_cond_init_monotonic(&ck.wake);
  ck.stopping = 0;
  if (pthread_create(&ck.thread, NULL, checkpoint_main, NULL) != 0) {
    sqlite3_close(ck.conn);
    ck.conn = NULL;
    return -1;
  }
  ck.running = 1;
  return 0;
}

void checkpointer_stop(void) {
  if (!ck.running)
    return;
  pthread_mutex_lock(&ck.lock);
  ck.stopping = 1;
  pthread_cond_signal(&ck.wake);
  pthread_mutex_unlock(&ck.lock);
  pthread_join(ck.thread, NULL);
  sqlite3_close(ck.conn);
  ck.conn = NULL;
  ck.running = 0;
}

void checkpointer_stats(struct checkpoint_stats *out) {
  out->log_frames = __atomic_load_n(&ck.log_frames, __ATOMIC_RELAXED);
  out->checkpointed_frames = __atomic_load_n(&ck.checkpointed_frames, __ATOMIC_RELAXED);
}

/*
 * checkpoint.h: the checkpointer thread (checkpoint.c), which copies the
 * database's write-ahead log into it outside the state lock.
 */
#ifndef MUSTER_CHECKPOINT_H
#define MUSTER_CHECKPOINT_H

/* Starts the checkpointer on the database at path. Returns 0, or -1 (logged)
 * when it cannot: the writer's own checkpoints go on then. */
int checkpointer_start(const char *path);
/* Stops it and waits for it (a no-op if it is not running). */
void checkpointer_stop(void);

/* What the checkpointer has done since the start (for /metrics): pages of
 * the log copied into the database, and the log's length in pages at its
 * last look (0 before its first). */
struct checkpoint_stats {
  long long copied_total;
  long long log_pages;
};
void checkpointer_stats(struct checkpoint_stats *out);

#endif

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

/* The write-ahead log at the checkpointer's last look (for /metrics; 0 and
 * 0 before its first): its length in frames (pages written since it last
 * started over), and how many of them are in the database by then. */
struct checkpoint_stats {
  long long log_frames;
  long long checkpointed_frames;
};
void checkpointer_stats(struct checkpoint_stats *out);

#endif

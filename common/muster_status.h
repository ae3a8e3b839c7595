/*
 * muster_status.h: the one table of worker states, shared by the controller
 * (its state machine and SQLite), the SDK and the CLI.
 *
 * Each row is X(SYMBOL, "name", terminal). The SDK's muster_status enum,
 * the controller's, their names and the terminal test are all generated
 * from it. Never reorder a row: the enums' values follow it.
 */
#ifndef MUSTER_STATUS_H
#define MUSTER_STATUS_H

#define MUSTER_STATUSES(X)                                                                         \
  X(SCHEDULING, "scheduling", 0)                                                                   \
  X(STARTING, "starting", 0)                                                                       \
  X(RUNNING, "running", 0)                                                                         \
  X(SUCCEEDED, "succeeded", 1)                                                                     \
  X(FAILED, "failed", 1)                                                                           \
  X(STOPPED, "stopped", 1)

#endif

/* reach.h: what the workers' account may write of what runs as root
 * (reach.c). */
#ifndef MUSTER_REACH_H
#define MUSTER_REACH_H

#include <stddef.h>

struct reach_item {
  const char *path; /* a file or directory the account must not write */
  const char *what; /* what it is, for the sentence: "the worker daemon" */
  int dir;          /* 1: its entries too (the web files) */
};

/* Becomes account in a child and tries each item, and every directory
 * above it. Returns 0 when it can write none; else -1 with err naming the
 * first it can write (or why it could not check). Call it before any
 * thread starts (it forks). */
int reach_check(const char *account, const struct reach_item *items, int n, char *err, size_t size);

#endif

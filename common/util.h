/*
 * util.h: small helpers shared by the controller, workerd and the SDK.
 */
#ifndef MUSTER_UTIL_H
#define MUSTER_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* On every internal function whose answer says whether it worked: a caller
 * that drops the answer does not compile. */
#define MUST_CHECK __attribute__((warn_unused_result))

/* Writes the current UTC time as "2026-11-21T14:00:00.123Z" into buf. */
void util_now_iso(char *buf, size_t size);
/* The same for ms milliseconds from now (negative: ago). */
void util_iso_after(int64_t ms, char *buf, size_t size);

/* Milliseconds of CLOCK_MONOTONIC; for deadlines and durations only. */
int64_t util_mono_ms(void);
/* Milliseconds of the wall clock (CLOCK_REALTIME), as file times are. */
int64_t util_wall_ms(void);

/* FNV-1a of a string (NULL: ""): for hash tables and short names, never
 * for secrets. */
uint32_t util_fnv1a(const char *s);

/* How workerd's exit report begins when a signal it did not get from the
 * controller ended it (a Slurm cancel, a time limit, a kill by hand); the
 * controller recognises it to wait for a queueing backend's own account. */
#define MUSTER_OUTSIDE_STOP "stopped from outside muster"

/* A condition variable whose timed waits run on CLOCK_MONOTONIC, and a
 * wait on it until at (util_mono_ms() time) or a signal. */
void util_cond_init_monotonic(pthread_cond_t *cv);
void util_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t at);

/* Fills out with len random characters of [a-z0-9] and a NUL (out holds len+1).
 * Returns 0, or a negative muster error if the kernel's random source failed. */
MUST_CHECK int util_random_alnum(char *out, size_t len);

/* Fills out with 2*nbytes random hex digits and a NUL. Same returns. */
MUST_CHECK int util_random_hex(char *out, size_t nbytes);

/* Compares two NUL-terminated secrets in time that depends only on their
 * lengths. Returns 1 if equal. */
int util_secret_equal(const char *a, const char *b);

/* Parses a whole decimal string into *out within [min, max].
 * Returns 0, or MUSTER_E_INVALID if s is empty, has trailing junk or is out
 * of range. */
MUST_CHECK int util_parse_long(const char *s, long min, long max, long *out);

/* Same for a finite double. */
MUST_CHECK int util_parse_double(const char *s, double min, double max, double *out);

/* Reads process pid's start time (clock ticks after boot, field 22 of
 * /proc/PID/stat; pid 0: this process) and whether it is a zombie: with the
 * pid, what tells a process from a later one that got the same pid. Returns
 * 0, MUSTER_E_NOT_FOUND if there is no such process, or MUSTER_E_PROTOCOL. */
MUST_CHECK int util_proc_stat(long pid, unsigned long long *start, int *zombie);

#endif

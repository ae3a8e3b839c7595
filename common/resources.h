/*
 * resources.h: what a worker may ask for, and the one conversion of those
 * numbers into the units each backend writes (cgroup bytes and quota,
 * Slurm's cpus and MiB). Validation refuses anything outside the ranges;
 * the conversions saturate anyway, so no backend can overflow an integer
 * into a different shape (a cpu of 3e9 once became one Slurm cpu). And the
 * words for those numbers that every message shares ("1 core", "23.5 GiB").
 */
#ifndef MUSTER_RESOURCES_H
#define MUSTER_RESOURCES_H

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The ranges a launch accepts (docs/design.md). A cpu is a core (a share
 * of one below 1); memory is GiB. */
#define RES_CPU_MIN 0.01
#define RES_CPU_MAX 4096.0
#define RES_MEMORY_MIN_GIB 0.01
#define RES_MEMORY_MAX_GIB 65536.0

/* v rounded up, held to [lo, hi] (NaN gives lo). */
static inline long long res_ceil_sat(double v, long long lo, long long hi) {
  if (!(v > (double)lo))
    return lo;
  v = ceil(v);
  return v >= (double)hi ? hi : (long long)v;
}

/* GiB as bytes, at least 1 MiB, at most 2^60. */
static inline long long res_memory_bytes(double gib) {
  return res_ceil_sat(gib * 1024.0 * 1024.0 * 1024.0, 1LL << 20, 1LL << 60);
}

/* cpu as a CFS quota in microseconds per period_us, at least the kernel's
 * 1 ms minimum. */
static inline long long res_cpu_quota_us(double cpu, long long period_us) {
  return res_ceil_sat(cpu * (double)period_us, 1000, 1LL << 40);
}

/* cpu as whole cpus (Slurm's --cpus-per-task): rounded up, at least 1. */
static inline int res_cpu_count(double cpu) {
  return (int)res_ceil_sat(cpu - 1e-9, 1, (long long)RES_CPU_MAX);
}

/* An amount of cores or GiB in words a user reads, with digits significant
 * digits below 100 ("23.5", "0.25", "1.7" for 1.7000000000000002 with 3),
 * one decimal above, no trailing zeros ("128", not "128.0"), and never the
 * exponent form ("0.00001", not "1e-05"). */
static inline void res_words_amount_digits(double v, int digits, char *buf, size_t len) {
  char *dot;
  size_t n;

  if (!(v > -1e-9) || !len) {
    snprintf(buf, len, "0");
    return;
  }
  if (v < 1e-9)
    snprintf(buf, len, "0");
  else if (v < 1e-3)
    snprintf(buf, len, "%.9f", v);
  else if (v < 99.95)
    snprintf(buf, len, "%.*g", digits, v);
  else
    snprintf(buf, len, "%.*f", digits > 3 ? digits - 2 : 1, v);
  dot = strchr(buf, '.');
  if (!dot || strchr(buf, 'e'))
    return;
  n = strlen(buf);
  while (n > 0 && buf[n - 1] == '0')
    buf[--n] = '\0';
  if (n > 0 && buf[n - 1] == '.')
    buf[--n] = '\0';
}

/* The same with three significant digits. */
static inline void res_words_amount(double v, char *buf, size_t len) {
  res_words_amount_digits(v, 3, buf, len);
}

/* Two amounts a sentence sets side by side ("3 cores, but this host has 2"):
 * with as many digits as it takes for them to read apart when they differ
 * (2.001 against 2 is "2.001", not "2"). */
static inline void res_words_apart(double a, double b, char *abuf, char *bbuf, size_t len) {
  for (int d = 3; d <= 15; d++) {
    res_words_amount_digits(a, d, abuf, len);
    res_words_amount_digits(b, d, bbuf, len);
    if (strcmp(abuf, bbuf) != 0 || (a - b < 1e-9 && b - a < 1e-9))
      return;
  }
}

/* amount (in words) as cores: "1 core", "0.5 cores", "2 cores". */
static inline void res_words_cores_of(const char *amount, char *buf, size_t len) {
  snprintf(buf, len, "%s core%s", amount, strcmp(amount, "1") == 0 ? "" : "s");
}

/* "1 core", "0.5 cores", "2 cores". */
static inline void res_words_cores(double v, char *buf, size_t len) {
  char amount[32];

  res_words_amount(v, amount, sizeof(amount));
  res_words_cores_of(amount, buf, len);
}

/* "23.5 GiB". */
static inline void res_words_gib(double v, char *buf, size_t len) {
  char amount[32];

  res_words_amount(v, amount, sizeof(amount));
  snprintf(buf, len, "%s GiB", amount);
}

/* "1 GPU", "2 GPUs". */
static inline void res_words_gpus(long n, char *buf, size_t len) {
  snprintf(buf, len, "%ld GPU%s", n, n == 1 ? "" : "s");
}

#endif

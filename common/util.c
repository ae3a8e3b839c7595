/* util.c: see util.h. */
#include "util.h"

#include "muster_errors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void util_now_iso(char *buf, size_t size) {
  util_iso_after(0, buf, size);
}

void util_iso_after(int64_t ms, char *buf, size_t size) {
  struct tm tm;
  char base[24];
  int64_t at;
  time_t sec;

  at = util_wall_ms() + ms;
  sec = (time_t)(at / 1000);
  gmtime_r(&sec, &tm);
  strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, size, "%s.%03dZ", base, (int)(at % 1000));
}

int64_t util_mono_ms(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t util_wall_ms(void) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint32_t util_fnv1a(const char *s) {
  uint32_t h = 2166136261u;

  for (const char *p = s ? s : ""; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  return h;
}

void util_cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t ca;

  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
}

void util_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t at) {
  struct timespec ts = {.tv_sec = at / 1000, .tv_nsec = (at % 1000) * 1000000L};

  pthread_cond_timedwait(cv, mu, &ts);
}

static MUST_CHECK int fill_random(unsigned char *buf, size_t len) {
  size_t got = 0;

  while (got < len) {
    ssize_t n = getrandom(buf + got, len - got, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return MUSTER_E_IO;
    }
    got += (size_t)n;
  }
  return 0;
}

int util_random_alnum(char *out, size_t len) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char raw[64];
  size_t i = 0;

  while (i < len) {
    int rc = fill_random(raw, sizeof(raw));
    if (rc)
      return rc;
    /* Rejection sampling keeps every character equally likely:
     * 252 is the largest multiple of 36 below 256. */
    for (size_t k = 0; k < sizeof(raw) && i < len; k++)
      if (raw[k] < 252)
        out[i++] = alphabet[raw[k] % 36];
  }
  out[len] = '\0';
  return 0;
}

int util_random_hex(char *out, size_t nbytes) {
  static const char digits[] = "0123456789abcdef";
  unsigned char raw[64];
  int rc;

  if (nbytes > sizeof(raw))
    return MUSTER_E_INVALID;
  rc = fill_random(raw, nbytes);
  if (rc)
    return rc;
  for (size_t i = 0; i < nbytes; i++) {
    out[2 * i] = digits[raw[i] >> 4];
    out[2 * i + 1] = digits[raw[i] & 15];
  }
  out[2 * nbytes] = '\0';
  return 0;
}

int util_secret_equal(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char diff = la != lb;

  for (size_t i = 0; i < la && i < lb; i++)
    diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}

int util_parse_long(const char *s, long min, long max, long *out) {
  char *end;
  long v;

  if (!s || !*s)
    return MUSTER_E_INVALID;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || *end || v < min || v > max)
    return MUSTER_E_INVALID;
  *out = v;
  return 0;
}

int util_parse_double(const char *s, double min, double max, double *out) {
  char *end;
  double v;

  if (!s || !*s)
    return MUSTER_E_INVALID;
  errno = 0;
  v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v < min || v > max)
    return MUSTER_E_INVALID;
  *out = v;
  return 0;
}

int util_proc_stat(long pid, unsigned long long *start, int *zombie) {
  char path[64], buf[1024], *p;
  unsigned long long st;
  char state;
  FILE *f;
  size_t n;

  if (pid > 0)
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  else
    snprintf(path, sizeof(path), "/proc/self/stat");
  f = fopen(path, "re");
  if (!f)
    return MUSTER_E_NOT_FOUND;
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
   * cmajflt utime stime cutime cstime priority nice threads itrealvalue
   * starttime; comm may hold anything, so parse after its last ')'. */
  p = strrchr(buf, ')');
  if (!p || sscanf(p + 1,
                   " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                   "%*d %llu",
                   &state, &st) != 2)
    return MUSTER_E_PROTOCOL;
  *start = st;
  *zombie = state == 'Z' || state == 'X';
  return 0;
}

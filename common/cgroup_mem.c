/* cgroup_mem.c: see cgroup_mem.h. */
#include "cgroup_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CG_DEPTH_MAX 32 /* cgroups walked up from this process's */

/* The number after "key " on a line of file path (memory.oom_control,
 * memory.events), or -1. */
static long long keyed_value(const char *path, const char *key) {
  char line[256];
  size_t klen = strlen(key);
  long long v = -1;
  FILE *f = fopen(path, "re");

  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f)) {
    char *end;
    if (strncmp(line, key, klen) != 0 || line[klen] != ' ')
      continue;
    errno = 0;
    v = strtoll(line + klen + 1, &end, 10);
    if (errno || end == line + klen + 1 || v < 0)
      v = -1;
    break;
  }
  fclose(f);
  return v;
}

/* A limit file (memory.limit_in_bytes, memory.max): bytes, or 0 for none
 * ("max", v1's huge default, unreadable). */
static long long limit_value(const char *path) {
  char buf[64], *end;
  long long v;
  size_t n;
  FILE *f = fopen(path, "re");

  if (!f)
    return 0;
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  errno = 0;
  v = strtoll(buf, &end, 10);
  if (errno || end == buf || v <= 0 || v >= (1LL << 60))
    return 0;
  return v;
}

/* The memory cgroup's path within its hierarchy, from /proc/self/cgroup
 * text: a v1 line "N:...memory...:PATH" wins over the v2 line "0::PATH".
 * Sets *v2. Returns 0, or -1 when there is neither. */
static int own_path(const char *text, char *path, size_t len, int *v2) {
  const char *line = text;
  int found = 0;

  while (line && *line) {
    const char *nl = strchr(line, '\n'), *c1 = strchr(line, ':'), *c2;
    size_t llen = nl ? (size_t)(nl - line) : strlen(line);

    if (c1 && (size_t)(c1 - line) < llen &&
        (c2 = memchr(c1 + 1, ':', llen - (size_t)(c1 - line) - 1))) {
      size_t clen = (size_t)(c2 - c1 - 1), plen = llen - (size_t)(c2 + 1 - line);
      int v1mem = 0;

      /* the controller list, comma-separated: is "memory" in it? */
      for (const char *s = c1 + 1; s < c2;) {
        const char *comma = memchr(s, ',', (size_t)(c2 - s));
        size_t n = comma ? (size_t)(comma - s) : (size_t)(c2 - s);
        if (n == 6 && strncmp(s, "memory", 6) == 0)
          v1mem = 1;
        s += n + 1;
      }
      if ((v1mem || (clen == 0 && !found)) && plen > 0 && plen < len && c2[1] == '/') {
        memcpy(path, c2 + 1, plen);
        path[plen] = '\0';
        *v2 = !v1mem;
        found = 1;
        if (v1mem)
          return 0;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  return found ? 0 : -1;
}

int cg_mem_read_at(const char *root_dir, const char *self_cgroup, struct cg_mem *m) {
  char rel[512], dir[256], file[800];
  struct stat st;
  int v2 = 0, levels = 0;

  m->oom_kills = 0;
  m->limit = 0;
  /* "/.." (outside this cgroup namespace's root) cannot be read from here */
  if (own_path(self_cgroup, rel, sizeof(rel), &v2) != 0 || strstr(rel, "/..") != NULL)
    return -1;
  if (snprintf(dir, sizeof(dir), "%s%s", root_dir, v2 ? "" : "/memory") >= (int)sizeof(dir))
    return -1;
  /* v2 without the memory controller enabled, or v1 without its mount */
  snprintf(file, sizeof(file), "%s/%s", dir, v2 ? "cgroup.controllers" : "memory.usage_in_bytes");
  if (stat(file, &st) != 0)
    return -1;
  for (;;) {
    long long kills, limit;
    char *slash;

    snprintf(file, sizeof(file), "%s%s/%s", dir, strcmp(rel, "/") ? rel : "",
             v2 ? "memory.events" : "memory.oom_control");
    /* The kernel counts a kill in the victim's own cgroup (and, on v2,
     * in every one above, where a sibling's kills would show too): only
     * this process's own cgroup's count is taken. */
    kills = levels == 0 ? keyed_value(file, "oom_kill") : -1;
    if (kills > 0)
      m->oom_kills = kills;
    snprintf(file, sizeof(file), "%s%s/%s", dir, strcmp(rel, "/") ? rel : "",
             v2 ? "memory.max" : "memory.limit_in_bytes");
    limit = limit_value(file);
    if (limit > 0 && (m->limit == 0 || limit < m->limit))
      m->limit = limit;
    if (strcmp(rel, "/") == 0 || ++levels >= CG_DEPTH_MAX)
      break;
    slash = strrchr(rel, '/');
    if (slash == rel)
      rel[1] = '\0';
    else
      *slash = '\0';
  }
  return 0;
}

int cg_mem_read(struct cg_mem *m) {
  char text[4096];
  size_t n;
  FILE *f = fopen("/proc/self/cgroup", "re");

  m->oom_kills = 0;
  m->limit = 0;
  if (!f)
    return -1;
  n = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[n] = '\0';
  return cg_mem_read_at("/sys/fs/cgroup", text, m);
}

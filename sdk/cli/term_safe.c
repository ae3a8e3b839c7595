/* term_safe.c: what the API says, shown so that it cannot drive the
 * reader's terminal (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes c (a byte below 0x20, or 0x7f) as its escape into out. */
static size_t esc_byte(unsigned char c, char *out) {
  switch (c) {
  case '\n':
    return (size_t)snprintf(out, TERM_SAFE_GROWTH + 1, "\\n");
  case '\t':
    return (size_t)snprintf(out, TERM_SAFE_GROWTH + 1, "\\t");
  case '\r':
    return (size_t)snprintf(out, TERM_SAFE_GROWTH + 1, "\\r");
  default:
    return (size_t)snprintf(out, TERM_SAFE_GROWTH + 1, "\\x%02x", c);
  }
}

size_t term_safe(const char *s, size_t n, int keep_lines, char *out) {
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0;

  for (size_t i = 0; i < n; i++) {
    unsigned char c = p[i];

    if ((c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f) {
      o += esc_byte(c, out + o);
    } else if (c == 0xc2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f) {
      /* A C1 control (U+0080..U+009F): CSI among them. */
      o += (size_t)snprintf(out + o, 2 * TERM_SAFE_GROWTH + 1, "\\u%04x", p[i + 1]);
      i++;
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
  return o;
}

char *term_safe_dup(const char *s, int keep_lines) {
  size_t n = strlen(s);
  char *out = malloc(n * TERM_SAFE_GROWTH + 1);

  if (out)
    term_safe(s, n, keep_lines, out);
  return out;
}

/* Replaces *s by its safe form when it differs (kept as it was without
 * memory). */
static void safe_field(char **s, int keep_lines) {
  char *safe;

  if (!*s || !(safe = term_safe_dup(*s, keep_lines)))
    return;
  if (strcmp(safe, *s) == 0) {
    free(safe);
    return;
  }
  free(*s);
  *s = safe;
}

void term_safe_worker(muster_worker *w) {
  char **fields[] = {&w->session,     &w->name,          &w->role,       &w->script,
                     &w->code,        &w->kernel,        &w->ip_address, &w->hostname,
                     &w->backend,     &w->backend_ref,   &w->created_at, &w->running_at,
                     &w->finished_at, &w->last_heartbeat};

  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
    safe_field(fields[i], 0);
  /* A failure keeps its lines (the stderr tail under its sentence), which
   * print_failure() indents: a line of it cannot pass for the CLI's own. */
  safe_field(&w->failure, 1);
}

void term_safe_list(muster_worker_list *l) {
  for (size_t i = 0; l && i < l->count; i++)
    term_safe_worker(&l->items[i]);
}

/* usage.c: what the muster CLI says about a wrong command line: the one
 * line that says what is wrong, a "did you mean" where a command or an
 * option is close to what was typed (edit distance), and where to read
 * more ("see 'muster CMD --help'"), never the whole usage. A command's
 * options are read from its usage text, so the suggestions cannot drift
 * from what --help shows. It calls nothing in the CLI. */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define WORD_MAX 64

/* The optimal string alignment distance of a[0..na) and b[0..nb) (edits,
 * an adjacent swap counted as one); words longer than WORD_MAX count as far
 * apart. */
static size_t distance(const char *a, size_t na, const char *b, size_t nb) {
  size_t d[WORD_MAX + 1][WORD_MAX + 1];

  if (na > WORD_MAX || nb > WORD_MAX)
    return WORD_MAX;
  for (size_t i = 0; i <= na; i++)
    d[i][0] = i;
  for (size_t j = 0; j <= nb; j++)
    d[0][j] = j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      size_t cost = a[i - 1] != b[j - 1], best = d[i - 1][j - 1] + cost;
      if (d[i - 1][j] + 1 < best)
        best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best)
        best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[na][nb];
}

/* Whether typed is close enough to cand (both without leading dashes) to
 * suggest it: one edit on a word of two letters or more, two on one of six
 * or more; the same word with other dashes is closest of all. Returns the
 * distance, or WORD_MAX when not close. */
static size_t closeness(const char *typed, const char *cand, size_t ncand) {
  size_t d = distance(typed, strlen(typed), cand, ncand);

  if (d == 0 || (d == 1 && ncand >= 2) || (d == 2 && ncand >= 6))
    return d;
  return WORD_MAX;
}

const char *closest_word(const char *typed, const char *const *words, size_t n) {
  const char *best = NULL;
  size_t best_d = WORD_MAX;

  for (size_t i = 0; i < n; i++) {
    size_t d = closeness(typed, words[i], strlen(words[i]));
    if (d < best_d) {
      best = words[i];
      best_d = d;
    }
  }
  return best;
}

/* The next option named in a usage text from *p on ("-n", "--cpu"): its
 * start and length, *p moved past it. Returns 0 when there is none left. */
static int next_option(const char **p, const char **opt, size_t *len) {
  for (const char *s = *p; *s; s++) {
    if (s[0] != '-' || (s > *p && !strchr(" [|(\n", s[-1])))
      continue;
    size_t n = strspn(s, "-abcdefghijklmnopqrstuvwxyz0123456789");
    if (n < 2 || (s[1] == '-' && n < 3) || s[n - 1] == '-')
      continue;
    *opt = s;
    *len = n;
    *p = s + n;
    return 1;
  }
  return 0;
}

/* Whether the usage text's synopsis (up to its first blank line; the prose
 * after it quotes other commands' options, "muster launch -n 4") names opt
 * as an option. */
static int usage_has(const char *usage, const char *opt) {
  const char *p = usage, *o, *end = strstr(usage, "\n\n");
  size_t n;

  while (next_option(&p, &o, &n) && (!end || o < end))
    if (n == strlen(opt) && strncmp(o, opt, n) == 0)
      return 1;
  return 0;
}

/* Where a usage text sends the user: "muster launch --help" for
 * "usage: muster launch ...", "muster --help" for the main one. */
static void print_see(const char *usage) {
  const char *cmd = strncmp(usage, "usage: muster ", 14) == 0 ? usage + 14 : "";
  size_t n = strspn(cmd, "abcdefghijklmnopqrstuvwxyz");

  fprintf(stderr, "see 'muster %.*s%s--help'\n", (int)n, cmd, n ? " " : "");
}

int usage_error(const char *usage, const char *fmt, ...) {
  va_list ap;

  fputs("muster: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  print_see(usage);
  return EXIT_USAGE;
}

int unknown_option(const char *usage, const char *opt) {
  const char *p = usage, *o, *best = NULL, *typed = opt + strspn(opt, "-");
  size_t n, best_n = 0, best_d = WORD_MAX;

  if (usage_has(usage, opt))
    return usage_error(usage, "%s needs a value", opt);
  while (opt[0] == '-' && next_option(&p, &o, &n)) {
    size_t dashes = strspn(o, "-");
    size_t d = closeness(typed, o + dashes, n - dashes);
    if (d < best_d) {
      best = o;
      best_n = n;
      best_d = d;
    }
  }
  if (best)
    return usage_error(usage, "unknown option %s (did you mean %.*s?)", opt, (int)best_n, best);
  return usage_error(usage, "unknown option %s", opt);
}

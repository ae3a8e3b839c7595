/* cmd_view.c: the commands that show workers: muster ps (ls), show and
 * logs, and the table and the full view they print. */
#include "cli.h"
#include "resources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_ps[] =
    "usage: muster ps [-a] [--session S] [--status S]... [--role R] [--json]\n"
    "\n"
    "Lists workers of every session (--session S: of one), newest first: the\n"
    "live ones, or all with -a. WHY says what a scheduling worker waits for, or\n"
    "why a worker failed (its first line; muster show prints it whole).\n";

static const char usage_show[] = "usage: muster show [--json] ID...\n\nShows workers in full.\n";

static const char usage_logs[] =
    "usage: muster logs [-f] [--stderr] [--raw] ID\n"
    "\n"
    "Prints a worker's output; -f follows it until the worker ends. On a terminal\n"
    "its control characters but newlines and tabs are written out (\\x1b, \\r), so\n"
    "that the output cannot drive the terminal; --raw prints it as it is.\n";

/* Bytes in the CLI's few characters: 812K, 408M, 1.5G. */
static void fmt_bytes(long long b, char *buf, size_t size) {
  if (b < 1024LL * 1024)
    snprintf(buf, size, "%lldK", b / 1024);
  else if (b < 1024LL * 1024 * 1024)
    snprintf(buf, size, "%lldM", b / (1024 * 1024));
  else
    snprintf(buf, size, "%.1fG", (double)b / (1024.0 * 1024 * 1024));
}

/* "12.3s/408M": cpu seconds and memory now (peak once it ended), or "-". */
static void fmt_usage(const muster_worker *w, char *buf, size_t size) {
  muster_usage u;
  char mem[32];

  if (!muster_worker_usage(w, &u)) {
    snprintf(buf, size, "-");
    return;
  }
  fmt_bytes(muster_status_terminal(w->status) ? u.memory_peak_bytes : u.memory_bytes, mem,
            sizeof(mem));
  snprintf(buf, size, "%.1fs/%s", u.cpu_seconds, mem);
}

/* The last cell of a row, WHY: what a scheduling worker waits for (cut to
 * WHY_MAX bytes, on a character's boundary, with "..."), or why it failed
 * (the sentence and its stderr's last line), so a table keeps one line per
 * worker. */
#define WHY_MAX 100
static void fmt_why(const muster_worker *w, char *buf, size_t size) {
  char why[512];
  size_t n;

  if (!muster_worker_waiting_for(w, why + 12, sizeof(why) - 12)) {
    /* One line a worker: the sentence and its stderr's last line. */
    fmt_failure_line(w->failure ? w->failure : "", buf, size);
    return;
  }
  memcpy(why, "waiting for ", 12);
  n = strcspn(why, "\r\n");
  why[n] = '\0';
  if (n > WHY_MAX) {
    n = WHY_MAX - 3;
    while (n > 0 && ((unsigned char)why[n] & 0xC0) == 0x80)
      n--;
    memcpy(why + n, "...", 4);
  }
  snprintf(buf, size, "%s", why);
}

/* why (NUL-terminated, in a buffer of size bytes) made safe to show, cut
 * to fit. */
static void safe_why(char *why, size_t size) {
  char *safe = term_safe_dup(why, 0);

  if (safe) {
    snprintf(why, size, "%s", safe);
    free(safe);
  }
}

static void print_table(const muster_worker_list *l) {
  printf("%-12s  %-10s  %-15s  %-8s  %-10s  %-15s  %5s  %6s  %12s  %3s  %5s  %4s  %s\n", "ID",
         "STATUS", "SESSION", "ROLE", "NAME", "IP", "CPU", "MEM", "USED", "GPU", "AGE", "EXIT",
         "WHY");
  for (size_t i = 0; i < l->count; i++) {
    const muster_worker *w = &l->items[i];
    char age[16], code[16], used[40], why[4096];

    fmt_age(age_of(w->created_at), age, sizeof(age));
    if (w->has_exit_code)
      snprintf(code, sizeof(code), "%d", w->exit_code);
    else if (w->signal)
      snprintf(code, sizeof(code), "sig%d", w->signal);
    else
      snprintf(code, sizeof(code), "-");
    fmt_usage(w, used, sizeof(used));
    fmt_why(w, why, sizeof(why));
    safe_why(why, sizeof(why));
    printf("%-12s  %-10s  %-15s  %-8.8s  %-10.10s  %-15s  %5g  %6g  %12s  %3d  %5s  %4s  %s\n",
           w->id, muster_status_name(w->status), w->session ? w->session : "-",
           w->role ? w->role : "-", w->name ? w->name : "-", w->ip_address ? w->ip_address : "-",
           w->cpu, w->memory, used, w->nvidia_gpu, age, code, why);
  }
}

static void print_show(const muster_worker *w) {
  printf("id:          %s\n", w->id);
  printf("status:      %s\n", muster_status_name(w->status));
  if (w->failure) {
    printf("failure:     ");
    print_failure(stdout, w->failure, "             ");
  }
  {
    char why[512];
    if (muster_worker_waiting_for(w, why, sizeof(why))) {
      safe_why(why, sizeof(why));
      printf("waiting for: %s\n", why);
    }
  }
  printf("session:     %s\n", w->session ? w->session : "-");
  printf("role:        %s\n", w->role ? w->role : "-");
  printf("name:        %s\n", w->name ? w->name : "-");
  {
    char cores[48], gib[48], gpus[32], amount[32];
    /* What was asked for, exactly as %g would (12.25 cores, 1.234 GiB). */
    res_words_amount_digits(w->cpu, 6, amount, sizeof(amount));
    res_words_cores_of(amount, cores, sizeof(cores));
    res_words_amount_digits(w->memory, 6, amount, sizeof(amount));
    snprintf(gib, sizeof(gib), "%s GiB", amount);
    res_words_gpus(w->nvidia_gpu, gpus, sizeof(gpus));
    printf("resources:   %s, %s, %s\n", cores, gib, gpus);
  }
  {
    muster_usage u;
    if (muster_worker_usage(w, &u))
      printf("usage:       %.2f cpu seconds, %.1f MiB now, %.1f MiB at most\n", u.cpu_seconds,
             (double)u.memory_bytes / 1048576, (double)u.memory_peak_bytes / 1048576);
  }
  if (w->script)
    printf("script:      %s %s\n", w->kernel ? w->kernel : "", w->script);
  if (w->code)
    printf("code:        %s\n", w->code);
  printf("ip_address:  %s\n", w->ip_address ? w->ip_address : "-");
  printf("hostname:    %s\n", w->hostname ? w->hostname : "-");
  if (w->exec_port)
    printf("exec_port:   %d\n", w->exec_port);
  printf("backend:     %s %s\n", w->backend ? w->backend : "-",
         w->backend_ref ? w->backend_ref : "");
  if (w->has_exit_code)
    printf("exit_code:   %d\n", w->exit_code);
  if (w->signal)
    printf("signal:      %d\n", w->signal);
  printf("created_at:  %s\n", w->created_at ? w->created_at : "-");
  printf("running_at:  %s\n", w->running_at ? w->running_at : "-");
  printf("finished_at: %s\n", w->finished_at ? w->finished_at : "-");
}
int cmd_ps(int argc, char **argv) {
  unsigned statuses = 0;
  const char *session = NULL, *role = NULL;
  int all = 0, as_json = 0, rc, code = EXIT_OK;
  muster_client *c = NULL;
  muster_worker_list ws = {0};

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_ps, stdout);
      goto out;
    } else if (strcmp(a, "-a") == 0 || strcmp(a, "--all") == 0) {
      all = 1;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if ((strcmp(a, "--session") == 0 || strcmp(a, "--role") == 0 ||
                strcmp(a, "--status") == 0) &&
               v) {
      i++;
      if (a[2] == 's' && a[3] == 'e')
        session = v;
      else if (a[2] == 'r')
        role = v;
      else {
        int s;
        for (s = 0; s < MUSTER_STATUS_UNKNOWN; s++)
          if (strcmp(v, muster_status_name((muster_status)s)) == 0)
            break;
        if (s == MUSTER_STATUS_UNKNOWN) {
          code = usage_error(usage_ps,
                             "--status must be scheduling, starting, running, "
                             "succeeded, failed or stopped, not \"%s\"",
                             v);
          goto out;
        }
        statuses |= 1u << s;
      }
    } else {
      code = unknown_option(usage_ps, a);
      goto out;
    }
  }
  if (!statuses && !all)
    statuses = 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING;
  if ((code = connect_client(&c)))
    goto out;
  rc = muster_list(c, statuses, session, role, &ws, NULL);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  if (as_json) {
    print_list_json(&ws);
  } else {
    term_safe_list(&ws);
    print_table(&ws);
  }
out:
  muster_worker_list_free(&ws);
  muster_client_free(c);
  return code;
}

int cmd_show(int argc, char **argv) {
  int as_json = 0, n = 0, code = EXIT_OK;
  muster_client *c = NULL;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_show, stdout);
      return EXIT_OK;
    }
    if (strcmp(argv[i], "--json") == 0)
      as_json = 1;
    else if (argv[i][0] == '-')
      return unknown_option(usage_show, argv[i]);
    else if (is_run_id(argv[i]))
      return usage_error(usage_show,
                         "%s is a run; muster show takes worker ids (muster runs lists runs)",
                         argv[i]);
    else
      n++;
  }
  if (!n)
    return usage_error(usage_show, "name the workers to show");
  if ((code = connect_client(&c)))
    return code;
  if (as_json && n > 1)
    printf("[");
  for (int i = 1, shown = 0; i < argc; i++) {
    muster_worker w;
    int rc;
    if (argv[i][0] == '-')
      continue;
    rc = muster_get(c, argv[i], &w);
    if (rc) {
      code = call_failed(c, rc);
      break;
    }
    if (as_json) {
      printf(shown++ ? ",\n " : "");
      print_worker_json(&w);
    } else {
      printf(shown++ ? "\n" : "");
      term_safe_worker(&w);
      print_show(&w);
    }
    muster_worker_cleanup(&w);
  }
  if (as_json)
    printf(n > 1 ? "]\n" : "\n");
  muster_client_free(c);
  return code;
}

/* How a log reaches stdout: as it is, or (a terminal's, unless --raw) with
 * its control characters written out but for newlines and tabs, so that a
 * worker's output cannot drive the reader's terminal. */
struct log_out {
  int safe;
  char carry; /* a byte that may start a C1 control: held for the next chunk */
};

static int write_out(void *arg, const char *data, size_t len) {
  struct log_out *lo = arg;
  char *safe, *joined = NULL;
  size_t n;

  if (!lo->safe) {
    if (fwrite(data, 1, len, stdout) != len)
      return 1;
    fflush(stdout);
    return 0;
  }
  if (lo->carry) {
    if (!(joined = malloc(len + 1)))
      return 1;
    joined[0] = lo->carry;
    memcpy(joined + 1, data, len);
    data = joined;
    len++;
    lo->carry = 0;
  }
  if (len && (unsigned char)data[len - 1] == 0xc2)
    lo->carry = data[--len];
  safe = malloc(len * TERM_SAFE_GROWTH + 1);
  if (!safe) {
    free(joined);
    return 1;
  }
  n = term_safe(data, len, 1, safe);
  free(joined);
  if (fwrite(safe, 1, n, stdout) != n) {
    free(safe);
    return 1;
  }
  free(safe);
  fflush(stdout);
  return 0;
}

int cmd_logs(int argc, char **argv) {
  const char *id = NULL;
  int follow = 0, raw = 0, rc, code;
  muster_stream stream = MUSTER_STDOUT;
  muster_client *c = NULL;
  struct log_out lo = {0, 0};

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_logs, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "-f") == 0 || strcmp(a, "--follow") == 0) {
      follow = 1;
    } else if (strcmp(a, "--stderr") == 0) {
      stream = MUSTER_STDERR;
    } else if (strcmp(a, "--raw") == 0) {
      raw = 1;
    } else if (a[0] == '-') {
      return unknown_option(usage_logs, a);
    } else if (id) {
      return usage_error(usage_logs, "name one worker");
    } else {
      id = a;
    }
  }
  if (!id)
    return usage_error(usage_logs, "name the worker whose output to print");
  if ((code = connect_client(&c)))
    return code;
  lo.safe = !raw && isatty(STDOUT_FILENO);
  rc = muster_logs(c, id, stream, 0, follow, write_out, &lo);
  if (lo.carry)
    fputs("\\xc2", stdout);
  if (rc)
    code = call_failed(c, rc);
  muster_client_free(c);
  return code;
}

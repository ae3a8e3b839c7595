/*
 * cli.h: what the muster CLI's files share (sdk/cli/, the `muster`
 * binary): its exit codes, the controller named by the global options, the
 * helpers of cli_util.c (usage and failure messages, argument parsing, the
 * worker output more than one command prints), and the commands that
 * muster.c's table dispatches to. The CLI uses only libmuster's public API
 * (muster.h), as curl's tool uses only libcurl's.
 *
 * Layers, each calling only those below it: muster.c (main, the command
 * table) -> cmd_*.c (one file per command group) -> launch_lease.c,
 * await_progress.c, mpi_agent.c -> cli_util.c, usage.c -> libmuster.
 */
#ifndef MUSTER_CLI_H
#define MUSTER_CLI_H

#include "muster.h"
#include "util.h"

#include <stddef.h>
#include <stdio.h>

/* Exit codes, one per kind of outcome, so that a script can tell them
 * apart (muster --help and the README list them). */
enum {
  EXIT_OK = 0,          /* all good */
  EXIT_WORKERS = 1,     /* a worker or the training failed, or the wait timed out */
  EXIT_USAGE = 2,       /* the command line is wrong */
  EXIT_NOT_FOUND = 3,   /* no such worker or run */
  EXIT_REFUSED = 4,     /* refused: an invalid value, a request that can never fit, the
                           wrong state, a bad token */
  EXIT_UNREACHABLE = 5, /* no controller answered (none found, down, timed out) */
  EXIT_INTERNAL = 6,    /* the controller or muster itself failed (internal error,
                           out of memory, an unexpected answer) */
};

/* The exit code for a libmuster error (a negative muster_error). */
int exit_code_for(int rc);

/* --url and --token, or NULL: set by main before any command runs, read by
 * connect_client() (and by muster await, which draws its progress line
 * only for the default controller). */
extern const char *opt_url, *opt_token;

/* ---- messages and the controller ---- */

/* usage.c: prints "muster: " and the message, then where to read more
 * ("see 'muster CMD --help'", CMD from the usage text), to stderr. Returns
 * EXIT_USAGE. */
int usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* usage.c: the usage error for an option the command does not take: "OPT
 * needs a value" when usage names it, else "unknown option OPT", with "did
 * you mean" the closest option of usage where one is close. Returns
 * EXIT_USAGE. */
int unknown_option(const char *usage, const char *opt);

/* usage.c: the word of words[0..n) closest to typed, if one is close
 * enough to suggest (borrowed), else NULL. */
const char *closest_word(const char *typed, const char *const *words, size_t n);

/* Reports a failed call and returns the exit code for it. */
int call_failed(muster_client *c, int rc);

/* What a command says and exits with when memory runs out. */
int out_of_memory(void);

/* Connects *c to the controller of --url/--token, MUSTER_URL/MUSTER_TOKEN
 * or the local state directory; the caller frees *c with
 * muster_client_free(). Returns 0, or the exit code after saying why. */
int connect_client(muster_client **c);

/* $MUSTER_SESSION when set and not empty (borrowed), else NULL. */
const char *session_default(void);

/* ---- output ---- */

/* The worker object exactly as the controller sent it. */
void print_worker_json(const muster_worker *w);

/* The workers as a JSON array, and a newline. */
void print_list_json(const muster_worker_list *l);

/* What muster launch prints: the ids, one per line, or the workers as JSON. */
void print_launched(const muster_worker_list *l, int as_json);

/* Prints a failure (the sentence, then the quoted lines of its stderr, if
 * any) to out: every line after the first starts with indent. Ends with a
 * newline. */
void print_failure(FILE *out, const char *failure, const char *indent);

/* ---- term_safe.c: what the API says, unable to drive a terminal ----
 * A worker's name, command, failure or log comes from whoever launched or
 * runs it: shown raw, an escape sequence in it would retitle the reader's
 * terminal, clear it or draw lines that pass for the CLI's own. Control
 * characters are written out instead: \n \t \r \xNN, and the C1 controls
 * as \u0080..\u009f. */
#define TERM_SAFE_GROWTH 6 /* the most bytes one input byte becomes */
/* s (n bytes) made safe into out (room for n * TERM_SAFE_GROWTH + 1);
 * keep_lines: newlines and tabs stay. Returns the length written. */
size_t term_safe(const char *s, size_t n, int keep_lines, char *out);
/* The same, into a new string (NULL without memory). */
char *term_safe_dup(const char *s, int keep_lines);
/* Makes every string of w (its json aside), or of every worker of l, safe
 * in place: for the human forms of ps, show, await, launch and stop. */
void term_safe_worker(muster_worker *w);
void term_safe_list(muster_worker_list *l);

/* A failure on one line, for a table: its sentence, then its last quoted
 * line (a traceback's last line), into buf. */
void fmt_failure_line(const char *failure, char *buf, size_t size);

/* Seconds since an ISO time of the controller, or -1. */
double age_of(const char *iso);

/* An age in seconds as the tables print it ("45s", "3m", "2h", "5d"; "-"
 * when negative), into buf. */
void fmt_age(double s, char *buf, size_t size);

/* ---- arguments ---- */

/* A number >= min into *out. Returns 0, or -1 when s is not one. */
MUST_CHECK int parse_double(const char *s, double min, double *out);

/* The value of --cpu, --memory, --ps-cpu or --ps-memory (flag) into *out:
 * a number in the controller's range (resources.h). Returns 0, or -1 with
 * the sentence that says what is wrong in msg. */
MUST_CHECK int parse_resource(const char *flag, const char *s, double *out, char *msg,
                              size_t msglen);

/* Whether s looks like a run's id (r-0123456789), which a command that
 * takes worker ids refuses by name rather than as a malformed worker id. */
int is_run_id(const char *s);

/* The value of --cwd into buf (size bytes): an absolute path as it is
 * (the workers' host may have it, this one not), a relative one made
 * absolute against this directory (it must exist here). Returns 0, or -1. */
MUST_CHECK int cli_abs_dir(const char *dir, char *buf, size_t size);

/* A whole number from min to max into *out. Returns 0, or -1. */
MUST_CHECK int parse_int(const char *s, long min, long max, long *out);

/* A growing array of borrowed strings; the caller frees v. */
struct strv {
  const char **v;
  size_t n, cap;
};

/* Appends x (borrowed). Returns 0, or -1 when memory runs out. */
MUST_CHECK int strv_push(struct strv *s, const char *x);

/* Reads whitespace-separated ids from stdin into ids (the strings are
 * kept in *store, freed by the caller). Returns 0, or -1 when memory runs
 * out or the input is too long. */
MUST_CHECK int read_ids_stdin(struct strv *ids, char **store);

/* ---- the commands (muster.c's table) ----
 * Each takes its own argv (argv[0] is the command's name) and returns the
 * process exit code. */

/* cmd_workers.c */
int cmd_launch(int argc, char **argv);
int cmd_await(int argc, char **argv);
int cmd_stop(int argc, char **argv);
/* cmd_view.c */
int cmd_ps(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_logs(int argc, char **argv);
/* cmd_exec.c */
int cmd_exec(int argc, char **argv);
int cmd_rsh(int argc, char **argv);
int cmd_rank(int argc, char **argv);
/* cmd_run.c */
int cmd_run(int argc, char **argv);
/* cmd_runs.c */
int cmd_runs(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
/* cmd_stack.c */
int cmd_stack(int argc, char **argv);
/* cmd_users.c */
int cmd_users(int argc, char **argv);
int cmd_whoami(int argc, char **argv);

#endif

/*
 * child_failure.c: the sentence for a child that failed before its command
 * started (child.c's status pipe), for the worker's command and the exec
 * channel's alike: what is missing is named, with its path, and the text is
 * UTF-8 whatever the cwd, the command or the PATH hold (it goes into JSON).
 */
#include "workerd.h"

#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How much of the PATH a sentence quotes, in bytes. */
#define PATH_QUOTE_MAX 300

/* The PATH of envp (borrowed), or NULL. */
static const char *envp_path(char *const *envp) {
  for (char *const *e = envp; e && *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0)
      return *e + 5;
  return NULL;
}

/* Writes to out (size bytes) the file dir/name, dir taken relative to cwd
 * (may be NULL) unless absolute, as the child saw it after its chdir.
 * Returns 0 if it is a regular file, else -1. */
static int regular_at(const char *cwd, const char *dir, size_t dirlen, const char *name, char *out,
                      size_t size) {
  struct stat sb;
  int n;

  if (dirlen && dir[0] != '/' && cwd)
    n = snprintf(out, size, "%s/%.*s/%s", cwd, (int)dirlen, dir, name);
  else if (dirlen)
    n = snprintf(out, size, "%.*s/%s", (int)dirlen, dir, name);
  else if (name[0] != '/' && cwd)
    n = snprintf(out, size, "%s/%s", cwd, name);
  else
    n = snprintf(out, size, "%s", name);
  if (n < 0 || (size_t)n >= size)
    return -1;
  return stat(out, &sb) == 0 && S_ISREG(sb.st_mode) ? 0 : -1;
}

/* Writes to file (PATH_MAX bytes) the file execvp found for cmd (with a
 * slash: cmd itself; else the first regular file on path, or on execvp's
 * default, an empty entry the cwd). Returns 0 if there is one, else -1. */
static int found_file(const char *cwd, const char *cmd, const char *path, char *file) {
  const char *p = path ? path : "/bin:/usr/bin";

  if (strchr(cmd, '/'))
    return regular_at(cwd, "", 0, cmd, file, PATH_MAX);
  for (;;) {
    size_t len = strcspn(p, ":");
    if (regular_at(cwd, len ? p : ".", len ? len : 1, cmd, file, PATH_MAX) == 0)
      return 0;
    if (!p[len])
      return -1;
    p += len + 1;
  }
}

/* 1 if file has an execute bit for someone: one the worker's account
 * cannot run is out of its reach, not a file that is no program. (A
 * program on the PATH that the account cannot see at all is "not found":
 * the child says ENOENT itself.) */
static int executable(const char *file) {
  struct stat sb;

  return stat(file, &sb) == 0 && (sb.st_mode & 0111) != 0;
}

/* Writes to out (size bytes) the interpreter that file's "#!" line names,
 * or "" if it has none (an ELF file: its loader). */
static void interpreter_of(const char *file, char *out, size_t size) {
  char head[256];
  ssize_t n;
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  size_t start, len;

  out[0] = '\0';
  if (fd < 0)
    return;
  n = read(fd, head, sizeof(head) - 1);
  close(fd);
  if (n < 3 || head[0] != '#' || head[1] != '!')
    return;
  head[n] = '\0';
  start = 2 + strspn(head + 2, " \t");
  len = strcspn(head + start, " \t\n");
  snprintf(out, size, "%.*s", (int)len, head + start);
}

/* Writes to buf (size bytes) why cmd, which exists as file, could not be
 * started although execve said ENOENT: its interpreter or loader is
 * missing. */
static void missing_interpreter(const char *cmd, const char *file, char *buf, size_t size) {
  char interp[256];
  size_t n;

  interpreter_of(file, interp, sizeof(interp));
  n = strlen(interp);
  if (n && interp[n - 1] == '\r') {
    interp[n - 1] = '\0';
    snprintf(buf, size,
             "%s: its interpreter %s was not found (its #! line ends in a carriage return: "
             "Windows line endings)",
             cmd, interp);
  } else if (n) {
    snprintf(buf, size, "%s: its interpreter %s was not found", cmd, interp);
  } else {
    snprintf(buf, size, "%s exists but cannot be started: its loader is missing (%s)", file,
             strerror(ENOENT));
  }
}

/* Makes the text in buf valid UTF-8: a character cut at the end (by a
 * bounded snprintf) goes, any other byte that starts no character becomes
 * '?'. */
static void utf8_mend(char *buf) {
  size_t n = utf8_trim(buf, strlen(buf));

  buf[n] = '\0';
  for (size_t i = 0; i < n;) {
    size_t k = utf8_char_len((const unsigned char *)buf + i, n - i);
    if (k == 0) {
      buf[i++] = '?';
    } else {
      i += k;
    }
  }
}

/* A path in the host's /tmp, which a confined worker does not see (it has a
 * /tmp of its own: workerd/sandbox.c), unless it lies in the working
 * directory, which is bound there. */
static bool in_private_tmp(const char *path, const char *cwd) {
  size_t n = cwd ? strlen(cwd) : 0;

  if (!path || strncmp(path, "/tmp/", 5) != 0 || wd.scratch.lock_fd < 0 || wd.scratch.overlay)
    return false;
  return !(n > 0 && strncmp(path, cwd, n) == 0 && (path[n] == '/' || cwd[n - 1] == '/'));
}

#define PRIVATE_TMP                                                                                \
  " (the worker has a /tmp of its own, which its session's workers share: the host's /tmp is "     \
  "out of its sight; put the file in the launch's directory)"

/* Writes to buf (size bytes) the sentence for a child that failed before
 * its command started (st), which ran argv in cwd with envp, checking
 * script first (cwd and script may be NULL): "script /p/x.py not found",
 * "muster-train: not found on the worker's PATH (/a:/b)", "./run.sh: its
 * interpreter /usr/bin/foo was not found", "the working directory /p does
 * not exist on this worker's host". Always valid UTF-8. */
void child_failure_sentence(const struct exec_status *st, const char *cwd, const char *script,
                            char *const *argv, char *const *envp, char *buf, size_t size) {
  const char *path = envp_path(envp);
  char file[PATH_MAX];

  if (st->stage == STAGE_SCRIPT && st->err == ENOENT && in_private_tmp(script, cwd))
    snprintf(buf, size, "script %s not found" PRIVATE_TMP, script);
  else if (st->stage == STAGE_SCRIPT && st->err == ENOENT)
    snprintf(buf, size, "script %s not found", script);
  else if (st->stage == STAGE_SCRIPT && wd.run_as[0])
    snprintf(buf, size, "script %s cannot be read by the worker's account %s: %s", script,
             wd.run_as, strerror(st->err));
  else if (st->stage == STAGE_SCRIPT)
    snprintf(buf, size, "script %s cannot be read: %s", script, strerror(st->err));
  else if (st->stage == STAGE_CHDIR && st->err == ENOENT)
    snprintf(buf, size, "the working directory %s does not exist on this worker's host", cwd);
  else if (st->stage == STAGE_CHDIR && st->err == EACCES && wd.run_as[0])
    snprintf(buf, size, "the worker's account %s cannot enter the working directory %s: %s",
             wd.run_as, cwd, strerror(st->err));
  else if (st->stage == STAGE_CHDIR)
    snprintf(buf, size, "cannot change to the working directory %s: %s", cwd, strerror(st->err));
  else if (st->stage == STAGE_EXEC && st->err == ENOENT &&
           found_file(cwd, argv[0], path, file) == 0)
    missing_interpreter(strchr(argv[0], '/') ? argv[0] : file, file, buf, size);
  else if ((st->stage == STAGE_EXEC || st->stage == STAGE_PATH) && st->err == ENOENT &&
           !strchr(argv[0], '/') && path) {
    size_t fit = utf8_fit(path, PATH_QUOTE_MAX);
    snprintf(buf, size, "%s: not found on the worker's PATH (%.*s%s)", argv[0], (int)fit, path,
             path[fit] ? "…" : "");
  } else if ((st->stage == STAGE_EXEC || st->stage == STAGE_PATH) && st->err == ENOENT &&
             !strchr(argv[0], '/'))
    snprintf(buf, size, "%s: not found on the worker's PATH (unset)", argv[0]);
  else if ((st->stage == STAGE_EXEC || st->stage == STAGE_PATH) && st->err == ENOENT &&
           in_private_tmp(argv[0], cwd))
    snprintf(buf, size, "%s: not found" PRIVATE_TMP, argv[0]);
  else if ((st->stage == STAGE_EXEC || st->stage == STAGE_PATH) && st->err == ENOENT)
    snprintf(buf, size, "%s: not found", argv[0]);
  else if (st->stage == STAGE_EXEC && st->err == EACCES && wd.run_as[0] &&
           !(strchr(argv[0], '/') && found_file(cwd, argv[0], path, file) == 0 &&
             !executable(file)))
    snprintf(buf, size, "cannot run \"%s\" as the worker's account %s: %s", argv[0], wd.run_as,
             strerror(st->err));
  else if (st->stage == STAGE_EXEC)
    snprintf(buf, size, "cannot run \"%s\": %s", argv[0], strerror(st->err));
  else if (st->stage == STAGE_USER)
    snprintf(buf, size, "cannot run \"%s\" as the worker's account %s: %s", argv[0], wd.run_as,
             strerror(st->err));
  else if (st->stage == STAGE_CONFINE)
    snprintf(buf, size, "cannot isolate \"%s\": %s", argv[0], strerror(st->err));
  else
    snprintf(buf, size, "cannot set up the standard streams of \"%s\": %s", argv[0],
             strerror(st->err));
  utf8_mend(buf);
}

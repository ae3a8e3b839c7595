/*
 * slurm_words.c: what Slurm says, made into muster's sentences: a failed
 * command's words, whether they mean Slurm cannot be reached, how a job
 * ended, which nodes are down, what a job's output says went wrong. Calls
 * only slurm_run.c (slurm_internal.h).
 */
#include "slurm_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Slurm's own words from a failed command: its stderr's last line, without
 * "sbatch: error: " and the like. */
void slurm_words(const struct sb_out *o, const char *cmd, int timeout_ms, char *buf, size_t len) {
  const char *s = o->err ? o->err : "";
  const char *last = s, *p;
  size_t n;

  if (o->timed_out) {
    snprintf(buf, len, "%s did not answer within %d s", cmd, timeout_ms / 1000);
    return;
  }
  for (p = s; *p; p++)
    if (*p == '\n' && p[1])
      last = p + 1;
  n = strcspn(last, "\n");
  for (const char *pre = "error: "; (p = memmem(last, n, pre, strlen(pre)));) {
    n -= (size_t)(p + strlen(pre) - last);
    last = p + strlen(pre);
  }
  if (strncmp(last, "Batch job submission failed: ", 29) == 0 && n > 29) {
    last += 29;
    n -= 29;
  }
  if (n == 0)
    snprintf(buf, len, "%s failed with exit code %d", cmd, o->status);
  else
    snprintf(buf, len, "%.*s", (int)n, last);
}

/* Whether Slurm's words say it could not be reached at all. */
int slurm_unreachable(const char *words) {
  return strstr(words, "Unable to contact slurm controller") != NULL ||
         strstr(words, "Zero Bytes were transmitted") != NULL ||
         strstr(words, "Socket timed out") != NULL ||
         strstr(words, "Communication connection failure") != NULL ||
         strstr(words, "did not answer within") != NULL || strstr(words, "cannot run ") == words;
}

/* A sentence for a job that ended in state with reason. */
void sb_end_sentence(const char *state, const char *reason, const char *nodes, char *buf,
                     size_t len) {
  if (strcmp(state, "NODE_FAIL") == 0)
    snprintf(buf, len, "node %s failed (Slurm: NODE_FAIL)", nodes && *nodes ? nodes : "?");
  else if (strcmp(state, "OUT_OF_MEMORY") == 0)
    snprintf(buf, len, "killed: out of memory (Slurm: OUT_OF_MEMORY)");
  else if (strcmp(state, "TIMEOUT") == 0)
    snprintf(buf, len, "hit the job's time limit (Slurm: TIMEOUT)");
  else if (strcmp(state, "CANCELLED") == 0)
    snprintf(buf, len, "cancelled outside muster (Slurm: CANCELLED)");
  else if (strcmp(state, "PREEMPTED") == 0)
    snprintf(buf, len, "preempted by Slurm (Slurm: PREEMPTED)");
  else if (strcmp(state, "BOOT_FAIL") == 0)
    snprintf(buf, len, "its node failed to boot (Slurm: BOOT_FAIL)");
  else if (strcmp(state, "DEADLINE") == 0)
    snprintf(buf, len, "missed the job's deadline (Slurm: DEADLINE)");
  else if (strcmp(state, "FAILED") == 0)
    snprintf(buf, len, "its Slurm job failed (Slurm: FAILED, %s)",
             reason && *reason ? reason : "no reason given");
  else
    snprintf(buf, len, "its Slurm job ended before its muster-workerd said how (Slurm: %s)", state);
}

/* The nodes Slurm has down now ("n2"), for a NODE_FAIL sentence; "" when
 * it cannot tell. */
void sb_down_nodes(char *buf, size_t len) {
  char *argv[] = {"sinfo", "--noheader", "--states=down,fail,no_respond", "--format=%N", NULL};
  struct sb_out o;

  buf[0] = '\0';
  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) == 0 && o.status == 0 && o.out)
    snprintf(buf, len, "%.*s", (int)strcspn(o.out, "\n"), o.out);
  sb_out_free(&o);
}

/* The last line of job jobid's output (DIR/JOBID.out, DIR its account's) that says
 * "error:" and why (slurmstepd's words for a step that could not start: a
 * workerd that is not where --workerd says on that node, say), rather than
 * srun's summary of the task's exit, appended to buf. */
void sb_append_output_error(const char *dir, long jobid, char *buf, size_t len) {
  char path[700], tail[8192], *last = NULL, *last_any = NULL;
  struct stat st;
  ssize_t n;
  int fd;

  snprintf(path, sizeof(path), "%s/%ld.out", dir, jobid);
  /* (the jobs' account owns the directory: never a link it put there) */
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return;
  /* (a plain file, not a hard link to another: root reads it) */
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    close(fd);
    return;
  }
  if (lseek(fd, 0, SEEK_END) > (off_t)sizeof(tail) - 1)
    (void)lseek(fd, -(off_t)sizeof(tail) + 1, SEEK_END);
  else
    (void)lseek(fd, 0, SEEK_SET);
  n = read(fd, tail, sizeof(tail) - 1);
  close(fd);
  if (n <= 0)
    return;
  tail[n] = '\0';
  for (char *line = tail; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl)
      *nl = '\0';
    /* srun's own summary of a task's end ("srun: error: n1: task 0:
     * Exited with exit code 2") comes after the line that says why: that
     * one is quoted, the summary only where there is nothing else. */
    if (strstr(line, "error:")) {
      last_any = line;
      if (!(strstr(line, "srun: error:") && strstr(line, ": task ")))
        last = line;
    }
    line = nl ? nl + 1 : NULL;
  }
  if (!last)
    last = last_any;
  if (last) {
    size_t at = strlen(buf);
    if (at < len)
      snprintf(buf + at, len - at, ": %.300s", last);
  }
}

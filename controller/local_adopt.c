/*
 * local_adopt.c: what an earlier controller left. reconcile adopts the
 * workers whose recorded process still runs (and takes their room back);
 * adopted workers, not our children, are probed through /proc; and cgroups
 * that no worker record owns are swept.
 */
#include "local_internal.h"

#include "cgroup.h"
#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "netlink.h"
#include "network.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Workers adopted after a restart are not our children: their end is seen
 * through /proc, once a second (heartbeat loss catches them anyway; this
 * only makes it sooner). */
void local_probe_adopted(int64_t now) {
  if (now - lb.last_probe_ms < 1000)
    return;
  lb.last_probe_ms = now;
  for (;;) {
    char id[16] = "", why[200];
    int attempt = 0;
    pid_t pid = 0;

    pthread_mutex_lock(&lb.mu);
    for (struct lproc *p = lb.head; p; p = p->next)
      if (p->adopted && p->live && !p->reported && !local_proc_same(p->pid, p->start)) {
        snprintf(id, sizeof(id), "%s", p->id);
        attempt = p->attempt;
        pid = p->pid;
        p->reported = 1;
        break;
      }
    pthread_mutex_unlock(&lb.mu);
    if (!id[0])
      return;
    local_cg_finish(id, attempt); /* its leftovers */
    snprintf(why, sizeof(why), "lost: its muster-workerd (pid %d) is gone", (int)pid);
    report_fail(BACKEND_LOST, id, attempt, why);
  }
}

/* Cgroups that no worker record owns (an adopted worker stopped at once,
 * a controller that crashed between creating one and starting its workerd,
 * a worker whose record went while its cgroup could not be emptied): their
 * processes are killed and they go. Every 5 s, once reconciled. */
struct names {
  char (*v)[32];
  int n, cap;
};

static void name_add(const char *name, void *arg) {
  struct names *ns = arg;

  if (strlen(name) >= sizeof(ns->v[0]))
    return;
  if (ns->n == ns->cap) {
    int c2 = ns->cap ? 2 * ns->cap : 32;
    char(*grown)[32] = realloc(ns->v, (size_t)c2 * sizeof(*grown));
    if (!grown)
      return;
    ns->v = grown;
    ns->cap = c2;
  }
  snprintf(ns->v[ns->n++], sizeof(ns->v[0]), "%s", name);
}

void local_sweep_cgroups(int64_t now) {
  static int64_t last;
  struct names ns = {0};

  pthread_mutex_lock(&lb.mu);
  if (!lb.sweep || now - last < 5000) {
    pthread_mutex_unlock(&lb.mu);
    return;
  }
  pthread_mutex_unlock(&lb.mu);
  last = now;
  cg_each(name_add, &ns);
  for (int i = 0; i < ns.n; i++) {
    char id[32], *dot, *end;
    struct lproc *p;
    long attempt;
    int owned;

    snprintf(id, sizeof(id), "%s", ns.v[i]);
    dot = strrchr(id, '.');
    if (!dot)
      continue;
    *dot = '\0';
    attempt = strtol(dot + 1, &end, 10);
    pthread_mutex_lock(&lb.mu);
    p = lp_find(id);
    owned = p && *end == '\0' && p->attempt == attempt;
    pthread_mutex_unlock(&lb.mu);
    if (owned)
      continue;
    LOG(LOG_INFO, "cgroup %s belongs to no worker now: its processes are killed and it goes",
        ns.v[i]);
    (void)cg_destroy(ns.v[i], 200);
  }
  free(ns.v);
}

/* Parses "PID:START". Returns 0, or -1 for anything else (a bare pid from
 * an older controller is not enough to know the process). */
static MUST_CHECK int ref_parse(const char *ref, pid_t *pid, unsigned long long *start) {
  char *end;
  long p;
  unsigned long long s;

  if (!ref)
    return -1;
  errno = 0;
  p = strtol(ref, &end, 10);
  if (end == ref || *end != ':' || p <= 1 || p > 0x3fffffff)
    return -1;
  ref = end + 1;
  s = strtoull(ref, &end, 10);
  if (end == ref || *end || errno)
    return -1;
  *pid = (pid_t)p;
  *start = s;
  return 0;
}

/* Ends what runs of an attempt that was not adopted (a workerd a crashed
 * controller's fork server started, not yet registered), before anything
 * new starts: the worker's next attempt may get the same address, and two
 * workerds must never make its veth pair at once. Its cgroup goes, and its
 * veth with its namespace: that is waited for (up to 5 s in all; the
 * kernel tears namespaces down in the background, in milliseconds when
 * the host is not loaded). Without cgroups (--isolation none) there is
 * nothing to end them by: such a workerd is refused when it registers. */
static void end_earlier_attempts(const struct backend_live *ws, int n) {
  int64_t until;
  int fd;

  for (int i = 0; i < n; i++) {
    char name[32];

    if (ws[i].adopted || ws[i].attempt < 1)
      continue;
    local_cg_name(ws[i].id, ws[i].attempt, name, sizeof(name));
    (void)cg_destroy(name, 1000); /* (it says what it could not end) */
  }
  if (!net_bridge())
    return;
  until = util_mono_ms() + 5000;
  fd = nl_open();
  for (int i = 0; fd >= 0 && i < n; i++) {
    char veth[NL_VETH_NAME_MAX];
    struct in_addr ip;

    if (ws[i].adopted || inet_pton(AF_INET, ws[i].where.bind_ip, &ip) != 1)
      continue;
    nl_worker_veth_name(ip, veth);
    while (nl_link_index(fd, veth) > 0 && util_mono_ms() < until)
      usleep(10 * 1000);
  }
  if (fd >= 0)
    close(fd);
}

/* Forgets the records of adopted workers, giving back what they held (a
 * reconcile that failed adopts none). lb.mu held. */
static void drop_adopted_locked(void) {
  for (struct lproc *p = lb.head, *next; p; p = next) {
    next = p->next;
    if (!p->adopted)
      continue;
    lb.cpu_used -= p->req.cpu;
    lb.memory_used -= p->req.memory;
    lp_free(p);
  }
}

int local_reconcile(struct backend_live *ws, int n, char *err, size_t errlen) {
  pthread_mutex_lock(&lb.mu);
  for (int i = 0; i < n; i++) {
    struct backend_live *l = &ws[i];
    unsigned long long start;
    struct lproc *p;
    pid_t pid;

    l->adopted = 0;
    if (ref_parse(l->ref, &pid, &start) != 0 || !local_proc_same(pid, start))
      continue;
    p = FAULT_FAILS("local_adopt_nomem") ? NULL : lp_new(l->id);
    if (!p) {
      /* (not swept: its cgroup, owned by no record, would go, and with
       * it a worker that runs; nor probed: none is adopted) */
      snprintf(err, errlen, "out of memory recording the local workers still running (%s)", l->id);
      drop_adopted_locked();
      pthread_mutex_unlock(&lb.mu);
      return MUSTER_E_NOMEM;
    }
    l->adopted = 1;
    p->attempt = l->attempt;
    p->pid = pid;
    p->start = start;
    p->adopted = 1;
    p->req = l->req;
    p->ip_slot = local_ip_to_slot(l->where.bind_ip);
    if (p->ip_slot >= 0)
      lb.ip_used[p->ip_slot] = 1;
    p->gpu_mask = local_gpus_parse(l->where.gpu_indices);
    local_reserve(p);
  }
  lb.sweep = 1; /* every record of an adopted worker is made */
  pthread_mutex_unlock(&lb.mu);
  end_earlier_attempts(ws, n);
  return 0;
}

/*
 * local_table.c: the local backend's state (lb) and its table of worker
 * records: lookup by id, and the room each record holds (cores and memory
 * for admission, GPUs, an address), with the operations that
 * reserve and give back room (place, release) or report it
 * (could_ever_fit, capacity, usage). See local_internal.h for the other parts.
 */
#include "local_internal.h"

#include "fault.h"
#include "muster_errors.h"
#include "network.h"
#include "resources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct local_backend lb = {.mu = PTHREAD_MUTEX_INITIALIZER, .zygote_fd = -1};

/* ---- the table (lb.mu held) ---- */

static unsigned lp_hash(const char *id) {
  return util_fnv1a(id) % LP_HASH;
}

struct lproc *lp_find(const char *id) {
  for (struct lproc *p = lb.hash[lp_hash(id)]; p; p = p->hnext)
    if (strcmp(p->id, id) == 0)
      return p;
  return NULL;
}

struct lproc *lp_new(const char *id) {
  struct lproc *p = calloc(1, sizeof(*p));
  unsigned h;

  if (!p)
    return NULL;
  snprintf(p->id, sizeof(p->id), "%s", id);
  p->ip_slot = -1;
  h = lp_hash(id);
  p->hnext = lb.hash[h];
  lb.hash[h] = p;
  p->next = lb.head;
  if (lb.head)
    lb.head->prev = p;
  lb.head = p;
  return p;
}

/* Drops a record and gives back the address and GPUs it held. */
void lp_free(struct lproc *p) {
  struct lproc **pp = &lb.hash[lp_hash(p->id)];

  if (p->gpu_mask)
    lb.room_freed = 1; /* a waiting worker may fit now */
  lb.gpu_used &= ~p->gpu_mask;
  if (p->ip_slot >= 0)
    lb.ip_used[p->ip_slot] = 0;
  while (*pp && *pp != p)
    pp = &(*pp)->hnext;
  if (*pp)
    *pp = p->hnext;
  if (p->prev)
    p->prev->next = p->next;
  else
    lb.head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  free(p);
}

/* A record is dropped once it is released, nothing is due for it, and its
 * process is gone (reaped), never existed, or (adopted, so not ours to
 * reap) was cancelled or seen gone. Until then it keeps its address and its
 * GPUs: a worker in its stop grace period still uses them. */
void lp_maybe_free(struct lproc *p) {
  if (!p->live && !p->kill_at_ms && (p->pid == 0 || p->exited || (p->adopted && p->reported)))
    lp_free(p);
}

/* A worker attempt's cgroup: "ID.ATTEMPT". */
void local_cg_name(const char *id, int attempt, char *buf, size_t size) {
  snprintf(buf, size, "%s.%d", id, attempt);
}

/* A worker's address: its own on the bridge, or a loopback one
 * (network.h decides which, once). */
MUST_CHECK int local_ip_to_slot(const char *ip) {
  return net_ip_slot(ip);
}

static MUST_CHECK int ip_alloc(void) {
  int slots = net_slots(IP_SLOTS);

  for (int k = 0; k < slots; k++) {
    int slot = (lb.ip_next + k) % slots;
    if (!lb.ip_used[slot]) {
      lb.ip_used[slot] = 1;
      lb.ip_next = (slot + 1) % slots;
      return slot;
    }
  }
  return -1;
}

static void gpus_format(uint64_t mask, char *buf, size_t size) {
  size_t len = 0;

  buf[0] = '\0';
  for (int i = 0; i < 64 && len + 4 < size; i++)
    if (mask & (1ULL << i))
      len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? "," : "", i);
}

uint64_t local_gpus_parse(const char *s) {
  uint64_t mask = 0;
  char *end;

  while (s && *s) {
    long i = strtol(s, &end, 10);
    if (end == s)
      break;
    if (i >= 0 && i < 64)
      mask |= 1ULL << i;
    s = *end == ',' ? end + 1 : end;
  }
  return mask;
}

static int free_gpus(void) {
  int n = 0;

  for (int i = 0; i < lb.cfg.gpus; i++)
    if (!(lb.gpu_used & (1ULL << i)))
      n++;
  return n;
}

void local_reserve(struct lproc *p) {
  p->live = 1;
  lb.cpu_used += p->req.cpu;
  lb.memory_used += p->req.memory;
  lb.gpu_used |= p->gpu_mask;
}

/* Gives back a released worker's cores and memory (what admission counts);
 * its address and GPUs go with its record (lp_maybe_free). */
static void unreserve(struct lproc *p) {
  if (!p->live)
    return;
  p->live = 0;
  lb.cpu_used -= p->req.cpu;
  lb.memory_used -= p->req.memory;
  if (lb.cpu_used < 1e-9)
    lb.cpu_used = 0;
  if (lb.memory_used < 1e-9)
    lb.memory_used = 0;
}

/* ---- the operations on room (they take lb.mu) ---- */

int local_could_ever_fit(const struct backend_req *r, const char **field, char *msg,
                         size_t msglen) {
  char cores[48], gib[48], gpus[32];

  if (r->cpu > lb.cfg.cpus + 1e-9)
    *field = "cpu";
  else if (r->memory > lb.cfg.memory + 1e-9)
    *field = "memory";
  else if (r->ngpu > lb.cfg.gpus)
    *field = "nvidia_gpu";
  else
    return 0;
  res_words_cores(lb.cfg.cpus, cores, sizeof(cores));
  res_words_gib(lb.cfg.memory, gib, sizeof(gib));
  res_words_gpus(lb.cfg.gpus, gpus, sizeof(gpus));
  snprintf(msg, msglen,
           "%s: the request can never fit the local backend (it has %s, %s of memory and %s in "
           "all)",
           *field, cores, gib, gpus);
  return MUSTER_E_CAPACITY;
}

int local_capacity(struct backend_capacity *cap) {
  cap->cpu = lb.cfg.cpus;
  cap->memory = lb.cfg.memory;
  cap->ngpu = lb.cfg.gpus;
  cap->workers = net_slots(IP_SLOTS); /* each live worker holds an address */
  cap->where = "this host";
  return 1;
}

int local_place(const char *id, const struct backend_req *r, struct backend_placement *where,
                char *why, size_t whylen) {
  struct lproc *p;
  uint64_t mask = 0;
  int slot, taken = 0, ok = 0;
  char want[48], free_s[32], all[32];

  pthread_mutex_lock(&lb.mu);
  /* A little slack absorbs float rounding of fractional cores. */
  if (lb.cpu_used + r->cpu > lb.cfg.cpus + 1e-9) {
    /* The request and what is free read apart ("1 core (0.9999 free"). */
    res_words_apart(r->cpu, lb.cfg.cpus - lb.cpu_used, all, free_s, sizeof(all));
    res_words_cores_of(all, want, sizeof(want));
    res_words_amount(lb.cfg.cpus, all, sizeof(all));
    snprintf(why, whylen, "%s (%s free of %s)", want, free_s, all);
    goto out;
  }
  if (lb.memory_used + r->memory > lb.cfg.memory + 1e-9) {
    res_words_apart(r->memory, lb.cfg.memory - lb.memory_used, all, free_s, sizeof(all));
    snprintf(want, sizeof(want), "%s GiB", all);
    res_words_amount(lb.cfg.memory, all, sizeof(all));
    snprintf(why, whylen, "%s of memory (%s free of %s)", want, free_s, all);
    goto out;
  }
  if (r->ngpu > free_gpus()) {
    res_words_gpus(r->ngpu, want, sizeof(want));
    snprintf(why, whylen, "%s (%d free of %d on this host)", want, free_gpus(), lb.cfg.gpus);
    goto out;
  }
  p = lp_find(id);
  if (p) {
    lp_maybe_free(p);
    p = lp_find(id);
  }
  if (p) {
    snprintf(why, whylen, "its earlier attempt to end");
    goto out;
  }
  slot = ip_alloc();
  if (slot < 0) {
    snprintf(why, whylen, "a free address (%s)", net_bridge() ? net_subnet_text() : "127.0.X.Y");
    goto out;
  }
  /* (tests: an allocation that fails) */
  p = FAULT_FAILS("local_place_nomem") ? NULL : lp_new(id);
  if (!p) {
    lb.ip_used[slot] = 0;
    snprintf(why, whylen, "out of memory in the controller recording its room");
    ok = -1;
    goto out;
  }
  for (int i = 0; i < lb.cfg.gpus && taken < r->ngpu; i++)
    if (!((lb.gpu_used | mask) & (1ULL << i))) {
      mask |= 1ULL << i;
      taken++;
    }
  p->req = *r;
  p->ip_slot = slot;
  p->gpu_mask = mask;
  local_reserve(p);
  net_slot_ip(slot, where->bind_ip, sizeof(where->bind_ip));
  gpus_format(mask, where->gpu_indices, sizeof(where->gpu_indices));
  ok = 1;
out:
  pthread_mutex_unlock(&lb.mu);
  return ok;
}

void local_release(const char *id) {
  struct lproc *p;

  pthread_mutex_lock(&lb.mu);
  p = lp_find(id);
  if (p) {
    unreserve(p);
    lp_maybe_free(p);
  }
  pthread_mutex_unlock(&lb.mu);
}

void local_usage(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total) {
  pthread_mutex_lock(&lb.mu);
  *cpu_used = lb.cpu_used;
  *cpu_total = lb.cfg.cpus;
  *mem_used = lb.memory_used;
  *mem_total = lb.cfg.memory;
  pthread_mutex_unlock(&lb.mu);
}

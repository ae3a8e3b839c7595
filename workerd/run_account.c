/*
 * run_account.c: the account a worker's commands run as (MUSTER_RUN_AS):
 * its ids, its home and its groups less the privileged ones, looked up in
 * the name service and kept for RA_TTL_MS.
 *
 * The fork server keeps the answers for the accounts its requests name
 * (asked in a child of its own, run_account_ask(), so that a slow name
 * service never holds up a fork; run_account_store() keeps the answer),
 * and each worker forked after finds it in the memory it inherits
 * (run_account_lookup()). Asked itself, each worker would ask the name
 * service again: with nss-systemd some hundred system calls for the
 * account, its groups and each group's name, a tenth of a launch's time.
 * A worker that finds no answer kept, and a directly started workerd, ask.
 * Changes to an account reach new workers within RA_TTL_MS, as nscd's
 * cache does within its positive-time-to-live; an answer in which a
 * group's entry could not be read is used once and not kept. It calls no
 * other module of workerd.
 */
#include "workerd.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RA_TTL_MS 10000 /* how long a looked-up account is used again */
#define RA_SLOTS 8      /* accounts kept (a fork server serves few) */

struct ra_slot {
  struct run_account a;
  int64_t at_ms; /* when it was looked up (0: empty) */
};

static struct ra_slot slots[RA_SLOTS];

/* Groups that give root's power, or near it, over the host: never the
 * worker's, whatever the account's entry says. A group whose entry cannot
 * be read (the name service failed, as against "no such group") counts as
 * privileged, and *failed is set: such an answer is not kept. */
static bool group_privileged(gid_t gid, bool *failed) {
  static const char *const names[] = {"root", "disk", "docker",  "adm", "shadow",
                                      "sudo", "lxd",  "libvirt", "kvm", "systemd-journal"};
  struct group gr, *g = NULL;
  size_t size = 16384;
  bool privileged = false;
  char *buf = NULL;
  int e = ERANGE;

  if (gid == 0)
    return true;
  /* (a group of many members needs a large buffer: grown up to 4 MiB) */
  while (e == ERANGE && size <= (4u << 20)) {
    char *grown = realloc(buf, size);

    if (!grown) {
      e = ENOMEM;
      break;
    }
    buf = grown;
    e = getgrgid_r(gid, &gr, buf, size, &g);
    size *= 2;
  }
  if (e != 0 && e != ENOENT && e != ESRCH && e != EBADF) {
    *failed = true;
    privileged = true;
  }
  for (size_t i = 0; !privileged && g && i < sizeof(names) / sizeof(names[0]); i++)
    privileged = strcmp(g->gr_name, names[i]) == 0;
  free(buf);
  return privileged;
}

int run_account_ask(const char *name, struct run_account *a) {
  struct passwd *pw;
  gid_t all[WD_GROUPS_MAX];
  int n = WD_GROUPS_MAX;
  bool failed = false;

  memset(a, 0, sizeof(*a));
  if (strlen(name) >= sizeof(a->name) || !(pw = getpwnam(name)))
    return -1;
  snprintf(a->name, sizeof(a->name), "%s", name);
  a->home_too_long = strlen(pw->pw_dir) >= sizeof(a->home);
  snprintf(a->home, sizeof(a->home), "%s", pw->pw_dir);
  a->uid = pw->pw_uid;
  a->gid = pw->pw_gid;
  /* (pw points into getpwnam()'s buffer, which getgrouplist() may reuse:
   * everything needed is copied above) */
  if (getgrouplist(name, a->gid, all, &n) < 0) {
    a->too_many_groups = true;
  } else {
    for (int i = 0; i < n; i++)
      if (all[i] != a->gid && !group_privileged(all[i], &failed))
        a->groups[a->n_groups++] = all[i];
  }
  a->keep = !failed;
  return 0;
}

int run_account_cached(const char *name, struct run_account *a) {
  int64_t now = util_mono_ms();

  for (int i = 0; i < RA_SLOTS; i++)
    if (slots[i].at_ms && strcmp(slots[i].a.name, name) == 0 && now - slots[i].at_ms < RA_TTL_MS) {
      *a = slots[i].a;
      return 0;
    }
  return -1;
}

void run_account_store(const struct run_account *a, int64_t asked_ms) {
  struct ra_slot *use = &slots[0];

  if (!a->keep)
    return;
  for (int i = 1; i < RA_SLOTS; i++)
    if (slots[i].at_ms < use->at_ms)
      use = &slots[i]; /* the oldest (or an empty one) is replaced */
  for (int i = 0; i < RA_SLOTS; i++)
    if (slots[i].at_ms && strcmp(slots[i].a.name, a->name) == 0)
      use = &slots[i]; /* as is an entry of the same name */
  use->a = *a;
  use->at_ms = asked_ms;
}

int run_account_lookup(const char *name, struct run_account *a) {
  int64_t asked = util_mono_ms();

  if (run_account_cached(name, a) == 0)
    return 0;
  if (run_account_ask(name, a) != 0)
    return -1; /* not kept: an account made a moment later is found */
  run_account_store(a, asked);
  return 0;
}

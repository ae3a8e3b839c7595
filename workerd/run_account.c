/*
 * run_account.c: the account a worker's commands run as (MUSTER_RUN_AS):
 * its ids, its home and its groups less the privileged ones, looked up in
 * the name service and kept for RA_TTL_MS.
 *
 * The fork server looks the account of each request up before it forks
 * (run_account_lookup() fills the cache), so that the worker finds the
 * answer in the memory it inherits. Asked itself, each worker would ask
 * the name service again: with nss-systemd some hundred system calls for
 * the account, its groups and each group's name, a tenth of a launch's
 * time. A directly started workerd has an empty cache and asks. Changes
 * to an account reach new workers within RA_TTL_MS, as nscd's cache does
 * within its positive-time-to-live. It calls no other module of workerd.
 */
#include "workerd.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>

#define RA_TTL_MS 10000 /* how long a looked-up account is used again */
#define RA_SLOTS 8      /* accounts kept (a fork server serves few) */

struct ra_slot {
  struct run_account a;
  int64_t at_ms; /* when it was looked up (0: empty) */
};

static struct ra_slot slots[RA_SLOTS];

/* Groups that give root's power, or near it, over the host: never the
 * worker's, whatever the account's entry says. */
static bool group_privileged(gid_t gid) {
  static const char *const names[] = {"root", "disk", "docker",  "adm", "shadow",
                                      "sudo", "lxd",  "libvirt", "kvm", "systemd-journal"};
  struct group *g;

  if (gid == 0)
    return true;
  g = getgrgid(gid);
  for (size_t i = 0; g && i < sizeof(names) / sizeof(names[0]); i++)
    if (strcmp(g->gr_name, names[i]) == 0)
      return true;
  return false;
}

/* Asks the name service for account name into *a. Returns 0, or -1 if
 * there is none. */
static int ra_ask(const char *name, struct run_account *a) {
  struct passwd *pw = getpwnam(name);
  gid_t all[WD_GROUPS_MAX];
  int n = WD_GROUPS_MAX;

  if (!pw)
    return -1;
  memset(a, 0, sizeof(*a));
  snprintf(a->name, sizeof(a->name), "%s", name);
  snprintf(a->home, sizeof(a->home), "%s", pw->pw_dir);
  a->uid = pw->pw_uid;
  a->gid = pw->pw_gid;
  /* (pw points into getpwnam()'s buffer, which getgrouplist() may reuse:
   * everything needed is copied above) */
  if (getgrouplist(name, a->gid, all, &n) < 0) {
    a->too_many_groups = true;
    return 0;
  }
  for (int i = 0; i < n; i++)
    if (all[i] != a->gid && !group_privileged(all[i]))
      a->groups[a->n_groups++] = all[i];
  return 0;
}

int run_account_lookup(const char *name, struct run_account *a) {
  int64_t now = util_mono_ms();
  struct ra_slot *use = &slots[0];

  if (strlen(name) >= sizeof(a->name))
    return -1;
  for (int i = 0; i < RA_SLOTS; i++) {
    if (slots[i].at_ms && strcmp(slots[i].a.name, name) == 0 && now - slots[i].at_ms < RA_TTL_MS) {
      *a = slots[i].a;
      return 0;
    }
    if (slots[i].at_ms < use->at_ms)
      use = &slots[i]; /* the oldest (or an empty one) is replaced */
  }
  if (ra_ask(name, a) != 0)
    return -1; /* not kept: an account made a moment later is found */
  for (int i = 0; i < RA_SLOTS; i++)
    if (slots[i].at_ms && strcmp(slots[i].a.name, name) == 0)
      use = &slots[i]; /* a stale entry of the same name is replaced */
  use->a = *a;
  use->at_ms = now;
  return 0;
}

/* main.c: muster-controller's command line, start-up and shutdown. */
#include "account.h"
#include "api.h"
#include "backend.h"
#include "cgroup.h"
#include "fault.h"
#include "hostport.h"
#include "log.h"
#include "muster_errors.h"
#include "network.h"
#include "reach.h"
#include "resources.h"
#include "scratch.h"
#include "state.h"
#include "user_cmd.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <microhttpd.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

static void usage(FILE *out) {
  fprintf(out, "usage: muster-controller [options]\n"
               "\n"
               "Runs muster's REST API, keeps worker state in SQLite and starts workers\n"
               "through a backend.\n"
               "\n"
               "  --listen HOST:PORT        address to serve on (default 127.0.0.1:8470;\n"
               "                            :PORT every address; port 0 picks a free one)\n"
               "  --state-dir DIR           database, token, logs (default ~/.muster)\n"
               "  --backend NAME            how workers are started: local (default), slurm\n"
               "                            (a Slurm job per launch, from a login node), or\n"
               "                            external (starts nothing: workerd is started by\n"
               "                            hand or by a load generator)\n"
               "  --advertise-url URL       where workers reach this controller (default: the\n"
               "                            --listen address; set it when that is 0.0.0.0 or\n"
               "                            behind NAT)\n"
               "  --slurm-partition P       slurm: the partition jobs go to (default: Slurm's)\n"
               "  --slurm-account A         slurm: the account jobs are charged to\n"
               "  --slurm-arg ARG           slurm: one more sbatch argument (repeatable)\n"
               "  --retain S                keep ended workers, their events and logs for S s\n"
               "                            (default 604800, 7 days; 0 keeps them forever)\n"
               "  --start-timeout S         fail workers not registered after S s (default 60)\n"
               "  --heartbeat-timeout S     fail workers silent for S s (default 15)\n"
               "  --heartbeat-interval S    how often workers heartbeat (default 2)\n"
               "  --heartbeat-rate N        longer intervals past N heartbeats a second from\n"
               "                            all live workers (default 5000; 0: never)\n"
               "  --host-beat auto|on|off   one heartbeat per host for its workers: once the\n"
               "                            rate stretches the interval (auto, the default),\n"
               "                            always, or never\n"
               "  --stop-grace S            SIGTERM to SIGKILL on stop (default 5)\n"
               "  --cpus N                  cores the local backend hands out (default: all)\n"
               "  --memory GIB              memory the local backend hands out (default: all)\n"
               "  --gpus N                  GPUs the local backend hands out (default 0)\n"
               "  --isolation none|cgroup   local: put each worker in a cgroup of its own\n"
               "                            (default: where the host allows it)\n"
               "  --network bridge|host     local: each worker in a network namespace of its\n"
               "                            own, on a bridge with an address of its own\n"
               "                            (bridge, the default where allowed: root), or on\n"
               "                            the host's network with a loopback address (host)\n"
               "  --subnet CIDR             bridge: the workers' subnet (default 10.213.0.0/16;\n"
               "                            its bridge is muster0, another's mu<hex>)\n"
               "  --workerd PATH            the muster-workerd binary (default: beside this one)\n"
               "  --web-dir DIR             the web UI's files (default: ../share/muster/web\n"
               "                            beside this binary, else the source tree's)\n"
               "  --workdir DIR             where workers' scripts run (default: current dir)\n"
               "  --run-as USER             local, slurm: workers' commands (slurm: their jobs)\n"
               "                            run as this account (not root; the controller\n"
               "                            must run as root; default for a root controller:\n"
               "                            muster-worker)\n"
               "  --tls-cert FILE           serve HTTPS with this certificate (PEM; its chain\n"
               "                            after it); clients and workers verify it against\n"
               "                            the system's CAs or MUSTER_CA_FILE\n"
               "  --tls-key FILE            the certificate's private key (PEM)\n"
               "  --http-threads N          HTTP thread pool size (default 4)\n"
               "  -v, --verbose             log debug lines\n"
               "  -h, --help                this text\n"
               "  --version                 print the version\n");
}

/* HOST:PORT, or :PORT for every address. */
/* 1 when dir and its levels - 1 parents are directories of root or of this
 * user that no one else may write to; else 0. */
static int trusted_dir(const char *dir, int levels) {
  char path[PATH_MAX];
  struct stat st;

  if (!realpath(dir, path))
    return 0;
  for (int i = 0; i < levels; i++) {
    char *slash = strrchr(path, '/');
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) ||
        (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 022))
      return 0;
    if (!slash || slash == path)
      break;
    *slash = '\0';
  }
  return 1;
}

static MUST_CHECK int parse_listen(const char *arg, struct ctl_config *cfg) {
  char full[600];

  if (arg[0] == ':') {
    snprintf(full, sizeof(full), "0.0.0.0%.590s", arg);
    arg = full;
  }
  if (hostport_split(arg, strlen(arg), cfg->listen_host, sizeof(cfg->listen_host), 0, &cfg->port))
    return MUSTER_E_INVALID;
  return 0;
}

/* Fills cfg from argv. Returns 0, 1 for --help/--version (exit 0), or
 * MUSTER_E_INVALID after printing what was wrong. */
static MUST_CHECK int parse_args(int argc, char **argv, struct ctl_config *cfg) {
  char self[PATH_MAX];
  ssize_t n;
  const char *home = getenv("HOME");
  struct sysinfo si;

  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->listen_host, sizeof(cfg->listen_host), "127.0.0.1");
  cfg->port = 8470;
  snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s/.muster", home ? home : ".");
  snprintf(cfg->backend, sizeof(cfg->backend), "local");
  snprintf(cfg->web_dir, sizeof(cfg->web_dir), "%s", MUSTER_WEB_DIR);
  if (!getcwd(cfg->workdir, sizeof(cfg->workdir)))
    snprintf(cfg->workdir, sizeof(cfg->workdir), "/");
  cfg->start_timeout_s = 60;
  cfg->heartbeat_timeout_s = 15;
  cfg->heartbeat_interval_s = 2;
  cfg->heartbeat_rate = 5000;
  cfg->stop_grace_s = 5;
  cfg->retain_s = 7 * 86400;
  cfg->cpus = (double)sysconf(_SC_NPROCESSORS_ONLN);
  cfg->memory = sysinfo(&si) == 0 ? (double)si.totalram * si.mem_unit / (1024.0 * 1024 * 1024) : 1;
  cfg->gpus = 0;
  cfg->http_threads = 4;
  n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    const char *bin = dirname(self);
    char web[sizeof(cfg->web_dir)];
    snprintf(cfg->workerd_path, sizeof(cfg->workerd_path), "%s/muster-workerd", bin);
    /* An installed controller (PREFIX/bin) serves PREFIX/share/muster/web;
     * one run from its build directory, the source tree's web/. Only a
     * directory nobody else could have made or filled: a build in /tmp/b
     * must not serve a /tmp/share/muster/web another user made there. */
    if (snprintf(web, sizeof(web), "%s/../share/muster/web", bin) < (int)sizeof(web) &&
        trusted_dir(web, 3))
      snprintf(cfg->web_dir, sizeof(cfg->web_dir), "%s", web);
  } else {
    snprintf(cfg->workerd_path, sizeof(cfg->workerd_path), "muster-workerd");
  }

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    long l;

#define NEED_VALUE()                                                                               \
  do {                                                                                             \
    if (!v) {                                                                                      \
      fprintf(stderr, "muster-controller: %s needs a value\n", a);                                 \
      return MUSTER_E_INVALID;                                                                     \
    }                                                                                              \
    i++;                                                                                           \
  } while (0)

    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 1;
    } else if (strcmp(a, "--version") == 0) {
      printf("muster-controller %s\n", MUSTER_VERSION);
      return 1;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
      log_verbosity = LOG_DEBUG;
    } else if (strcmp(a, "--listen") == 0) {
      NEED_VALUE();
      bad = parse_listen(v, cfg);
    } else if (strcmp(a, "--state-dir") == 0) {
      NEED_VALUE();
      bad = strlen(v) >= sizeof(cfg->state_dir) - 64;
      snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", v);
    } else if (strcmp(a, "--backend") == 0) {
      NEED_VALUE();
      if (!backend_find(v)) {
        fprintf(stderr,
                "muster-controller: --backend: there is no backend \"%s\" (this "
                "controller has: %s)\n",
                v, backend_names());
        return MUSTER_E_INVALID;
      }
      snprintf(cfg->backend, sizeof(cfg->backend), "%s", v);
    } else if (strcmp(a, "--retain") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0, 3650 * 86400.0, &cfg->retain_s);
    } else if (strcmp(a, "--start-timeout") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0.1, 86400, &cfg->start_timeout_s);
    } else if (strcmp(a, "--heartbeat-timeout") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0.5, 86400, &cfg->heartbeat_timeout_s);
    } else if (strcmp(a, "--heartbeat-interval") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0.1, 3600, &cfg->heartbeat_interval_s);
    } else if (strcmp(a, "--heartbeat-rate") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0, 1e7, &cfg->heartbeat_rate);
    } else if (strcmp(a, "--host-beat") == 0) {
      NEED_VALUE();
      if (strcmp(v, "auto") == 0)
        cfg->host_beat = HOST_BEAT_AUTO;
      else if (strcmp(v, "on") == 0)
        cfg->host_beat = HOST_BEAT_ON;
      else if (strcmp(v, "off") == 0)
        cfg->host_beat = HOST_BEAT_OFF;
      else
        bad = 1;
    } else if (strcmp(a, "--stop-grace") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0, 3600, &cfg->stop_grace_s);
    } else if (strcmp(a, "--cpus") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0, 1e6, &cfg->cpus);
    } else if (strcmp(a, "--memory") == 0) {
      NEED_VALUE();
      bad = util_parse_double(v, 0, 1e9, &cfg->memory);
    } else if (strcmp(a, "--gpus") == 0) {
      NEED_VALUE();
      bad = util_parse_long(v, 0, 64, &l);
      cfg->gpus = (int)l;
    } else if (strcmp(a, "--isolation") == 0) {
      NEED_VALUE();
      if (strcmp(v, "none") == 0) {
        cfg->isolation = CG_OFF;
      } else if (strcmp(v, "cgroup") == 0) {
        cfg->isolation = CG_FORCE;
      } else {
        fprintf(stderr, "muster-controller: --isolation is none or cgroup, not \"%s\"\n", v);
        return MUSTER_E_INVALID;
      }
    } else if (strcmp(a, "--network") == 0) {
      NEED_VALUE();
      if (strcmp(v, "bridge") == 0) {
        cfg->network = NET_BRIDGE;
      } else if (strcmp(v, "host") == 0) {
        cfg->network = NET_HOST;
      } else {
        fprintf(stderr, "muster-controller: --network is bridge or host, not \"%s\"\n", v);
        return MUSTER_E_INVALID;
      }
    } else if (strcmp(a, "--subnet") == 0) {
      NEED_VALUE();
      bad = strlen(v) >= sizeof(cfg->subnet);
      snprintf(cfg->subnet, sizeof(cfg->subnet), "%s", v);
    } else if (strcmp(a, "--http-threads") == 0) {
      NEED_VALUE();
      bad = util_parse_long(v, 1, 64, &l);
      cfg->http_threads = (int)l;
    } else if (strcmp(a, "--advertise-url") == 0) {
      NEED_VALUE();
      if ((strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0) ||
          strlen(v) >= sizeof(cfg->advertise_url)) {
        fprintf(stderr,
                "muster-controller: --advertise-url must be an http:// or https:// URL, not "
                "\"%s\"\n",
                v);
        return MUSTER_E_INVALID;
      }
      snprintf(cfg->advertise_url, sizeof(cfg->advertise_url), "%s", v);
    } else if (strcmp(a, "--slurm-partition") == 0) {
      NEED_VALUE();
      snprintf(cfg->slurm_partition, sizeof(cfg->slurm_partition), "%s", v);
    } else if (strcmp(a, "--slurm-account") == 0) {
      NEED_VALUE();
      snprintf(cfg->slurm_account, sizeof(cfg->slurm_account), "%s", v);
    } else if (strcmp(a, "--slurm-arg") == 0) {
      NEED_VALUE();
      if (cfg->nslurm_args == (int)(sizeof(cfg->slurm_args) / sizeof(cfg->slurm_args[0]))) {
        fprintf(stderr, "muster-controller: at most 32 --slurm-arg\n");
        return MUSTER_E_INVALID;
      }
      cfg->slurm_args[cfg->nslurm_args++] = (char *)v;
    } else if (strcmp(a, "--workerd") == 0) {
      NEED_VALUE();
      snprintf(cfg->workerd_path, sizeof(cfg->workerd_path), "%s", v);
    } else if (strcmp(a, "--web-dir") == 0) {
      NEED_VALUE();
      snprintf(cfg->web_dir, sizeof(cfg->web_dir), "%s", v);
    } else if (strcmp(a, "--workdir") == 0) {
      NEED_VALUE();
      snprintf(cfg->workdir, sizeof(cfg->workdir), "%s", v);
    } else if (strcmp(a, "--tls-cert") == 0 || strcmp(a, "--tls-key") == 0) {
      char *dst = a[6] == 'c' ? cfg->tls_cert : cfg->tls_key;
      NEED_VALUE();
      bad = strlen(v) >= sizeof(cfg->tls_cert) || !*v;
      snprintf(dst, sizeof(cfg->tls_cert), "%s", v);
    } else if (strcmp(a, "--run-as") == 0) {
      NEED_VALUE();
      bad = strlen(v) >= sizeof(cfg->run_as) || !*v;
      snprintf(cfg->run_as, sizeof(cfg->run_as), "%s", v);
    } else {
      fprintf(stderr, "muster-controller: unknown option %s (see --help)\n", a);
      return MUSTER_E_INVALID;
    }
    if (bad) {
      fprintf(stderr, "muster-controller: %s: invalid value \"%s\"\n", a, v);
      return MUSTER_E_INVALID;
    }
#undef NEED_VALUE
  }
  if (!cfg->tls_cert[0] != !cfg->tls_key[0]) {
    fprintf(stderr, "muster-controller: %s needs %s too\n",
            cfg->tls_cert[0] ? "--tls-cert" : "--tls-key",
            cfg->tls_cert[0] ? "--tls-key" : "--tls-cert");
    return MUSTER_E_INVALID;
  }
  if (cfg->advertise_url[0] &&
      (cfg->tls_cert[0] != '\0') == (strncmp(cfg->advertise_url, "http://", 7) == 0)) {
    fprintf(stderr, "muster-controller: --advertise-url %s: the controller serves %s\n",
            cfg->advertise_url,
            cfg->tls_cert[0] ? "HTTPS only (--tls-cert)"
                             : "plain HTTP (https:// needs --tls-cert)");
    return MUSTER_E_INVALID;
  }
  if (cfg->tls_cert[0] && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
    fprintf(stderr, "muster-controller: --tls-cert: this libmicrohttpd was built without TLS\n");
    return MUSTER_E_INVALID;
  }
  /* A worker heartbeats every interval and is lost after the timeout
   * without one: a timeout no longer than the interval loses them all. */
  if (cfg->heartbeat_interval_s >= cfg->heartbeat_timeout_s) {
    fprintf(stderr,
            "muster-controller: --heartbeat-interval (%g s) must be shorter than "
            "--heartbeat-timeout (%g s), or every worker is failed as lost between two "
            "heartbeats\n",
            cfg->heartbeat_interval_s, cfg->heartbeat_timeout_s);
    return MUSTER_E_INVALID;
  }
  /* A worker's code never runs as root: a root controller without
   * --run-as gives it the setup script's account (on Slurm, its jobs are
   * submitted as that account). */
  int switches = strcmp(cfg->backend, "local") == 0 || strcmp(cfg->backend, "slurm") == 0;
  if (!cfg->run_as[0] && geteuid() == 0 && switches) {
    if (!getpwnam(MUSTER_DEFAULT_ACCOUNT)) {
      fprintf(stderr,
              "muster-controller: this controller runs as root and never runs a worker's code "
              "as root, but there is no account " MUSTER_DEFAULT_ACCOUNT
              " on this host: run scripts/setup.sh (it makes one) or name another with "
              "--run-as USER\n");
      return MUSTER_E_INVALID;
    }
    snprintf(cfg->run_as, sizeof(cfg->run_as), "%s", MUSTER_DEFAULT_ACCOUNT);
  }
  if (cfg->run_as[0]) {
    struct passwd *pw = getpwnam(cfg->run_as);

    if (!pw) {
      fprintf(stderr,
              "muster-controller: --run-as: no account \"%s\" on this host (scripts/setup.sh "
              "makes muster-worker)\n",
              cfg->run_as);
      return MUSTER_E_INVALID;
    }
    if (pw->pw_uid == 0 || pw->pw_uid == geteuid() || pw->pw_gid == 0 || pw->pw_gid == getegid()) {
      fprintf(stderr,
              "muster-controller: --run-as: \"%s\" is %s; workers must run as an account "
              "of their own\n",
              cfg->run_as,
              pw->pw_uid == 0 || pw->pw_gid == 0 ? "root or in root's group as its own"
                                                 : "the controller's own account or group");
      return MUSTER_E_INVALID;
    }
    if (geteuid() != 0 || !switches) {
      fprintf(stderr,
              "muster-controller: --run-as needs the local or slurm backend and a controller "
              "run as root (it switches each worker's commands, or submits its Slurm jobs, "
              "to \"%s\")\n",
              cfg->run_as);
      return MUSTER_E_INVALID;
    }
  }
  if (cfg->run_as[0]) {
    char self[PATH_MAX], why[PATH_MAX + 512];
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
    struct reach_item items[] = {
        {cfg->workerd_path, "the worker daemon", 0},
        {self, "this controller's binary", 0},
        {cfg->web_dir, "the web UI's files", 1},
        {cfg->state_dir, "the state directory", 0},
    };

    if (k > 0)
      self[k] = '\0';
    else
      snprintf(self, sizeof(self), "%s", cfg->workerd_path);
    if (reach_check(cfg->run_as, items, 4, why, sizeof(why)) != 0) {
      fprintf(stderr, "muster-controller: %s\n", why);
      return MUSTER_E_INVALID;
    }
  }
  /* A root controller's Slurm jobs run muster-workerd as the account: from
   * exec on it must be non-dumpable (its environment holds the job's
   * secret), which the kernel gives a binary the account cannot read, run
   * as the job script's own interpreter (an absolute #! line, no blanks). */
  if (cfg->run_as[0] && strcmp(cfg->backend, "slurm") == 0) {
    struct stat st;

    if (stat(cfg->workerd_path, &st) == 0 && (st.st_uid != 0 || (st.st_mode & 0044) != 0)) {
      fprintf(stderr,
              "muster-controller: %s is readable by %s (mode %04o, owner uid %u): its Slurm jobs "
              "would start it dumpable, and it refuses to run so; make it root-owned, mode 0711, "
              "as CMake builds and installs it\n",
              cfg->workerd_path, cfg->run_as, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
      return MUSTER_E_INVALID;
    }
    if (cfg->workerd_path[0] != '/' || strlen(cfg->workerd_path) >= 120 ||
        strpbrk(cfg->workerd_path, " \t\n")) {
      fprintf(stderr,
              "muster-controller: --workerd %s cannot be a Slurm job's #! line (an absolute "
              "path under 120 bytes, without blanks), and a shell in between would hold the "
              "job's secret where %s can read it\n",
              cfg->workerd_path, cfg->run_as);
      return MUSTER_E_INVALID;
    }
  }
  if (access(cfg->workerd_path, X_OK) != 0) {
    fprintf(stderr, "muster-controller: cannot run the worker daemon %s: %s (see --workerd)\n",
            cfg->workerd_path, strerror(errno));
    return MUSTER_E_INVALID;
  }
  return 0;
}

/* Writes the controller's URL beside its token, so that clients on this
 * host find it without any set-up. */
static void write_url_file(void) {
  char path[600], tmp[620];
  FILE *f;

  snprintf(path, sizeof(path), "%s/url", g.cfg.state_dir);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  f = fopen(tmp, "w");
  if (!f)
    return;
  fprintf(f, "%s\n", g.controller_url);
  if (fclose(f) == 0)
    rename(tmp, path);
}

int main(int argc, char **argv) {
  struct ctl_config cfg;
  struct rlimit rl;
  sigset_t set;
  char err[512];
  int rc, sig = 0;

  log_set_program("muster-controller");
  if (argc > 1 && strcmp(argv[1], "user") == 0)
    return user_cmd(argc - 1, argv + 1);
  rc = parse_args(argc, argv, &cfg);
  if (rc)
    return rc > 0 ? 0 : 2;

  /* Hundreds of workers keep a connection each. */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  signal(SIGPIPE, SIG_IGN);
  /* Workers forked by the fork server (and anything a worker leaves
   * behind) are re-parented to us, so that we reap them and see at once
   * when one dies. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  /* Every thread inherits this mask; the main thread takes the signals. */
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  /* The socket first: its port makes the controller's one URL (or
   * --advertise-url does), which state_init() fixes before any backend
   * starts; nothing is served until the backend and its reconciliation
   * are done. */
  rc = net_setup(cfg.network, cfg.subnet, cfg.backend, err, sizeof(err));
  if (!rc)
    rc = api_bind(&cfg, err, sizeof(err));
  if (!rc)
    rc = state_init(&cfg, err, sizeof(err));
  if (!rc)
    rc = api_start(err, sizeof(err));
  if (rc) {
    LOG(LOG_ERROR, "%s", err);
    api_stop();
    state_cleanup();
    return 1;
  }
  write_url_file();
  rc = state_start_monitor();
  if (rc) {
    LOG(LOG_ERROR, "could not start the monitor thread");
    api_stop();
    state_cleanup();
    return 1;
  }
  /* The private /tmp trees that workerds killed outright left (those still
   * running hold theirs): common/scratch.h. The API and the monitor already
   * run meanwhile (a large tree takes what it takes); a reap's own sweep
   * (local_reap.c) may run beside it: each tree goes to whichever gets its
   * lock. */
  FAULT_POINT("scratch_before_sweep");
  scratch_sweep(g.cfg.state_dir);
  if (strcmp(g.backend->name, "local") == 0) {
    char cores[48], gib[48], gpus[32];
    res_words_cores(g.cfg.cpus, cores, sizeof(cores));
    res_words_gib(g.cfg.memory, gib, sizeof(gib));
    res_words_gpus(g.cfg.gpus, gpus, sizeof(gpus));
    LOG(LOG_INFO, "listening on %s (state in %s, local backend: %s, %s, %s)", g.controller_url,
        g.cfg.state_dir, cores, gib, gpus);
  } else
    LOG(LOG_INFO, "listening on %s (state in %s, %s backend%s%s)", g.controller_url,
        g.cfg.state_dir, g.backend->name, g.cfg.slurm_partition[0] ? ", partition " : "",
        g.cfg.slurm_partition);
  printf("muster-controller: listening on %s\n", g.controller_url);
  /* Who runs the workers' code is the first thing to know about their
   * boundary: said at every start, as health says it. */
  if (g.cfg.run_as[0] && strcmp(g.backend->name, "slurm") == 0)
    printf("muster-controller: workers' commands run as %s, or as their user's unix_user (their "
           "Slurm jobs are submitted as it)\n",
           g.cfg.run_as);
  else if (g.cfg.run_as[0])
    printf("muster-controller: workers' commands run as %s, or as their user's unix_user\n",
           g.cfg.run_as);
  else if (strcmp(g.backend->name, "slurm") == 0)
    printf("muster-controller: workers' commands run as this controller's account (their Slurm "
           "jobs are submitted as it; a controller run as root submits them as another: "
           "--run-as)\n");
  else if (strcmp(g.backend->name, "local") == 0)
    printf("muster-controller: workers' commands run as this controller's account (a controller "
           "run as root can give them one of their own: --run-as)\n");
  /* Where workers are on the network, and why not in a namespace of their
   * own when they are not, said at every start as health says it. */
  if (net_bridge())
    printf("muster-controller: network: bridge %s (%s); each worker in a network namespace of "
           "its own; workers reach this controller at %s\n",
           net_bridge_name(), net_subnet_text(), g.worker_url);
  else
    printf("muster-controller: network: host (%s)\n", net_reason());
  /* The sign-in link carries the token: it goes to a terminal, once, never
   * into a file that stdout may be redirected to. */
  if (g.token_new && isatty(STDOUT_FILENO))
    printf("muster-controller: new API token (kept in %s/token); web UI:\n    %s/?token=%s\n",
           g.cfg.state_dir, g.controller_url, g.api_token);
  else
    printf("muster-controller: web UI: %s/?token=<the token in %s/token>\n", g.controller_url,
           g.cfg.state_dir);
  fflush(stdout);

  while (sigwait(&set, &sig) == 0 && sig == SIGHUP)
    ;
  LOG(LOG_INFO, "signal %d: shutting down (workers keep running)", sig);
  state_begin_shutdown();
  /* Give woken connections a moment to send their last answers: 100 ms,
   * and up to 2 s while an await's answer has yet to go out. */
  for (int waited = 0; waited < 100 || (waited < 2000 &&
                                        __atomic_load_n(&g.awaits_answering, __ATOMIC_RELAXED) > 0);
       waited += 10)
    usleep(10 * 1000);
  state_stop_monitor();
  api_stop();
  state_cleanup();
  return 0;
}

#!/usr/bin/env bash
# tests/cgroup_clean.sh DIR...: removes the cgroups that the controllers of a
# test made, and unmounts the sessions' /tmp overlays their workers left. Each controller lists its cgroup base directories in
# STATE/cgroups; its workers outlive it by design (a restarted controller
# adopts them), so a test that is done with them removes what they leave:
# every worker cgroup under those bases (killing any process still in it:
# they are the test's own workers), then the bases. DIR is searched for
# state directories (a "cgroups" file) up to 4 levels down.
set -u
for root in "$@"; do
  [ -d "$root" ] || continue
  while IFS= read -r list; do
    while IFS= read -r base; do
      case $base in /sys/fs/cgroup/*/muster-* | /sys/fs/cgroup/*muster-*) ;; *) continue ;; esac
      [ -d "$base" ] || continue
      for d in "$base"/*/; do
        [ -d "$d" ] || continue
        for _ in $(seq 100); do
          rmdir "$d" 2>/dev/null && break
          while read -r pid; do
            [ "$pid" -gt 1 ] 2>/dev/null && kill -9 "$pid" 2>/dev/null
          done <"$d/cgroup.procs"
          sleep 0.02
        done
        [ -d "$d" ] && echo "cgroup_clean: could not remove $d" >&2
      done
      rmdir "$base" 2>/dev/null || echo "cgroup_clean: could not remove $base" >&2
    done <"$list"
  done < <(find "$root" -maxdepth 4 -name cgroups -type f 2>/dev/null)
  # The sessions' /tmp overlays (common/scratch.c) that workerds killed
  # outright left mounted: a controller's next start would sweep them; a
  # test's state directory has none.
  while IFS= read -r m; do
    mountpoint -q "$m" && { umount -l "$m" || echo "cgroup_clean: could not unmount $m" >&2; }
  done < <(find "$root" -maxdepth 6 -path '*/scratch/*/merged' -type d 2>/dev/null)
done
exit 0

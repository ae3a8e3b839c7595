#!/usr/bin/env bash
# muster-train as a user runs it: modes agree, MNIST is learnt, checkpoints
# resume exactly, bad data is refused with a clear error, a dead parameter
# server ends its workers. Usage: test_trainer.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=${1:-build}
src=${2:-.}
train=$build/muster-train
data=$src/data/mnist
tmp=$(mktemp -d /tmp/muster-trainer-test-XXXXXX)
pids=()
pass=0
fail=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own allocations are not ours to judge in a sanitized build.
export LSAN_OPTIONS=${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$src/tests/trainer/lsan.supp
# In a sanitized build, Open MPI's plugins leave allocations behind that
# LeakSanitizer reports after they are unloaded (no frame to suppress by):
# MPI jobs run without leak detection; memory errors are still caught, and the
# single-process runs keep every check.
mpirun=(env "ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0" mpirun -np 2 --oversubscribe --bind-to none)

cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

ok() { echo "ok - $*"; pass=$((pass + 1)); }
not_ok() { echo "not ok - $*"; fail=$((fail + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else not_ok "$what"; fi; }
. "$(dirname "$0")/../lib/wait.sh"

# The JSON summary (the last line) field $2 of output file $1.
field() { tail -1 "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }

# Max abs difference of two raw float32 parameter dumps.
maxdiff() {
  python3 - "$1" "$2" <<'PY'
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open(sys.argv[2], 'rb').read())
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
print(max(abs(x - y) for x, y in zip(a, b)))
PY
}
le() { python3 -c "import sys; sys.exit(0 if float('$1') <= float('$2') else 1)"; }
ge() { python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }

[ -x "$train" ] || { echo "not ok - $train is not built"; echo "0 passed, 1 failed"; exit 1; }
[ -s "$data/train-images-idx3-ubyte" ] || { echo "not ok - no MNIST in $data (scripts/setup.sh fetches it)"; echo "0 passed, 1 failed"; exit 1; }

# --- allreduce (2 ranks) and single agree after 50 steps at the same global batch
"$train" --steps 50 --batch 64 --quiet --dump-params "$tmp/single.bin" > "$tmp/single.out" 2>&1
"${mpirun[@]}" "$train" --mode allreduce --steps 50 --batch 64 --quiet \
  --dump-params "$tmp/ar.bin" > "$tmp/ar.out" 2>&1
if [ -s "$tmp/single.bin" ] && [ -s "$tmp/ar.bin" ]; then
  d=$(maxdiff "$tmp/single.bin" "$tmp/ar.bin")
  check "allreduce(2) matches single after 50 steps (max abs weight difference $d <= 1e-4)" le "$d" 1e-4
  check "allreduce reports 2 ranks and 50 steps" test "$(field "$tmp/ar.out" ranks)/$(field "$tmp/ar.out" steps)" = 2/50
else
  not_ok "allreduce vs single: a run failed: $(tail -3 "$tmp/single.out" "$tmp/ar.out")"
fi

# --- parameter servers, --sync, 1 PS + 2 workers, match single too
ps_run() { # $1 = extra args ; runs 1 PS + 2 workers on loopback, waits for all
  # A port nobody holds now (a random one could be taken, and the PS would
  # not start: its workers then wait out their timeouts).
  local port cluster i
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cluster="{\"ps\": [\"127.0.0.1:$port\"], \"worker\": [\"127.0.0.1:$((port + 1))\", \"127.0.0.1:$((port + 2))\"]}"
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"ps\", \"index\": 0}}" \
    "$train" --mode ps "$@" > "$tmp/ps.out" 2>&1 &
  ps_pid=$!; pids+=("$ps_pid")
  for i in 0 1; do
    TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      "$train" --mode ps "$@" > "$tmp/w$i.out" 2>&1 &
    eval "w${i}_pid=$!"; pids+=("$!")
  done
}
ps_run --sync --steps 50 --batch 64 --quiet --dump-params "$tmp/ps.bin"
wait "$w0_pid"; w0=$?; wait "$w1_pid"; w1=$?; wait "$ps_pid"; psr=$?
if [ $w0 -eq 0 ] && [ $w1 -eq 0 ] && [ $psr -eq 0 ] && [ -s "$tmp/ps.bin" ]; then
  d=$(maxdiff "$tmp/single.bin" "$tmp/ps.bin")
  check "PS --sync (1 PS, 2 workers) matches single after 50 steps (max abs difference $d <= 1e-4)" le "$d" 1e-4
else
  not_ok "PS --sync run failed (worker0 $w0, worker1 $w1, ps $psr): $(tail -2 "$tmp/w0.out" "$tmp/ps.out")"
fi

# --- a killed parameter server ends its workers, non-zero, at once, naming it.
# Their I/O timeout is 60 s here: an end within 30 s came from the broken
# connection, not from that timeout, however slow a loaded machine is.
ps_run --sync --epochs 50 --batch 64 --quiet --io-timeout 60
# Killed mid-training: once the PS says every worker is in (before it
# listens, the workers would wait out their connect timeout instead).
if ! wait_for 60 "the PS to say both workers connected" grep -q "all 2 workers connected" "$tmp/ps.out"; then
  not_ok "the PS did not say within 60 s that both workers connected: $(tail -3 "$tmp/ps.out")"
fi
kill -KILL "$ps_pid"
t0=$(date +%s.%N)
# Reaped here, where bash's "Killed" note about it can go nowhere.
{ wait "$ps_pid"; } 2>/dev/null
wait "$w0_pid"; w0=$?; wait "$w1_pid"; w1=$?
took=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")
check "workers exit non-zero when their PS is killed (exit codes $w0, $w1)" test $w0 -ne 0 -a $w1 -ne 0
check "...at once, not at their 60 s I/O timeout (took $took s)" le "$took" 30
check "...and say which PS failed" grep -qi "ps 0" "$tmp/w0.out"

# --- MNIST: >= 97.5 % test accuracy within 5 epochs, single and allreduce(2)
"$train" --epochs 5 > "$tmp/mnist1.out" 2>&1
acc=$(field "$tmp/mnist1.out" test_accuracy 2>/dev/null || echo 0)
check "single reaches $acc >= 0.975 test accuracy on MNIST in 5 epochs" ge "$acc" 0.975
check "single prints one progress line per epoch" test "$(grep -c '^epoch ' "$tmp/mnist1.out")" -eq 5
"${mpirun[@]}" "$train" --mode allreduce --epochs 5 > "$tmp/mnist2.out" 2>&1
acc=$(field "$tmp/mnist2.out" test_accuracy 2>/dev/null || echo 0)
check "allreduce(2) reaches $acc >= 0.975 test accuracy on MNIST in 5 epochs" ge "$acc" 0.975
check "allreduce prints one summary for the job" test "$(grep -c '^{"mode"' "$tmp/mnist2.out")" -eq 1

# --- resume after a checkpoint gives the loss of an uninterrupted run
# A real interruption: kill -9 once the first epoch's checkpoint is written
# (atomically: once the file exists it is whole), then the same command
# with --resume.
"$train" --epochs 2 --quiet > "$tmp/full.out" 2>&1
"$train" --epochs 2 --quiet --checkpoint "$tmp/ck" > /dev/null 2>&1 &
ck_pid=$!; pids+=("$ck_pid")
ck_until=$((SECONDS + 120))
while [ ! -s "$tmp/ck" ] && [ "$SECONDS" -lt "$ck_until" ] && kill -0 "$ck_pid" 2>/dev/null; do sleep 0.01; done
check "the first epoch's checkpoint is written (within 120 s)" test -s "$tmp/ck"
kill -KILL "$ck_pid" 2>/dev/null; wait "$ck_pid" 2>/dev/null
"$train" --epochs 2 --quiet --resume "$tmp/ck" > "$tmp/resumed.out" 2>&1
a=$(field "$tmp/full.out" final_loss 2>/dev/null || echo x); b=$(field "$tmp/resumed.out" final_loss 2>/dev/null || echo y)
check "resumed run's final loss $b equals the uninterrupted run's $a" test "$a" = "$b"
check "the resumed run did only the second epoch's steps" test "$(field "$tmp/resumed.out" steps)" -eq 468
check "no temporary checkpoint file is left behind" test -z "$(ls "$tmp" | grep 'ck.tmp' | grep -v "ck.tmp.$ck_pid")"
# --auto-resume (what muster run --max-restarts passes on a restart): from
# --checkpoint's file when there is one, from the start when there is none;
# the checkpoint's directory is made where it is written.
"$train" --epochs 2 --quiet --checkpoint "$tmp/ck" --auto-resume > "$tmp/auto.out" 2>&1
check "--auto-resume with a checkpoint resumes from it (steps $(field "$tmp/auto.out" steps), loss $(field "$tmp/auto.out" final_loss))" \
  test "$(field "$tmp/auto.out" steps)/$(field "$tmp/auto.out" final_loss)" = "468/$a"
"$train" --steps 5 --quiet --checkpoint "$tmp/new/dir/ck" --auto-resume > "$tmp/auto2.out" 2>&1
check "--auto-resume without one starts from the beginning, making the checkpoint's directory" \
  bash -c "[ \"\$(grep -o '\"steps\": [0-9]*' '$tmp/auto2.out')\" = '\"steps\": 5' ] && [ -s '$tmp/new/dir/ck' ]"
"$train" --epochs 1 --quiet --auto-resume > "$tmp/auto3.out" 2>&1; rc=$?
check "--auto-resume without --checkpoint is refused, saying so (exit $rc)" \
  bash -c "[ $rc = 2 ] && grep -q 'auto-resume needs --checkpoint' '$tmp/auto3.out'"

# --- bad data is refused with a clear error naming the file
mkdir -p "$tmp/bad"
cp "$data"/* "$tmp/bad/"
head -c 1000000 "$data/train-images-idx3-ubyte" > "$tmp/bad/train-images-idx3-ubyte"
"$train" --data "$tmp/bad" --steps 1 > "$tmp/trunc.out" 2>&1; rc=$?
check "a truncated IDX file: exit 2 (got $rc)" test $rc -eq 2
check "...saying it is truncated and naming the file" grep -q "train-images-idx3-ubyte: truncated" "$tmp/trunc.out"
cp "$data/train-images-idx3-ubyte" "$tmp/bad/"
printf '\x00\x00\x09\x03' | dd of="$tmp/bad/train-labels-idx1-ubyte" bs=1 count=4 conv=notrunc 2>/dev/null
"$train" --data "$tmp/bad" --steps 1 > "$tmp/magic.out" 2>&1; rc=$?
check "a garbled magic number: exit 2 (got $rc)" test $rc -eq 2
check "...saying what the magic should be" grep -q "train-labels-idx1-ubyte: not an IDX file" "$tmp/magic.out"
# A test set of wider images than the training set's (28x60, not 28x28):
# refused, never read past the rows the network holds.
mkdir -p "$tmp/wide"
cp "$data"/* "$tmp/wide/"
python3 - "$tmp/wide/t10k-images-idx3-ubyte" <<'PY'
import struct, sys
n = 100
open(sys.argv[1], "wb").write(struct.pack(">IIII", 0x803, n, 28, 60) + bytes(n * 28 * 60))
PY
printf '\x00\x00\x08\x01\x00\x00\x00\x64' > "$tmp/wide/t10k-labels-idx1-ubyte"
head -c 100 /dev/zero >> "$tmp/wide/t10k-labels-idx1-ubyte"
"$train" --data "$tmp/wide" --steps 1 --batch 8 > "$tmp/wide.out" 2>&1; rc=$?
check "a test set whose images differ in size from the training set's: exit 2 saying so (got $rc: $(tail -1 "$tmp/wide.out"))" \
  bash -c "[ $rc -eq 2 ] && grep -q 'must have the same image size' '$tmp/wide.out'"
# Data that a worker's account (--run-as) cannot read: the sentence names
# the file and the account.
if [ "$(id -u)" = 0 ] && getent passwd muster-worker >/dev/null; then
  mkdir -p "$tmp/private"
  cp "$data"/* "$tmp/private/"
  chmod 755 "$tmp" "$tmp/private"
  chmod 600 "$tmp/private/train-images-idx3-ubyte"
  runuser -u muster-worker -- "$train" --data "$tmp/private" --steps 1 > "$tmp/acct.out" 2>&1; rc=$?
  check "data the account cannot read: exit 2 naming the file and the account (got $rc: $(tail -1 "$tmp/acct.out"))" \
    bash -c "[ $rc -eq 2 ] && grep -q 'train-images-idx3-ubyte cannot be read by the account muster-worker' '$tmp/acct.out'"
else
  echo "# skipped: data the account cannot read: needs root and the account muster-worker (scripts/setup.sh makes it)"
fi
"$train" --data "$tmp/nowhere" --steps 1 > "$tmp/none.out" 2>&1; rc=$?
check "a missing data directory: exit 2 and a hint to run setup" \
  bash -c "[ $rc -eq 2 ] && grep -q 'scripts/setup.sh' '$tmp/none.out'"
"$train" --layers 100,10 --steps 1 > "$tmp/layers.out" 2>&1; rc=$?
check "--layers not matching the data: exit 2 naming the sizes" \
  bash -c "[ $rc -eq 2 ] && grep -q 'must have 784 units' '$tmp/layers.out'"
"$train" --batch 0 > "$tmp/batch.out" 2>&1; rc=$?
check "--batch 0: exit 2" test $rc -eq 2

# --- synthetic data learns too (the benchmarks use it)
"$train" --synthetic 6000 --epochs 2 --quiet > "$tmp/syn.out" 2>&1
acc=$(field "$tmp/syn.out" test_accuracy 2>/dev/null || echo 0)
check "synthetic data is learnable ($acc >= 0.9)" ge "$acc" 0.9

# --- CUDA lives in a plugin: the CPU paths neither load nor need it
plugin=$build/libmuster-train-cuda.so
cuda_libs='libcudart|libcublas|libcublasLt|libnccl'
if readelf -d "$train" | grep -E "NEEDED.*($cuda_libs)" > "$tmp/needed.out"; then
  not_ok "muster-train itself names no CUDA library: $(cat "$tmp/needed.out")"
else
  ok "muster-train itself names no CUDA library (readelf -d)"
fi
if [ -e "$plugin" ]; then
  check "the plugin names them" bash -c "readelf -d '$plugin' | grep -Eq 'NEEDED.*(libcudart)' && readelf -d '$plugin' | grep -Eq 'NEEDED.*(libnccl)'"
  # A machine without CUDA: every directory the CUDA libraries are found in
  # is hidden under an empty tmpfs, in a mount namespace of this test's own.
  dirs=$(ldd "$plugin" | awk -v re="$cuda_libs" '$1 ~ re && $3 ~ /^\// {print $3}' | xargs -r -n1 dirname | sort -u | tr '\n' ' ')
  # A directory that also holds what muster-train itself loads (a distro's
  # CUDA in /usr/lib/x86_64-linux-gnu) cannot be hidden without hiding that.
  shared_dir=
  for d in $dirs; do
    for lib in $(ldd "$train" | awk '$3 ~ /^\// {print $3}') /usr/lib/x86_64-linux-gnu/libopenblas.so.0; do
      [ "$(dirname "$(readlink -f "$lib")")" = "$(readlink -f "$d")" ] && shared_dir=$d
    done
  done
  if [ -z "$dirs" ]; then
    not_ok "the loader finds none of the plugin's CUDA libraries here: $(ldd "$plugin" | grep -E "$cuda_libs")"
  elif [ -n "$shared_dir" ]; then
    echo "# skipped: the CUDA libraries share $shared_dir with muster-train's own; hiding them would hide those"
  elif unshare -m --propagation private true 2>/dev/null; then
    unshare -m --propagation private bash -c '
      for d in '"$dirs"'; do mount -t tmpfs -o size=1m muster-test-no-cuda "$d" || exit 9; done
      echo mounted > "$2/nocuda-mounted"
      "$1" --steps 5 --synthetic 1000 --quiet > "$2/nocuda-cpu.out" 2>&1; echo $? > "$2/nocuda-cpu.rc"
      "$1" --device cuda --steps 1 --synthetic 1000 > "$2/nocuda-gpu.out" 2>&1; echo $? > "$2/nocuda-gpu.rc"
    ' _ "$train" "$tmp"
    if [ ! -e "$tmp/nocuda-mounted" ]; then
      echo "# skipped: a tmpfs over $dirs could not be mounted in a mount namespace here"
    else
      check "without CUDA libraries (hidden: $dirs) the CPU path runs" \
        bash -c "[ \"\$(cat '$tmp/nocuda-cpu.rc' 2>/dev/null)\" = 0 ] && tail -1 '$tmp/nocuda-cpu.out' | grep -q '\"steps\": 5'"
      check "...and --device cuda exits 2 naming the missing library ($(cat "$tmp/nocuda-gpu.out" 2>/dev/null))" \
        bash -c "[ \"\$(cat '$tmp/nocuda-gpu.rc' 2>/dev/null)\" = 2 ] && grep -Eq 'needs lib(cudart|cublas|cublasLt|nccl)[^ ]*, which this machine.s loader cannot find' '$tmp/nocuda-gpu.out'"
    fi
  else
    echo "# skipped: hiding the CUDA libraries needs a mount namespace (unshare -m), which this user may not make"
  fi
else
  "$train" --device cuda --steps 1 --synthetic 1000 > "$tmp/nocuda-gpu.out" 2>&1; rc=$?
  check "built without the CUDA plugin, --device cuda exits 2 and says so" \
    bash -c "[ $rc -eq 2 ] && grep -q 'built without CUDA' '$tmp/nocuda-gpu.out'"
fi

# --- CUDA: where no GPU is present, a clear refusal (the GPU checks skip)
"$train" --device cuda --steps 1 > "$tmp/cuda.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--device cuda: no CUDA device\|built without CUDA\|--device cuda needs" "$tmp/cuda.out"; then
  ok "--device cuda without a GPU says so in one sentence and exits 2 ($(head -1 "$tmp/cuda.out"))"
  check "...in one line" test "$(wc -l < "$tmp/cuda.out")" -eq 1
  echo "# skipped: CUDA results against CPU (relative error <= 1e-3) need a GPU, and none is present here"
elif [ $rc -eq 0 ]; then
  "$train" --device cuda --steps 50 --batch 64 --quiet --dump-params "$tmp/cuda.bin" > /dev/null 2>&1
  d=$(maxdiff "$tmp/single.bin" "$tmp/cuda.bin")
  check "CUDA matches the CPU after 50 steps (max abs difference $d <= 1e-3)" le "$d" 1e-3
else
  not_ok "--device cuda: exit $rc: $(tail -2 "$tmp/cuda.out")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

# tests/lib/wait.sh: sourced by the shell tests.
#
# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 0.1 s until it
# succeeds; after SECONDS, says what it waited for and fails. Tests wait for
# the event they need this way, never for a fixed time.
wait_for() {
  local secs=$1 what=$2 end
  shift 2
  end=$(($(date +%s%N) + secs * 1000000000))
  until "$@"; do
    if [ "$(date +%s%N)" -ge "$end" ]; then
      echo "# gave up after $secs s waiting for $what"
      return 1
    fi
    sleep 0.1
  done
}

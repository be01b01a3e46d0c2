#!/usr/bin/env bash
# A throw-away Spark standalone cluster (one master, one worker) on loopback, started from
# the pyspark wheel's own scripts and jars: no Spark download and no Maven needed.
#
#   scripts/standalone_cluster.sh start    # starts it in the background, prints the master URL
#   scripts/standalone_cluster.sh status   # prints the master URL if it is up (exit 1 if not)
#   scripts/standalone_cluster.sh stop     # stops worker (and its executors) and master
#
# Environment (all optional):
#   CLUSTER_DIR     logs, pid files, work and scratch dirs   (default /tmp/bsr-cluster)
#   PYTHON          Python whose pyspark to use and that executors run user code with
#                   (default: the repository's .venv/bin/python, else python3 on PATH)
#   SPARK_HOME      default: the directory of $PYTHON's pyspark package
#   MASTER_PORT, MASTER_WEBUI_PORT, WORKER_PORT, WORKER_WEBUI_PORT   default: free ports
#   WORKER_CORES (2), WORKER_MEMORY (2g), SPARK_DAEMON_MEMORY (512m), START_TIMEOUT (120 s)
#   OWNER_PID       if set, a watchdog stops the cluster once that process has exited (so
#                   a test run that is killed outright does not leave the cluster behind)
#   SPARK_DAEMON_JAVA_OPTS  default "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" (lean JVMs for
#                   a small test machine; set it to "" for the JVM's defaults)
#
# Everything binds to 127.0.0.1 only (SPARK_LOCAL_IP and --host). Drivers that use this
# cluster should also set SPARK_LOCAL_IP=127.0.0.1 and PYSPARK_PYTHON=$PYTHON: executors
# start their Python workers with the interpreter the driver names.
set -euo pipefail

HOST=127.0.0.1
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/bsr-cluster}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    PYTHON="$REPO_ROOT/.venv/bin/python"
  else
    PYTHON=$(command -v python3)
  fi
fi
START_TIMEOUT=${START_TIMEOUT:-120}

log() { echo "standalone_cluster: $*" >&2; }

spark_home() {
  if [[ -z "${SPARK_HOME:-}" ]]; then
    SPARK_HOME=$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
  fi
  export SPARK_HOME
}

free_port() {
  "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# pid_alive PIDFILE PATTERN: the pid in PIDFILE is running and its command line has PATTERN
# (so a recycled pid is never mistaken for ours).
pid_alive() {
  local pidfile=$1 pattern=$2 pid
  [[ -f "$pidfile" ]] || return 1
  pid=$(cat "$pidfile")
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$pattern"
}

# stop_daemon NAME PATTERN: SIGTERM, then SIGKILL after 20 s.
stop_daemon() {
  local name=$1 pattern=$2 pidfile="$CLUSTER_DIR/$1.pid" pid
  if ! pid_alive "$pidfile" "$pattern"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(cat "$pidfile")
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do
    pid_alive "$pidfile" "$pattern" || break
    sleep 0.5
  done
  if pid_alive "$pidfile" "$pattern"; then
    log "$name did not stop on SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# alive_workers WEBUI_PORT: the number of ALIVE workers the master's JSON reports.
alive_workers() {
  "$PYTHON" - "$1" <<'EOF' 2>/dev/null || echo 0
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=5) as response:
    state = json.load(response)
print(sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE"))
EOF
}

# Runs "$@" with the daemons' environment; exec, so that `daemon_env ... &` leaves $! the
# daemon's own pid (spark-class in turn execs java).
daemon_env() {
  exec env \
    SPARK_HOME="$SPARK_HOME" \
    SPARK_LOCAL_IP=$HOST \
    SPARK_LOCAL_HOSTNAME=$HOST \
    SPARK_LOCAL_DIRS="$CLUSTER_DIR/local" \
    SPARK_WORKER_DIR="$CLUSTER_DIR/work" \
    SPARK_CONF_DIR="$CLUSTER_DIR/conf" \
    SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}" \
    SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}" \
    PYSPARK_PYTHON="$PYTHON" \
    PYSPARK_DRIVER_PYTHON="$PYTHON" \
    "$@"
}

cmd_status() {
  if pid_alive "$CLUSTER_DIR/master.pid" deploy.master.Master \
      && pid_alive "$CLUSTER_DIR/worker.pid" deploy.worker.Worker \
      && [[ -f "$CLUSTER_DIR/cluster.env" ]]; then
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/cluster.env"
    log "running: master $MASTER_URL (web UI $MASTER_WEBUI_URL), $(alive_workers "$MASTER_WEBUI_PORT") alive worker(s)"
    echo "$MASTER_URL"
    return 0
  fi
  log "not running (CLUSTER_DIR=$CLUSTER_DIR)"
  return 1
}

cmd_stop() {
  if pid_alive "$CLUSTER_DIR/watchdog.pid" "standalone_cluster.sh watch"; then
    kill -TERM "$(cat "$CLUSTER_DIR/watchdog.pid")" 2>/dev/null || true
  fi
  rm -f "$CLUSTER_DIR/watchdog.pid"
  stop_daemon worker deploy.worker.Worker
  stop_daemon master deploy.master.Master
  rm -f "$CLUSTER_DIR/cluster.env" "$CLUSTER_DIR/master_url"
}

cmd_start() {
  if cmd_status >/dev/null 2>&1; then
    log "already running"
    cmd_status
    return 0
  fi
  cmd_stop  # leftovers of a half-started cluster
  spark_home
  if [[ -n "${JAVA_HOME:-}" ]]; then
    if [[ ! -x "$JAVA_HOME/bin/java" ]]; then
      log "JAVA_HOME=$JAVA_HOME has no bin/java"
      return 2
    fi
  elif ! command -v java >/dev/null 2>&1; then
    log "no Java found (set JAVA_HOME or put java on PATH)"
    return 2
  fi
  mkdir -p "$CLUSTER_DIR"/{local,work,conf}
  local master_port=${MASTER_PORT:-$(free_port)}
  local master_webui=${MASTER_WEBUI_PORT:-$(free_port)}
  local worker_port=${WORKER_PORT:-$(free_port)}
  local worker_webui=${WORKER_WEBUI_PORT:-$(free_port)}
  local master_url="spark://$HOST:$master_port"
  # Spark's default log4j2 configuration logs INFO to stderr; it goes to the log files.
  cat >"$CLUSTER_DIR/conf/spark-defaults.conf" <<EOF
spark.master.rest.enabled false
spark.ui.reverseProxy false
EOF

  log "starting master $master_url (web UI http://$HOST:$master_webui, logs in $CLUSTER_DIR)"
  daemon_env nohup "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host $HOST --port "$master_port" --webui-port "$master_webui" \
    </dev/null >"$CLUSTER_DIR/master.log" 2>&1 &
  echo $! >"$CLUSTER_DIR/master.pid"

  log "starting worker (${WORKER_CORES:-2} cores, ${WORKER_MEMORY:-2g})"
  daemon_env nohup "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    --host $HOST --port "$worker_port" --webui-port "$worker_webui" \
    --cores "${WORKER_CORES:-2}" --memory "${WORKER_MEMORY:-2g}" \
    --work-dir "$CLUSTER_DIR/work" "$master_url" \
    </dev/null >"$CLUSTER_DIR/worker.log" 2>&1 &
  echo $! >"$CLUSTER_DIR/worker.pid"

  local deadline=$((SECONDS + START_TIMEOUT))
  until [[ "$(alive_workers "$master_webui")" -ge 1 ]]; do
    if ! pid_alive "$CLUSTER_DIR/master.pid" deploy.master.Master \
        || ! pid_alive "$CLUSTER_DIR/worker.pid" deploy.worker.Worker; then
      log "a daemon exited during start-up; see $CLUSTER_DIR/master.log and worker.log"
      tail -n 20 "$CLUSTER_DIR/master.log" "$CLUSTER_DIR/worker.log" >&2 || true
      cmd_stop
      return 1
    fi
    if ((SECONDS >= deadline)); then
      log "no worker registered within ${START_TIMEOUT}s; see $CLUSTER_DIR/*.log"
      tail -n 20 "$CLUSTER_DIR/master.log" "$CLUSTER_DIR/worker.log" >&2 || true
      cmd_stop
      return 1
    fi
    sleep 0.5
  done
  cat >"$CLUSTER_DIR/cluster.env" <<EOF
MASTER_URL=$master_url
MASTER_PORT=$master_port
MASTER_WEBUI_PORT=$master_webui
MASTER_WEBUI_URL=http://$HOST:$master_webui
WORKER_WEBUI_PORT=$worker_webui
SPARK_HOME=$SPARK_HOME
PYTHON=$PYTHON
EOF
  echo "$master_url" >"$CLUSTER_DIR/master_url"
  if [[ -n "${OWNER_PID:-}" ]]; then
    nohup bash "${BASH_SOURCE[0]}" watch "$OWNER_PID" </dev/null >>"$CLUSTER_DIR/watchdog.log" 2>&1 &
    echo $! >"$CLUSTER_DIR/watchdog.pid"
  fi
  log "up: worker registered with $master_url"
  echo "$master_url"
}

# watch PID: stops the cluster once PID has exited (started by `start` when OWNER_PID is set).
cmd_watch() {
  local owner=$1
  while kill -0 "$owner" 2>/dev/null; do
    sleep 2
  done
  log "owner process $owner exited; stopping the cluster"
  rm -f "$CLUSTER_DIR/watchdog.pid"  # do not let cmd_stop signal this very process
  cmd_stop
}

case "${1:-}" in
  start) cmd_start ;;
  watch) cmd_watch "${2:?watch needs a pid}" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 start|stop|status   (CLUSTER_DIR=${CLUSTER_DIR})" >&2
    exit 64
    ;;
esac

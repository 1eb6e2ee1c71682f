#!/usr/bin/env bash
# A real Slurm on this machine: munged, slurmctld and slurmd configured in a
# temporary directory (one node, this host), then the shortened quickstart
# submitted with `sbatch examples/slurm/quickstart.sbatch` and waited for:
# the batch job must succeed, the troupe job in it too, with its metrics
# written and its worker run by the node agent srun started; no daemon or
# worker is left afterwards. Skips (77) without root or Slurm.
# Usage: sbatch_quickstart_test.sh TROUPE_BINARY SOURCE_DIR
set -euo pipefail
troupe=$1
src=$2

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "a private Slurm needs root (run the tests as root to cover it)"
for tool in munged mungekey slurmctld slurmd sbatch sinfo srun; do
  command -v "$tool" >/dev/null || skip "$tool is missing (scripts/setup.sh installs slurm-wlm and munge)"
done

tmp=$(mktemp -d /tmp/troupe-slurm-test.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
dump() {
  for f in "$tmp"/log/* "$tmp"/submit/*.out "$tmp"/submit/troupe-slurm-*/{controller,agents}.log; do
    [ -f "$f" ] && { echo "---- $f"; tail -n 30 "$f"; }
  done
}

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# munge, with its own key and socket.
mkdir -m 700 "$tmp/munge"
mkdir -m 755 "$tmp/log" "$tmp/state" "$tmp/spool" "$tmp/submit"
mungekey --create --keyfile "$tmp/munge/munge.key" >/dev/null
chmod 400 "$tmp/munge/munge.key"
chmod 711 "$tmp/munge"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/seed" \
  >"$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$tmp/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$tmp/munge/munge.sock" ] || { dump; fail "munged did not start"; }

# One node: this host, all its cores and most of its memory.
node=$(hostname)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
export SLURM_CONF="$tmp/slurm.conf"
cat >"$SLURM_CONF" <<CONF
ClusterName=troupetest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PlugStackConfig=/dev/null
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  [ "$(sinfo -h -o %t 2>/dev/null)" = "idle" ] && break
  sleep 0.2
done
[ "$(sinfo -h -o %t 2>/dev/null)" = "idle" ] || { dump; fail "the Slurm node did not become idle"; }

# The shortened quickstart, colocated: its worker is started by the agent.
cd "$tmp/submit"
cp -r "$src/configs" .
start=$(date +%s)
set +e
timeout 540 sbatch --wait --output=quickstart.out --export="ALL,TROUPE=$troupe" \
  "$src/examples/slurm/quickstart.sbatch" configs/colocated.yaml \
  --set sft.steps=4 --set rm.steps=4 --set rl.iterations=3 \
  --set sft.eval_every=0 --set rm.eval_every=0 --set rl.eval_every=2 >sbatch.out 2>&1
rc=$?
set -e
echo "sbatch --wait: exit $rc after $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] || { cat sbatch.out; dump; fail "the batch job failed ($rc)"; }
grep -q "succeeded" quickstart.out || { dump; fail "the troupe job did not succeed"; }

# Its metrics: every stage, the held-out score of the RL stage.
metrics=$(ls troupe-slurm-*/jobs/*/runs/quickstart-colocated/metrics.jsonl)
grep -q '"stage":"sft"' "$metrics" || fail "no sft metrics in $metrics"
grep -q '"stage":"rm"' "$metrics" || fail "no rm metrics in $metrics"
rl=$(grep -c '"stage":"rl"' "$metrics" || true)
[ "$rl" -ge 3 ] || fail "$rl rl metrics lines in $metrics"
grep -q '"val/score/mean"' "$metrics" || fail "no held-out score in $metrics"
# The worker ran on the Slurm node, started by its agent.
events=$(dirname "$metrics")/events.jsonl
grep -q "\"node\":\"$node\"" "$events" || { dump; fail "no role ran on node $node"; }
grep -q "started worker 0 of job" troupe-slurm-*/agents.log || { dump; fail "the agent started no worker"; }
# The agent was stopped, not killed: it left.
grep -q "troupe node: left" troupe-slurm-*/agents.log || { dump; fail "the agent did not leave"; }
# Nothing of the job is left: no troupe process of this test (named by its
# directory, or working in it, as the workers do) still runs. Other tests'
# processes may run beside it.
left=()
for pid in $(pgrep -f "$troupe" || true); do
  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
  cmd=$( (tr '\0' ' ' <"/proc/$pid/cmdline") 2>/dev/null || true)
  case "$cmd" in "$troupe "*) ;; *) continue ;; esac # troupe itself, not a script naming it
  case "$cwd $cmd" in *"$tmp"*) left+=("$pid: $cmd") ;; esac
done
[ ${#left[@]} -eq 0 ] || { printf '%s\n' "${left[@]}" >&2; fail "troupe processes left after the batch job"; }
echo "PASS: sbatch ran the quickstart through troupe slurm run ($rl rl lines)"

#!/usr/bin/env bash
# `make bench`: every benchmark in one run on this machine, then the table and docs/benchmarks.md, whose
# Targets table holds the acceptance figures of issue 17 ("Enqueue at the speed of SQLite").
# Peers and agentpost side by side (run_peers.py), draining with 20 messages waiting per agent vs plain
# claim-all (claim_batch.py), enqueue with 256 agents vs 8 (enqueue_agents.py), pickup latency and idle
# cost (latency.py), instructions per message under callgrind (instructions.py), growth with a million retained messages (growth.py), agent parallelism through the
# real processor (parallel.py).
# About 12-14 minutes on 2 cores. BENCH_QUICK=1 runs a small version (minutes) that still writes the doc.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
bash "$here/setup_venv.sh"
py="$here/.venv/bin/python"
out="$(mktemp -d -t agentpost-bench-results-XXXXXX)"
loads="$out/loads.tsv"
t0=$(date +%s)
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

sample_load() { printf '%s\t%s\n' "$1" "$(cut -d' ' -f1 /proc/loadavg)" >>"$loads"; }

if [[ "${BENCH_QUICK:-}" == "1" ]]; then
  peers_args=(--n 5000 --variant-n 2000 --runs 1 --kills 5)
  growth_args=(--n 5000 --runs 1 --retained 200000)
  latency_args=(--n 400)
  claim_args=(--rounds 10 --runs 3)
  agents_args=(--n 1000 --runs 3)
else
  peers_args=(--n 20000 --variant-n 5000 --runs 3 --kills 20)
  growth_args=(--runs 3 --n 10000)
  latency_args=(--n 1000)
  claim_args=(--rounds 50 --runs 3)
  agents_args=(--n 5000 --runs 3)
fi

sample_load start
echo "bench: throughput and safety, peers and agentpost (run_peers.py ${peers_args[*]})"
"$py" "$here/run_peers.py" "${peers_args[@]}" \
  --add systems_agentpost:AgentpostSqlite --add systems_agentpost:AgentpostPostgres \
  --json "$out/peers.json" || echo "bench: run_peers reported errors (see the table)"
sample_load throughput
echo "bench: draining with 20 messages waiting per agent vs plain claim-all (claim_batch.py ${claim_args[*]})"
# A failed check here leaves its targets NOT MEASURED in the report rather than losing the whole run.
"$py" "$here/claim_batch.py" "${claim_args[@]}" --json "$out/claim_batch.json" || echo "bench: claim_batch failed"
sample_load claim-batch
echo "bench: enqueue with 256 agents vs 8 (enqueue_agents.py ${agents_args[*]})"
"$py" "$here/enqueue_agents.py" "${agents_args[@]}" --json "$out/enqueue_agents.json" || echo "bench: enqueue_agents failed"
sample_load enqueue-agents
echo "bench: instructions per message under callgrind, agentpost vs plain sqlite3 (instructions.py)"
"$py" "$here/instructions.py" --json "$out/instructions.json" || echo "bench: instructions failed"
sample_load instructions
echo "bench: pickup latency at 200 messages/s and idle cost (latency.py)"
"$py" "$here/latency.py" "${latency_args[@]}" --wake-ms 20 --json "$out/latency.json"
sample_load latency
echo "bench: growth with retained completed messages (growth.py)"
"$py" "$here/growth.py" "${growth_args[@]}" --json "$out/growth.json"
sample_load growth
echo "bench: agent parallelism through the real processor (parallel.py)"
"$py" "$here/parallel.py" --k 1,2,4 --cap 4 --json "$out/parallel.json"
sample_load parallel

"$py" - "$out" "$t0" "$started" <<'EOF'
import json, subprocess, sys, time
from pathlib import Path
out, t0, started = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
loads = [{"step": s, "load1": float(v)} for s, v in (l.split("\t") for l in (out / "loads.tsv").read_text().split("\n") if l)]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
import os
cmd = os.environ.get("BENCH_COMMAND", "make bench") + (" (BENCH_QUICK=1)" if os.environ.get("BENCH_QUICK") == "1" else "")
meta = {"command": cmd, "started": started, "wall_s": time.time() - t0, "loads": loads, "commit": commit}
(out / "meta.json").write_text(json.dumps(meta, indent=2))
EOF
"$py" "$here/report.py" --results "$out" --out "$root/docs/benchmarks.md"
echo "bench: raw results kept in $out"

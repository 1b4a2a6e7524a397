#!/bin/bash
# moe plan's validation against this machine's noise: ROUNDS rounds, each one whole
# scripts/plan_validate.sh (calibrate, then measure every variant, then predict it from that
# round's own rates) and, with RATE, one scripts/plan_cluster.sh at that link rate (2 hosts x 2
# ranks; root) in the same round, so each prediction is compared with the measurement of its own
# round. Each script runs under `flock -x $LOCK` (default /tmp/moe_quiet.lock; LOCK= runs without),
# so nothing else measured or built meanwhile, and the lock is let go between them.
# Prints, per configuration, predicted / measured in every round, the rounds within 20%, and the
# ratio of the medians over the rounds; then how many rows were within 20% in each round. Twice:
# predicted from the round's calibrated rates, and at the speed the paired speed probe saw during
# each measurement (`moe bench --dist --speed-probe`, `moe plan --probe-ms`).
# Usage: [RATES_1X="unshaped 400mbit 1gbit"] [RATES_4X1="unshaped 1gbit"] scripts/plan_rounds.sh OUT_DIR ROUNDS [ITERS] [RATE]
# RATES_1X: each round also runs `RPH=1 scripts/plan_cluster.sh` (2 hosts x 1 rank, item 5's
# layout) at those link settings; RATES_4X1 the same with 4 hosts x 1 rank (`HOSTS=4`: the 4 hosts
# share the machine's cores).
# SUMMARY_ONLY=1: only the tables, from OUT_DIR/r1 .. rROUNDS as they are (e.g. links to the rounds
# of several runs).
# REPLAY=1: measure nothing; predict every round's measurements again from its own rates with this
# build's model (SKIP_MEASURED=1 of both scripts: a model change compared on rounds measured
# before), then the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1
ROUNDS=$2
ITERS=${3:-5}
RATE=${4:-}
LOCK=${LOCK-/tmp/moe_quiet.lock}
locked() { if [[ -n $LOCK ]]; then flock -x "$LOCK" "$@"; else "$@"; fi; }
mkdir -p "$OUT"
for ((k = 1; k <= ROUNDS; ++k)); do
  [[ ${SUMMARY_ONLY:-0} == 1 ]] && break
  R=$OUT/r$k
  if [[ ${REPLAY:-0} == 1 ]]; then
    SKIP_MEASURED=1 scripts/plan_validate.sh "$R" "$ITERS" >"$R/replay.log" 2>&1 || echo "round $k: replay failed" | tee -a "$OUT/rounds.txt"
    if [[ -n ${RATES_1X:-} ]]; then
      # shellcheck disable=SC2086
      SKIP_MEASURED=1 RPH=1 scripts/plan_cluster.sh "$R" $RATES_1X >"$R/replay_cluster1x.log" 2>&1 ||
        echo "round $k: cluster (RPH=1) replay failed" | tee -a "$OUT/rounds.txt"
    fi
    if [[ -n ${RATES_4X1:-} ]]; then
      # shellcheck disable=SC2086
      SKIP_MEASURED=1 RPH=1 HOSTS=4 scripts/plan_cluster.sh "$R" $RATES_4X1 >"$R/replay_cluster4x1.log" 2>&1 ||
        echo "round $k: cluster (4 hosts x 1 rank) replay failed" | tee -a "$OUT/rounds.txt"
    fi
    if [[ -n $RATE ]]; then
      SKIP_MEASURED=1 scripts/plan_cluster.sh "$R" "$RATE" >"$R/replay_cluster.log" 2>&1 ||
        echo "round $k: cluster replay failed" | tee -a "$OUT/rounds.txt"
    fi
    continue
  fi
  mkdir -p "$R"
  echo "round $k: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/rounds.txt"
  locked scripts/plan_validate.sh "$R" "$ITERS" >"$R/validate.log" 2>&1 || echo "round $k: plan_validate.sh failed" | tee -a "$OUT/rounds.txt"
  if [[ -n ${RATES_1X:-} ]]; then
    # shellcheck disable=SC2086
    locked env RPH=1 scripts/plan_cluster.sh "$R" $RATES_1X >"$R/cluster1x.log" 2>&1 ||
      echo "round $k: plan_cluster.sh (RPH=1) failed" | tee -a "$OUT/rounds.txt"
  fi
  if [[ -n ${RATES_4X1:-} ]]; then
    # shellcheck disable=SC2086
    locked env RPH=1 HOSTS=4 scripts/plan_cluster.sh "$R" $RATES_4X1 >"$R/cluster4x1.log" 2>&1 ||
      echo "round $k: plan_cluster.sh (4 hosts x 1 rank) failed" | tee -a "$OUT/rounds.txt"
  fi
  if [[ -n $RATE ]]; then
    locked scripts/plan_cluster.sh "$R" "$RATE" >"$R/cluster.log" 2>&1 || echo "round $k: plan_cluster.sh failed" | tee -a "$OUT/rounds.txt"
  fi
  echo "round $k done: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/rounds.txt"
done
python3 - "$OUT" "$ROUNDS" "$RATE" "${RATES_4X1:-}" ${RATES_1X:-} <<'PY'
import json, os, statistics, sys
out, rounds, rate, rates_4x1, rates_1x = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(), sys.argv[5:]
runs = [("np1_t1.json", "1 process, 1 thread"), ("np1_t1_T1024.json", "1 process, 1 thread, T=1024"),
        ("np1_pool.json", "1 process, full pool"), ("np2.json", "mpirun -np 2"), ("np4.json", "mpirun -np 4")]
def load(path):
    return json.load(open(path)) if os.path.exists(path) else None
ok = lambda q: abs(q - 1) <= 0.2
group = lambda key: "across hosts" if " hosts x " in key[0] else "one host"

# prefix "p": predicted from the round's calibrated rates; "q": at the speed the paired probe saw
# during the measurement (moe plan --probe-ms; rounds from before the probe have no q files).
def table(prefix, title):
    rows = {}  # (label, variant) -> {round: (measured ms, predicted ms)}
    order = []
    for k in range(1, rounds + 1):
        r = os.path.join(out, "r%d" % k)
        sets = [(tag, label, "%s_%s_%%s.json" % (prefix, tag)) for tag, label in runs]
        for r1 in rates_1x:
            sets.append(("cluster_1x_%s.json" % r1, "2 hosts x 1 rank, %s" % r1, "%s_cluster_1x_%s_%%s.json" % (prefix, r1)))
        for r4 in rates_4x1:
            sets.append(("cluster_4x1_%s.json" % r4, "4 hosts x 1 rank, %s" % r4, "%s_cluster_4x1_%s_%%s.json" % (prefix, r4)))
        if rate:
            sets.append(("cluster_%s.json" % rate, "2 hosts x 2 ranks, %s" % rate, "%s_cluster_%s_%%s.json" % (prefix, rate)))
        for tag, label, pred in sets:
            m = load(os.path.join(r, "m_" + tag))
            if not m:
                continue
            for x in m["dist_results"]:
                p = load(os.path.join(r, pred % x["variant"]))
                if not p:
                    continue
                key = (label, x["variant"])
                if key not in rows:
                    rows[key] = {}
                    order.append(key)
                rows[key][k] = (x["median_ms"], p["ranked"][0]["step_ms"])
    if not rows:
        return
    print(title)
    print()
    print("| run | variant | " + " | ".join("round %d: measured ms, predicted / measured" % k for k in range(1, rounds + 1)) +
          " | rounds within 20% | median measured ms | median predicted ms | ratio of medians |")
    print("|---|---|" + "---|" * rounds + "---|---|---|---|")
    per_round = {(k, g): [0, 0] for k in range(1, rounds + 1) for g in ("one host", "across hosts")}
    over = {g: [0, 0] for g in ("one host", "across hosts")}
    for key in order:
        cells, within = [], 0
        for k in range(1, rounds + 1):
            if k not in rows[key]:
                cells.append("-")
                continue
            m, p = rows[key][k]
            q = p / m
            within += ok(q)
            per_round[(k, group(key))][0] += ok(q)
            per_round[(k, group(key))][1] += 1
            cells.append("%.1f, %.2f%s" % (m, q, "" if ok(q) else " **off**"))
        mm = statistics.median(v[0] for v in rows[key].values())
        pm = statistics.median(v[1] for v in rows[key].values())
        over[group(key)][0] += ok(pm / mm)
        over[group(key)][1] += 1
        print("| %s | %s | %s | %d of %d | %.1f | %.1f | %.2f%s |" % (key[0], key[1], " | ".join(cells), within,
              len(rows[key]), mm, pm, pm / mm, "" if ok(pm / mm) else " **off**"))
    print()
    for g in ("one host", "across hosts"):
        if not over[g][1]:
            continue
        for k in range(1, rounds + 1):
            print("%s, round %d: %d of %d within 20%%" % (g, k, per_round[(k, g)][0], per_round[(k, g)][1]))
        print("%s, ratio of the medians over the rounds: %d of %d within 20%%" % (g, over[g][0], over[g][1]))
    print()

table("p", "Predicted from each round's calibrated rates:")
table("q", "Predicted at the speed the paired probe saw during each measurement (moe plan --probe-ms):")
PY

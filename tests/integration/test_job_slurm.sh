#!/usr/bin/env bash
# A job launched by Slurm for real: scripts/slurm-local.sh configures Debian's
# slurm-wlm (with munge) as a one-node cluster on this machine, `sbatch --wait`
# runs scripts/slurm-job.sh, which starts 2 ferry-ps as one job step and 3
# ferry-trainer ranks as another, every rank taking its rank and the world size from
# Slurm's environment; the job must train to the end with every rank logging the
# same (bsp) train loss at each of the 15 steps (full precision, from each rank's
# metrics file) and the same validation loss. Every rank's exit status reaches the
# test through sbatch --wait (the job fails if a rank does); the two ferry-ps are
# ended by slurm-job.sh cancelling their job step (Slurm kills them), so theirs says
# nothing and is not checked. The trainer is reached through a small wrapper in
# $TMP/bin (slurm-job.sh's FERRY_BIN) that adds a metrics file per rank. Then an
# elastic job (FERRY_ELASTIC=1:2): sbatch starts the servers and one trainer, and a
# second srun step, started from outside into the running allocation, joins it; both
# trainers must log the same loss at every step they share, the joiner must have been
# admitted mid-run, and the job must end well. Traffic stays on 127.0.0.1. The cluster
# is stopped and removed afterwards. Needs root and
# slurm-wlm (scripts/test.sh installs it; skipped, saying so, without it).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || { echo "SKIP: configuring Slurm needs root"; exit 77; }
command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    { echo "SKIP: slurm-wlm and munge are not installed (scripts/deps.sh slurm-wlm munge)"; exit 77; }
pgrep -r R,S,D -x slurmctld >/dev/null && { echo "SKIP: a slurmctld already runs here"; exit 77; }

SL="$FERRY_SRC/scripts/slurm-local.sh"
bash "$SL" start >"$TMP/slurm-start.log" 2>&1 || fail "slurm-local.sh start: $(cat "$TMP/slurm-start.log")"
trap 'bash "$SL" stop >/dev/null 2>&1 || true; cleanup' EXIT
ok "one-node Slurm cluster up: $(sinfo -h -o '%P %D %T' | head -1)"

# Whatever the build directory holds (the daemons under sanitizers too); the trainer
# through its wrapper.
mkdir -p "$TMP/bin"
cat >"$TMP/bin/ferry-trainer" <<WRAP
#!/usr/bin/env bash
exec "$FERRY_BIN/worker/ferry-trainer" "\$@" --metrics-out "$TMP/m\$SLURM_PROCID.jsonl"
WRAP
chmod +x "$TMP/bin/ferry-trainer"
ln -s "$FERRY_BIN/server/ferry-ps" "$TMP/bin/ferry-ps"
cd "$TMP"
FERRY_BIN=$TMP/bin FERRY_HOST=127.0.0.1 FERRY_PORT=$((20000 + RANDOM % 20000)) \
    FERRY_PROGRESS=plain timeout 300 sbatch --wait --ntasks=3 --output="$TMP/slurm-%j.out" \
    "$FERRY_SRC/scripts/slurm-job.sh" --data "$FERRY_SRC/data/ptb" --train-tokens 45000 \
    --eval-tokens 2000 --epochs 1 --batch-size 21 --max-steps 15 --log-interval 1 \
    >"$TMP/sbatch.log" 2>&1 || fail "sbatch: $(cat "$TMP/sbatch.log"; tail -20 "$TMP"/slurm-*.out)"
out=$(ls "$TMP"/slurm-*.out)
for r in 0 1 2; do
    grep -q "rank $r of 3 (rank $r from SLURM_PROCID, world 3 from SLURM_NTASKS)" "$out" ||
        fail "rank $r did not take its rank from Slurm: $(grep "job '" "$out" | head)"
done
[ "$(grep -c "ferry-trainer: done: 15 steps in" "$out")" -eq 3 ] || fail "not every rank finished: $(tail -20 "$out")"
[ "$(grep -c "epoch 1 valid" "$out")" -eq 3 ] &&
    [ "$(grep "epoch 1 valid" "$out" | sed 's/.*valid: //; s/ (.*//' | sort -u | wc -l)" -eq 1 ] ||
    fail "the ranks disagree on the validation loss: $(grep "epoch 1 valid" "$out")"
for r in 1 2; do
    same_listing "rank $r's train losses against rank 0's" "$(train_losses "$TMP/m$r.jsonl")" \
        "$(train_losses "$TMP/m0.jsonl")" 15
done
ok "sbatch ran 2 ferry-ps and 3 ranks (ranks from Slurm), all 15 steps with the same train loss on every rank ($(train_losses "$TMP/m0.jsonl" | tail -1) at step 15), one validation loss"

# An elastic job, and a second srun step that joins it while it runs. Metrics files are
# named by step (both trainers are task 0 of their step).
mkdir -p "$TMP/ebin"
cat >"$TMP/ebin/ferry-trainer" <<WRAP
#!/usr/bin/env bash
exec "$FERRY_BIN/worker/ferry-trainer" "\$@" --metrics-out "$TMP/e\$SLURM_STEP_ID.jsonl"
WRAP
chmod +x "$TMP/ebin/ferry-trainer"
ln -s "$FERRY_BIN/server/ferry-ps" "$TMP/ebin/ferry-ps"
EPORT=$((20000 + RANDOM % 20000))
EARGS=(--data "$FERRY_SRC/data/ptb" --train-tokens 60000 --eval-tokens 2000 --epochs 1
    --batch-size 4 --emsize 32 --nhid 32 --bptt 10 --lr 0.1 --max-steps 600 --log-interval 1)
jid=$(FERRY_BIN=$TMP/ebin FERRY_HOST=127.0.0.1 FERRY_PORT=$EPORT FERRY_ELASTIC=1:2 \
    FERRY_TRAINERS=1 FERRY_PROGRESS=plain sbatch --parsable --ntasks=2 --output="$TMP/elastic-%j.out" \
    "$FERRY_SRC/scripts/slurm-job.sh" "${EARGS[@]}") || fail "sbatch of the elastic job"
first_trained() { grep -q '"step":20,' "$TMP"/e*.jsonl 2>/dev/null; }
wait_until "the elastic job's first trainer to reach step 20" 120 first_trained
timeout 300 srun --jobid="$jid" --overlap --ntasks=1 "$TMP/ebin/ferry-trainer" \
    --ps "127.0.0.1:$EPORT,127.0.0.1:$((EPORT + 1))" --job "slurm-$jid" --elastic 1:2 \
    "${EARGS[@]}" >"$TMP/joiner.log" 2>&1 || fail "the joining srun step: $(tail -5 "$TMP/joiner.log")"
job_done() { ! squeue -h -j "$jid" 2>/dev/null | grep -q .; }
wait_until "the elastic Slurm job $jid to end" 300 job_done
[ "$(grep -c "ferry-trainer: done: 600 steps in" "$TMP/elastic-$jid.out")" -eq 1 ] ||
    fail "the elastic job's trainer did not complete: $(tail -5 "$TMP/elastic-$jid.out")"
grep -q "elastic: admitted in .* at step [1-9]" "$TMP/joiner.log" ||
    fail "the srun step was not admitted mid-run: $(grep elastic "$TMP/joiner.log" | head -3)"
python3 - "$TMP" <<'EOF' || fail "the two trainers of the elastic job disagree"
import glob, json, sys
runs = []
for f in sorted(glob.glob(sys.argv[1] + "/e*.jsonl")):
    runs.append({e["step"]: e["loss"] for e in map(json.loads, open(f)) if e["event"] == "train"})
if len(runs) != 2:
    sys.exit(f"{len(runs)} metrics files, want 2 (the batch step's trainer and the joiner)")
both = sorted(set(runs[0]) & set(runs[1]))
if len(both) < 10 or any(runs[0][s] != runs[1][s] for s in both):
    sys.exit(f"{len(both)} steps in common, or a loss differs")
print(f"both trainers logged steps {both[0]}..{both[-1]} with the same loss")
EOF
ok "elastic job under Slurm: a second srun step joined the running job ($(grep -m1 'elastic: admitted' "$TMP/joiner.log" | sed 's/.*elastic: //'))"
bash "$SL" stop >/dev/null 2>&1
pgrep -r R,S,D -x slurmctld >/dev/null && fail "slurmctld still runs after stop"
[ -e /etc/slurm/slurm.conf ] && fail "slurm.conf left behind"
ok "Slurm stopped and its configuration removed"
finish

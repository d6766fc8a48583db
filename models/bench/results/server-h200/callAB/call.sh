# issue 25: burst through HTTP on one machine, three front ends: base (all of a burst's handlers in one loop turn),
# turns (one intake a turn; the engine not told MORE), gather (HEAD: turns + an idle engine gathers the burst)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
for arm in base turns; do rm -rf /tmp/$arm && mkdir /tmp/$arm && cp -r models kernels resplan tests pyproject.toml /tmp/$arm/; done
sed -i '/    state.client.queued_intakes = app.turns.queued/d' /tmp/base/models/server/app.py /tmp/turns/models/server/app.py
sed -i 's/    app = TakingTurns(build_app(state))/    app = build_app(state)/' /tmp/base/models/server/app.py
grep -c "TakingTurns(build_app\|queued_intakes = " /tmp/base/models/server/app.py /tmp/turns/models/server/app.py models/server/app.py >> $OUT/times.txt
run() { # arm rounds limit extra
  local d=$PWD; [ $1 != gather ] && d=/tmp/$1
  (cd $d && PYTHONPATH=/tmp/site:$d timeout $3 python3 -m models.bench.serve_http --model-dir /tmp/q08 $4 --rounds $2 --workloads burst --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1); echo "$1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null; cp /tmp/sh_$1/burst-ttft-by-request.csv $OUT/$1.csv 2>/dev/null
}
run base 2 300 "--make qwen3_5-0.8b"
run gather 3 160 ""
run turns 2 120 ""
tar czf $OUT/rest.tgz -C /tmp sh_base sh_turns sh_gather sh_base.log sh_turns.log sh_gather.log 2>/dev/null
cat $OUT/times.txt; for a in base turns gather; do echo "== $a"; grep -h -E "^\| burst" $OUT/$a.md | cut -c1-1200; done

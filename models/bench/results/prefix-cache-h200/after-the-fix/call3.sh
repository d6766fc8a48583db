# Session 40, call 3: the prefix cache's system prompt and Poisson at bb5ac46+ (issue 26's last two workloads at the
# tree of the burst and chats), then the switch-interval probe of a busy host (issue 24).
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 150 python3 -m models.bench.traffic --model qwen3_5-0.8b --shape system-prompt --system-len 2000 --prompt-len uniform:50,200 --gen-len fixed:64 --num-requests 256 --rate 40 --max-seq-len 2304 --arms resident-triton,resident-triton-cache --rounds 2 --max-running 64 --no-progress --out $OUT/sys > $OUT/sys.log 2>&1
echo "== system prompt rc=$? at $(( $(date +%s) - T0 )) s"; grep "^round" $OUT/sys.log
timeout 120 python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate 40 --arms resident-triton,resident-triton-cache --rounds 2 --max-running 64 --no-progress --out $OUT/poisson > $OUT/poisson.log 2>&1
echo "== poisson rc=$? at $(( $(date +%s) - T0 )) s"; grep "^round" $OUT/poisson.log
python3 - <<'PY'
import os
for w in ("sys", "poisson"):
    p = os.environ["OUT"] + f"/{w}/results.md"
    if not os.path.exists(p):
        continue
    rows = [l for l in open(p) if l.startswith("| ")]
    head = [c.strip() for c in rows[0].split("|")]
    want = ["arm", "output tok/s", "TTFT p50 ms", "TTFT p90 ms", "prompt tokens", "prompt tokens computed", "prefix hits", "vs no cache", "TTFT p50 no cache / cache", "all tokens = no cache"]
    for l in rows[2:]:
        cells = [c.strip() for c in l.split("|")]
        print(w, " | ".join(f"{x}: {cells[head.index(x)]}" for x in want if x in head))
PY
left=$(( 255 - ($(date +%s) - T0) )); echo "switch interval probe with ${left} s"
[ $left -gt 90 ] && timeout $left python3 scratch/switch_interval.py $OUT > $OUT/switch.log 2>&1; echo "== switch rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^== |round [0-9] " $OUT/switch.log | cut -c1-200 | head -30
find $OUT -name "*.png" -delete; find $OUT -name "results.json" -delete; find $OUT -type f | sort

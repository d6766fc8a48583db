# issue 25: does the burst's ITL p50 rise in-process when its 128 arrivals spread over tens of ms, as through HTTP?
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
for rate in inf 2000 800; do
  timeout 200 python3 -m models.bench.traffic --num-requests 128 --rate $rate --rounds 2 --no-progress --model qwen3_5-0.8b \
    --arms resident-triton-cache --max-running 32 --max-seq-len 2048 --out $OUT/burst_$rate > $OUT/burst_$rate.log 2>&1
  echo "== rate $rate rc=$? at $(( $(date +%s) - T0 )) s"
  python3 - $OUT/burst_$rate/results.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    keys = ("tokps", "ttft_p50_ms", "itl_p50_ms", "tpot_mean_ms", "decode_step_ms", "decode_beside_pass", "decode_steps", "prefill_passes")
    print({k: (round(r[k], 3) if isinstance(r.get(k), float) else r.get(k)) for k in keys},
          "deciles", [round(x, 2) for x in r.get("itl_ms_deciles", [])])
PY
done

# issue 25: the burst through HTTP against in-process, 3 rounds each, with the beside-pass share and ITL p30/p70;
# then the configured-shape gemv test and the engine GPU tests with what time is left.
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 380 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 3 --workloads burst > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? in $(( $(date +%s) - T0 )) s"
tail -8 $OUT/sh/results.md 2>/dev/null || tail -30 $OUT/serve_http.log
grep -h "ITL\|beside" $OUT/sh/burst-http/results.md 2>/dev/null | head -4
python3 - $OUT/sh/burst-http/results.json $OUT/sh/burst-engine/results.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        for r in json.load(open(f))["runs"]:
            print(f.split("/")[-2], "p50", round(r["itl_p50_ms"], 3), "deciles", [round(x, 2) for x in r.get("itl_ms_deciles", [])],
                  "beside", r.get("engine_beside_share", (r.get("decode_beside_pass", 0) / r["decode_steps"]) if r.get("decode_steps") else None))
    except Exception as e:
        print(f, e)
PY
left=$(( 470 - ($(date +%s) - T0) ))
echo "tests with ${left} s"
timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider -p no:benchmark tests/test_decode_kernels.py -k "configured" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/gpu_tests.log

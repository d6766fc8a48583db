source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
lscpu -p=CPU,CORE,SOCKET,NODE | grep -v '^#' > $OUT/cpus.txt
SERVER=$(awk -F, '$2<2{print $1}' $OUT/cpus.txt | paste -sd,); CLIENT=$(awk -F, '$2>=2{print $1}' $OUT/cpus.txt | paste -sd,)
echo "server cpus $SERVER; client cpus $CLIENT"
timeout 300 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/pinned --rounds 2 --workloads burst --server-cpus $SERVER --client-cpus $CLIENT > $OUT/pinned.log 2>&1
echo "pinned rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- start|^\| burst" $OUT/pinned/results.md 2>/dev/null | cut -c1-700 || tail -5 $OUT/pinned.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/pinned/*-http $OUT/pinned/*-engine
left=$(( 440 - ($(date +%s) - T0) )); echo "unpinned with $left s"
timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --out $OUT/free --rounds 2 --workloads burst > $OUT/free.log 2>&1
echo "free rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- start|^\| burst" $OUT/free/results.md 2>/dev/null | cut -c1-700 || tail -3 $OUT/free.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/free/*-http $OUT/free/*-engine $OUT/*/server-*.log

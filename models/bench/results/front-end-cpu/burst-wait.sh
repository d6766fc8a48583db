. .venv/bin/activate
for i in 1 2; do for w in 0 5; do
  python -m models.server --model-dir /tmp/qtiny --port 8021 --max-running 32 --max-seq-len 2048 --no-progress --burst-wait-ms $w > scratch/bab_srv.out 2> scratch/bab_srv.err &
  pid=$!
  for k in $(seq 60); do grep -q ready scratch/bab_srv.out && break; sleep 1; done
  timeout 300 python -m models.bench.traffic --url http://127.0.0.1:8021 --model qwen3_5-tiny --num-requests 48 --rate inf --gen-len fixed:16 --rounds 2 --client-procs 1 --no-progress --out scratch/bab/w$w-$i > scratch/bab_w$w-$i.log 2>&1
  kill -TERM $pid; wait $pid
  echo "wait $w run $i"; grep -A2 "^| server" scratch/bab/w$w-$i/results.md | tail -1 | awk -F'|' '{print "tok/s",$6,"passes tok",$24,"pass ms",$25,"srv ttft",$26}'; grep "^| TTFT" scratch/bab/w$w-$i/results.md
done; done

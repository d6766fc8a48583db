# Session 40, call 2: the chats after the split-K fix (tokens and targets), then the whole GPU suite with a probe that
# writes each worker's live threads at the end of its session and its stacks if it is still alive 20 s later.
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 200 python3 scratch/chat_diverge.py $OUT/chat > $OUT/chat.log 2>&1; echo "== chats rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^round|differ|request " $OUT/chat.log | head -20
python3 - <<'PY'
import os
rows = [l for l in open(os.environ["OUT"] + "/chat/results.md") if l.startswith("| ")]
head = [c.strip() for c in rows[0].split("|")]
want = ["arm", "output tok/s", "TTFT p50 ms", "TTFT p90 ms", "prompt tokens computed", "vs no cache", "TTFT p50 no cache / cache", "all tokens = no cache"]
for l in rows[2:]:
    cells = [c.strip() for c in l.split("|")]
    print(" | ".join(f"{w}: {cells[head.index(w)]}" for w in want if w in head))
PY
mkdir -p $OUT/threads
OUT=$OUT/threads PYTHONPATH=scratch/probe:$PYTHONPATH timeout 320 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark -p no:cacheprovider -p hangprobe tests > $OUT/gpu_suite.log 2>&1; echo "== gpu suite rc=$? at $(( $(date +%s) - T0 )) s"
tail -8 $OUT/gpu_suite.log | cut -c1-300
for f in $OUT/threads/*.txt; do echo "-- $f"; grep -v "^  .*daemon=True" $f | head -30; done
ps -eo pid,etime,cmd | grep -i python | grep -v grep | head

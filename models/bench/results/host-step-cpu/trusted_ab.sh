# A/B of models.bench.host_step: a base worktree (/tmp/base: git worktree add /tmp/base <commit>) against this tree, alternated R times; c=1 and c=64
. /work/main/.venv/bin/activate
R=${R:-3}
for i in $(seq $R); do
  for t in /tmp/base /work/main; do
    (cd $t && python -m models.bench.host_step --concurrency 1,64 --arms resident --rounds 5 2>/dev/null | grep "^| resident" | sed "s|^|$(basename $t) |")
  done
done

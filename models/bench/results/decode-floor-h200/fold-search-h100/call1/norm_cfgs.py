"""Read the NORM_CONFIGS literal(s) a `models.bench.gemv --parts norm` run printed (commented picks too) -> JSON."""
import json
import re
import sys

pat = re.compile(r"^#?\s*\((1), (\d+), (\d+)\): \((\d+), (\d+), (\d+), (\d+)\),")
out = []
for path in sys.argv[1:]:
    lit = False
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("NORM_CONFIGS"):
            lit = True
        elif lit and (m := pat.match(line)):
            v = [int(g) for g in m.groups()]
            out.append([v[:3], v[3:], not line.startswith("#")])
print(json.dumps(out))

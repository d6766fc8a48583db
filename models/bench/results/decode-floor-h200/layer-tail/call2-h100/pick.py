"""Fastest persistent tail of one layer_tail bench output: prints 'config tail_us chain_us'."""
import pathlib
import re
import sys

text = pathlib.Path(sys.argv[1]).read_text()
chain = re.search(r"^\| chain \| ([\d.]+)", text, re.M)
tails = re.findall(r"^\| tail ([\d,]+) \| ([\d.]+)", text, re.M)
if chain and tails:
    cfg, us = min(tails, key=lambda t: float(t[1]))
    print(cfg, us, chain[1])

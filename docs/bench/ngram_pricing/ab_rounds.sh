#!/bin/bash
# A/B of goodput model+ngram: c6a10d2 (shared pricing) against 55c5c59 (priced apart), taking turns.
for round in 1 2; do
  for side in old new; do
    cd /tmp/ab_$side && env PYTHONPATH=/tmp/ab_$side /work/main/.venv/bin/python -m scripts.bench_throughput \
      --batch-sizes 1 4 --temperatures 0 1 --seeds 0 1 2 --num-draft-tokens 2 --proposers model+ngram \
      --confidence 0 --runtimes local --static-batch-sizes --num-records 64 --records-at-b1 16 \
      --out /tmp/ab_out/${side}_r$round > /tmp/ab_out/${side}_r$round.log 2>&1
  done
done
echo done > /tmp/ab_out/DONE

#!/bin/bash
# goodput model+ngram at T = 1: 55c5c59 (n-gram cells probed) against the working tree (priced at the model's cell until measured).
for round in 1 2; do
  for side in new fb; do
    dir=/tmp/ab_new; [ $side = fb ] && dir=/tmp/fb_clone
    cd $dir && env PYTHONPATH=$dir /work/main/.venv/bin/python -m scripts.bench_throughput \
      --batch-sizes 1 4 --temperatures 1 --seeds 0 1 2 --num-draft-tokens 2 --proposers model+ngram \
      --confidence 0 --runtimes local --static-batch-sizes --num-records 64 --records-at-b1 16 \
      --out /tmp/ab_out/t1_${side}_r$round > /tmp/ab_out/t1_${side}_r$round.log 2>&1
  done
done
echo done > /tmp/ab_out/DONE2

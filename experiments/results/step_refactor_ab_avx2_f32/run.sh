#!/bin/bash
# A B A B: base 42d457b (before the step refactor) vs main, same venv, quiet machine.
cd /work/wt-head
export OMP_WAIT_POLICY=PASSIVE
for round in 1 2; do
  for side in base main; do
    d=/work/wt-base; [ $side = main ] && d=/work/wt-head
    (cd $d && PYTHONPATH=$d /work/main/.venv/bin/python -c "import sys; from specdec.cli.main import main; sys.argv[0]=\"specdec\"; sys.exit(main())" bench --prompts /work/shared/data/specbench_dev.jsonl --limit 13 --max-new-tokens 128 --dtype float32 --drafters eagle,ngram,suffix --no-hf --out-json /work/ab/${side}_${round}.json) > /work/ab/${side}_${round}.log 2>&1
  done
done
echo done > /work/ab/DONE

source tools/gpu-env.sh
c=$(cat .commit)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_norms_gpu.py -k "held" -x > $OUT/held.txt 2>&1; echo "held: $(tail -1 $OUT/held.txt)"
grep -E "Error|assert" $OUT/held.txt | head -5
CFG=1024:1:4:0:hold:keep,1024:1:4:0:hold,1024:2:3:0:hold:keep,512:2:6:0:hold:keep,1024:1:4:1:keep,team:1024:1:4:0:hold:keep,team:1024:2:3:0:hold:keep
timeout 330 python3 benchmarks/norms_backward_staged.py --commit $c --out $OUT/sweep_bf16.json --kinds ln,rms --dtypes bf16 --sizes 32768,65536,131072,262144 --reps 10 --configs $CFG 2>&1 | grep -v "^max active"

source tools/gpu-env.sh
c=$(cat .commit)
CFG=512:2:6:0:hold:keep,512:2:6:0:hold,512:2:6:1:keep,512:2:6:0:keep,1024:1:4:1:keep,1024:1:4:0:hold:keep,1024:2:3:1:keep,team:512:2:6:2:keep,team:1024:2:3:1:keep,team:1024:1:4:1:keep,team:512:2:6:1:keep
timeout 250 python3 benchmarks/norms_backward_staged.py --commit $c --out $OUT/sweep_f32.json --kinds ln,rms --dtypes f32 --sizes 16384,32768,65536,131072,262144 --reps 10 --configs $CFG 2>&1 | grep -v "^max active"
timeout 250 python3 benchmarks/norms_backward_staged.py --commit $c --out $OUT/sweep_bf16b.json --kinds ln,rms --dtypes bf16 --sizes 32768,65536,131072,262144 --reps 10 --configs $CFG 2>&1 | grep -v "^max active"

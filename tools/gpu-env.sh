# Sourced on the GPU machine from the repository root, after `.devrt` travelled (see ../shared/gpu/README.md):
#   source tools/gpu-env.sh
# Unpacks the runtime and wheels (.devrt/activate.sh), then lays this checkout's pure-Python sources over the
# unpacked flydsl-compiler wheel, so that Python-only changes run without packing new wheels (the native extension
# comes from the wheel: repack when native/ changed). flydsl-kernels and flydsl-torch run from the checkout.
source .devrt/activate.sh
cp -r packages/flydsl-compiler/src/flydsl/. .devrt-site/flydsl/
cp -r packages/flydsl-layout/src/flydsl/. .devrt-site/flydsl/
export PYTHONPATH=$PYTHONPATH:$PWD/packages/flydsl-kernels/src:$PWD/packages/flydsl-torch/src
export FLYDSL_CACHE_DIR=${FLYDSL_CACHE_DIR:-/tmp/flycache} PYTHONUNBUFFERED=1

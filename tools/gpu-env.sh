# Sourced on the offline GPU machine from the repository root, after .devrt/ travelled (tools/pack-gpu-runtime.sh
# makes it on a machine with a package registry):
#   source tools/gpu-env.sh
# Unpacks each runtime piece and wheel of .devrt/ that is new since the last time (checked by checksum: a repacked
# piece is unpacked again) into .devrt-site/, puts that first on PYTHONPATH, then lays this checkout's pure-Python
# sources over the unpacked flydsl-compiler and flydsl-layout wheels, so that Python-only changes run without packing
# new wheels (the native extension comes from the wheel: repack when native/ changed). flydsl-kernels and
# flydsl-torch run from the checkout.
_devrt_site=$PWD/.devrt-site
if [ ! -d .devrt ]; then
  echo "gpu-env: no .devrt/ here: run tools/pack-gpu-runtime.sh where a package registry is, and carry .devrt" >&2
fi
mkdir -p "$_devrt_site/.unpacked"
for _piece in .devrt/rt-mlir.tar.xz .devrt/rt-llvm.tar.xz .devrt/wheels/*.whl; do
  [ -f "$_piece" ] || continue
  _stamp="$_devrt_site/.unpacked/$(basename "$_piece")"
  _sum=$(cksum <"$_piece")
  [ "$(cat "$_stamp" 2>/dev/null)" = "$_sum" ] && continue
  case $_piece in
    *.tar.xz) tar -xJf "$_piece" -C "$_devrt_site" ;;
    *.whl) python3 -m zipfile -e "$_piece" "$_devrt_site" ;;
  esac && echo "$_sum" >"$_stamp"
done
for _part in mlir llvm; do
  [ -f "$_devrt_site/.unpacked/rt-$_part.tar.xz" ] || echo "gpu-env: the $_part runtime has not travelled here yet" >&2
done
for _scripts in "$_devrt_site"/*.data/scripts; do  # the wheels' executables (ninja: torch extensions' builds)
  [ -d "$_scripts" ] && chmod +x "$_scripts"/* && PATH=$_scripts:$PATH
done
export PATH
cp -r packages/flydsl-compiler/src/flydsl/. "$_devrt_site/flydsl/"
cp -r packages/flydsl-layout/src/flydsl/. "$_devrt_site/flydsl/"
export PYTHONPATH=$_devrt_site${PYTHONPATH:+:$PYTHONPATH}:$PWD/packages/flydsl-kernels/src:$PWD/packages/flydsl-torch/src
export FLYDSL_CACHE_DIR=${FLYDSL_CACHE_DIR:-/tmp/flycache} PYTHONUNBUFFERED=1
unset _devrt_site _piece _stamp _sum _part _scripts

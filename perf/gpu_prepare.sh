#!/usr/bin/env bash
# Prepares, on this machine, what the GPU machine of the device tool lacks: it runs Python 3.12 with its own
# PyTorch, NumPy, psutil and TensorBoard, and reaches no package registry. The packages sf_engine needs beyond
# those (Gymnasium, EnvPool and its Atari ROMs, faster-fifo, and what they import) are downloaded here as cp312
# wheels and unpacked into .gpu_site/ (git-ignored), slimmed to fit the 64 MiB the device tool carries in all:
# EnvPool's wheel and its assets hold every env family (about 50 MB and 90 MB), of which only Atari and classic
# control stay (EnvPool's entry.py then registers only those). VizDoom's wheel (39 MB, 149 MB unpacked; the doom_* envs) does not fit
# beside them: it goes to .gpu_doom/ as it is, carried alone in the calls that run Doom and installed there; Brax's
# wheels go to .gpu_brax/ the same way.
#
#   perf/gpu_prepare.sh            # then carry .gpu_site (and .gpu_doom for Doom, .gpu_brax for Brax) in the calls
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SITE=.gpu_site
KEEP="atari classic_control python"  # EnvPool's families (and its Python core) kept whole
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT

# download DIR PACKAGE...: each package's cp312 manylinux wheel into DIR, or a stop naming what is missing
download() {
  local dir=$1
  shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@" 2>&1 \
    | grep -v "^WARNING: Location" || true
  local got
  got=$(find "$dir" -maxdepth 1 -name '*.whl' | wc -l)
  [ "$got" -eq $# ] || { echo "gpu_prepare.sh: $got of $# wheels downloaded into $dir: $*" >&2; exit 1; }
}

download "$WHEELS" envpool==1.2.5 envpool-assets==0.3.0 gymnasium==1.4.0 farama-notifications==0.0.6 \
  faster-fifo==1.5.2 dm-env==1.6 dm-tree==0.1.10 optree==0.20.0 vizdoom==1.3.2

# Brax, MuJoCo and MuJoCo Playground (perf/brax_ppo.py, the `brax` section): about 27 MB of wheels, carried alone
# in .gpu_brax/ beside .gpu_site; what Brax imports that the machine's image lacks (flax, optax and orbax are there;
# Warp, 390 MB unpacked, is left out: MJX and Playground run without it, in JAX)
download "$WHEELS/brax" brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-mjx==3.17.0 jaxopt==0.8.5 \
  ml-collections==1.1.0 trimesh==5.2.0 tensorboardx==2.6.5 glfw==2.11.0 playground==0.2.0

rm -rf "$SITE" .gpu_doom .gpu_brax
mkdir -p "$SITE" .gpu_doom
mv "$WHEELS"/vizdoom-*.whl .gpu_doom/
mv "$WHEELS/brax" .gpu_brax
for wheel in "$WHEELS"/*.whl; do
  unzip -q -o "$wheel" -d "$SITE"
done
for family in "$SITE"/envpool/*/; do
  name=$(basename "$family")
  case " $KEEP " in *" $name "*) continue ;; esac
  rm -rf "$family"
  sed -i "/^import envpool\.$name\./d" "$SITE"/envpool/entry.py  # nor registered: its names are unknown
done
find "$SITE"/envpool_assets -mindepth 1 -maxdepth 1 ! -name atari ! -name '*.py' -exec rm -rf {} +
find "$SITE" -name '__pycache__' -type d -prune -exec rm -rf {} +
if [ -f ../shared/baselines/single_process_ppo.py ]; then  # the one-file baseline, which ../shared does not carry
  mkdir -p "$SITE"/baselines
  cp ../shared/baselines/single_process_ppo.py "$SITE"/baselines/
fi
for folder in /.gpu_site/ /.gpu_doom/ /.gpu_brax/; do
  grep -qx "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >> .git/info/exclude
done
du -sh "$SITE" .gpu_doom .gpu_brax
